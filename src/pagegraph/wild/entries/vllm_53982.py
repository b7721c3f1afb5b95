"""vLLM #53982: the generic slot-mapping kernel maps a one-block ring group's raw positions.

Modelled over the scenario's KV-cache groups (a full-attention group and the ring): the
generic mapping reads the per-request tables as the kernel does, ``position // block_size`` as
a column through the flat allocation at ``row * stride + column`` with no width mask; the bed's
allocation ends one spare row past the last request slot, so a column past it reads the
allocation's last entry (on a GPU, a fault). The fixed twin maps the ring modulo its width.
"""

from __future__ import annotations

import torch

from ...kernels.slot_mapping import PAD_SLOT_ID
from ..record import Twin, WildBug


def flat_table(block_table: torch.Tensor) -> torch.Tensor:
    """``block_table``'s whole allocation from its first entry, flat (a view: the kernel's
    pointer arithmetic reaches any of it)."""
    n = block_table.untyped_storage().nbytes() // block_table.element_size()
    return block_table.as_strided((n - block_table.storage_offset(),), (1,))


def map_slots(
    block_table, idx_mapping, query_start_loc, positions, slot_mapping, page_size, *, column
) -> None:
    """Each token's slot through the flat table (sync-free torch ops): ``column(pos)`` is the
    column its block is read from; a padded row (index -1) and the tail get ``PAD_SLOT_ID``."""
    rows, total = idx_mapping.shape[0], slot_mapping.shape[0]
    t = torch.arange(total, device=slot_mapping.device, dtype=torch.int64)
    qsl = query_start_loc[: rows + 1].long()
    row = torch.searchsorted(qsl, t, right=True) - 1
    in_rows = (row >= 0) & (row < rows)
    slot = idx_mapping[row.clamp(0, rows - 1)].long()
    pos = positions[t.clamp(max=positions.shape[0] - 1)].long().clamp(min=0)
    flat = flat_table(block_table)
    at = (slot.clamp(min=0) * block_table.stride(0) + column(pos)).clamp(max=flat.shape[0] - 1)
    value = torch.where(slot >= 0, flat[at].long() * page_size + pos % page_size, PAD_SLOT_ID)
    value = torch.where(in_rows, value, slot_mapping)
    slot_mapping.copy_(torch.where(t >= qsl[rows], PAD_SLOT_ID, value))


def generic_on_every_group(
    block_table, idx_mapping, query_start_loc, positions, slot_mapping, page_size, *, group=None
) -> None:
    """Buggy: ``pos // block_size`` as the column on every group, the ring included."""
    map_slots(
        block_table,
        idx_mapping,
        query_start_loc,
        positions,
        slot_mapping,
        page_size,
        column=lambda pos: pos // page_size,
    )


def ring_mapped_modulo(
    block_table, idx_mapping, query_start_loc, positions, slot_mapping, page_size, *, group=None
) -> None:
    """Fixed: a ring group's column is ``(pos // block_size) % width``."""
    ring = group is not None and group.ring
    width = block_table.shape[1]
    map_slots(
        block_table,
        idx_mapping,
        query_start_loc,
        positions,
        slot_mapping,
        page_size,
        column=lambda pos: (pos // page_size) % width if ring else pos // page_size,
    )


generic_on_every_group.pagegraph_outputs = "slot_mapping"
ring_mapped_modulo.pagegraph_outputs = "slot_mapping"

BUG = WildBug(
    key="vllm-53982",
    engine="vLLM",
    version="main 94d96e24 (MI325X, ROCm 7.2.3); v0.28.1rc1.dev580 (B300, H200)",
    ref="vllm-project/vllm#53982",
    state="open (guard PR #54296 open)",
    bug_class="d",
    symptom="Memory access faults (an illegal memory access on CUDA) on every rank once "
    "sequences grow long enough; the out-of-bounds read grows with the sequence length.",
    cause="_compute_slot_mapping_kernel takes position // block_size as a column of a "
    "one-block ring group's row with no check against the row's width: it reads the next "
    "requests' rows, and the cache writes go through the poisoned slots.",
    prop="correct",
    buggy=Twin(generic_on_every_group),
    fixed=Twin(ring_mapped_modulo),
)
