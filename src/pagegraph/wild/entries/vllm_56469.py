"""vLLM #56469: the GLM kpool tail, a one-block ring, still went through the generic kernel.

Modelled over the scenario's KV-cache groups (two full-attention groups of different block
sizes and widths around a kpool tail of one 4-token block): the runner's dispatch picks, per
group, the generic mapping (a column of ``pos // block_size`` through the flat allocation, as
``vllm_53982`` reads it) or the group's own, ``own_block * kpool + pos % kpool``. Buggy: the
dispatch asks whether the group is, or inherits from, a sliding-window kind, which the kpool
tail does; fixed: builder-managed (ring) groups are excluded first.
"""

from __future__ import annotations

import torch

from ..record import Twin, WildBug
from .vllm_53982 import map_slots

#: Group kinds whose specs derive from the sliding-window spec in the modelled engine: the
#: kpool tail is a ring that inherits from it.
SLIDING_FAMILY = ("sliding", "ring")


def _uses_generic(group, *, exclude_builder_managed: bool) -> bool:
    """Whether the runner sends ``group`` through the generic kernel."""
    if group is None:
        return True
    if exclude_builder_managed and group.ring:
        return False
    return group.kind == "full" or group.kind in SLIDING_FAMILY


def _dispatch(*, exclude_builder_managed: bool):
    def build(
        block_table, idx_mapping, query_start_loc, positions, slot_mapping, page_size, *, group=None
    ) -> None:
        if _uses_generic(group, exclude_builder_managed=exclude_builder_managed):
            column = lambda pos: pos // page_size  # noqa: E731 - the generic kernel's column
        else:  # the kpool tail's builder: its own block, the offset in it
            column = torch.zeros_like
        map_slots(
            block_table,
            idx_mapping,
            query_start_loc,
            positions,
            slot_mapping,
            page_size,
            column=column,
        )

    build.__name__ = build.__qualname__ = (
        "kpool_tail_own_mapping" if exclude_builder_managed else "kpool_tail_through_generic"
    )
    build.pagegraph_outputs = "slot_mapping"
    return build


BUG = WildBug(
    key="vllm-56469",
    engine="vLLM",
    version="GLM-5.3-Flash on ROCm gfx942 (TP4); confirmed on CUDA (H20, TP4)",
    ref="vllm-project/vllm#56469",
    state="open (the equivalent #57317 merged)",
    bug_class="d",
    symptom="The GLM-5.3-Flash worker crashes on chunked prefills past about 40K tokens "
    "(memory access fault, EngineDeadError) inside _compute_slot_mappings_kernel.",
    cause="KpoolTailSpec inherits from the sliding-window spec, so the generic slot-mapping "
    "kernel still ran on the one-block kpool tail and mapped position // block_size against "
    "its one-column row: a wild block id.",
    prop="correct",
    buggy=Twin(_dispatch(exclude_builder_managed=False)),
    fixed=Twin(_dispatch(exclude_builder_managed=True)),
)
