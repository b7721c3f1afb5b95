"""Slot mappings over vLLM's KV-cache groups (``pagegraph.check.pipeline.group_checks``): a
group's own mapping, as vLLM's runner gives each group its mapping.

``ring_slot_mappings`` maps a ring group (vLLM's ``CircularBufferSpec`` and ``KpoolTailSpec``):
a request holds ``width`` blocks, used in turn, so position ``pos`` goes to ``block_table[r,
(pos // page_size) % width] * page_size + pos % page_size``; every other rule is the
``"slot_mapping"`` contract's. ``compute_group_slot_mappings`` takes ``group=``: the ring's
mapping on a ring group, ``compute_slot_mappings`` on any other. Both are sync-free torch ops.
"""

from __future__ import annotations

from typing import Protocol

import torch

from .contract import declare_outputs
from .slot_mapping import PAD_SLOT_ID, compute_slot_mappings

__all__ = ["compute_group_slot_mappings", "ring_slot_mappings"]


class RingGroup(Protocol):
    """What a slot mapping reads of a KV-cache group (``pagegraph.kinds.kv_group_layout.KVGroup``,
    a layer above): whether its table is a ring."""

    @property
    def ring(self) -> bool: ...


def ring_slot_mappings(
    block_table: torch.Tensor,
    idx_mapping: torch.Tensor,
    query_start_loc: torch.Tensor,
    positions: torch.Tensor,
    slot_mapping: torch.Tensor,
    page_size: int,
) -> None:
    """A ring group's slot mapping into ``slot_mapping`` (the module docstring). Shapes and
    dtypes as ``compute_slot_mappings``: ``block_table`` ``[max_reqs, width]`` int32 (the
    ring's blocks of each request), ``idx_mapping`` ``[rows]`` int32, ``query_start_loc``
    ``[rows + 1]`` int32, ``positions`` int64, ``slot_mapping`` ``[max_num_tokens]`` int64."""
    max_reqs, width = block_table.shape
    rows, total = idx_mapping.shape[0], slot_mapping.shape[0]
    t = torch.arange(total, device=slot_mapping.device, dtype=torch.int64)
    qsl = query_start_loc[: rows + 1].long()
    row = torch.searchsorted(qsl, t, right=True) - 1
    in_rows = (row >= 0) & (row < rows) & (t < positions.shape[0])
    slot = idx_mapping[row.clamp(0, max(rows - 1, 0))].long()
    real = slot >= 0
    pos = positions[t.clamp(max=max(positions.shape[0] - 1, 0))].long().clamp(min=0)
    ids = block_table[slot.clamp(0, max_reqs - 1), (pos // page_size) % width]
    value = torch.where(real, ids.long() * page_size + pos % page_size, PAD_SLOT_ID)
    value = torch.where(in_rows, value, slot_mapping)
    value = torch.where(t >= qsl[rows].clamp(0, total), PAD_SLOT_ID, value)
    slot_mapping.copy_(value)


declare_outputs(ring_slot_mappings, "slot_mapping")


def compute_group_slot_mappings(
    block_table: torch.Tensor,
    idx_mapping: torch.Tensor,
    query_start_loc: torch.Tensor,
    positions: torch.Tensor,
    slot_mapping: torch.Tensor,
    page_size: int,
    *,
    group: RingGroup | None = None,
) -> None:
    """The slot mapping of KV-cache group ``group`` (a ``pagegraph.kinds.kv_group_layout.KVGroup``,
    or ``None``: a single group): the ring's own on a ring group, else
    ``compute_slot_mappings``."""
    mapper = ring_slot_mappings if group is not None and group.ring else compute_slot_mappings
    mapper(block_table, idx_mapping, query_start_loc, positions, slot_mapping, page_size)


declare_outputs(compute_group_slot_mappings, "slot_mapping")
