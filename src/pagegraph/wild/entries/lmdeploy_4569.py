"""LMDeploy #4569: the CUDA-graph runner's static ``block_offsets`` buffer keeps a larger batch's
rows when the batch shrinks (the fix fills padded rows with the reserved block 0).

The graph runner copies the real rows' block offsets into its static input buffer, which
outlives the step, and the captured graph reads the bucket's rows of it. Buggy: nothing resets
the rows past the real batch, so they hold the block ids the last larger batch put there,
blocks that now belong to other requests. Fixed: padded rows are filled with block 0.
"""

from __future__ import annotations

import torch

from ...kernels.batch import BatchContext
from ...kernels.contract import declare_outputs
from ..block_rows import gather_real_rows, persistent_buffer
from ..wild_bug import Fidelity, Twin, WildBug


def offsets_tail_kept(
    block_table: torch.Tensor,
    num_blocks: torch.Tensor,
    idx_mapping: torch.Tensor,
    out: torch.Tensor,
    *,
    batch: BatchContext,
) -> None:
    """Buggy: the real rows are copied into the runner's static buffer; the graph reads the
    bucket's rows of it, the padded ones as an earlier batch left them."""
    static = persistent_buffer(out, "block_offsets")
    gather_real_rows(block_table, num_blocks, idx_mapping, static, batch)
    gather_real_rows(block_table, num_blocks, idx_mapping, out, batch)
    out[batch.num_reqs : batch.num_rows] = static[batch.num_reqs : batch.num_rows]


def offsets_tail_reset(
    block_table: torch.Tensor,
    num_blocks: torch.Tensor,
    idx_mapping: torch.Tensor,
    out: torch.Tensor,
    *,
    batch: BatchContext,
) -> None:
    """Fixed: padded rows are filled with the reserved block 0."""
    gather_real_rows(block_table, num_blocks, idx_mapping, out, batch)
    out[batch.num_reqs : batch.num_rows] = 0


declare_outputs(offsets_tail_kept, "block_table")
declare_outputs(offsets_tail_reset, "block_table")

BUG = WildBug(
    key="lmdeploy-4569",
    engine="LMDeploy",
    version="main, 2026-05 (PyTorch engine, CUDA graphs)",
    ref="InternLM/lmdeploy#4569",
    state="fixed (padded rows filled with block 0)",
    bug_class="a",
    symptom="Wrong or corrupted outputs once a batch shrinks below its captured bucket: "
    "padded rows read blocks that now belong to live requests.",
    cause="The graph runner copied only the real rows' block_offsets into its static buffer; "
    "the tail kept the previous, larger batch's block ids.",
    prop="correct",
    buggy=Twin(offsets_tail_kept),
    fixed=Twin(offsets_tail_reset),
    fidelity=Fidelity(
        modelled="The runner's static block_offsets input buffer, written for the real rows "
        "only, read by the graph over the whole bucket: padded rows carry the last larger "
        "batch's block ids.",
        stands_in=(
            "vLLM-style batch block tables (gather_block_tables) for LMDeploy's block_offsets",
            "the thread itself was not in the stored corpus when this record was written: "
            "modelled from the report as the entry summarises it",
        ),
        fix="Padded rows of the static buffer filled with the reserved block 0 at every step.",
    ),
)
