"""vLLM #39643: DeepSeek V3.2's indexer reuses its expanded block-table buffer across steps and
resets a padded row's column 0 only (the pull request zeroes whole padded rows).

``_expand_decode()`` writes the expanded block table (each decode token its request's row) into
a persistent buffer of the metadata builder; when the batch shrinks, the rows past the real
ones are padding, and only their first column was zeroed: columns 1 and up keep the block ids
a previous, larger step's expansion wrote, which the captured kernels then read.
"""

from __future__ import annotations

import torch

from ...kernels.batch import BatchContext
from ...kernels.contract import declare_outputs
from ..block_rows import gather_real_rows, persistent_buffer
from ..wild_bug import Fidelity, Twin, WildBug


def pad_rows_first_column(
    block_table: torch.Tensor,
    num_blocks: torch.Tensor,
    idx_mapping: torch.Tensor,
    out: torch.Tensor,
    *,
    batch: BatchContext,
) -> None:
    """Buggy: the builder's persistent buffer gets the real rows, a padded row's column 0 the
    null block; the kernels read the bucket's rows of it."""
    expanded = persistent_buffer(out, "expanded_block_table")
    gather_real_rows(block_table, num_blocks, idx_mapping, expanded, batch)
    expanded[batch.num_reqs : batch.num_rows, 0] = 0
    gather_real_rows(block_table, num_blocks, idx_mapping, out, batch)
    out[batch.num_reqs : batch.num_rows] = expanded[batch.num_reqs : batch.num_rows]


def pad_rows_whole(
    block_table: torch.Tensor,
    num_blocks: torch.Tensor,
    idx_mapping: torch.Tensor,
    out: torch.Tensor,
    *,
    batch: BatchContext,
) -> None:
    """Fixed: every entry of a padded row is the null block."""
    gather_real_rows(block_table, num_blocks, idx_mapping, out, batch)
    out[batch.num_reqs : batch.num_rows] = 0


declare_outputs(pad_rows_first_column, "block_table")
declare_outputs(pad_rows_whole, "block_table")

BUG = WildBug(
    key="vllm-39643",
    engine="vLLM",
    version="main, 2026-04 (DeepSeek V3.2 sparse indexer)",
    ref="vllm-project/vllm#39643",
    state="closed (a pull request, not merged as written)",
    bug_class="a",
    symptom="Padded rows of the expanded block table carry stale block ids into the captured "
    "indexer kernels: silent output corruption during decode.",
    cause="_expand_decode() reused its persistent buffer across steps and zeroed only column 0 "
    "of the padded rows; columns 1 and up kept an earlier, larger step's block ids.",
    prop="correct",
    buggy=Twin(pad_rows_first_column),
    fixed=Twin(pad_rows_whole),
    fidelity=Fidelity(
        modelled="The metadata builder's persistent expanded-block-table buffer, reused across "
        "steps, its padded rows reset in column 0 only.",
        stands_in=(
            "one row a request (vLLM's batch block tables) for the expansion of one row a "
            "decode token (repeat_interleave over the query lengths)",
        ),
        fix="#39643 (closed, not merged as written): zero the whole padded rows of the buffer.",
    ),
)
