"""Oracles of the ``"block_table"`` and ``"slot_mapping"`` kinds: plain Python over host copies,
row by row, written to be obviously correct rather than fast (they read device values, so
they sync, and a test or the verifier calls them outside any graph).

Both follow their kind's contract (``pagegraph.kernels.block_table`` and
``pagegraph.kernels.slot_mapping``) and extend it to broken host guarantees exactly as
pagegraph's builders do (every index and count clamped into its table), so that a builder
and its oracle agree on any input, hostile or not.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

import torch

from .batch import BatchContext
from .contract import declare_outputs
from .slot_mapping import PAD_SLOT_ID

if TYPE_CHECKING:
    from .group_slot_mappings import RingGroup

__all__ = [
    "reference_block_table",
    "reference_group_slot_mapping",
    "reference_ring_slot_mapping",
    "reference_slot_mapping",
]


def _clamp(value: int, lo: int, hi: int) -> int:
    return max(lo, min(value, hi))


def reference_block_table(
    block_table: torch.Tensor,
    num_blocks: torch.Tensor,
    idx_mapping: torch.Tensor,
    out: torch.Tensor,
    *,
    batch: BatchContext,
) -> None:
    """What a ``"block_table"`` builder must write into ``out`` (shapes as
    ``gather_block_tables``): real row ``i`` gets the first ``num_blocks[r]`` entries of
    ``block_table[r]``, ``r = idx_mapping[i]`` (both clamped into the table); padded rows
    ``num_reqs .. num_rows - 1`` are zeroed over the width; nothing else is written."""
    max_reqs, width = block_table.shape
    table = block_table.cpu().tolist()
    counts = num_blocks.cpu().tolist()
    slots = idx_mapping[: batch.num_reqs].cpu().tolist()
    for i, slot in enumerate(slots):
        r = _clamp(slot, 0, max_reqs - 1)
        n = _clamp(counts[r], 0, width)
        if n:
            out[i, :n] = torch.tensor(table[r][:n], dtype=torch.int32)
    for i in range(cast(int, batch.num_reqs), batch.num_rows):
        out[i, :width] = 0


declare_outputs(reference_block_table, "block_table")


def reference_slot_mapping(
    block_table: torch.Tensor,
    idx_mapping: torch.Tensor,
    query_start_loc: torch.Tensor,
    positions: torch.Tensor,
    slot_mapping: torch.Tensor,
    page_size: int,
    *,
    ring: bool = False,
) -> None:
    """What a ``"slot_mapping"`` builder must write into ``slot_mapping`` (shapes as
    ``compute_slot_mappings``): each token ``t`` of row ``i`` gets
    ``block_table[r, pos // page_size] * page_size + pos % page_size`` with ``r =
    idx_mapping[i]`` and ``pos = positions[t]``, or ``PAD_SLOT_ID`` when ``r < 0``; tokens
    ``qsl[rows] .. max_num_tokens - 1`` get ``PAD_SLOT_ID``; nothing else is written.

    Broken guarantees, as the builder treats them: ``r`` is clamped below ``max_reqs``,
    ``pos`` into ``[0, width * page_size)``, each row's tokens into ``[0, min(max_num_tokens,
    len(positions)))`` and the tail's start into ``[0, max_num_tokens]``. Rows are written
    in order, then the tail (a ``query_start_loc`` that decreases makes rows overlap, and
    the builders' order of writes is then not defined).

    ``ring``: the table is a ring group's (``pagegraph.check.pipeline.group_checks``): its ``width``
    blocks are used in turn, so a position past ``width * page_size`` is in the contract and
    goes to column ``(pos // page_size) % width`` (a negative position is still clamped to 0).
    """
    max_reqs, width = block_table.shape
    rows = idx_mapping.shape[0]
    max_num_tokens = slot_mapping.shape[0]
    limit = min(max_num_tokens, positions.shape[0])
    table = block_table.cpu().tolist()
    slots = idx_mapping.cpu().tolist()
    qsl = query_start_loc[: rows + 1].cpu().tolist()
    pos_all = positions.cpu().tolist()
    values = slot_mapping.cpu().tolist()
    for i in range(rows):
        start = _clamp(qsl[i], 0, limit)
        end = _clamp(qsl[i + 1], 0, limit)
        for t in range(start, end):
            if slots[i] < 0:
                values[t] = PAD_SLOT_ID
                continue
            r = min(slots[i], max_reqs - 1)
            if ring:
                pos = max(pos_all[t], 0)
                col = (pos // page_size) % width
            else:
                pos = _clamp(pos_all[t], 0, width * page_size - 1)
                col = pos // page_size
            values[t] = table[r][col] * page_size + pos % page_size
    for t in range(_clamp(qsl[rows], 0, max_num_tokens), max_num_tokens):
        values[t] = PAD_SLOT_ID
    slot_mapping.copy_(torch.tensor(values, dtype=torch.int64))


declare_outputs(reference_slot_mapping, "slot_mapping")


def reference_ring_slot_mapping(
    block_table: torch.Tensor,
    idx_mapping: torch.Tensor,
    query_start_loc: torch.Tensor,
    positions: torch.Tensor,
    slot_mapping: torch.Tensor,
    page_size: int,
) -> None:
    """``reference_slot_mapping`` of a ring group's table (``ring=True``)."""
    reference_slot_mapping(
        block_table, idx_mapping, query_start_loc, positions, slot_mapping, page_size, ring=True
    )


declare_outputs(reference_ring_slot_mapping, "slot_mapping")


def reference_group_slot_mapping(
    block_table: torch.Tensor,
    idx_mapping: torch.Tensor,
    query_start_loc: torch.Tensor,
    positions: torch.Tensor,
    slot_mapping: torch.Tensor,
    page_size: int,
    *,
    group: RingGroup | None = None,
) -> None:
    """What the slot mapping of KV-cache group ``group`` must be (a
    ``pagegraph.kinds.kv_group_layout.KVGroup``, or ``None``: a single group): the ring's on a ring
    group, ``reference_slot_mapping``'s on any other."""
    reference_slot_mapping(
        block_table,
        idx_mapping,
        query_start_loc,
        positions,
        slot_mapping,
        page_size,
        ring=group is not None and group.ring,
    )


declare_outputs(reference_group_slot_mapping, "slot_mapping")
