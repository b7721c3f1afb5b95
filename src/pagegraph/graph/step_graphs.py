"""The decode step's graphs: a builder's tables consumed by paged attention in the same graph.
``StepGraphs`` owns every buffer of one decode step, allocated once at the largest batch as an
engine's attention backend does, captures one graph per bucket (the builder, then the
consumer) and times each bucket's whole step, builder and consumer apart. Its buffers, the KV
pages no request holds, the capture and the timing: docs/ARCHITECTURE.md, "The step's graphs".
"""

from __future__ import annotations

import contextlib
import statistics
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import numpy as np
import torch

from ..consumers import csr_decode_attention, paged_decode_attention, prepare_decode_attention
from ..consumers.formats import CSR_CONSUMERS
from ..consumers.reader import HostBatch, Reader, as_reader
from ..kinds import KindSpec
from .capture import Graph, capture_buckets

if TYPE_CHECKING:
    from .capture import GraphPool
from .plan_workspace import PlanWorkspace

#: The page id of the guard page before page 0 of the step's KV cache.
GUARD_PAGE = -1
#: The two reserved pages as failures name them.
GUARD_NAME = f"the guard page before page 0 (page {GUARD_PAGE})"
NULL_BLOCK_NAME = "page 0 (the null block)"
#: Calls of one body captured back to back in a timing graph: a replay's launch is shared by
#: this many calls.
TIMING_CALLS = 20
#: Untimed replays of each timing graph before the timed ones (first-touch and clock ramp).
TIMING_WARMUP = 3
#: The parts a decode step is timed in, in the order they are replayed.
TIMED_PARTS = ("step", "builder", "consumer")

_M = TypeVar("_M")


@dataclass(frozen=True)
class StepShape:
    """The static shapes of one decode step."""

    max_bs: int
    width: int
    page_size: int
    #: pages the pool allocates from (page 0 included); the cache holds one more, the sentinel
    num_pages: int
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    dtype: torch.dtype
    #: "paged" or "csr" (``pagegraph.consumers.formats.CONSUMERS``)
    fmt: str
    index_dtype: torch.dtype = torch.int32

    @property
    def lists_pages(self) -> bool:
        """The consumer reads FlashInfer's page list (``kv_indptr`` / ``kv_indices``, built in
        the graph from the table), not the table itself."""
        return self.fmt in CSR_CONSUMERS


def default_consumer(fmt: str) -> Callable[..., object]:
    """The attention kernel of a format: ``paged_decode_attention`` or
    ``csr_decode_attention``."""
    kernels: dict[str, Callable[..., object]] = {
        "paged": paged_decode_attention,
        "csr": csr_decode_attention,
    }
    return kernels[fmt]


def build_csr(
    page_table: torch.Tensor,
    cache_seqlens: torch.Tensor,
    page_size: int,
    *,
    kv_pages: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    kv_last_page_len: torch.Tensor,
) -> None:
    """FlashInfer's CSR metadata from a page table, with torch ops only (no sync).

    page_table       ``[bs, width]`` int32, contiguous rows; row ``i``'s first
                     ``cdiv(cache_seqlens[i], page_size)`` entries (clamped to the width) live
    cache_seqlens    ``[bs]`` int32
    kv_pages         ``[>= bs]`` int32 scratch: each row's page count
    kv_indptr        ``[>= bs + 1]`` int32; entry 0 is 0 from allocation, entries
                     ``1..bs`` get the running sum of the page counts
    kv_indices       ``[max_bs * width + 1]`` int32: the live page ids, row after row; the
                     last entry is where the non-live entries of the table are scattered,
                     past every span a consumer is given
    kv_last_page_len ``[>= bs]`` int32: tokens in each row's last page (``1..page_size``)
    """
    bs, width = page_table.shape
    pages = kv_pages[:bs]
    torch.add(cache_seqlens[:bs], page_size - 1, out=pages)
    pages.div_(page_size, rounding_mode="floor").clamp_(0, width)
    torch.cumsum(pages, 0, dtype=torch.int32, out=kv_indptr[1 : bs + 1])
    last = kv_last_page_len[:bs]
    torch.sub(pages, 1, out=last)
    last.mul_(-page_size).add_(cache_seqlens[:bs])
    # The scatter's index and source are temporaries: inside a capture they come from the
    # graph's own pool, so the step allocates nothing at replay.
    cols = torch.arange(width, device=page_table.device)
    dest = kv_indptr[:bs, None].long() + cols[None, :]
    dump = kv_indices.shape[0] - 1
    dest = torch.where(cols[None, :] < pages[:, None], dest, dump)
    kv_indices.scatter_(0, dest.reshape(-1), page_table.reshape(-1))


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit equality of two tensors of one dtype (NaN equals the same NaN)."""
    as_int = {2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    return torch.equal(a.view(as_int), b.view(as_int))


@contextlib.contextmanager
def _quiet_interpreter() -> Iterator[None]:
    """The Triton interpreter computes in numpy, which warns on the NaN and Inf the padded
    rows carry by design."""
    with np.errstate(invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        yield


class StepGraphs:
    """One decode step's static buffers and its graphs (docs/ARCHITECTURE.md, "The step's
    graphs").

    Args:
        builder: a builder of ``kind``, a kind that feeds the consumer (page table or decode
            metadata).
        consumer: the attention call, with ``paged_decode_attention``'s signature (``fmt``
            "paged") or ``csr_decode_attention``'s ("csr"), given ``page_size=`` and
            ``workspace=``; or a ``pagegraph.consumers.reader.Reader`` (its launch arguments
            computed on the host at each call: at capture, the capture's lengths; its own
            workspace, if any, allocated here once, and its plan run by ``plan``).
        shape: the static shapes.
        req_to_token: the pool's ``[max_reqs + 1, >= max_context_len]`` table.
        buckets: batch sizes to capture.
        seed: the KV pages' random values.
        emulate: without CUDA, capture the step's graphs as ``EmulatedGraph`` (default) or,
            with ``False``, run the step eagerly at every replay. Timing stays eager there.
        null_block: what page 0 holds (``pagegraph.check.config.NULL_BLOCKS``): "nan" or
            "finite" (then the sentinel holds NaN).
    """

    def __init__(
        self,
        builder: Callable[..., object],
        kind: KindSpec,
        consumer: Callable[..., object] | Reader,
        shape: StepShape,
        req_to_token: torch.Tensor,
        buckets: Iterable[int],
        seed: int,
        emulate: bool | None = None,
        null_block: str = "nan",
    ) -> None:
        self.builder, self.kind = builder, kind
        self.reader = as_reader(consumer)
        self.consumer = self.reader.attend
        #: the real rows' lengths as the engine knows them on the host for the next call
        #: (``None``: a capture's, one token a row, as ``_capture`` stages them)
        self.host_lens: list[int] | None = None
        #: the builder writes the consumer's lengths itself (a decode-metadata builder)
        self.writes_lengths = "cache_seqlens" in kind.vector_names
        # What the kind's call reads (``pagegraph.kinds.IO_FIELDS``) beyond the buffers below.
        self.page_size, self.draft_tokens = shape.page_size, 0
        self.swa_page_table = self.full_to_swa = self.errors = self.engine = None
        self.derived = kind.derived_inputs(shape.max_bs, 0, req_to_token.device)
        self.shape, self.req_to_token = shape, req_to_token
        self.buckets = sorted(buckets, reverse=True)
        self.device = dev = req_to_token.device
        self.use_graphs = dev.type == "cuda"
        self.emulated = not self.use_graphs and emulate is not False
        s, i32 = shape, torch.int32
        self.req_pool_indices = torch.zeros(s.max_bs, dtype=s.index_dtype, device=dev)
        self.seq_lens = torch.zeros(s.max_bs, dtype=s.index_dtype, device=dev)
        self.page_table = torch.zeros((s.max_bs, s.width), dtype=i32, device=dev)
        self.cache_seqlens = torch.zeros(s.max_bs, dtype=i32, device=dev)
        self.cu_seqlens_k = torch.zeros(s.max_bs + 1, dtype=i32, device=dev)
        self.cu_seqlens_q = torch.zeros(s.max_bs + 1, dtype=i32, device=dev)
        self.vectors = {
            "cache_seqlens": self.cache_seqlens,
            "cu_seqlens_k": self.cu_seqlens_k,
            "cu_seqlens_q": self.cu_seqlens_q,
        }
        self.kv_pages = torch.zeros(s.max_bs, dtype=i32, device=dev)
        self.kv_indptr = torch.zeros(s.max_bs + 1, dtype=i32, device=dev)
        self.kv_indices_all = torch.zeros(s.max_bs * s.width + 1, dtype=i32, device=dev)
        #: what the consumer is given: every entry but the scatter's dump
        self.kv_indices = self.kv_indices_all[:-1]
        self.kv_last_page_len = torch.zeros(s.max_bs, dtype=i32, device=dev)
        heads = (s.max_bs, s.num_q_heads, s.head_dim)
        self.q = torch.zeros(heads, dtype=s.dtype, device=dev)
        self.out = torch.zeros(heads, dtype=s.dtype, device=dev)
        self.null_block = null_block
        self._fill_cache(seed)
        self.workspace = prepare_decode_attention(
            s.max_bs, s.num_q_heads, s.head_dim, device=dev, max_context_len=s.width * s.page_size
        )
        self.graphs: dict[int, Graph] = {}
        #: part ("step", "builder", "consumer") -> bucket -> graph of ``timing_calls`` calls
        #: per timed part, each bucket's graph (CUDA graphs only: timing needs CUDA)
        self.timing_graphs: dict[str, dict[int, Graph]] = {}
        self._timing_bodies: dict[str, Callable[[int], None]] = {}
        self.timing_calls = TIMING_CALLS
        #: a reader's own buffers (``Reader.workspace``), allocated once; None without
        self.plan_space = PlanWorkspace.for_reader(self.reader, s.max_bs, s.width, s.page_size, dev)

    def _fill_cache(self, seed: int) -> None:
        """Seeded random K and V in every page (a misrouted page changes the output), NaN in
        page 0 (``null_block`` "nan") or in the sentinel ("finite"), NaN in the guard page
        before page 0, and the sentinel's, the guard's and (``null_block`` "finite") page 0's
        values kept for ``sentinel_intact`` / ``reserved_changed``."""
        s = self.shape
        gen = torch.Generator(device=self.device).manual_seed(seed)
        dims = (s.num_pages + 1, s.page_size, s.num_kv_heads, s.head_dim)
        caches = []
        for _ in range(2):
            # The guard page, then the views' pages: the same seeded values as without it.
            alloc = torch.empty((dims[0] + 1, *dims[1:]), dtype=s.dtype, device=self.device)
            alloc[1:].copy_(torch.randn(dims, generator=gen, device=self.device))
            alloc[0] = float("nan")
            caches.append(alloc)
        self.k_cache, self.v_cache = (alloc[1:] for alloc in caches)
        # NaN in page 0, or where the null block holds data, in the sentinel (the last page)
        nan_page = 0 if self.null_block == "nan" else s.num_pages
        self.k_cache[nan_page] = float("nan")
        self.v_cache[nan_page] = float("nan")
        self.sentinel = s.num_pages
        self._sentinel_values = (self.k_cache[-1].clone(), self.v_cache[-1].clone())
        # The pages no row may write (``pagegraph.check.judges.padded_rows``): the guard, and page 0
        # where it is a block padded rows read (where it holds NaN, it is padding's own).
        self._reserved = {GUARD_NAME: tuple(alloc[0] for alloc in caches)}
        if self.null_block != "nan":
            self._reserved[NULL_BLOCK_NAME] = tuple(alloc[1] for alloc in caches)
        self.snapshot_reserved()

    def snapshot_reserved(self) -> None:
        """Keep the values of the pages ``reserved_changed`` compares with."""
        self._reserved_values = {
            name: tuple(page.clone() for page in pages) for name, pages in self._reserved.items()
        }

    def sentinel_intact(self) -> bool:
        """Whether the sentinel page of K and V still holds its values, bit for bit (a
        read-back)."""
        k, v = self._sentinel_values
        return _same_bits(self.k_cache[-1], k) and _same_bits(self.v_cache[-1], v)

    def reserved_changed(self) -> list[str]:
        """Which of the guard page and (``null_block`` "finite") page 0 no longer hold their
        values in K or V, bit for bit (a read-back; ``pagegraph.check.judges.padded_rows``)."""
        return [
            name
            for name, pages in self._reserved.items()
            if not all(map(_same_bits, pages, self._reserved_values[name]))
        ]

    # -- the step's body ---------------------------------------------------------------------

    def build(self, bs: int) -> None:
        """The builder under test on rows ``:bs``, as its kind calls it."""
        self.kind.call(self.builder, self, bs, {})

    def consume(self, bs: int) -> None:
        """The consumer on rows ``:bs``, from the builder's tables."""
        ps = self.shape.page_size
        if not self.writes_lengths:
            # The trtllm_mha / FA3 format's lengths are int32, whatever seq_lens holds.
            self.cache_seqlens[:bs].copy_(self.seq_lens[:bs])
        q, out = self.q[:bs], self.out[:bs]
        launch = self._launch_args(bs)
        if self.shape.lists_pages:
            build_csr(
                self.page_table[:bs],
                self.cache_seqlens[:bs],
                ps,
                kv_pages=self.kv_pages,
                kv_indptr=self.kv_indptr,
                kv_indices=self.kv_indices_all,
                kv_last_page_len=self.kv_last_page_len,
            )
            self.consumer(
                q,
                self.k_cache,
                self.v_cache,
                self.kv_indptr[: bs + 1],
                self.kv_indices,
                self.kv_last_page_len[:bs],
                out,
                page_size=ps,
                workspace=self.workspace,
                **launch,
            )
        else:
            self.consumer(
                q,
                self.k_cache,
                self.v_cache,
                self.page_table[:bs],
                self.cache_seqlens[:bs],
                out,
                page_size=ps,
                workspace=self.workspace,
                **launch,
            )

    def step(self, bs: int) -> None:
        self.build(bs)
        self.consume(bs)

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

    def plan(self, bucket: int) -> None:
        """A planned reader's plan for the next step on ``bucket`` (eager, outside the graph;
        ``pagegraph.check.judges.step_plan``); nothing for other readers."""
        if self.plan_space is not None:
            self.plan_space.plan(self.host_batch(bucket))

    # -- capture and replay ------------------------------------------------------------------

    def _capture(
        self,
        body: Callable[[int], None],
        graphs: dict[int, Graph],
        pool: GraphPool | None = None,
        emulate: bool = False,
    ) -> None:
        """Warm ``body`` up for every bucket on a side stream, then capture it, largest bucket
        first, in one pool (``pool``, default a new one); without CUDA the warm-up, then
        (``emulate``) one ``EmulatedGraph`` per bucket, largest first."""
        # Short lengths at capture: replays must not depend on them (nor on the host values
        # a reader computes from them).
        self.seq_lens.fill_(1)
        self.req_pool_indices.fill_(0)
        self.host_lens = None
        mode = "cuda" if self.use_graphs else "emulated" if emulate else "eager"
        quiet = _quiet_interpreter() if not self.use_graphs else contextlib.nullcontext()
        with quiet:
            captured, _ = capture_buckets(
                self.buckets,
                warm_up=body,
                body=body,
                mode=mode,
                device=self.device,
                pool=pool,
                ranges=False,
            )
        graphs.update(captured)

    def capture(self) -> None:
        """The step's graphs (builder then consumer), one per bucket; a planned reader's plan
        first runs on the capture's batch (the largest bucket, one token a row)."""
        self.host_lens = None
        self.plan(self.buckets[0])
        self._capture(self.step, self.graphs, emulate=self.emulated)

    def replay(self, bucket: int) -> None:
        """Run bucket ``bucket``'s step: its graph (emulated without CUDA), or the step
        eagerly."""
        if self.use_graphs:
            self.graphs[bucket].replay()
            return
        with _quiet_interpreter():
            if self.emulated:
                self.graphs[bucket].replay()
            else:
                self.step(bucket)

    # -- timing ----------------------------------------------------------------------------

    def capture_timing(self, calls: int = TIMING_CALLS) -> None:
        """Per bucket, a graph of ``calls`` back-to-back steps, one of builder calls and one of
        consumer calls (``TIMED_PARTS``), all in one pool apart from the step's graphs;
        without CUDA, only the warm-up (``time_bucket`` then runs the bodies eagerly). The
        inputs now in the buffers are kept."""
        rpi, sl = self.req_pool_indices.clone(), self.seq_lens.clone()
        self.timing_calls = calls
        bodies = dict(zip(TIMED_PARTS, (self.step, self.build, self.consume)))
        pool = torch.cuda.graph_pool_handle() if self.use_graphs else None
        for part, body in bodies.items():

            def repeated(bs: int, body: Callable[[int], None] = body) -> None:
                for _ in range(calls):
                    body(bs)

            self._timing_bodies[part] = repeated
            self._capture(repeated, self.timing_graphs.setdefault(part, {}), pool)
        self.req_pool_indices.copy_(rpi)
        self.seq_lens.copy_(sl)

    def _launcher(self, part: str, bucket: int) -> Callable[[], None]:
        if self.use_graphs:
            return self.timing_graphs[part][bucket].replay
        body = self._timing_bodies[part]

        def eager() -> None:
            with _quiet_interpreter():
                body(bucket)

        return eager

    def time_bucket(
        self, bucket: int, repeats: int, clock: Clock[Any] | None = None
    ) -> tuple[float, float, float]:
        """``(step, builder, consumer)`` device us per call on the inputs now in the buffers:
        the timing graphs (``capture_timing`` first) replayed in turns, ``repeats`` timed
        replays each (``time_interleaved``). ``clock``: default ``EventClock`` (CUDA);
        ``HostClock`` times the eager bodies without CUDA."""
        clock = clock or EventClock(self.device)
        launch = {part: self._launcher(part, bucket) for part in TIMED_PARTS}
        us = time_interleaved(launch, self.timing_calls, repeats, clock)
        return us["step"], us["builder"], us["consumer"]

    def close(self) -> None:
        if self.use_graphs and (self.graphs or self.timing_graphs):
            torch.cuda.synchronize(self.device)
        self.graphs.clear()
        self.timing_graphs.clear()


# -- timing helpers --------------------------------------------------------------------------


def per_call_us(replay_ms: Sequence[float], calls: int) -> float:
    """Microseconds per call: the median of ``replay_ms`` (replays of a graph of ``calls``
    back-to-back calls, in ms) over ``calls``."""
    if not replay_ms or calls < 1:
        raise ValueError("per_call_us needs at least one replay time and calls >= 1")
    return statistics.median(replay_ms) * 1e3 / calls


class Clock(Protocol[_M]):
    """What ``time_interleaved`` times with: ``begin`` before the replays, a ``mark`` before
    and after each, ``end`` after them all, then ``elapsed_ms`` between two marks
    (``EventClock``, ``HostClock``)."""

    def begin(self, replays: int) -> None: ...
    def mark(self) -> _M: ...
    def end(self) -> None: ...
    def elapsed_ms(self, a: _M, b: _M, /) -> float: ...


class EventClock:
    """Device time on the current stream: CUDA events, the replays queued behind a spin
    kernel so that the host's launch gaps do not reach the device's timeline."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def begin(self, replays: int) -> None:
        torch.cuda.synchronize(self.device)
        sleep = getattr(torch.cuda, "_sleep", None)
        if sleep is not None:
            # Cycles at about 2 GHz: long enough for the host to queue every replay.
            sleep(int((1e-3 + 50e-6 * replays) * 2e9))

    def mark(self) -> torch.cuda.Event:
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def end(self) -> None:
        torch.cuda.synchronize(self.device)

    @staticmethod
    def elapsed_ms(a: torch.cuda.Event, b: torch.cuda.Event) -> float:
        ms: float = a.elapsed_time(b)
        return ms


class HostClock:
    """Host wall time (``time.perf_counter``): ``EventClock``'s interface for eager bodies."""

    def begin(self, replays: int) -> None:
        pass

    def mark(self) -> float:
        return time.perf_counter()

    def end(self) -> None:
        pass

    @staticmethod
    def elapsed_ms(a: float, b: float) -> float:
        return (b - a) * 1e3


def time_interleaved(
    launch: dict[str, Callable[[], None]],
    calls: int,
    repeats: int,
    clock: Clock[_M],
    warmup: int = TIMING_WARMUP,
) -> dict[str, float]:
    """Microseconds per call of each of ``launch`` (by key), each a replay of ``calls``
    back-to-back calls: ``warmup`` untimed replays each, then ``repeats`` rounds that time
    one replay of each in turn (a drift of the clocks moves every part alike), the median
    replay over ``calls`` (``per_call_us``)."""
    if repeats < 1:
        raise ValueError("time_interleaved needs repeats >= 1")
    for fn in launch.values():
        for _ in range(warmup):
            fn()
    clock.begin(repeats * len(launch))
    marks: dict[str, list[tuple[_M, _M]]] = {name: [] for name in launch}
    for _ in range(repeats):
        for name, fn in launch.items():
            start = clock.mark()
            fn()
            marks[name].append((start, clock.mark()))
    clock.end()
    return {
        name: per_call_us([clock.elapsed_ms(a, b) for a, b in pairs], calls)
        for name, pairs in marks.items()
    }
