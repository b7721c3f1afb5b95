"""The CSR kind's mutants (``build_kv_indices``'s signature): one plain-torch base,
``plain_kv_indices`` (a control), with one bug switched in each. ``MUTANTS`` maps each name to
a ``Mutant``; ``CONTROLS`` holds the kind's correct builders."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..kernels.contract import cdiv, declare_outputs
from ..kernels.kv_indices import build_kv_indices
from .mutant import GRAPH, OUTSIDE, WRONG, Mutant, Zoo

_csr_frozen: dict[tuple[int, int], int] = {}


def _csr(fn: Callable[..., object]) -> Callable[..., object]:
    declare_outputs(fn, "csr")
    return fn


def _torch_csr(
    req_to_token: Any,
    req_pool_indices: Any,
    seq_lens: Any,
    page_size: Any,
    kv_indptr: Any,
    kv_indices: Any,
    *,
    bug: str = "",
    max_pages: int | None = None,
) -> None:
    """The CSR contract in sync-free torch ops (one scatter through a dump entry), with one
    ``bug`` switched in: ``"ell"`` (row i written at ``i * row_pages``), ``"past_end"`` (each
    row writes one page too many)."""
    bs, C = seq_lens.shape[0], kv_indices.shape[0]
    row_pages = cdiv(req_to_token.shape[1], page_size)
    tokens = seq_lens.long().clamp(0, row_pages * page_size)  # clamped before rounding up
    n = (tokens + page_size - 1) // page_size
    if max_pages is not None:
        n = n.clamp(max=max_pages)
    ends = torch.cumsum(n, 0).clamp(max=C)
    starts = torch.cat([ends.new_zeros(1), ends[:-1]])
    kv_indptr[1 : bs + 1] = ends.to(torch.int32)
    kv_indptr[:1].fill_(0)
    cols = torch.arange(row_pages, device=seq_lens.device)
    counts = (ends - starts)[:, None]
    base = torch.arange(bs, device=seq_lens.device) * row_pages if bug == "ell" else starts
    dest = base[:, None] + cols
    rows = req_pool_indices.long().clamp(0, req_to_token.shape[0] - 1)
    cols_tokens = (cols * page_size).clamp(max=req_to_token.shape[1] - 1)
    ids = (req_to_token[rows[:, None], cols_tokens].long() // page_size).to(torch.int32)
    padded = torch.cat([kv_indices, kv_indices.new_zeros(1)])
    # Scatters with one destination each (their order on a GPU is undefined for repeats):
    # past_end's extra pages first, so that the next row's own first page overwrites them.
    passes = [cols < counts] if bug != "past_end" else [cols == counts, cols < counts]
    for live in passes:
        padded.scatter_(0, torch.where(live & (dest < C), dest, C).reshape(-1), ids.reshape(-1))
    kv_indices.copy_(padded[:C])


@_csr
def csr_ell_offsets(
    req_to_token: Any,
    req_pool_indices: Any,
    seq_lens: Any,
    page_size: Any,
    *,
    kv_indptr: Any,
    kv_indices: Any,
) -> None:
    """Row i's pages written at i * row_pages (a padded layout) while kv_indptr is packed."""
    _torch_csr(
        req_to_token, req_pool_indices, seq_lens, page_size, kv_indptr, kv_indices, bug="ell"
    )


@_csr
def csr_one_page_past(
    req_to_token: Any,
    req_pool_indices: Any,
    seq_lens: Any,
    page_size: Any,
    *,
    kv_indptr: Any,
    kv_indices: Any,
) -> None:
    """Each row copies pages p <= n: one entry too many, past kv_indptr[bs] at the last row."""
    _torch_csr(
        req_to_token, req_pool_indices, seq_lens, page_size, kv_indptr, kv_indices, bug="past_end"
    )


@_csr
def csr_pages_frozen(
    req_to_token: Any,
    req_pool_indices: Any,
    seq_lens: Any,
    page_size: Any,
    *,
    kv_indptr: Any,
    kv_indices: Any,
) -> None:
    """Pages per row capped at what a batch size's first call (its warm-up) needed."""
    key = (kv_indices.data_ptr(), seq_lens.shape[0])
    if key not in _csr_frozen:
        longest = int(seq_lens.cpu().numpy().max()) if seq_lens.numel() else 0
        _csr_frozen[key] = max(1, cdiv(max(longest, 0), page_size))
    _torch_csr(
        req_to_token,
        req_pool_indices,
        seq_lens,
        page_size,
        kv_indptr,
        kv_indices,
        max_pages=_csr_frozen[key],
    )


@_csr
def plain_kv_indices(
    req_to_token: Any,
    req_pool_indices: Any,
    seq_lens: Any,
    page_size: Any,
    *,
    kv_indptr: Any,
    kv_indices: Any,
) -> None:
    """The CSR contract in sync-free torch ops: the mutants' base, correct (a control)."""
    _torch_csr(req_to_token, req_pool_indices, seq_lens, page_size, kv_indptr, kv_indices)


def reset_caches() -> None:
    """Forget what ``csr_pages_frozen`` cached."""
    _csr_frozen.clear()


MUTANTS: dict[str, Mutant] = {
    m.name: m
    for m in [
        Mutant("csr_ell_offsets", csr_ell_offsets, True, "correct (kv_indices)", kills=WRONG),
        # the extra entry also lands on the next row's first, left wrong by rows built at once
        Mutant("csr_one_page_past", csr_one_page_past, True, "bounded writes (kv_indices)",
               kills=(*OUTSIDE, "correct")),
        Mutant("csr_pages_frozen", csr_pages_frozen, True,
               "correct / graph-safe (captured short, replayed long)", kills=GRAPH),
    ]
}  # fmt: skip

#: The kind's correct builders, run as controls.
CONTROLS: dict[str, Callable[..., object]] = {
    "build_kv_indices": build_kv_indices,
    "plain_kv_indices": plain_kv_indices,
}

#: The kind's zoo (``pagegraph.mutants.zoo.ZOOS``).
ZOO = Zoo(MUTANTS, CONTROLS, reset_caches)

__all__ = ["CONTROLS", "MUTANTS", "ZOO", "plain_kv_indices", "reset_caches"]
