"""The decode-metadata kind's mutants (``build_decode_metadata``'s signature): pagegraph's
correct builder with one bug switched in after it (a scan, the draft tokens, ``cu_seqlens_q``).
``MUTANTS`` maps each name to a ``Mutant``; ``CONTROLS`` holds the kind's correct builder."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..kernels.contract import declare_outputs
from ..kernels.decode_metadata import build_decode_metadata
from ..kernels.page_table import build_page_table
from .mutant import WRONG, Mutant, Zoo


def _metadata(fn: Callable[..., object]) -> Callable[..., object]:
    declare_outputs(fn, "decode_metadata")
    return fn


@_metadata
def scan_exclusive(
    req_to_token: Any, req_pool_indices: Any, seq_lens: Any, page_size: Any, **kw: Any
) -> None:
    """cu_seqlens_k written as the exclusive scan: each row's start instead of its end."""
    build_decode_metadata(req_to_token, req_pool_indices, seq_lens, page_size, **kw)
    kw["cu_seqlens_k"][1:].sub_(kw["cache_seqlens"])


@_metadata
def draft_pages_missing(
    req_to_token: Any, req_pool_indices: Any, seq_lens: Any, page_size: Any, **kw: Any
) -> None:
    """The page tables built for seq_lens: the draft tokens' pages left out."""
    table, swa = kw["page_table"], kw.get("swa_page_table")
    narrow = dict(kw, page_table=table[:, :0])
    if swa is not None:
        narrow["swa_page_table"] = swa[:, :0]
    build_decode_metadata(req_to_token, req_pool_indices, seq_lens, page_size, **narrow)
    swa_kw = {}
    if swa is not None:
        swa_kw = {"swa_page_table": swa, "full_to_swa": kw["full_to_swa"]}
    build_page_table(req_to_token, req_pool_indices, seq_lens, table, page_size, **swa_kw)


#: Rows a "program" of scan_restarts_per_block sums before it restarts.
SCAN_RESTART = 8


@_metadata
def scan_restarts_per_block(
    req_to_token: Any, req_pool_indices: Any, seq_lens: Any, page_size: Any, **kw: Any
) -> None:
    """cu_seqlens_k summed per block of 8 rows and never carried across blocks."""
    build_decode_metadata(req_to_token, req_pool_indices, seq_lens, page_size, **kw)
    cu = kw["cu_seqlens_k"]
    bs = seq_lens.shape[0]
    for start in reversed(range(SCAN_RESTART, bs, SCAN_RESTART)):
        cu[1 + start : 1 + start + SCAN_RESTART].sub_(cu[start])


@_metadata
def cu_q_unscaled(
    req_to_token: Any, req_pool_indices: Any, seq_lens: Any, page_size: Any, **kw: Any
) -> None:
    """cu_seqlens_q written as 0, 1, 2, ...: the draft tokens per row forgotten."""
    build_decode_metadata(req_to_token, req_pool_indices, seq_lens, page_size, **kw)
    cu_q = kw.get("cu_seqlens_q")
    if cu_q is not None:
        torch.arange(cu_q.shape[0], out=cu_q)


MUTANTS: dict[str, Mutant] = {
    m.name: m
    for m in [
        Mutant("scan_exclusive", scan_exclusive, True, "correct (cu_seqlens_k)", kills=WRONG),
        Mutant("draft_pages_missing", draft_pages_missing, True,  # their tokens uncounted too
               "correct (draft tokens' pages)", kills=("correct", "error counters")),
        Mutant("scan_restarts_per_block", scan_restarts_per_block, True,
               "correct (cu_seqlens_k past 8 rows)", kills=WRONG),
        Mutant("cu_q_unscaled", cu_q_unscaled, True, "correct (cu_seqlens_q, draft > 0)",
               kills=WRONG),
    ]
}  # fmt: skip

#: The kind's correct builder, run as a control.
CONTROLS: dict[str, Callable[..., object]] = {"build_decode_metadata": build_decode_metadata}

#: The kind's zoo (``pagegraph.mutants.zoo.ZOOS``).
ZOO = Zoo(MUTANTS, CONTROLS)

__all__ = ["CONTROLS", "MUTANTS", "ZOO", "SCAN_RESTART"]
