"""LMDeploy #4569: the block-offsets tail of a shrunk batch keeps the previous step's blocks.

The CUDA-graph runner copied the real rows' block offsets into the bucket's static buffer and
left the padded rows as the last, larger batch had them, so a padded row named blocks that
now belong to other requests. The fix fills padded rows with the reserved block 0.
"""

from __future__ import annotations

from ...kernels.batch import BatchContext
from ..block_rows import gather_real_rows
from ..record import Twin, WildBug


def offsets_tail_kept(block_table, num_blocks, idx_mapping, out, *, batch: BatchContext) -> None:
    """Buggy: only the real rows are written; padded rows keep an earlier batch's blocks."""
    gather_real_rows(block_table, num_blocks, idx_mapping, out, batch)


def offsets_tail_reset(block_table, num_blocks, idx_mapping, out, *, batch: BatchContext) -> None:
    """Fixed: padded rows are filled with the reserved block 0."""
    gather_real_rows(block_table, num_blocks, idx_mapping, out, batch)
    out[batch.num_reqs : batch.num_rows] = 0


offsets_tail_kept.pagegraph_outputs = "block_table"
offsets_tail_reset.pagegraph_outputs = "block_table"

BUG = WildBug(
    key="lmdeploy-4569",
    engine="LMDeploy",
    version="main, 2026-05 (PyTorch engine, CUDA graphs)",
    ref="InternLM/lmdeploy#4569",
    state="fixed (padded rows filled with block 0)",
    bug_class="a",
    symptom="Wrong or corrupted outputs once a batch shrinks below its captured bucket: "
    "padded rows read blocks that now belong to live requests.",
    cause="The graph runner copied only the real rows' block_offsets into the static buffer; "
    "the tail kept the previous, larger batch's block ids.",
    prop="correct",
    buggy=Twin(offsets_tail_kept),
    fixed=Twin(offsets_tail_reset),
)
