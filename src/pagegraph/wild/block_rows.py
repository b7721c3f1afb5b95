"""Block-table pieces the corpus's vLLM- and LMDeploy-style builders share."""

from __future__ import annotations

import torch

from ..kernels.batch import BatchContext

__all__ = ["gather_real_rows", "persistent_buffer"]

#: Engine-side buffers that outlive a step, one per output allocation they mirror.
_BUFFERS: dict[tuple[object, ...], torch.Tensor] = {}


def persistent_buffer(out: torch.Tensor, name: str) -> torch.Tensor:
    """The engine's persistent buffer ``name`` laid out as ``out`` (a view of its own
    allocation, the size of ``out``'s): what one step writes there, the next step finds. The
    bed poisons its outputs between replays; an engine's own buffer it never touches."""
    storage = out.untyped_storage()
    key = (name, storage.data_ptr(), storage.nbytes(), out.device, out.dtype)
    buf = _BUFFERS.get(key)
    if buf is None:
        n = storage.nbytes() // out.element_size()
        buf = _BUFFERS[key] = torch.zeros(n, dtype=out.dtype, device=out.device)
    return buf.as_strided(out.shape, out.stride(), out.storage_offset())


def gather_real_rows(
    block_table: torch.Tensor,
    num_blocks: torch.Tensor,
    idx_mapping: torch.Tensor,
    out: torch.Tensor,
    batch: BatchContext,
) -> None:
    """Each real row's live blocks from the per-request table (sync-free torch ops); padded
    rows are left to the caller (``block_table`` ``[max_reqs, width]``, ``out`` ``[>= rows,
    width]`` int32)."""
    max_reqs, width = block_table.shape
    n = batch.num_reqs
    slots = idx_mapping[:n].long().clamp(0, max_reqs - 1)
    cols = torch.arange(width, device=out.device)
    live = cols < num_blocks[slots].long().clamp(0, width)[:, None]
    out[:n] = torch.where(live, block_table[slots], out[:n])
