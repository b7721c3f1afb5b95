"""Block-table pieces the corpus's vLLM- and LMDeploy-style builders share."""

from __future__ import annotations

import torch

from ..kernels.batch import BatchContext

__all__ = ["gather_real_rows"]


def gather_real_rows(block_table, num_blocks, idx_mapping, out, batch: BatchContext) -> None:
    """Each real row's live blocks from the per-request table (sync-free torch ops); padded
    rows are left to the caller (``block_table`` ``[max_reqs, width]``, ``out`` ``[>= rows,
    width]`` int32)."""
    max_reqs, width = block_table.shape
    n = batch.num_reqs
    slots = idx_mapping[:n].long().clamp(0, max_reqs - 1)
    cols = torch.arange(width, device=out.device)
    live = cols < num_blocks[slots].long().clamp(0, width)[:, None]
    out[:n] = torch.where(live, block_table[slots], out[:n])
