"""Mutants of the ``"block_table"`` and ``"slot_mapping"`` kinds: sync-free torch builders with one
realistic bug each, built on one correct base (``plain_block_table``, ``plain_slot_mapping``,
controls with pagegraph's builders of the kinds), the bug named in the docstring's first line.

``BLOCK_TABLE_BUGS`` and ``SLOT_MAPPING_BUGS`` map names to builders, ``BLOCK_TABLE_MUTANTS``
and ``SLOT_MAPPING_MUTANTS`` are the zoo's records. ``int32_slot`` stays out of the zoo: it
needs slot ids past 2^31, which no real KV cache reaches (the kind's own tests keep it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..kernels.batch import BatchContext
from ..kernels.block_table import gather_block_tables
from ..kernels.contract import declare_outputs
from ..kernels.slot_mapping import PAD_SLOT_ID, compute_slot_mappings
from .mutant import Mutant, Zoo

__all__ = [
    "BLOCK_TABLE_BUGS",
    "BLOCK_TABLE_CONTROLS",
    "BLOCK_TABLE_MUTANTS",
    "SLOT_MAPPING_BUGS",
    "SLOT_MAPPING_CONTROLS",
    "SLOT_MAPPING_MUTANTS",
    "SLOT_MAPPING_ZOO",
    "BLOCK_TABLE_ZOO",
    "plain_block_table",
    "plain_slot_mapping",
    "reset_caches",
]

# The first num_reqs each frozen mutant saw, by its output buffer.
_frozen_num_reqs: dict[tuple[int, int], int] = {}


def _torch_block_table(
    block_table: Any, num_blocks: Any, idx_mapping: Any, out: Any, batch: Any, *, bug: str = ""
) -> None:
    """The ``"block_table"`` contract in sync-free torch ops, with one ``bug`` switched in."""
    max_reqs, width = block_table.shape
    num_reqs, num_rows = batch.num_reqs, batch.num_rows
    if bug == "num_reqs_frozen":
        num_reqs = min(_frozen_num_reqs.setdefault((out.data_ptr(), num_rows), num_reqs), num_rows)
    if bug == "rows_to_max_bs":
        num_rows = min(batch.max_bs, out.shape[0])
    cols = torch.arange(width, device=out.device)
    slots = idx_mapping[:num_reqs].long().clamp(0, max_reqs - 1)
    if bug == "num_blocks_by_batch_row":
        counts = num_blocks[torch.arange(num_reqs, device=out.device).clamp(max=max_reqs - 1)]
    else:
        counts = num_blocks[slots]
    live = cols < counts.long().clamp(0, width)[:, None]
    if bug == "copies_whole_row":
        live = torch.ones_like(live)
    out[:num_reqs] = torch.where(live, block_table[slots], out[:num_reqs])
    if bug == "pad_rows_not_cleared":
        return
    if bug == "pad_rows_cleared_to_stale_count":
        # Padded rows cleared up to the live count of the slot their stale idx_mapping entry
        # names: the tail past it keeps an old request's block ids.
        stale = idx_mapping[num_reqs:num_rows].long().clamp(0, max_reqs - 1)
        n = stale.shape[0]
        keep = cols >= num_blocks[stale].long()[:, None]
        out[num_reqs : num_reqs + n] = torch.where(keep, out[num_reqs : num_reqs + n], 0)
        return
    out[num_reqs:num_rows] = 0
    if bug == "num_blocks_unclamped":
        _spill_past_width(block_table, out, slots, counts)


def _flat(t: torch.Tensor) -> torch.Tensor:
    """Every element of ``t``'s storage from its first one on, as a 1-D view."""
    room = t.untyped_storage().nbytes() // t.element_size() - t.storage_offset()
    return t.as_strided((room,), (1,))


def _spill_past_width(block_table: Any, out: Any, slots: Any, counts: Any) -> None:
    """What a gather that trusts ``num_blocks`` does past the width (vLLM's): entries ``width
    <= p < count`` of a row read on through the per-request table's storage and land on
    through the batch table's, in the next row. Within the storages only (at most a row past);
    each row's spill has its own span, so the indexed write has no duplicate index."""
    width = block_table.shape[1]
    src, dst = _flat(block_table), _flat(out)
    past = torch.arange(width, 2 * width, device=out.device)
    rows = torch.arange(slots.shape[0], device=out.device)
    s_idx = (slots[:, None] * block_table.stride(0) + past).clamp(max=src.shape[0] - 1)
    d_idx = (rows[:, None] * out.stride(0) + past).clamp(max=dst.shape[0] - 1)
    spill = past < counts.long()[:, None]
    dst[d_idx] = torch.where(spill, src[s_idx], dst[d_idx])


def _block_table_mutant(bug: str, doc: str) -> Callable[..., object]:
    def builder(
        block_table: Any, num_blocks: Any, idx_mapping: Any, out: Any, *, batch: BatchContext
    ) -> None:
        _torch_block_table(block_table, num_blocks, idx_mapping, out, batch, bug=bug)

    builder.__doc__ = doc
    builder.__name__ = builder.__qualname__ = bug
    declare_outputs(builder, "block_table")
    return builder


def plain_block_table(
    block_table: Any, num_blocks: Any, idx_mapping: Any, out: Any, *, batch: BatchContext
) -> None:
    """The ``"block_table"`` contract in sync-free torch ops: the mutants' base, correct."""
    _torch_block_table(block_table, num_blocks, idx_mapping, out, batch)


declare_outputs(plain_block_table, "block_table")


def _torch_slot_mapping(
    block_table: Any,
    idx_mapping: Any,
    qsl: Any,
    positions: Any,
    slot_mapping: Any,
    page_size: Any,
    *,
    bug: str = "",
) -> None:
    """The ``"slot_mapping"`` contract in sync-free torch ops, with one ``bug`` switched in.
    Each token finds its row by a search of ``query_start_loc``."""
    max_reqs, width = block_table.shape
    rows, total = idx_mapping.shape[0], slot_mapping.shape[0]
    dev = slot_mapping.device
    t = torch.arange(total, device=dev, dtype=torch.int64)
    limit = min(total, positions.shape[0])
    qsl = qsl[: rows + 1].long()
    row = torch.searchsorted(qsl, t, right=True) - 1
    in_rows = (row >= 0) & (row < rows) & (t < limit)
    slot = idx_mapping[row.clamp(0, max(rows - 1, 0))].long() if rows else t.new_full((total,), -1)
    real = slot >= 0
    if bug != "pad_row_unguarded":
        slot = slot.clamp(0, max_reqs - 1)  # a -1 left alone indexes the table's last row
    pos = positions[t.clamp(max=max(positions.shape[0] - 1, 0))].long()
    pos = pos.clamp(0, width * page_size - 1)
    block = (pos // width if bug == "block_by_width" else pos // page_size).clamp(0, width - 1)
    ids = block_table[slot, block]
    if bug == "int32_slot":
        value = (ids * page_size).long() + pos % page_size  # the product wraps in 32 bits
    else:
        value = ids.long() * page_size + pos % page_size
    if bug != "pad_row_unguarded":
        value = torch.where(real, value, PAD_SLOT_ID)
    value = torch.where(in_rows, value, slot_mapping)
    if bug != "no_tail":
        tail_start = rows if bug == "tail_from_rows" else qsl[rows].clamp(0, total)
        value = torch.where(t >= tail_start, PAD_SLOT_ID, value)
    slot_mapping.copy_(value)


def _slot_mapping_mutant(bug: str, doc: str) -> Callable[..., object]:
    def builder(
        block_table: Any,
        idx_mapping: Any,
        query_start_loc: Any,
        positions: Any,
        slot_mapping: Any,
        page_size: Any,
    ) -> None:
        _torch_slot_mapping(
            block_table, idx_mapping, query_start_loc, positions, slot_mapping, page_size, bug=bug
        )

    builder.__doc__ = doc
    builder.__name__ = builder.__qualname__ = bug
    declare_outputs(builder, "slot_mapping")
    return builder


def plain_slot_mapping(
    block_table: Any,
    idx_mapping: Any,
    query_start_loc: Any,
    positions: Any,
    slot_mapping: Any,
    page_size: Any,
) -> None:
    """The ``"slot_mapping"`` contract in sync-free torch ops: the mutants' base, correct."""
    _torch_slot_mapping(
        block_table, idx_mapping, query_start_loc, positions, slot_mapping, page_size
    )


declare_outputs(plain_slot_mapping, "slot_mapping")

BLOCK_TABLE_BUGS: dict[str, Callable[..., object]] = {
    f.__name__: f
    for f in [
        _block_table_mutant("pad_rows_not_cleared",
                            "Padded rows not cleared: they keep an earlier batch's block ids."),
        _block_table_mutant("pad_rows_cleared_to_stale_count",
                            "Padded rows cleared only up to the live count of the slot their "
                            "stale idx_mapping entry names."),
        _block_table_mutant("copies_whole_row",
                            "The whole row copied, num_blocks ignored: the stale tail too."),
        _block_table_mutant("num_reqs_frozen",
                            "num_reqs cached at the first call for an output buffer (a host "
                            "value frozen at warm-up)."),
        _block_table_mutant("num_blocks_by_batch_row",
                            "num_blocks read by batch row instead of by request slot."),
        _block_table_mutant("rows_to_max_bs",
                            "Padded rows written up to max_bs instead of num_rows."),
        _block_table_mutant("num_blocks_unclamped",
                            "num_blocks trusted past the width (as vLLM's gather does): a count "
                            "past the row's capacity spills into the next row."),
    ]
}  # fmt: skip

SLOT_MAPPING_BUGS: dict[str, Callable[..., object]] = {
    f.__name__: f
    for f in [
        _slot_mapping_mutant("no_tail",
                             "Tokens past query_start_loc[rows] not set to PAD_SLOT_ID."),
        _slot_mapping_mutant("tail_from_rows",
                             "The PAD fill starts at token `rows` (one token a row assumed), "
                             "not at query_start_loc[rows]."),
        _slot_mapping_mutant("pad_row_unguarded",
                             "A padded row's index -1 used unguarded: it reads a block-table "
                             "row and writes real slots."),
        _slot_mapping_mutant("block_by_width",
                             "The block index as position // width, not position // page_size."),
        _slot_mapping_mutant("int32_slot",
                             "block_id * page_size computed in 32 bits: slots past 2^31 wrap."),
    ]
}  # fmt: skip


def reset_caches() -> None:
    """Forget what the host-value mutants cached."""
    _frozen_num_reqs.clear()


#: Mutant -> the property it must fail (what the kill table shows).
BLOCK_TABLE_KILLS = {
    "pad_rows_not_cleared": "correct (padded rows cleared to the null block)",
    "pad_rows_cleared_to_stale_count": "correct (padded rows cleared over the width)",
    "copies_whole_row": "bounded writes (past num_blocks)",
    "num_reqs_frozen": "correct (num_reqs, a host value, frozen at the first call)",
    "num_blocks_by_batch_row": "correct (num_blocks read by batch row)",
    "rows_to_max_bs": "bounded writes (rows past the bucket)",
    "num_blocks_unclamped": "row containment (num_blocks past the width: hostile scenarios)",
}
SLOT_MAPPING_KILLS = {
    "no_tail": "correct (the tail past query_start_loc[rows] filled with PAD_SLOT_ID)",
    "tail_from_rows": "correct (the tail starts at query_start_loc[rows]; draft tokens)",
    "pad_row_unguarded": "correct (a padded row's index -1)",
    "block_by_width": "correct (block index position // page_size)",
}


def _records(bugs: dict[str, Callable[..., object]], kills: dict[str, str]) -> dict[str, Mutant]:
    """The zoo's records of ``kills``' bugs, every one able to die on a CPU; each is caught
    by the property its ``killed_by`` text starts with."""
    return {
        name: Mutant(name, bugs[name], True, why, kills=(why.split(" (")[0],))
        for name, why in kills.items()
    }


BLOCK_TABLE_MUTANTS = _records(BLOCK_TABLE_BUGS, BLOCK_TABLE_KILLS)
SLOT_MAPPING_MUTANTS = _records(SLOT_MAPPING_BUGS, SLOT_MAPPING_KILLS)
#: The kinds' correct builders, run as controls.
BLOCK_TABLE_CONTROLS: dict[str, Callable[..., object]] = {
    "gather_block_tables": gather_block_tables,
    "plain_block_table": plain_block_table,
}
SLOT_MAPPING_CONTROLS: dict[str, Callable[..., object]] = {
    "compute_slot_mappings": compute_slot_mappings,
    "plain_slot_mapping": plain_slot_mapping,
}
#: The kinds' zoos (``pagegraph.mutants.zoo.ZOOS``).
BLOCK_TABLE_ZOO = Zoo(BLOCK_TABLE_MUTANTS, BLOCK_TABLE_CONTROLS, reset_caches)
SLOT_MAPPING_ZOO = Zoo(SLOT_MAPPING_MUTANTS, SLOT_MAPPING_CONTROLS, reset_caches)
