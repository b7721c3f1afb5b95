"""The checker's own output buffers, handed to the runner under test: the tables inside one
poisoned allocation with canary rows and pad columns, and a metadata builder's vectors with a
canary entry on both sides (a CSR builder's ``kv_indptr`` and ``kv_indices`` likewise). The
checker compares the whole allocations after every replay, so a write anywhere outside the
live region is seen."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..kernels.contract import cdiv
from ..workload.decode import Step
from ..workload.pool import KVPool
from .config import INDEX_DTYPES, CheckConfig
from .verify import (
    CANARY_ROWS,
    POISON,
    batch_size,
    preset_views,
    replay_bytes,
    vector_replay_bytes,
)


@dataclass
class CheckBuffers:
    """The tables and vectors of one check, and the views the runner gets of them."""

    #: ``[T, max_bs + 2 * CANARY_ROWS, width + table_pad_cols]`` int32, T = 2 with SWA else 1
    tables: torch.Tensor
    #: per table, the ``[max_bs, width]`` int32 view the builder fills (page_table, then SWA)
    views: list[torch.Tensor]
    #: each table view's row stride (``table_pad_cols``, ``swa_table_pad_cols``)
    row_strides: tuple[int, ...] = ()
    #: a metadata builder's ``[3, max_bs + 3]`` int32 vectors, a CSR builder's ``[2,
    #: capacity + 2]`` ones, or None for a table builder
    vectors: torch.Tensor | None = None
    #: views of ``vectors`` (int32) by output name, or None: ``cache_seqlens`` ``[max_bs]``,
    #: ``cu_seqlens_k`` and ``cu_seqlens_q`` ``[max_bs + 1]``; or ``kv_indptr`` ``[max_bs +
    #: 1]`` and ``kv_indices`` ``[capacity]``
    vector_views: dict[str, torch.Tensor] | None = None
    #: the builder kind the buffers are for (``pagegraph.kernels.registry.OUTPUT_KINDS``)
    kind: str = "page_table"

    def runner_kwargs(self, cfg: CheckConfig) -> dict:
        """The runner's output arguments: tables, and a metadata or CSR builder's vectors."""
        kwargs = dict(
            page_table=self.views[0], swa_page_table=self.views[1] if len(self.views) == 2 else None
        )
        if self.kind == "csr":
            kwargs.update(self.vector_views, outputs="csr")
        elif self.vector_views is not None:
            kwargs.update(self.vector_views, outputs="decode_metadata",
                          draft_tokens=cfg.draft_tokens)  # fmt: skip
        return kwargs

    def eager_calls(self, fn: Callable, cfg: CheckConfig, pool: KVPool, batch: Step,
                    device: torch.device) -> tuple[Callable[[], None], ...]:  # fmt: skip
        """The builder's calls on one workload batch (its ``bs`` request indices and lengths,
        staged here as ``[bs]`` tensors of ``cfg.index_dtype``), into the first ``bs`` rows of
        the buffers, as callables of no argument: a warm-up with every length 1 (an engine's
        first call is its warm-up on short dummy lengths, as the capture's are), then the
        batch itself."""
        dtype = INDEX_DTYPES[cfg.index_dtype]
        rpi = torch.tensor(batch.req_pool_indices, dtype=dtype, device=device)
        sl = torch.tensor(batch.seq_lens, dtype=dtype, device=device)
        short = torch.ones_like(sl)
        # A warm-up row's request index must be a real row, as a padded row's is.
        rpi_short = rpi.clamp(0, pool.req_to_token.shape[0] - 1)
        bs = batch.bs
        req_to_token, full_to_swa = pool.req_to_token, pool.full_to_swa
        views = self.views
        kwargs = {}
        if full_to_swa is not None:
            kwargs = {"swa_page_table": views[1][:bs], "full_to_swa": full_to_swa}
        if self.kind == "csr":
            csr_fn, kv_indptr = fn, self.vector_views["kv_indptr"][: bs + 1]
            kv_indices = self.vector_views["kv_indices"]

            def fn(r2t, rpi, sl, _table, page_size):
                csr_fn(r2t, rpi, sl, page_size, kv_indptr=kv_indptr, kv_indices=kv_indices)

        elif self.vector_views is not None:
            # build_decode_metadata's signature: page_size fourth, the outputs by keyword.
            meta_fn, page_table = fn, views[0][:bs]
            kwargs.update(
                cache_seqlens=self.vector_views["cache_seqlens"][:bs],
                cu_seqlens_k=self.vector_views["cu_seqlens_k"][: bs + 1],
                cu_seqlens_q=self.vector_views["cu_seqlens_q"][: bs + 1],
                draft_tokens=cfg.draft_tokens,
            )

            def fn(r2t, rpi, sl, _table, page_size, **kw):
                meta_fn(r2t, rpi, sl, page_size, page_table=page_table, **kw)

        def warm_up() -> None:
            fn(req_to_token, rpi_short, short, views[0][:bs], cfg.page_size, **kwargs)

        def call() -> None:
            fn(req_to_token, rpi, sl, views[0][:bs], cfg.page_size, **kwargs)

        return warm_up, call


def allocate_check_buffers(cfg: CheckConfig, kind: str, device: torch.device) -> CheckBuffers:
    """Poisoned buffers for ``cfg`` and a builder of ``kind``: with vectors for a
    ``"decode_metadata"`` or ``"csr"`` builder."""
    width = cfg.width
    strides = table_row_strides(cfg)
    T, rows = len(strides), cfg.max_bs + 2 * CANARY_ROWS
    # The tables live in one allocation with a canary row above and below and the layout's
    # pad columns: the checker poisons and compares all of it. An SWA table with a row
    # stride of its own packs its rows closer inside its slab, the rest of which is canary.
    tables = torch.full((T, rows, max(strides)), POISON, dtype=torch.int32, device=device)
    views = [
        torch.as_strided(tables, (cfg.max_bs, width), (stride, 1),
                         t * tables[0].numel() + CANARY_ROWS * stride)
        for t, stride in enumerate(strides)
    ]  # fmt: skip
    if kind == "csr":
        return _csr_buffers(cfg, tables, views, device)
    if kind != "decode_metadata":
        return CheckBuffers(tables, views, strides)
    # A metadata builder's vectors, each with a canary entry on both sides.
    vectors = torch.full((3, cfg.max_bs + 3), POISON, dtype=torch.int32, device=device)
    vector_views = {
        "cache_seqlens": vectors[0, 1 : 1 + cfg.max_bs],
        "cu_seqlens_k": vectors[1, 1 : 2 + cfg.max_bs],
        "cu_seqlens_q": vectors[2, 1 : 2 + cfg.max_bs],
    }
    preset_views(vectors, cfg.preset_outputs)  # set at allocation, as the engine does
    return CheckBuffers(tables, views, strides, vectors, vector_views, kind)


def table_row_strides(cfg: CheckConfig) -> tuple[int, ...]:
    """The row stride of each table the builder fills: the page table's, then the SWA
    table's (its own ``swa_table_pad_cols``, else the page table's ``table_pad_cols``)."""
    strides = [cfg.width + cfg.table_pad_cols]
    if cfg.swa:
        pad = cfg.table_pad_cols if cfg.swa_table_pad_cols is None else cfg.swa_table_pad_cols
        strides.append(cfg.width + pad)
    return tuple(strides)


def _csr_buffers(cfg: CheckConfig, tables: torch.Tensor, views: list[torch.Tensor],
                 device: torch.device) -> CheckBuffers:  # fmt: skip
    """A CSR builder's ``kv_indptr`` (``[max_bs + 1]``) and ``kv_indices`` (``csr_capacity``
    entries, as an engine sizes it for its longest rows) in one ``[2, L]`` allocation, each
    with a canary entry on both sides; the tables stay poisoned (a CSR builder gets none)."""
    capacity = csr_capacity(cfg)
    vectors = torch.full((2, csr_vector_length(cfg)), POISON, dtype=torch.int32, device=device)
    vector_views = {
        "kv_indptr": vectors[0, 1 : 2 + cfg.max_bs],
        "kv_indices": vectors[1, 1 : 1 + capacity],
    }
    preset_views(vectors, cfg.preset_outputs, "csr")
    return CheckBuffers(tables, views, (tables.shape[-1],), vectors, vector_views, "csr")


def csr_capacity(cfg: CheckConfig) -> int:
    """Entries of the checker's ``kv_indices``: ``max_bs`` rows of the table's width, as an
    engine sizes it (SGLang: ``max_bs * max_context_len`` token slots at page size 1)."""
    return cfg.max_bs * cfg.width


def csr_vector_length(cfg: CheckConfig) -> int:
    """Entries of each row of a CSR builder's ``[2, L]`` vectors: ``kv_indptr`` and
    ``kv_indices`` with a canary entry on both sides."""
    return max(cfg.max_bs + 3, csr_capacity(cfg) + 2)


def table_bytes(cfg: CheckConfig, kind: str = "page_table") -> int:
    """Device bytes the checker's tables and their verification take (an upper estimate of
    the working set, for the memory check before allocating): the tables, and twice the
    snapshots and intermediates of one verification batch (``pagegraph.verify.replay_bytes``):
    the warm-up run before capture leaves its intermediates cached beside the graph's own."""
    tables = 2 if cfg.swa else 1
    rows = cfg.max_bs + 2 * CANARY_ROWS
    padded_width = max(table_row_strides(cfg))
    own = tables * rows * padded_width * 4
    if kind == "csr":  # the gathers span a request's row; kv_indices and its int64 steps
        row_pages = cdiv(cfg.max_context_len + cfg.r2t_extra_cols, cfg.page_size)
        per = replay_bytes(tables, rows, padded_width, cfg.max_bs, row_pages)
        entries = 2 * csr_vector_length(cfg)  # _csr_buffers' [2, L] allocation
        per += vector_replay_bytes(entries, csr_capacity(cfg))
        own += entries * 4
    else:
        per = replay_bytes(tables, rows, padded_width, cfg.max_bs, cfg.width)
    return own + 2 * per * batch_size(per, min(cfg.chunk, cfg.steps))
