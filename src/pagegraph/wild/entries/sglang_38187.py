"""SGLang #38187: Llama4's local-attention refill at CUDA-graph replay translated the full table's
page ids through the token-slot ``full_to_swa`` mapping, never scaled by ``page_size``, so FA3
read SWA token slots as page ids (the fix reads the graph's SWA page table, built from slots).

Modelled with the bed's two tables: the full page table is built as usual, and the SWA table is
the full table's page ids looked up in ``full_to_swa`` as if they were token slots (buggy), or
each page's first slot looked up and divided by ``page_size`` (fixed, the SWA table the graph
holds). With ``page_size == 1`` the two agree, as the report says; the scenario pages by 16.
"""

from __future__ import annotations

from typing import cast

import torch

from ...kernels.page_table import build_page_table
from ..wild_bug import Fidelity, Twin, WildBug


def swa_from_page_ids(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    page_table: torch.Tensor,
    page_size: int,
    *,
    swa_page_table: torch.Tensor | None = None,
    full_to_swa: torch.Tensor | None = None,
) -> None:
    """Buggy: ``swa_page_table[i, p] = full_to_swa[page_table[i, p]]`` on live entries."""
    build_page_table(req_to_token, req_pool_indices, seq_lens, page_table, page_size)
    bs, width = page_table.shape
    pages = torch.div(seq_lens[:bs].long() + page_size - 1, page_size, rounding_mode="floor")
    live = torch.arange(width, device=page_table.device) < pages.clamp(0, width)[:, None]
    # The entry's scenario has SWA: the bed passes both tables.
    to_swa, swa_table = cast(torch.Tensor, full_to_swa), cast(torch.Tensor, swa_page_table)
    ids = page_table.long().clamp(0, to_swa.shape[0] - 1)
    swa = to_swa[ids].to(swa_table.dtype)  # a token slot, taken for a page id
    swa_table.copy_(torch.where(live, swa, swa_table))


def swa_from_slots(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    page_table: torch.Tensor,
    page_size: int,
    *,
    swa_page_table: torch.Tensor | None = None,
    full_to_swa: torch.Tensor | None = None,
) -> None:
    """Fixed: the SWA table from each page's first slot, ``full_to_swa[slot] // page_size``."""
    build_page_table(
        req_to_token,
        req_pool_indices,
        seq_lens,
        page_table,
        page_size,
        swa_page_table=swa_page_table,
        full_to_swa=full_to_swa,
    )


BUG = WildBug(
    key="sglang-38187",
    engine="SGLang",
    version="main, September 2026 (Llama-4-Scout, FA3, --page-size 16, decode CUDA graphs)",
    ref="sgl-project/sglang#38187",
    state="open (fix PR)",
    bug_class="e",
    symptom="CUDA illegal memory access on Llama4 with --page-size 16 under concurrent decode "
    "with CUDA graphs; correct with --disable-decode-cuda-graph or page size 1.",
    cause="The local-attention replay refill ran translate_loc_from_full_to_swa on "
    "metadata.page_table: page ids through the token-slot mapping, never divided by "
    "page_size, so FA3 read SWA token slots as page ids (up to 16x out of range).",
    prop="correct",
    buggy=Twin(swa_from_page_ids),
    fixed=Twin(swa_from_slots),
    fidelity=Fidelity(
        modelled="the SWA table made at replay from the full table's page ids through the "
        "token-slot full_to_swa mapping: a token slot where the reader takes a page id",
        fix="PR #38187: read page ids from the graph's own tables (metadata.swa_page_table), "
        "built from slots and divided by page_size, at capture and at replay",
        stands_in=("pagegraph's SWA page table for SGLang's local-attention table",),
    ),
)
