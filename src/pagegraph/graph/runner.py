"""``GraphRunner``: static buffers, one CUDA graph per padded batch bucket, sync-free replay.
The runner owns every input and output of the builder as a static buffer allocated once at the
largest size, so between replays only the buffers' contents change; ``capture()`` captures one
graph per bucket and ``replay()`` stages the batch without a host sync
(``pagegraph.graph.staging``) and launches the bucket's graph, or without CUDA replays an
``EmulatedGraph`` (``pagegraph.graph.emulate``). docs/ARCHITECTURE.md, "The graph runner".
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, TypeAlias

import numpy as np
import torch

from ..detect.ranges import phase, pop, push, range_name
from ..kernels.contract import cdiv
from ..kernels.page_table import build_page_table
from ..kinds import Builder, EngineState, kind_of, vector_names
from ..kinds.builders import builder_capabilities
from .buckets import Buckets, PaddingPolicy, resolve_padding
from .builder_names import resolve_builder
from .capture import CaptureStep, Graph, capture_buckets
from .emulate import emulation_wanted
from .errors import (
    BufferAllocationError,
    CaptureOutOfMemory,
    NotCaptured,
    StaticBufferMoved,
    check_arguments,
    check_count,
    check_table_buffer,
    check_vector_buffer,
    merge_vectors,
    oom_message,
)
from .staging import BatchValues, Mailbox, count_values, write_batch

if TYPE_CHECKING:
    from .capture import GraphPool

__all__ = [
    "BufferAllocationError",
    "CaptureOutOfMemory",
    "GraphRunner",
    "NotCaptured",
    "StaticBufferMoved",
]


#: A static buffer's place as a graph holds it: ``(data_ptr, shape, strides)``.
Address: TypeAlias = tuple[int, tuple[int, ...], tuple[int, ...]]
#: Rows ``:n`` of the static inputs and page tables (the SWA table ``None`` without SWA).
RowViews: TypeAlias = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]


#: Pinned staging buffers in the ring. A buffer is rewritten only after the copy that last
#: read it has completed; with this many in flight the wait practically never happens.
STAGING_RING = 4


class GraphRunner:
    """Capture a page-table builder into CUDA graphs over batch buckets and replay it.

    Args:
        req_to_token: ``[max_reqs, >= max_context_len]`` int32/int64, on the runner's device.
        max_bs: largest batch; the static buffers have this many rows.
        max_context_len: tokens a request can hold; ``max_num_pages = cdiv(max_context_len,
            page_size)`` is the width of the page tables unless ``table_width`` says
            otherwise.
        page_size: tokens per page.
        buckets: preset name or explicit list (see ``pagegraph.graph.buckets.Buckets``).
        padding: ``"sglang"``, ``"vllm"``, ``"dummy-row"`` or a ``PaddingPolicy`` (with
            graphs, frozen into each graph's stage node at capture).
        builder: a callable with the builder signature, a built-in name, or ``"module:fn"``.
        full_to_swa: ``[num_slots + 1]`` int32/int64 enables the SWA table.
        errors: allocate an ``errors`` counter buffer and pass it to the builder.
        use_graphs: capture CUDA graphs (default: when ``req_to_token`` is on CUDA).
        emulate: without CUDA graphs on the CPU, emulated ones (default) or none (``False``).
        index_dtype: dtype of the static ``req_pool_indices`` and ``seq_lens``.
        page_table, swa_page_table: an engine's own static output buffers
            (``[>= max_bs, >= max_num_pages]`` int32, inner stride 1), used instead of new
            ones; the runner writes rows ``:max_bs`` and columns ``:max_num_pages``.
        table_width: pages per table row, when an engine caps pages per request below
            ``cdiv(max_context_len, page_size)`` (longer rows then stop at the width).
        outputs: the builder's kind (``pagegraph.kinds.KINDS``; default ``kind_of``): how
            it is called and its static output vectors (``KindSpec.vectors``, in
            ``runner.vectors`` by name), the engine's own passed by name (``vectors={...}``
            or keywords, ``**named_vectors``; a name that is not one of the kind's vectors,
            or one given both ways as two tensors, is a ``ValueError``: an engine's own
            buffer is never replaced). ``draft_tokens`` is frozen into the graphs.
        engine: the engine state the kind reads (``KindSpec.engine_state``: vLLM's block
            tables, ``pagegraph.workload.engine_block_tables.EngineBlockTables``), or None.

    A kind built ``"eager"`` (``KindSpec.where``: vLLM's block tables) is called before
    each replay, told the real batch size (``batch=``); the graph reads its tables
    (``graph_reads``, a copy into ``read_table``, which the checker compares with them).
    """

    def __init__(
        self,
        req_to_token: torch.Tensor,
        *,
        max_bs: int,
        max_context_len: int,
        page_size: int,
        buckets: str | Sequence[int] | Buckets = "sglang",
        padding: str | PaddingPolicy = "sglang",
        builder: Builder | str = build_page_table,
        full_to_swa: torch.Tensor | None = None,
        errors: bool = False,
        use_graphs: bool | None = None,
        index_dtype: torch.dtype = torch.int32,
        page_table: torch.Tensor | None = None,
        swa_page_table: torch.Tensor | None = None,
        table_width: int | None = None,
        outputs: str = "auto",
        draft_tokens: int = 0,
        vectors: dict[str, torch.Tensor] | None = None,
        engine: EngineState | None = None,
        emulate: bool | None = None,
        **named_vectors: torch.Tensor | None,
    ) -> None:
        check_arguments(req_to_token, page_size, max_context_len, index_dtype, full_to_swa)
        self._configure(
            req_to_token,
            full_to_swa,
            max_bs=max_bs,
            max_context_len=max_context_len,
            page_size=page_size,
            buckets=buckets,
            padding=padding,
            builder=builder,
            outputs=outputs,
            draft_tokens=draft_tokens,
            table_width=table_width,
            use_graphs=use_graphs,
        )
        given = merge_vectors(named_vectors, vectors, vector_names())
        # None is "not given": a caller may pass another kind's vector names as None.
        unknown = sorted(
            name
            for name, buf in given.items()
            if name not in self.kind.vector_names
            and (buf is not None or name not in vector_names())
        )
        if unknown:
            raise ValueError(self.kind.unknown_vectors_message(unknown))
        #: what reads the tables after the builder in each bucket's graph (``attach_reader``)
        self.reader: Callable[[int], None] | None = None
        self.engine = engine
        self._engine_names = tuple(engine.buffers()) if engine is not None else ()
        if self.kind.engine_state is not None and engine is None:
            raise ValueError(
                f"a {self.kind.name} builder reads the engine's {self.kind.engine_state}: "
                "pass engine="
            )
        self._allocate_buffers(max_bs, index_dtype, errors, page_table, swa_page_table, given)
        self._init_staging(max_bs, index_dtype)
        self.emulated = emulation_wanted(self.device, use_graphs, emulate)
        self.graphs: dict[int, Graph] = {}  # EmulatedGraph where self.emulated
        self.pool: GraphPool | None = None
        self._addresses: dict[str, Address | None] | None = None
        # With graphs captured: the bucket of each batch size 0..max_bs (0 for 0: a batch has
        # a row), which also says that replay() may take its short path.
        self._bucket_of: list[int] | None = None
        self.last_bucket: int | None = None

    def _configure(
        self,
        req_to_token: torch.Tensor,
        full_to_swa: torch.Tensor | None,
        *,
        max_bs: int,
        max_context_len: int,
        page_size: int,
        buckets: str | Sequence[int] | Buckets,
        padding: str | PaddingPolicy,
        builder: Builder | str,
        outputs: str,
        draft_tokens: int,
        table_width: int | None,
        use_graphs: bool | None,
    ) -> None:
        """The runner's settings: device, buckets, padding, builder and what it outputs, the
        table width and whether to capture graphs (``ValueError`` for a bad one)."""
        self.device = req_to_token.device
        self._device_index = req_to_token.get_device()  # -1 for the CPU
        self.req_to_token = req_to_token
        self.full_to_swa = full_to_swa
        self.page_size = page_size
        self.max_context_len = max_context_len
        self.buckets = buckets if isinstance(buckets, Buckets) else Buckets(buckets, max_bs)
        if self.buckets.max_bs != max_bs:
            raise ValueError(f"buckets end at {self.buckets.max_bs}, max_bs is {max_bs}")
        self.max_bs = max_bs
        self.padding = resolve_padding(padding)
        self.builder = resolve_builder(builder)
        self.kind = kind_of(self.builder, outputs)
        self.outputs = self.kind.name
        #: the builder runs before each replay, on the host, not inside the graph
        self.eager_builder = self.kind.where == "eager"
        self.takes_batch = builder_capabilities(self.builder).batch
        if full_to_swa is not None and not self.kind.swa:
            raise ValueError(
                f"a {self.kind.name} builder has no SWA outputs: full_to_swa must be None"
            )
        check_count("draft_tokens", draft_tokens, 0)
        self.draft_tokens = draft_tokens
        self.error_kinds = self.kind.error_kinds
        if table_width is not None:
            check_count("table_width", table_width, 1)
        self.max_num_pages = table_width or cdiv(max_context_len, page_size)
        self.use_graphs = self.device.type == "cuda" if use_graphs is None else use_graphs
        if self.use_graphs and self.device.type != "cuda":
            raise ValueError("use_graphs=True needs req_to_token on a CUDA device")

    def _allocate_buffers(
        self,
        max_bs: int,
        index_dtype: torch.dtype,
        errors: bool,
        page_table: torch.Tensor | None,
        swa_page_table: torch.Tensor | None,
        metadata_given: dict[str, torch.Tensor | None],
    ) -> None:
        """The static buffers: inputs, page tables (the engine's own where given), the
        ``errors`` counters and, for a metadata builder, the metadata outputs. Running out of
        device memory raises ``BufferAllocationError`` with the sizes asked for."""
        dev = self.device
        if swa_page_table is not None and self.full_to_swa is None:
            raise ValueError("swa_page_table was given without full_to_swa")
        for name, buf in (("page_table", page_table), ("swa_page_table", swa_page_table)):
            if buf is not None:
                check_table_buffer(
                    name, buf, dev, max_bs, self.max_num_pages, self.max_context_len, self.page_size
                )
        tables = 2 if self.full_to_swa is not None else 1
        try:
            self.req_pool_indices = torch.zeros(max_bs, dtype=index_dtype, device=dev)
            self.seq_lens = torch.zeros(max_bs, dtype=index_dtype, device=dev)
            self.page_table = (
                page_table[:max_bs, : self.max_num_pages]
                if page_table is not None
                else torch.zeros((max_bs, self.max_num_pages), dtype=torch.int32, device=dev)
            )
            self.swa_page_table: torch.Tensor | None = None
            if self.full_to_swa is not None:
                self.swa_page_table = (
                    swa_page_table[:max_bs, : self.max_num_pages]
                    if swa_page_table is not None
                    else torch.zeros_like(self.page_table)
                )
            self.errors = (
                torch.zeros(len(self.error_kinds), dtype=torch.int32, device=dev)
                if errors
                else None
            )
            #: the kind's output vectors by name (``_vector_buffers``)
            self.vectors: dict[str, torch.Tensor] = {}
            self._vector_buffers(max_bs, metadata_given)
            #: the inputs the graph derives from the staged batch for the builder (its kind's)
            self.derived = self.kind.derived_inputs(max_bs, self.draft_tokens, dev)
            # What the graph of an eagerly built kind reads: its copy of the tables.
            self.read_table = torch.zeros_like(self.page_table) if self.eager_builder else None
        except (torch.OutOfMemoryError, RuntimeError) as exc:
            if not isinstance(exc, torch.OutOfMemoryError) and "memory" not in str(exc):
                raise
            need = tables * max_bs * self.max_num_pages * 4
            raise BufferAllocationError(
                f"GraphRunner static buffers do not fit on {dev}: {tables} page table(s) of "
                f"[max_bs={max_bs}, max_num_pages={self.max_num_pages}] int32 = "
                f"{need / 2**30:.2f} GiB ({exc})"
            ) from exc

    def _vector_buffers(self, max_bs: int, given: Mapping[str, torch.Tensor | None]) -> None:
        """The kind's 1-D output vectors (``KindSpec.vectors``): the engine's own where
        ``given`` (``ValueError`` for one that does not fit; one longer than needed is used
        whole when its length is the engine's to choose, as ``kv_indices``), else new ones."""
        dev = self.device
        lengths = self.kind.vector_lengths(max_bs, self.max_num_pages, self.draft_tokens)
        for spec in self.kind.vectors:
            name, length = spec.name, lengths[spec.name]
            buf = given.get(name)
            if buf is None:
                buf = torch.zeros(length, dtype=spec.dtype, device=dev)
            else:
                check_vector_buffer(name, buf, spec.dtype, length, dev)
                if spec.engine_sized:
                    length = buf.shape[0]  # the engine sized it; the builder must stay inside it
            self.vectors[name] = buf[:length]
            # Also an attribute, as engines' code reads it (``runner.<name>``).
            setattr(self, name, self.vectors[name])

    def _init_staging(self, max_bs: int, index_dtype: torch.dtype) -> None:
        """Graphs stage from a mailbox (read by each graph's first node); eager replays copy
        host values through a pinned ring."""
        dev = self.device
        # An eagerly built kind stages on the host too: its builder reads the inputs before
        # the graph runs.
        graph_stage = self.use_graphs and not self.eager_builder
        self._mailbox = Mailbox(max_bs, dev) if graph_stage else None
        pin = dev.type == "cuda"
        rings = 0 if graph_stage else STAGING_RING
        self._staging = [
            torch.zeros((2, max_bs), dtype=index_dtype, pin_memory=pin) for _ in range(rings)
        ]
        self._staging_np = [buf.numpy() for buf in self._staging]
        self._staging_done: list[torch.cuda.Event | None] = [None] * rings
        self._staging_next = 0

    # -- building -------------------------------------------------------------------------

    def _build(self, bs: int, n: int | None = None) -> None:
        """Call the builder on rows ``:bs`` (the bucket; ``n`` real rows, told to a builder
        that takes ``batch=`` where it runs eagerly), as its kind calls it."""
        extra: dict[str, object] = {}
        swa = self.swa_page_table  # allocated exactly when full_to_swa is given
        if self.full_to_swa is not None and swa is not None:
            extra["swa_page_table"] = swa[:bs]
            extra["full_to_swa"] = self.full_to_swa
        if self.errors is not None:
            extra["errors"] = self.errors
        if self.takes_batch:
            extra["batch"] = self.kind.batch_context(bs if n is None else n, bs, self.max_bs)
        self.kind.call(self.builder, self, bs, extra)

    def attach_reader(self, reader: Callable[[int], None]) -> None:
        """Run ``reader(bs)`` after the builder on rows ``:bs`` in every bucket's graph (warmed
        up, captured and replayed with it: the decode step's attention,
        ``pagegraph.graph.step_consumer``); for a kind built eagerly, the graph holds the
        reader alone, reading what the builder wrote before the launch. Before
        ``capture()``."""
        if self.captured:
            raise RuntimeError("attach_reader() after capture(): the graphs would not hold it")
        self.reader = reader

    def build(self, bs: int) -> None:
        """The builder alone on rows ``:bs`` (no stage, no reader): a body to time."""
        self._build(bs)

    def write_inputs(
        self, req_pool_indices: BatchValues | None = None, seq_lens: BatchValues | None = None
    ) -> None:
        """A batch into the inputs now, apart from the graphs (bodies timed outside them); with
        none, the capture's inputs: request row 0, length 1 (``staging.write_batch``)."""
        write_batch((self.req_pool_indices, self.seq_lens), req_pool_indices, seq_lens)

    def _body(self, bs: int) -> None:
        """What a bucket's graph runs after the stage: the builder, then the reader if any."""
        self._build(bs)
        if self.reader is not None:
            self.reader(bs)

    def graph_reads(self, bs: int) -> None:
        """What the graph of an eagerly built kind does with the tables: reads rows ``:bs``
        (a copy into ``read_table``), as an attention kernel would, then the reader if any."""
        read_table = self.read_table
        if read_table is None:
            raise RuntimeError(f"a {self.kind.name} builder runs in the graph: no read_table")
        read_table[:bs].copy_(self.page_table[:bs])
        if self.reader is not None:
            self.reader(bs)

    def _warm_up_graph(self, bs: int) -> None:
        """A bucket's warm-up before its CUDA graph: the graph's body, after the builder of a
        kind built eagerly (the graph then reads what it wrote)."""
        if self.eager_builder:
            self._build(bs)
        self._graph_body(bs)

    def _warm_up_eagerly(self, bs: int) -> None:
        """A bucket's warm-up without CUDA graphs (no mailbox: the graph's body, after the
        builder of a kind built eagerly)."""
        if self.eager_builder:
            self._build(bs)
            self.graph_reads(bs)
        else:
            self._body(bs)

    def _graph_body(self, bs: int) -> None:
        """What a bucket's graph runs: the stage from the mailbox (a no-op when nothing was
        posted, as in warm-up), then the builder and the reader."""
        if self.eager_builder:
            self.graph_reads(bs)
            return
        mailbox = self._mailbox
        if mailbox is None:
            raise RuntimeError("a graph body stages from the mailbox: this runner has none")
        mailbox.launch(
            self.req_pool_indices,
            self.seq_lens,
            bs,
            self.padding.seq_len,
            self.padding.req_pool_index,
        )
        self._body(bs)

    def static_buffers(self) -> dict[str, torch.Tensor | None]:
        """Every buffer a graph reads or writes, by name (``None`` where absent)."""
        own = {
            "read_table": self.read_table,
            **self.vectors,
            **self.derived,
            **(self.engine.buffers() if self.engine is not None else {}),
        }
        return own | {
            "req_to_token": self.req_to_token,
            "full_to_swa": self.full_to_swa,
            "req_pool_indices": self.req_pool_indices,
            "seq_lens": self.seq_lens,
            "page_table": self.page_table,
            "swa_page_table": self.swa_page_table,
            "errors": self.errors,
        }

    def static_buffer(self, name: str) -> torch.Tensor | None:
        """The buffer ``name`` of ``static_buffers`` as it is now (the runner's attribute, a
        derived input, or the engine state's)."""
        if self.engine is not None and name in self._engine_names:
            return self.engine.buffers()[name]
        if name in self.derived:
            return self.derived[name]
        own: torch.Tensor | None = getattr(self, name)
        return own

    @staticmethod
    def _address(t: torch.Tensor | None) -> Address | None:
        return None if t is None else (t.data_ptr(), tuple(t.shape), tuple(t.stride()))

    def addresses(self) -> dict[str, Address | None]:
        """``name -> (data_ptr, shape, strides)`` of every buffer a graph reads or writes."""
        return {name: self._address(t) for name, t in self.static_buffers().items()}

    def check_addresses(self) -> None:
        """Raise ``StaticBufferMoved`` if any buffer differs from what was captured."""
        if self._addresses is None:
            raise NotCaptured("replay() before capture(): call runner.capture() first")
        # Every replay runs this: compare attribute by attribute against what capture saw
        # (a buffer replaced by a new tensor, or given new storage in place, both show).
        for name, t, ptr, shape, stride in self._watch:
            # The same tensor object at the same address, shape and strides: nothing replaced
            # it, gave it new storage (set_, a growing resize_) or reshaped it in place (a
            # shrinking resize_, as_strided_). Anything else takes the full comparison.
            # Past the identity test the buffer now is ``t``: its attributes are read there.
            if self.static_buffer(name) is not t or t.data_ptr() != ptr or t.shape != shape:
                break
            if t.stride() != stride:
                break
        else:
            return
        now = self.addresses()
        captured = self._addresses
        moved = [name for name, addr in now.items() if addr != captured[name]]
        if moved:
            detail = "; ".join(f"{n}: {captured[n]} -> {now[n]}" for n in moved)
            raise StaticBufferMoved(
                f"static buffer(s) changed since capture ({detail}); the graphs still point at "
                "the old memory: copy_ new contents into the captured buffers instead"
            )

    # -- capture --------------------------------------------------------------------------

    def capture(self) -> None:
        """Warm every bucket up, then capture one graph per bucket, largest first, in one
        shared pool (eager mode: only records the buffer addresses; emulated: see the top)."""
        self.write_inputs()  # short lengths at capture: replays must not depend on them
        sizes = sorted(self.buckets.sizes, reverse=True)
        step = CaptureStep("warm-up", sizes[0])  # where an out-of-memory error happened
        try:
            if self.use_graphs:
                mode, warm_up, body = "cuda", self._warm_up_graph, self._graph_body
            else:  # the body excludes staging, which writes what the record reads
                mode = "emulated" if self.emulated else "eager"
                warm_up = self._warm_up_eagerly
                body = self.graph_reads if self.eager_builder else self._body
            graphs, self.pool = capture_buckets(
                sizes, warm_up=warm_up, body=body, mode=mode, device=self.device, step=step
            )
            self.graphs.update(graphs)
        except torch.OutOfMemoryError as exc:
            raise CaptureOutOfMemory(oom_message(self, step.what, step.bucket, exc)) from exc
        self._addresses = self.addresses()
        self._watch = [
            (name, t, t.data_ptr(), t.shape, t.stride())
            for name, t in self.static_buffers().items()
            if t is not None
        ]
        self._views: dict[int, RowViews] = {}
        # The NVTX range names of every bucket, built once: with graphs a replay opens one
        # (``replay/bs=N``: the post and the launch), eagerly two (``stage/bs=N``, then
        # ``replay/bs=N`` around the builder).
        if self._mailbox is not None:
            self._bucket_of = [0] + [self.buckets.bucket_for(n) for n in range(1, self.max_bs + 1)]
            self._replay_ranges = {bs: range_name("replay", bs) for bs in self.buckets.sizes}
        else:
            self._eager_ranges: dict[int, tuple[str, str]] = {
                bs: (range_name("stage", bs), range_name("replay", bs)) for bs in self.buckets.sizes
            }

    @property
    def captured(self) -> bool:
        return self._addresses is not None

    # -- replay ---------------------------------------------------------------------------

    def _views_of(self, n: int) -> RowViews:
        """Rows ``:n`` of the static buffers (inputs, tables), made once per ``n``: slicing
        is not free, and every replay needs four."""
        views = self._views.get(n)
        if views is None:
            swa = self.swa_page_table[:n] if self.swa_page_table is not None else None
            views = (self.req_pool_indices[:n], self.seq_lens[:n], self.page_table[:n], swa)
            self._views[n] = views
        return views

    def _stage(self, req_pool_indices: BatchValues, seq_lens: BatchValues, n: int) -> None:
        """Stage the batch for rows ``:n`` of the static inputs, with no host sync: with graphs,
        post it for the next graph launch; eagerly, copy it in."""
        index = self._device_index
        if self._mailbox is not None:
            self._mailbox.post(req_pool_indices, seq_lens, n, index)
            return
        if (
            isinstance(req_pool_indices, torch.Tensor)
            and isinstance(seq_lens, torch.Tensor)
            and req_pool_indices.get_device() == index
            and seq_lens.get_device() == index
            and (index >= 0 or (req_pool_indices.is_cpu and seq_lens.is_cpu))
        ):
            rpi_view, sl_view, _, _ = self._views_of(n)
            rpi_view.copy_(req_pool_indices)
            sl_view.copy_(seq_lens)
            return
        slot = self._staging_next
        self._staging_next = (slot + 1) % STAGING_RING
        done = self._staging_done[slot]
        if done is not None and not done.query():
            # Back-pressure: STAGING_RING copies are still in flight. This waits, and the sync
            # detectors will say so; it cannot happen when the caller consumes each replay.
            done.synchronize()
        host = self._staging_np[slot]
        for i, values in enumerate((req_pool_indices, seq_lens)):
            if isinstance(values, torch.Tensor):
                if values.device.type != "cpu":
                    raise ValueError(
                        f"batch tensors must be on {self.device} or the CPU, got {values.device}"
                    )
                values = values.numpy()
            host[i, :n] = np.asarray(values)
        staged = self._staging[slot]
        nb = self.device.type == "cuda"
        self.req_pool_indices[:n].copy_(staged[0, :n], non_blocking=nb)
        self.seq_lens[:n].copy_(staged[1, :n], non_blocking=nb)
        if nb:
            event = torch.cuda.Event()
            event.record()
            self._staging_done[slot] = event

    def replay(
        self, req_pool_indices: BatchValues, seq_lens: BatchValues
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Build the page tables of one batch of ``n`` requests through the captured graphs.

        Args:
            req_pool_indices: ``[n]`` request rows, a device tensor, a CPU tensor or a list.
                With graphs, a device tensor must be 1-D int32/int64 (else ``TypeError``) and
                is read when the graph runs on the current stream, like any kernel input;
                host values are copied at the call.
            seq_lens: ``[n]`` lengths, same kinds.

        Returns:
            ``(page_table[:n], swa_page_table[:n] or None)``: views of the static buffers,
            valid until the next replay.
        """
        # The engine's usual call, two 1-D tensors of one shape into captured graphs on the
        # current device, takes the short path: the general one's checks add up to a sizeable
        # part of a bare graph launch, so here the count and the bucket come from the shape
        # once. What the shape does not settle (dtype, device, moved buffers) raises from the
        # same calls as on the general path; anything else (lists, other shapes, an empty or
        # oversized batch, eager mode, another current device) takes the general path.
        bucket_of = self._bucket_of
        if (
            bucket_of is not None
            and type(seq_lens) is torch.Tensor
            and type(req_pool_indices) is torch.Tensor
        ):
            shape = seq_lens.shape
            if len(shape) == 1 and req_pool_indices.shape == shape:
                n = shape[0]
                if 0 < n < len(bucket_of) and torch._C._cuda_getDevice() == self._device_index:
                    bucket = bucket_of[n]
                    self.check_addresses()
                    self._post_and_launch(req_pool_indices, seq_lens, n, bucket)
                    self.last_bucket = bucket
                    _, _, page_table, swa = self._views_of(n)
                    return page_table, swa
        return self._replay(req_pool_indices, seq_lens)

    def _replay(
        self, req_pool_indices: BatchValues, seq_lens: BatchValues
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``replay()`` for any batch: lists, host tensors, eager mode, another device."""
        n = count_values(seq_lens)
        if count_values(req_pool_indices) != n:
            raise ValueError(
                f"req_pool_indices has {count_values(req_pool_indices)} entries, seq_lens has {n}"
            )
        bucket = self.buckets.bucket_for(n)  # raises before any buffer is touched
        self.check_addresses()
        if self._mailbox is None:
            stage_range, replay_range = self._eager_ranges[bucket]
            push(stage_range)
            try:
                self._stage(req_pool_indices, seq_lens, n)
                self.padding.apply(self.req_pool_indices, self.seq_lens, n, bucket)
            finally:
                pop()
            push(replay_range)
            try:
                if self.eager_builder:
                    self._build(bucket, n)  # before the graph that reads its tables
                    if self.graphs:
                        self.graphs[bucket].replay()
                    else:
                        self.graph_reads(bucket)
                else:
                    self.graphs[bucket].replay() if self.emulated else self._body(bucket)
            finally:
                pop()
        elif torch._C._cuda_getDevice() == self._device_index:
            self._post_and_launch(req_pool_indices, seq_lens, n, bucket)
        else:
            # A device context is not free: entered only when the current device differs.
            with torch.cuda.device(self.device):
                self._post_and_launch(req_pool_indices, seq_lens, n, bucket)
        self.last_bucket = bucket
        _, _, page_table, swa = self._views_of(n)
        return page_table, swa

    def _post_and_launch(
        self, req_pool_indices: BatchValues, seq_lens: BatchValues, n: int, bucket: int
    ) -> None:
        """The graph path of ``replay``: post the batch, launch the bucket's graph, both in
        the bucket's ``replay`` range (the post writes pinned memory and makes no CUDA call
        unless the device is ``staging.SLOTS`` posts behind, a wait the detectors report)."""
        mailbox = self._mailbox
        if mailbox is None:  # the graph path runs where graphs stage: the runner made one
            raise RuntimeError("the graph path posts to the mailbox: this runner has none")
        posts = mailbox.posted
        launched = False
        push(self._replay_ranges[bucket])
        try:
            self._stage(req_pool_indices, seq_lens, n)
            self.graphs[bucket].replay()
            launched = True
        except BaseException:
            # A post no graph will consume (the launch raised, or anything between the post
            # and the launch, Ctrl-C included) is taken back: else every later graph would
            # stage the batch posted one call before its own. A launched graph consumes its
            # post, whatever is raised after the launch.
            if not launched and mailbox.posted > posts:
                mailbox.withdraw()
            raise
        finally:
            pop()

    # -- errors and teardown --------------------------------------------------------------

    def read_errors(self) -> dict[str, int]:
        """Counters of the ``errors`` buffer by kind (a device-to-host read: call it outside
        the replay path)."""
        if self.errors is None:
            raise RuntimeError("this runner was made without errors=True")
        with phase("verify"):
            return dict(zip(self.error_kinds, self.errors.tolist()))

    def reset_errors(self) -> None:
        if self.errors is not None:
            self.errors.zero_()

    def close(self) -> None:
        """Release the graphs and their pool (pending replays finish first). The references
        are dropped even when that wait raises (a CUDA context a builder broke)."""
        try:
            if self.graphs and self.use_graphs:
                torch.cuda.synchronize(self.device)
        finally:
            self.graphs.clear()
            self.pool = None
            self._addresses = None
            self._bucket_of = None
