"""The checker's own output buffers, handed to the runner under test: the tables inside one
poisoned allocation with canary rows and pad columns, and a metadata builder's vectors with a
canary entry on both sides (a CSR builder's ``kv_indptr`` and ``kv_indices`` likewise). The
checker compares the whole allocations after every replay, so a write anywhere outside the
live region is seen."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import SimpleNamespace

import torch

from ...kernels.contract import POISON, cdiv
from ...kernels.declarations import factory_declaration_of
from ...kinds import PAGE_TABLE, KindSpec
from ...kinds.builders import builder_capabilities
from ...workload.decode import Step
from ...workload.pool import KVPool
from ..config import INDEX_DTYPES, CheckConfig
from ..judges.verify import CANARY_ROWS, batch_size, preset_views, replay_bytes, vector_replay_bytes


@dataclass
class CheckBuffers:
    """The tables and vectors of one check, and the views the runner gets of them."""

    #: ``[T, max_bs + 2 * CANARY_ROWS, width + table_pad_cols]`` int32, T = 2 with SWA else 1
    tables: torch.Tensor
    #: per table, the ``[max_bs, width]`` int32 view the builder fills (page_table, then SWA)
    views: list[torch.Tensor]
    #: each table view's row stride (``table_pad_cols``, ``swa_table_pad_cols``)
    row_strides: tuple[int, ...] = ()
    #: the kind's vectors in one ``[V, L]`` allocation, each with a canary entry on both
    #: sides (``vector_layout``), or None for a kind without vectors
    vectors: torch.Tensor | None = None
    #: views of ``vectors`` by output name, or None
    vector_views: dict[str, torch.Tensor] | None = None
    #: the builder kind the buffers are for
    kind: KindSpec = PAGE_TABLE

    def runner_kwargs(self, cfg: CheckConfig, engine_own: Sequence[str] = ()) -> dict[str, object]:
        """The runner's output arguments: tables, and the kind's vectors but those named in
        ``engine_own`` (a runner factory's own buffers, which the checker must not pass
        over: ``engine_buffers``)."""
        return dict(
            page_table=self.views[0],
            swa_page_table=self.views[1] if len(self.views) == 2 else None,
            vectors={k: v for k, v in (self.vector_views or {}).items() if k not in engine_own},
            outputs=self.kind.name,
            draft_tokens=cfg.draft_tokens if self.kind.tables_include_draft else 0,
        )

    def eager_calls(
        self,
        fn: Callable[..., object],
        cfg: CheckConfig,
        pool: KVPool,
        batch: Step,
        device: torch.device,
        engine: object | None = None,
    ) -> tuple[Callable[[], None], ...]:
        """The builder's calls on one workload batch (its ``bs`` request indices and lengths,
        staged here as ``[bs]`` tensors of ``cfg.index_dtype``), into the first ``bs`` rows of
        the buffers, as its kind calls it, as callables of no argument: a warm-up with every
        length 1 (an engine's first call is its warm-up on short dummy lengths, as the
        capture's are), then the batch itself."""
        dtype = INDEX_DTYPES[cfg.index_dtype]
        rpi = torch.tensor(batch.req_pool_indices, dtype=dtype, device=device)
        sl = torch.tensor(batch.seq_lens, dtype=dtype, device=device)
        # A warm-up row's request index must be a real row, as a padded row's is.
        rpi_short = rpi.clamp(0, pool.req_to_token.shape[0] - 1)
        bs = batch.bs
        extra: dict[str, object] = {}
        if pool.full_to_swa is not None:
            extra = {"swa_page_table": self.views[1][:bs], "full_to_swa": pool.full_to_swa}
        if builder_capabilities(fn).batch:
            extra["batch"] = self.kind.batch_context(bs, bs, cfg.max_bs)
        draft = cfg.draft_tokens if self.kind.tables_include_draft else 0
        derived = self.kind.derived_inputs(cfg.max_bs, draft, device)

        def io(rows: torch.Tensor, lengths: torch.Tensor) -> SimpleNamespace:
            return SimpleNamespace(
                req_to_token=pool.req_to_token,
                req_pool_indices=rows,
                seq_lens=lengths,
                page_table=self.views[0],
                swa_page_table=None,
                full_to_swa=pool.full_to_swa,
                errors=None,
                page_size=cfg.page_size,
                vectors=self.vector_views,
                draft_tokens=cfg.draft_tokens if self.kind.tables_include_draft else 0,
                engine=engine,
                derived=derived,
            )

        warm_io, call_io = io(rpi_short, torch.ones_like(sl)), io(rpi, sl)

        def warm_up() -> None:
            self.kind.call(fn, warm_io, bs, extra)

        def call() -> None:
            self.kind.call(fn, call_io, bs, extra)

        return warm_up, call


def allocate_check_buffers(cfg: CheckConfig, kind: KindSpec, device: torch.device) -> CheckBuffers:
    """Poisoned buffers for ``cfg`` and a builder of ``kind``: the tables (all poison for a
    kind that writes none) and the kind's vectors."""
    width = cfg.width
    strides = table_row_strides(cfg)
    T, rows = len(strides), cfg.max_bs + 2 * CANARY_ROWS
    # The tables live in one allocation with a canary row above and below and the layout's
    # pad columns: the checker poisons and compares all of it. An SWA table with a row
    # stride of its own packs its rows closer inside its slab, the rest of which is canary.
    tables = torch.full((T, rows, max(strides)), POISON, dtype=torch.int32, device=device)
    views = [
        torch.as_strided(
            tables, (cfg.max_bs, width), (stride, 1), t * tables[0].numel() + CANARY_ROWS * stride
        )
        for t, stride in enumerate(strides)
    ]
    if not kind.vectors:
        return CheckBuffers(tables, views, strides, kind=kind)
    lengths = vector_lengths(cfg, kind)
    # One allocation: a kind's vectors share a dtype (int32, or int64 slot ids).
    vectors = torch.full(
        (len(lengths), vector_row_length(cfg, kind)),
        POISON,
        dtype=kind.vectors[0].dtype,
        device=device,
    )
    vector_views = {name: vectors[v, 1 : 1 + n] for v, (name, n) in enumerate(lengths.items())}
    preset_views(vectors, cfg.preset_outputs, kind)  # set at allocation, as the engine does
    return CheckBuffers(tables, views, strides, vectors, vector_views, kind)


def vector_lengths(cfg: CheckConfig, kind: KindSpec) -> dict[str, int]:
    """Entries of each of the kind's vectors in the checker's allocation (an engine-sized
    one: as its kind sizes it for ``max_bs`` rows of the table's width, as an engine does)."""
    return kind.vector_lengths(cfg.max_bs, cfg.width, cfg.draft_tokens)


def vector_row_length(cfg: CheckConfig, kind: KindSpec) -> int:
    """Entries of each row of the kind's ``[V, L]`` vectors: the longest vector with a canary
    entry on both sides."""
    return max(vector_lengths(cfg, kind).values()) + 2


def table_row_strides(cfg: CheckConfig) -> tuple[int, ...]:
    """The row stride of each table the builder fills: the page table's, then the SWA
    table's (its own ``swa_table_pad_cols``, else the page table's ``table_pad_cols``)."""
    strides = [cfg.width + cfg.table_pad_cols]
    if cfg.swa:
        pad = cfg.table_pad_cols if cfg.swa_table_pad_cols is None else cfg.swa_table_pad_cols
        strides.append(cfg.width + pad)
    return tuple(strides)


def engine_capacity(cfg: CheckConfig, kind: KindSpec) -> int:
    """Entries of the kind's engine-sized vectors in the checker's allocation (0 for a kind
    without one)."""
    lengths = vector_lengths(cfg, kind)
    return sum(lengths[v.name] for v in kind.vectors if v.engine_sized)


def table_bytes(cfg: CheckConfig, kind: KindSpec) -> int:
    """Device bytes the checker's tables and their verification take (an upper estimate of
    the working set, for the memory check before allocating): the tables, and twice the
    snapshots and intermediates of one verification batch
    (``pagegraph.check.judges.verify.replay_bytes``):
    the warm-up run before capture leaves its intermediates cached beside the graph's own."""
    tables = 2 if cfg.swa else 1
    rows = cfg.max_bs + 2 * CANARY_ROWS
    padded_width = max(table_row_strides(cfg))
    own = tables * rows * padded_width * 4
    if kind.vectors:
        # The gathers of a kind without a table width span a request's row.
        row_pages = cdiv(cfg.max_context_len + cfg.r2t_extra_cols, cfg.page_size)
        gathered = cfg.width if kind.writes_tables else row_pages
        per = replay_bytes(tables, rows, padded_width, cfg.max_bs, gathered)
        entries = len(kind.vectors) * vector_row_length(cfg, kind)
        # kv_indices' int64 index steps: an engine-sized vector's entries
        per += vector_replay_bytes(entries, engine_capacity(cfg, kind))
        own += entries * 4
    else:
        per = replay_bytes(tables, rows, padded_width, cfg.max_bs, cfg.width)
    return own + 2 * per * batch_size(per, min(cfg.chunk, cfg.steps))


def _same_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether ``a`` and ``b`` view one allocation."""
    return bool(a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr())


def engine_buffers(factory: Callable[..., object]) -> tuple[str, ...]:
    """The output vectors a runner factory allocates itself, as an engine does (declared with
    ``pagegraph.kernels.declarations.declare_runner_factory``; default none): the checker
    then passes it none of its own under those names."""
    return factory_declaration_of(factory).engine_buffers


@dataclass
class EngineVectors:
    """The runner's output vectors that are not the checker's views (an engine's own
    buffers, ``engine_buffers``), each paired with the checker's view of the same name: the
    builder writes the engine's buffer, the checker judges its own allocation. ``push``
    before a replay hands the engine's buffers what the checker's hold (the poison and the
    preset entries), ``pull`` after it copies what the replay left back for the judges.
    Entries past the shorter of the two are not mirrored (an engine-sized ``kv_indices``
    longer than the checker's capacity: writes past it are the engine's to bound)."""

    #: (the engine's buffer, the checker's view), both ``[n]`` of one dtype
    pairs: list[tuple[torch.Tensor, torch.Tensor]]
    #: the vectors' names, as ``pairs``
    names: tuple[str, ...] = ()

    @classmethod
    def of(cls, runner_vectors: dict[str, torch.Tensor], buffers: CheckBuffers) -> EngineVectors:
        """The pairs of ``runner_vectors`` (``GraphRunner.vectors``) outside the checker's
        allocation. One inside it (a view of another of the checker's vectors, as an engine
        handing one buffer over as two outputs does) is not mirrored: the checker sees what
        was written there as it is."""
        own = buffers.vectors
        pairs, names = [], []
        for name, view in (buffers.vector_views or {}).items():
            engine = runner_vectors.get(name)
            if engine is None or own is None or _same_storage(engine, own):
                continue
            n = min(engine.shape[0], view.shape[0])
            pairs.append((engine[:n], view[:n]))
            names.append(name)
        return cls(pairs, tuple(names))

    def push(self) -> None:
        """The checker's poisoned views into the engine's buffers (device copies)."""
        for engine, view in self.pairs:
            engine.copy_(view)

    def pull(self) -> None:
        """What the replay left in the engine's buffers into the checker's views."""
        for engine, view in self.pairs:
            view.copy_(engine)
