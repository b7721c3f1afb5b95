"""vLLM-Omni #4562: a decode step picks its rows with boolean-mask indexing inside a FULL decode
graph's capture (``rows[mask]``: an output shape from the data, a host sync, refused by a stream
capture); the fix keeps every row and the static shape.

Modelled as a plain-torch page-table builder that selects the rows holding a token with a
boolean mask and writes only those (buggy), or writes every row through ``torch.where`` over
the same mask (fixed). On a CPU the cpu sync detector names the mask's ``nonzero`` as a
sync, as torch's sync-debug mode does on CUDA.
"""

from __future__ import annotations

import torch

from ..wild_bug import Fidelity, Twin, WildBug


def _page_ids(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    page_table: torch.Tensor,
    page_size: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each row's page ids ``[bs, width]`` and which of them are live (sync-free torch ops)."""
    bs, width = page_table.shape
    pages = torch.div(seq_lens[:bs].long() + page_size - 1, page_size, rounding_mode="floor")
    pages = pages.clamp(0, width)
    live = torch.arange(width, device=page_table.device) < pages[:, None]
    rows = req_pool_indices[:bs].long().clamp(0, req_to_token.shape[0] - 1)
    starts = req_to_token[:, ::page_size][:, :width]  # each page's first slot, a view
    ids = torch.div(starts[rows], page_size, rounding_mode="floor").to(page_table.dtype)
    return ids, live, pages


def rows_by_mask(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    page_table: torch.Tensor,
    page_size: int,
) -> None:
    """Buggy: the rows holding a token picked by boolean-mask indexing, then written."""
    ids, live, pages = _page_ids(req_to_token, req_pool_indices, seq_lens, page_table, page_size)
    keep = pages > 0
    picked = torch.arange(page_table.shape[0], device=page_table.device)[keep]  # shape from data
    page_table[picked] = torch.where(live[picked], ids[picked], page_table[picked])


def rows_by_where(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    page_table: torch.Tensor,
    page_size: int,
) -> None:
    """Fixed: every row kept, the mask applied with ``torch.where`` (a static shape)."""
    ids, live, pages = _page_ids(req_to_token, req_pool_indices, seq_lens, page_table, page_size)
    keep = (pages > 0)[:, None] & live
    page_table.copy_(torch.where(keep, ids, page_table))


BUG = WildBug(
    key="vllm-omni-4562",
    engine="vLLM-Omni",
    version="main, June 2026 (Higgs-Audio-v3 talker, cudagraph_mode FULL_DECODE_ONLY)",
    ref="vllm-project/vllm-omni#4562",
    state="closed (fix proposed in PR #4563)",
    bug_class="c",
    symptom="Capture of the talker's decode graph aborts with 'CUDA error: operation not "
    "permitted when stream is capturing' on the low-latency profile.",
    cause="_decode_request_token_positions filtered its request rows with boolean-mask "
    "indexing (req_rows[decode_mask]): a data-dependent output shape, a host sync inside the "
    "captured forward.",
    prop="sync-free builder call",
    buggy=Twin(rows_by_mask),
    fixed=Twin(rows_by_where),
    fidelity=Fidelity(
        modelled="boolean-mask row selection inside the captured per-step metadata build: "
        "its nonzero is a host sync (the capture's failure on CUDA)",
        fix="PR #4563: under the decode graph return the unfiltered rows (every span is 1), "
        "keeping the captured shape static; here the mask is applied with torch.where",
        stands_in=(
            "a page table's rows for the talker's per-request token positions",
            "rows holding a token (length > 0) for the decode mask (span == 1, start in range)",
        ),
    ),
)
