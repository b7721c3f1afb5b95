"""The pool and the decode workload a ``CheckConfig`` describes: ``KVPool``'s and
``DecodeWorkload``'s arguments, shared by the replay check and the decode step."""

from __future__ import annotations

from typing import Any

import torch

from ..config import INDEX_DTYPES, CheckConfig


def pool_kwargs(cfg: CheckConfig) -> dict[str, Any]:
    """``KVPool`` arguments of the config, ``device`` aside (keyword arguments of several
    types, by name)."""
    return dict(
        max_reqs=cfg.max_reqs or cfg.max_bs + 1,
        max_context_len=cfg.max_context_len,
        page_size=cfg.page_size,
        num_pages=cfg.num_pages,
        swa=cfg.swa,
        seed=cfg.seed,
        row_order=cfg.row_order,
        dtype=INDEX_DTYPES[cfg.r2t_dtype],
        extra_cols=cfg.r2t_extra_cols,
        storage_offset=cfg.r2t_offset,
        full_to_swa_dtype=INDEX_DTYPES[cfg.full_to_swa_dtype],
    )


def workload_kwargs(cfg: CheckConfig, metadata: bool, len_limit: int) -> dict[str, Any]:
    """``DecodeWorkload`` arguments of the config (``ProducedWorkload`` passes them on)."""
    return dict(
        max_bs=cfg.max_bs,
        steps=cfg.steps,
        seed=cfg.seed + 1,
        finish_rate=cfg.finish_rate,
        draft_tokens=cfg.draft_tokens,
        initial_len=cfg.initial_len,
        swa_window=cfg.swa_window,
        swa_churn=cfg.swa_churn,
        near_capacity=cfg.near_capacity,
        inject=cfg.injection(),
        capacity=len_limit,
        max_len=2**31 - 1 if INDEX_DTYPES[cfg.index_dtype] == torch.int32 else 2**40,
        committed_lengths=metadata,
    )
