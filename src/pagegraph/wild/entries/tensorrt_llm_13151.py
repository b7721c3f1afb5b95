"""TensorRT-LLM #13151: CUDA-graph padding dummies alias the state slots of live requests (the
fix reserves a sentinel slot for padding).

Modelled on vLLM's slot mapping, whose padded rows are marked by request index -1: a padded
row's tokens must map to ``PAD_SLOT_ID`` (a write there is dropped), never to a live slot.
"""

from __future__ import annotations

import torch

from ...kernels.slot_mapping import PAD_SLOT_ID
from ..record import Twin, WildBug


def _token_slots(
    block_table,
    idx_mapping,
    query_start_loc,
    positions,
    slot_mapping,
    page_size,
    *,
    dummies_alias: bool,
) -> None:
    """Each token's KV slot from its row's request (sync-free torch ops); a padded row (index
    -1) gets ``PAD_SLOT_ID``, or, with ``dummies_alias``, the first real row's request."""
    max_reqs, width = block_table.shape
    rows, total = idx_mapping.shape[0], slot_mapping.shape[0]
    t = torch.arange(total, device=slot_mapping.device)
    qsl = query_start_loc[: rows + 1].long()
    row = (torch.searchsorted(qsl, t, right=True) - 1).clamp(0, rows - 1)
    req = idx_mapping[row].long()
    padded = req < 0
    if dummies_alias:
        # The dummy borrows a slot a live request holds.
        req = torch.where(padded, idx_mapping[0].long(), req)
    pos = positions[t.clamp(max=positions.shape[0] - 1)].long().clamp(0, width * page_size - 1)
    ids = block_table[req.clamp(0, max_reqs - 1), pos // page_size].long()
    slot = ids * page_size + pos % page_size
    if not dummies_alias:
        slot = torch.where(padded, PAD_SLOT_ID, slot)
    slot_mapping.copy_(torch.where(t < qsl[rows], slot, PAD_SLOT_ID))


def dummies_borrow_live_slots(
    block_table, idx_mapping, query_start_loc, positions, slot_mapping, page_size
) -> None:
    """Buggy: a padding dummy writes through a live request's slots."""
    _token_slots(
        block_table,
        idx_mapping,
        query_start_loc,
        positions,
        slot_mapping,
        page_size,
        dummies_alias=True,
    )


def dummies_dropped(
    block_table, idx_mapping, query_start_loc, positions, slot_mapping, page_size
) -> None:
    """Fixed: a padding dummy's tokens map to the pad slot, whose writes are dropped."""
    _token_slots(
        block_table,
        idx_mapping,
        query_start_loc,
        positions,
        slot_mapping,
        page_size,
        dummies_alias=False,
    )


dummies_borrow_live_slots.pagegraph_outputs = "slot_mapping"
dummies_dropped.pagegraph_outputs = "slot_mapping"

BUG = WildBug(
    key="tensorrt-llm-13151",
    engine="TensorRT-LLM",
    version="main, 2026 (MTP with CUDA-graph padding, Mamba cache)",
    ref="NVIDIA/TensorRT-LLM#13151",
    state="merged",
    bug_class="a",
    symptom="Wrong outputs of hybrid Mamba models under MTP with CUDA graphs: live requests' "
    "cached state overwritten.",
    cause="Padding dummies had no permanent slot and aliased slots of live requests; the state "
    "update scattered through them (and through a stale index tail).",
    prop="correct",
    buggy=Twin(dummies_borrow_live_slots),
    fixed=Twin(dummies_dropped),
)
