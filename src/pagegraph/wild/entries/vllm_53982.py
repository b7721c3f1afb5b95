"""vLLM #53982 (and #56469): the generic slot-mapping kernel maps a one-block ring group's raw
positions.

Modelled over the scenario's KV-cache groups (a full-attention group and the ring): the
generic mapping reads the per-request tables as the kernel does, ``position // block_size`` as
a column through the flat allocation at ``row * stride + column`` with no width mask; the bed's
allocation ends one spare row past the last request slot, so a column past it reads the
allocation's last entry (on a GPU, a fault). One defect, two reports: the QSA ring (#53982) and
GLM's kpool tail (#56469), whose spec inherits from the sliding-window one and so still went
through the generic kernel. The fixed twin follows the merged #57317: ring groups are mapped by
their own builder, never by the generic kernel.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ...kernels.contract import declare_outputs
from ...kernels.group_slot_mappings import RingGroup
from ...kernels.slot_mapping import PAD_SLOT_ID
from ..wild_bug import Fidelity, Twin, WildBug


def flat_table(block_table: torch.Tensor) -> torch.Tensor:
    """``block_table``'s whole allocation from its first entry, flat (a view: the kernel's
    pointer arithmetic reaches any of it)."""
    n = block_table.untyped_storage().nbytes() // block_table.element_size()
    return block_table.as_strided((n - block_table.storage_offset(),), (1,))


def map_slots(
    block_table: torch.Tensor,
    idx_mapping: torch.Tensor,
    query_start_loc: torch.Tensor,
    positions: torch.Tensor,
    slot_mapping: torch.Tensor,
    page_size: int,
    *,
    column: Callable[[torch.Tensor], torch.Tensor],
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
    block_table: torch.Tensor,
    idx_mapping: torch.Tensor,
    query_start_loc: torch.Tensor,
    positions: torch.Tensor,
    slot_mapping: torch.Tensor,
    page_size: int,
    *,
    group: RingGroup | None = None,
) -> None:
    """Buggy: ``pos // block_size`` as the column on every group, the ring included (the
    generic kernel run on a group whose spec does not opt out of it)."""
    map_slots(
        block_table,
        idx_mapping,
        query_start_loc,
        positions,
        slot_mapping,
        page_size,
        column=lambda pos: pos // page_size,
    )


def ring_by_its_own_builder(
    block_table: torch.Tensor,
    idx_mapping: torch.Tensor,
    query_start_loc: torch.Tensor,
    positions: torch.Tensor,
    slot_mapping: torch.Tensor,
    page_size: int,
    *,
    group: RingGroup | None = None,
) -> None:
    """Fixed (#57317): a ring group (one circular block a request) is taken out of the
    generic kernel and mapped by its own builder, ``own_block * block_size + pos %
    block_size``; every other group keeps the generic mapping."""
    own = group is not None and group.ring
    map_slots(
        block_table,
        idx_mapping,
        query_start_loc,
        positions,
        slot_mapping,
        page_size,
        column=torch.zeros_like if own else (lambda pos: pos // page_size),
    )


declare_outputs(generic_on_every_group, "slot_mapping")
declare_outputs(ring_by_its_own_builder, "slot_mapping")

BUG = WildBug(
    key="vllm-53982",
    engine="vLLM",
    version="main 94d96e24 (MI325X, ROCm 7.2.3); v0.28.1rc1.dev580 (B300, H200); GLM-5.3-Flash "
    "kpool tail (#56469)",
    ref="vllm-project/vllm#53982",
    state="open (the kpool-tail fix #57317 merged; guard PR #54296 open)",
    bug_class="d",
    symptom="Memory access faults (an illegal memory access on CUDA) on every rank once "
    "sequences grow long enough; the out-of-bounds read grows with the sequence length.",
    cause="The generic slot-mapping kernel takes position // block_size as a column of a "
    "one-block ring group's row (QSA ring, GLM's kpool tail, whose spec inherits from the "
    "sliding-window one) with no check against the row's width: it reads the next requests' "
    "rows, and the cache writes go through the poisoned slots.",
    prop="correct",
    buggy=Twin(generic_on_every_group),
    fixed=Twin(ring_by_its_own_builder),
    fidelity=Fidelity(
        modelled="The generic kernel's unmasked load at row * stride + pos // block_size of a "
        "one-block ring group, reading past the row into the next rows of the allocation.",
        stands_in=(
            "the allocation's last entry for a read past its end (on a GPU, the fault)",
            "a QSA-like ring of one 64-token block for the QSA ring and GLM's 4-token kpool tail",
        ),
        fix="#57317 (merged, for the kpool tail): ring groups are taken out of the generic "
        "kernel and mapped by their own builder (own block * block_size + pos % block_size). "
        "Not followed: the guard of #54296 (open), which maps columns past the row to "
        "PAD_SLOT_ID and so drops the ring's writes the bed's contract counts as live.",
        refs=("vllm-project/vllm#56469", "vllm-project/vllm#57317", "vllm-project/vllm#54296"),
    ),
)
