"""The decode step's graphs: a builder's tables consumed by paged attention in the same graph.
``StepGraphs`` holds every buffer of one decode step, allocated once at the largest batch as an
engine's attention backend does; a ``GraphRunner`` given the consumer as its reader stages,
pads and replays one graph per bucket (the stage, the builder, then the consumer), and the
step's own timing graphs time each bucket's whole step, builder and consumer apart, on inputs
the runner writes, with ``pagegraph.runtime.timing``. Its buffers, the KV pages no request
holds, the capture and the timing: docs/ARCHITECTURE.md, "The step's graphs".
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch

from ..consumers.reader import Reader
from ..kernels.contract import same_bits
from ..kinds import KindSpec
from ..kinds.seams import EngineState
from ..runtime.timing import Clock, EventClock, time_interleaved
from .buckets import Buckets, PaddingPolicy
from .capture import Graph, capture_buckets
from .runner import GraphRunner
from .step_consumer import StepConsumer, StepShape, quiet_interpreter

if TYPE_CHECKING:
    from .capture import GraphPool

#: Columns after each page-table row's width that no row owns, for a kind built in the graph:
#: a reader's read past its row lands there (``pagegraph.check.judges.reader_judges``).
CANARY_COLUMNS = 1
#: The page id of the guard page before page 0 of the step's KV cache.
GUARD_PAGE = -1
#: The two reserved pages as failures name them.
GUARD_NAME = f"the guard page before page 0 (page {GUARD_PAGE})"
NULL_BLOCK_NAME = "page 0 (the null block)"
#: Calls of one body captured back to back in a timing graph: a replay's launch is shared by
#: this many calls.
TIMING_CALLS = 20
#: The parts a decode step is timed in, in the order they are replayed.
TIMED_PARTS = ("step", "builder", "consumer")


class StepGraphs:
    """One decode step's static buffers and its graphs (docs/ARCHITECTURE.md, "The step's
    graphs"): a ``GraphRunner`` stages, pads and replays the batch through one graph a bucket,
    the builder then the consumer (a ``StepConsumer``, with the attention's buffers); the KV
    cache, its reserved pages and the timing graphs are held here.

    Args:
        builder: a builder of ``kind``, a kind that feeds the consumer (page table or decode
            metadata).
        consumer: the attention call, with the signature of ``shape.format``'s kernel
            (``pagegraph.consumers.formats``), given ``page_size=`` and ``workspace=``; or a
            ``pagegraph.consumers.reader.Reader`` (its launch arguments computed on the host at
            each call: at capture, the capture's lengths; its own workspace, if any, allocated
            here once, and its plan run by ``plan``).
        shape: the static shapes.
        req_to_token: the pool's ``[max_reqs + 1, >= max_context_len]`` table.
        buckets: batch sizes to capture (a ``Buckets`` or a list ending at ``shape.max_bs``).
        seed: the KV pages' random values.
        emulate: without CUDA, capture the step's graphs as ``EmulatedGraph`` (default) or,
            with ``False``, run the step eagerly at every replay. Timing stays eager there.
        null_block: what page 0 holds (``pagegraph.check.config.NULL_BLOCKS``): "nan" or
            "finite" (then the sentinel holds NaN).
        padding: the padded rows' convention (``pagegraph.graph.buckets.PADDING``).
        engine: the engine state a kind built eagerly reads (vLLM's per-request block tables,
            ``GraphRunner``'s ``engine``), kept up to date by the caller before each step.
    """

    def __init__(
        self,
        builder: Callable[..., object],
        kind: KindSpec,
        consumer: Callable[..., object] | Reader,
        shape: StepShape,
        req_to_token: torch.Tensor,
        buckets: Buckets | Sequence[int],
        seed: int,
        emulate: bool | None = None,
        null_block: str = "nan",
        padding: str | PaddingPolicy = "sglang",
        engine: EngineState | None = None,
        table_pad_cols: int = 0,
    ) -> None:
        self.shape = s = shape
        self.device = req_to_token.device
        # The page table is a column slice of a wider buffer, its row stride above its width:
        # the engine's pad columns, as an engine's persistent table sliced for the step, and
        # at least one canary column after every row for a kind built in the graph (a kind
        # built eagerly, vLLM's gather, writes at its engine tables' own stride).
        extra = max(table_pad_cols, 0 if kind.where == "eager" else CANARY_COLUMNS)
        table = (
            torch.zeros((s.max_bs, s.width + extra), dtype=torch.int32, device=self.device)
            if extra
            else None
        )
        #: the columns after each row's width, ``[max_bs, extra]`` (None without): the
        #: reads-only-its-row replay names the NaN page there
        self.canary = table[:, s.width :] if table is not None else None
        self.runner = r = GraphRunner(
            req_to_token,
            max_bs=s.max_bs,
            max_context_len=req_to_token.shape[1],
            page_size=s.page_size,
            buckets=buckets,
            padding=padding,
            builder=builder,
            outputs=kind.name,
            index_dtype=s.index_dtype,
            table_width=s.width,
            page_table=table,
            # Only an opt-out is passed: the runner emulates by default where it can (the CPU).
            emulate=False if emulate is False else None,
            engine=engine,
        )
        self.buckets = sorted(r.buckets.sizes, reverse=True)
        # The runner's buffers, under the names the judges use.
        self.req_pool_indices, self.seq_lens, self.page_table = (
            r.req_pool_indices,
            r.seq_lens,
            r.page_table,
        )
        self.null_block = null_block
        self._fill_cache(seed)
        #: what reads the tables after the builder in each bucket's graph (the runner's reader)
        self.consumer = c = StepConsumer(
            consumer,
            s,
            r.page_table,
            r.seq_lens,
            r.vectors[kind.consumer_lengths] if kind.consumer_lengths else None,
            self.k_cache,
            self.v_cache,
            req_to_token,
            r.req_pool_indices,
        )
        r.attach_reader(c.consume)
        # The consumer's buffers, under the names the judges use.
        self.q, self.out, self.stale, self.plan_space = c.q, c.out, c.stale, c.plan_space
        self.k_new, self.v_new = c.k_new, c.v_new
        #: the batch ``replay`` stages: ``(req_pool_indices, seq_lens)`` of the real rows
        self.batch: tuple[list[int], list[int]] | None = None
        #: part ("step", "builder", "consumer") -> bucket -> graph of ``timing_calls`` calls
        #: per timed part, each bucket's graph (CUDA graphs only: timing needs CUDA)
        self.timing_graphs: dict[str, dict[int, Graph]] = {}
        self._timing_bodies: dict[str, Callable[[int], None]] = {}
        self.timing_calls = TIMING_CALLS

    @property
    def graphs(self) -> dict[int, Graph]:
        """The step's graphs by bucket (the runner's)."""
        return self.runner.graphs

    @property
    def use_graphs(self) -> bool:
        return self.runner.use_graphs

    @property
    def emulated(self) -> bool:
        return self.runner.emulated

    @property
    def host_lens(self) -> list[int] | None:
        """The real rows' lengths as the engine knows them on the host for the next call
        (``None``: a capture's, one token a row): what a reader's launch arguments and plan
        are computed from."""
        return self.consumer.host_lens

    @host_lens.setter
    def host_lens(self, lens: list[int] | None) -> None:
        self.consumer.host_lens = lens

    def _fill_cache(self, seed: int) -> None:
        """Seeded random K and V in every page (a misrouted page changes the output), NaN in
        page 0 (``null_block`` "nan") or in the sentinel ("finite"), NaN in the guard page
        before page 0 and in the discard page after the sentinel, and the sentinel's, the
        guard's and (``null_block`` "finite") page 0's values kept for ``sentinel_intact`` /
        ``reserved_changed``."""
        s = self.shape
        gen = torch.Generator(device=self.device).manual_seed(seed)
        dims = (s.num_pages + 1, s.page_size, s.num_kv_heads, s.head_dim)
        caches = []
        for _ in range(2):
            # The guard page, the pool's pages and the sentinel (the same seeded values as
            # without the guard), then the discard page.
            alloc = torch.empty((dims[0] + 2, *dims[1:]), dtype=s.dtype, device=self.device)
            alloc[1:-1].copy_(torch.randn(dims, generator=gen, device=self.device))
            alloc[0] = float("nan")
            alloc[-1] = float("nan")
            caches.append(alloc)
        #: the whole allocations, guard page first (``CacheModel`` snapshots them)
        self.k_alloc, self.v_alloc = caches
        self.k_cache, self.v_cache = (alloc[1:] for alloc in caches)
        # NaN in page 0, or where the null block holds data, in the sentinel (the last page)
        nan_page = 0 if self.null_block == "nan" else s.num_pages
        self.k_cache[nan_page] = float("nan")
        self.v_cache[nan_page] = float("nan")
        self.sentinel = s.num_pages
        self._sentinel_values = (
            self.k_cache[self.sentinel].clone(),
            self.v_cache[self.sentinel].clone(),
        )
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
        page = self.sentinel
        return same_bits(self.k_cache[page], k) and same_bits(self.v_cache[page], v)

    def reserved_changed(self) -> list[str]:
        """Which of the guard page and (``null_block`` "finite") page 0 no longer hold their
        values in K or V, bit for bit (a read-back; ``pagegraph.check.judges.padded_rows``)."""
        return [
            name
            for name, pages in self._reserved.items()
            if not all(map(same_bits, pages, self._reserved_values[name]))
        ]

    # -- the step's body ---------------------------------------------------------------------

    def build(self, bs: int) -> None:
        """The builder under test on rows ``:bs``, as its kind calls it (the runner's call)."""
        self.runner.build(bs)

    def consume(self, bs: int) -> None:
        """The consumer on rows ``:bs``, from the builder's tables."""
        self.consumer.consume(bs)

    def step(self, bs: int) -> None:
        self.build(bs)
        self.consume(bs)

    def plan(self, bucket: int, label: str | None = None) -> None:
        """A planned reader's plan for the next step on ``bucket`` (``StepConsumer.plan``),
        named ``label`` where a later plan reads what it left."""
        self.consumer.plan(bucket, label)

    # -- capture and replay ------------------------------------------------------------------

    def _quiet(self) -> contextlib.AbstractContextManager[None]:
        """``_quiet_interpreter`` where the step runs in the Triton interpreter (no CUDA)."""
        return quiet_interpreter() if not self.use_graphs else contextlib.nullcontext()

    def _capture(
        self, body: Callable[[int], None], graphs: dict[int, Graph], pool: GraphPool | None
    ) -> None:
        """Warm a timing ``body`` up for every bucket on a side stream, then capture it,
        largest bucket first, in ``pool``; without CUDA only the warm-up."""
        # The runner's capture inputs: replays must not depend on them (nor on the host values
        # a reader computes from them).
        self.runner.write_inputs()
        self.host_lens = None
        mode = "cuda" if self.use_graphs else "eager"
        with self._quiet():
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
        """The step's graphs (stage, builder, consumer), one per bucket, by the runner; a
        planned reader's plan first runs on the capture's batch (the largest bucket, one token
        a row); a reader's workspace canaries are read back after it."""
        self.host_lens = None
        self.plan(
            self.buckets[0], f"the capture's plan (bucket {self.buckets[0]}, one token a row)"
        )
        with self._quiet():
            self.runner.capture()
        if self.plan_space is not None:
            self.plan_space.check_canaries("capture (warm-up and capture on the capture's batch)")

    def stage(self, req_pool_indices: list[int], seq_lens: list[int]) -> None:
        """The batch the next replays run on (``n`` real rows; the runner pads the bucket),
        and its lengths as the host knows them (``host_lens``)."""
        self.batch = (req_pool_indices, seq_lens)
        self.host_lens = list(seq_lens)

    def replay(self) -> None:
        """Run the staged batch's step through the runner: its bucket's graph (emulated
        without CUDA, or the step run eagerly); a reader's workspace canaries are read back
        after it (``PlanWorkspace.check_canaries``)."""
        if self.batch is None:
            raise RuntimeError("replay() before stage(): no batch to run")
        self.consumer.poison_out()  # a row the replay leaves unwritten keeps the poison
        with self._quiet():
            self.runner.replay(*self.batch)
        if self.plan_space is not None:
            self.plan_space.check_canaries("replay")  # a write past a workspace tensor's end

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
        self.runner.write_inputs(rpi, sl)

    def load_timed_batch(self, req_pool_indices: list[int], seq_lens: list[int]) -> None:
        """The batch the timing graphs run on next: written into rows ``:n`` of the runner's
        inputs now (``GraphRunner.write_inputs``), its lengths as the host knows them
        (``host_lens``). Every row of a timed bucket is real: ``n`` is the bucket."""
        self.runner.write_inputs(req_pool_indices, seq_lens)
        self.host_lens = list(seq_lens)

    def _launcher(self, part: str, bucket: int) -> Callable[[], None]:
        if self.use_graphs:
            return self.timing_graphs[part][bucket].replay
        body = self._timing_bodies[part]

        def eager() -> None:
            with quiet_interpreter():
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
        try:
            self.runner.close()
            if self.use_graphs and self.timing_graphs:
                torch.cuda.synchronize(self.device)
        finally:
            self.timing_graphs.clear()
