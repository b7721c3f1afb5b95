"""vLLM #39643: padded rows of the indexer's expanded block table zeroed in column 0 only.

DeepSeek V3.2's sparse-attention indexer expands the batch's block table for the graph;
padded rows were reset in their first column only, so the rest of each padded row kept block
ids of an earlier batch, which the captured kernels then read. The fix zeroes whole rows.
"""

from __future__ import annotations

from ...kernels.batch import BatchContext
from ..block_rows import gather_real_rows
from ..record import Twin, WildBug


def pad_rows_first_column(
    block_table, num_blocks, idx_mapping, out, *, batch: BatchContext
) -> None:
    """Buggy: a padded row's first entry is the null block, the rest stale."""
    gather_real_rows(block_table, num_blocks, idx_mapping, out, batch)
    out[batch.num_reqs : batch.num_rows, 0] = 0


def pad_rows_whole(block_table, num_blocks, idx_mapping, out, *, batch: BatchContext) -> None:
    """Fixed: every entry of a padded row is the null block."""
    gather_real_rows(block_table, num_blocks, idx_mapping, out, batch)
    out[batch.num_reqs : batch.num_rows] = 0


pad_rows_first_column.pagegraph_outputs = "block_table"
pad_rows_whole.pagegraph_outputs = "block_table"

BUG = WildBug(
    key="vllm-39643",
    engine="vLLM",
    version="main, 2026-04 (DeepSeek V3.2 sparse indexer)",
    ref="vllm-project/vllm#39643",
    state="closed (a pull request, not merged as written)",
    bug_class="a",
    symptom="Padded rows of the expanded block table carry stale block ids into the captured "
    "indexer kernels.",
    cause="Padding reset only column 0 of each padded row; the rest kept an earlier batch's "
    "block ids.",
    prop="correct",
    buggy=Twin(pad_rows_first_column),
    fixed=Twin(pad_rows_whole),
)
