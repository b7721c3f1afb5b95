"""The mutant zoo's part for vLLM's two kinds (``block_table``, ``slot_mapping``): which
property each mutant must fail, and the kinds' controls. The mutants themselves are built on
one plain-torch base beside pagegraph's builders of the kinds
(``pagegraph.kernels.vllm_mutants``); ``pagegraph.check.mutants`` merges them into
``MUTANTS`` and ``CONTROLS``.

The slot-mapping ``int32_slot`` mutant is left out: it needs slot ids past 2^31, which no
pool of a real KV cache reaches (it stays in the kind's own tests).
"""

from __future__ import annotations

from collections.abc import Callable

from ..kernels.block_table import gather_block_tables
from ..kernels.slot_mapping import compute_slot_mappings
from ..kernels.vllm_mutants import (
    BLOCK_TABLE_MUTANTS,
    SLOT_MAPPING_MUTANTS,
    plain_block_table,
    plain_slot_mapping,
)
from ..kernels.vllm_mutants import reset_caches as reset_vllm_caches

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

#: The correct builders of the two kinds, run as controls.
VLLM_CONTROLS: dict[str, Callable] = {
    "gather_block_tables": gather_block_tables,
    "plain_block_table": plain_block_table,
    "compute_slot_mappings": compute_slot_mappings,
    "plain_slot_mapping": plain_slot_mapping,
}


def vllm_mutants(mutant: type) -> dict:
    """The two kinds' mutants as the zoo's ``Mutant`` records, every one able to die on a
    CPU; each is caught by the property its ``killed_by`` text starts with."""

    def record(name: str, builder, killed_by: str):
        return mutant(name, builder, True, killed_by, kills=(killed_by.split(" (")[0],))

    found = {name: record(name, BLOCK_TABLE_MUTANTS[name], why)
             for name, why in BLOCK_TABLE_KILLS.items()}  # fmt: skip
    found.update({name: record(name, SLOT_MAPPING_MUTANTS[name], why)
                  for name, why in SLOT_MAPPING_KILLS.items()})  # fmt: skip
    return found


__all__ = ["BLOCK_TABLE_KILLS", "SLOT_MAPPING_KILLS", "VLLM_CONTROLS", "reset_vllm_caches",
           "vllm_mutants"]  # fmt: skip
