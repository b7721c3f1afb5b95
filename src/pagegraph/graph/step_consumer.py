"""The decode step's consumer side: what reads a builder's tables in the step's graph.
``StepConsumer`` holds the attention's buffers (the queries, the output, the reader format's
metadata built in the graph, the split-K workspace, a reader's plan workspace) and the host
lengths a reader's launch arguments come from; its ``consume`` is the reader a ``GraphRunner``
captures after the builder. It sees the runner's tables, never the builder. The format
(``pagegraph.consumers.formats``) says what the graph builds and how the attention is called.
docs/ARCHITECTURE.md, "The step's graphs".
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import torch

from ..consumers import prepare_decode_attention
from ..consumers.formats import ReaderFormat, reader_format
from ..consumers.reader import (
    PAD_SLOT_ID,
    CacheWrite,
    HostBatch,
    Reader,
    StepInputs,
    as_reader,
)
from .plan_workspace import PlanWorkspace

#: The bit pattern ``out`` holds before each replay, by element size (``poison_out``): finite,
#: and far outside what attention (a convex combination of V's rows) writes: 0x5A5A is 203.25
#: in fp16 and about 1.5e16 in bf16.
OUT_POISON = {2: 0x5A5A, 4: 0x5A5A5A5A}


@dataclass(frozen=True)
class StepShape:
    """The static shapes of one decode step."""

    max_bs: int
    width: int
    page_size: int
    #: pages the pool allocates from (page 0 included); the cache holds two more, the sentinel
    #: (page ``num_pages``) and the discard page (``num_pages + 1``)
    num_pages: int
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    dtype: torch.dtype
    #: the reader format's name (``pagegraph.consumers.formats.FORMATS``)
    fmt: str
    index_dtype: torch.dtype = torch.int32

    @property
    def discard_slot(self) -> int:
        """The first slot of the discard page: where a masked cache write may go."""
        return (self.num_pages + 1) * self.page_size

    @property
    def format(self) -> ReaderFormat:
        """The registered reader format ``fmt`` names."""
        return reader_format(self.fmt)


def default_consumer(fmt: str) -> Callable[..., object]:
    """The attention kernel of a format (``ReaderFormat.kernel``)."""
    return reader_format(fmt).kernel


@contextlib.contextmanager
def quiet_interpreter() -> Iterator[None]:
    """The Triton interpreter computes in numpy, which warns on the NaN and Inf the padded
    rows carry by design."""
    with np.errstate(invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        yield


class StepConsumer:
    """The attention that reads one decode step's tables, and its buffers.

    Args:
        consumer: the attention call (the signature of ``shape.format``'s kernel: ``q``,
            ``k_cache``, ``v_cache``, the format's ``arguments``, ``out``, given
            ``page_size=`` and ``workspace=``) or
            a ``pagegraph.consumers.reader.Reader`` (launch arguments from the host lengths at
            each call, frozen in a graph; its workspace allocated here once, planned by
            ``plan``).
        shape: the static shapes.
        page_table: ``[max_bs, width]`` int32, the builder's table (the runner's).
        seq_lens: ``[max_bs]`` int32/int64, the staged lengths (the runner's).
        lengths: ``[max_bs]`` int32, each row's length as the builder writes it (the vector
            its kind names in ``KindSpec.consumer_lengths``), or None: the consumer's own,
            copied from ``seq_lens`` in the graph.
        k_cache, v_cache: ``[num_pages + 2, page_size, Hkv, D]`` of ``shape.dtype``: the
            pool's pages, the sentinel and the discard page.
        req_to_token, req_pool_indices: the pool's table and the staged request indices (the
            runner's), for a reader that builds its own metadata (``Reader.inputs``) and for
            the cache write (``CacheWrite.inputs``).

    Before the reader's ``attend`` the step writes each row's new token into the cache
    (``Reader.writer``) from ``k_new`` / ``v_new`` ``[max_bs, Hkv, D]``, ``out_cache_loc`` and
    ``positions`` ``[max_bs]`` int64 and ``idx_mapping`` ``[max_bs]`` int32, which the bench
    writes before each step (``stage_writes``), as an engine copies them in before a replay.
    """

    def __init__(
        self,
        consumer: Callable[..., object] | Reader,
        shape: StepShape,
        page_table: torch.Tensor,
        seq_lens: torch.Tensor,
        lengths: torch.Tensor | None,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        req_to_token: torch.Tensor,
        req_pool_indices: torch.Tensor,
    ) -> None:
        self.reader = as_reader(consumer)
        self.req_to_token, self.req_pool_indices = req_to_token, req_pool_indices
        self.consumer = self.reader.attend
        self.shape, self.page_table, self.seq_lens = shape, page_table, seq_lens
        self.k_cache, self.v_cache = k_cache, v_cache
        self.device = dev = page_table.device
        s, i32 = shape, torch.int32
        #: the builder writes the consumer's lengths itself (``KindSpec.consumer_lengths``)
        self.writes_lengths = lengths is not None
        #: ``[max_bs]`` int32: each row's length as the consumer reads it
        self.lengths = torch.zeros(s.max_bs, dtype=i32, device=dev) if lengths is None else lengths
        #: the real rows' lengths as the engine knows them on the host for the next call
        #: (``None``: a capture's, one token a row)
        self.host_lens: list[int] | None = None
        #: the reader format, its buffers (built in the graph from the table before the
        #: attention) and their stale entries (``ReaderFormat.stale``)
        self.format = fmt = s.format
        self.metadata = fmt.allocate(s.max_bs, s.width, dev)
        self.stale = fmt.stale(self.metadata)
        heads = (s.max_bs, s.num_q_heads, s.head_dim)
        self.q = torch.zeros(heads, dtype=s.dtype, device=dev)
        self.out = torch.zeros(heads, dtype=s.dtype, device=dev)
        kv_heads = (s.max_bs, s.num_kv_heads, s.head_dim)
        self.k_new = torch.zeros(kv_heads, dtype=s.dtype, device=dev)
        self.v_new = torch.zeros(kv_heads, dtype=s.dtype, device=dev)
        self.out_cache_loc = torch.full((s.max_bs,), PAD_SLOT_ID, dtype=torch.int64, device=dev)
        self.positions = torch.zeros(s.max_bs, dtype=torch.int64, device=dev)
        self.idx_mapping = torch.full((s.max_bs,), -1, dtype=torch.int32, device=dev)
        self.workspace = prepare_decode_attention(
            s.max_bs, s.num_q_heads, s.head_dim, device=dev, max_context_len=s.width * s.page_size
        )
        #: a context manager factory the next ``consume`` call runs in, then cleared
        self.watch: Callable[[int], contextlib.AbstractContextManager[object]] | None = None
        #: a reader's own buffers (``Reader.workspace``), allocated once; None without
        self.plan_space = PlanWorkspace.for_reader(
            self.reader,
            s.max_bs,
            s.width,
            s.page_size,
            dev,
            num_q_heads=s.num_q_heads,
            head_dim=s.head_dim,
        )

    def consume(self, bs: int) -> None:
        """The consumer on rows ``:bs``, from the builder's tables (the next call inside
        ``watch(bs)`` when one is set: a sync detector around the capture's warm-up)."""
        if self.watch is not None:
            watch, self.watch = self.watch, None
            with watch(bs):
                return self.consume(bs)
        ps = self.shape.page_size
        if not self.writes_lengths:
            # The trtllm_mha / FA3 format's lengths are int32, whatever seq_lens holds.
            self.lengths[:bs].copy_(self.seq_lens[:bs])
        q, out = self.q[:bs], self.out[:bs]
        launch = self._launch_args(bs)
        self.reader.writer(self.cache_write(bs), **launch)
        if self.reader.inputs:
            launch["inputs"] = self.inputs(bs)
        table, lens = self.page_table[:bs], self.lengths[:bs]
        self.format.build(self.metadata, table, lens, ps)
        self.consumer(
            q,
            self.k_cache,
            self.v_cache,
            *self.format.arguments(self.metadata, table, lens),
            out,
            page_size=ps,
            workspace=self.workspace,
            **launch,
        )

    def inputs(self, bs: int) -> StepInputs:
        """The staged inputs, rows ``:bs``."""
        return StepInputs(self.req_to_token, self.req_pool_indices[:bs], self.seq_lens[:bs])

    def cache_write(self, bs: int) -> CacheWrite:
        """What the step's cache write is given for rows ``:bs``."""
        return CacheWrite(
            k_new=self.k_new[:bs],
            v_new=self.v_new[:bs],
            k_cache=self.k_cache,
            v_cache=self.v_cache,
            out_cache_loc=self.out_cache_loc[:bs],
            positions=self.positions[:bs],
            idx_mapping=self.idx_mapping[:bs],
            page_table=self.page_table[:bs],
            lengths=self.lengths[:bs],
            page_size=self.shape.page_size,
            discard_slot=self.shape.discard_slot,
            inputs=self.inputs(bs),
        )

    def stage_writes(
        self, slots: list[int], positions: list[int], bucket: int, pad_slot: int
    ) -> None:
        """The next step's cache-write inputs, as an engine copies them in before a replay:
        real rows ``:n`` (``n = len(slots)``) get their new token's slot and position and
        ``idx_mapping`` ``i``; padded rows ``n:bucket`` get ``pad_slot``, position 0 and
        ``idx_mapping`` -1. ``k_new`` / ``v_new`` are the caller's to fill."""
        n = len(slots)
        dev = self.device
        self.out_cache_loc[:n].copy_(torch.tensor(slots, dtype=torch.int64), non_blocking=False)
        self.out_cache_loc[n:bucket].fill_(pad_slot)
        self.positions[:n].copy_(torch.tensor(positions, dtype=torch.int64))
        self.positions[n:bucket].zero_()
        self.idx_mapping[:n].copy_(torch.arange(n, dtype=torch.int32, device=dev))
        self.idx_mapping[n:bucket].fill_(-1)

    def poison_out(self) -> None:
        """Every row of ``out`` given ``OUT_POISON``'s bits: a row a call leaves unwritten
        keeps them (``pagegraph.check.judges.reader_judges``)."""
        bits = {2: torch.int16, 4: torch.int32}[self.out.element_size()]
        self.out.view(bits).fill_(OUT_POISON[self.out.element_size()])

    def host_batch(self, bs: int) -> HostBatch:
        """What the engine knows on the host for a call on ``bs`` rows: ``host_lens``, or the
        capture's one token a row."""
        lens = tuple(self.host_lens) if self.host_lens is not None else (1,) * bs
        return HostBatch(lens, bs, self.shape.page_size, self.shape.width)

    def _launch_args(self, bs: int) -> dict[str, object]:
        """The reader's host launch arguments for a call on ``bs`` rows, and its workspace
        (``plan=``) when it has one."""
        launch = self.reader.arguments(self.host_batch(bs))
        if self.plan_space is not None:
            launch["plan"] = self.plan_space.tensors
        return launch

    def plan(self, bucket: int, label: str | None = None) -> None:
        """A planned reader's plan for the next step on ``bucket`` (eager, outside the graph;
        ``pagegraph.check.judges.step_plan``), named ``label``; nothing for other readers."""
        if self.plan_space is not None:
            self.plan_space.plan(self.host_batch(bucket), label)
