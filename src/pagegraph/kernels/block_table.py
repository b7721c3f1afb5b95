"""The batch's block table gathered from the engine's per-request tables, on the device in one
launch, sync-free: ``gather_block_tables``, a ``"block_table"`` builder (vLLM's layout).

The grid, ``(num_rows, parts)``, comes from host sizes only, so the launch is the same for any
values on the device; a real row's copy follows its live blocks, a padded row is zeroed over
its width. The engine's guarantees (counts within the width, slots within the table) are not
trusted: both are clamped, so broken metadata stays inside its own row. The contract is
``gather_block_tables``'s docstring.
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from .batch import BatchContext
from .contract import _check_tensor, cdiv, declare_outputs

__all__ = ["GATHER_BLOCK", "gather_block_tables", "gather_parts"]

#: Entries one program copies per pass.
GATHER_BLOCK = 256
#: Most programs a row; a wider row's blocks are shared in turn.
MAX_PARTS = 8


def gather_parts(width: int) -> int:
    """Programs per batch row for a table ``width`` entries wide."""
    return max(1, min(MAX_PARTS, cdiv(width, GATHER_BLOCK)))


def check_block_table_args(
    block_table: Any, num_blocks: Any, idx_mapping: Any, out: Any, batch: Any
) -> None:
    """The ``"block_table"`` contract's host-side checks, from metadata only (never values):
    ``TypeError`` for a wrong type or dtype, ``ValueError`` for a wrong rank, stride, size or
    device, each naming the argument."""
    if not isinstance(batch, BatchContext):
        raise TypeError(f"batch must be a BatchContext, got {type(batch).__name__}")
    if batch.num_reqs is None:
        raise ValueError(
            "batch.num_reqs is None: a block_table builder runs eagerly, told the real batch size"
        )
    _check_tensor("block_table", block_table, 2, (torch.int32,))
    _check_tensor("num_blocks", num_blocks, 1, (torch.int32,))
    _check_tensor("idx_mapping", idx_mapping, 1, (torch.int32,))
    _check_tensor("out", out, 2, (torch.int32,))
    max_reqs, width = block_table.shape
    if max_reqs == 0:
        raise ValueError("block_table has no request rows")
    if num_blocks.shape[0] != max_reqs:
        raise ValueError(
            f"num_blocks has {num_blocks.shape[0]} entries, block_table {max_reqs} rows"
        )
    if idx_mapping.shape[0] < batch.num_reqs:
        raise ValueError(
            f"idx_mapping has {idx_mapping.shape[0]} entries, num_reqs = {batch.num_reqs}"
        )
    if out.shape[1] != width:
        raise ValueError(f"out is {out.shape[1]} wide, block_table {width}")
    if out.shape[0] < batch.num_rows:
        raise ValueError(f"out has {out.shape[0]} rows, num_rows = {batch.num_rows}")
    devices = {t.device for t in (block_table, num_blocks, idx_mapping, out)}
    if len(devices) != 1:
        raise ValueError(f"tensors on several devices: {sorted(map(str, devices))}")


def gather_block_tables(
    block_table: torch.Tensor,
    num_blocks: torch.Tensor,
    idx_mapping: torch.Tensor,
    out: torch.Tensor,
    *,
    batch: BatchContext,
) -> None:
    """Fill ``out[:batch.num_rows]`` in place, from the per-request tables.

    ::

        block_table   [max_reqs, width]     int32   per-request block ids (row r: request slot r)
        num_blocks    [max_reqs]            int32   live blocks of each request slot
        idx_mapping   [>= num_reqs]         int32   batch row -> request slot
        out           [>= num_rows, width]  int32   the persistent batch table, written in place
        batch         BatchContext                  num_reqs, num_rows, max_bs (host ints)

    For a real row ``i < num_reqs`` with slot ``r = idx_mapping[i]`` and ``n = num_blocks[r]``:
    ``out[i, p] = block_table[r, p]`` for ``p < n``; entries ``p >= n`` keep what they held (a
    stale tail, bounded by ``num_blocks`` in every consumer). A padded row ``num_reqs <= i <
    num_rows`` is zeroed over its width (the null block). Nothing else is written: not rows
    ``>= num_rows``, not columns past ``width`` in a table whose row stride is larger. The
    engine guarantees ``0 <= n <= width`` and ``0 <= r < max_reqs``; they are not trusted:
    ``n`` is clamped to ``[0, width]`` and ``r`` to ``[0, max_reqs)``. No host sync, no
    allocation, one launch (none for an empty bucket or a zero width)."""
    check_block_table_args(block_table, num_blocks, idx_mapping, out, batch)
    width = block_table.shape[1]
    if batch.num_rows == 0 or width == 0:
        return
    grid = (batch.num_rows, gather_parts(width))
    _gather_kernel[grid](
        block_table,
        num_blocks,
        idx_mapping,
        out,
        block_table.stride(0),
        out.stride(0),
        block_table.shape[0],
        width,
        batch.num_reqs,
        BLOCK=GATHER_BLOCK,
    )


declare_outputs(gather_block_tables, "block_table")


@triton.jit(do_not_specialize=["num_reqs"])  # type: ignore[untyped-decorator]  # Triton ships no types
def _gather_kernel(  # type: ignore[no-untyped-def]  # a Triton kernel
    block_table_ptr,  # [max_reqs, src_stride] int32
    num_blocks_ptr,  # [max_reqs] int32
    idx_mapping_ptr,  # [>= num_reqs] int32
    out_ptr,  # [>= num_rows, out_stride] int32
    src_stride,
    out_stride,
    max_reqs,
    width,
    num_reqs,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    part = tl.program_id(1)
    parts = tl.num_programs(1)
    # 64-bit row offsets: max_reqs * width may pass 2^31 entries in a large engine.
    dst = out_ptr + row.to(tl.int64) * out_stride
    lanes = tl.arange(0, BLOCK)
    if row >= num_reqs:
        # Padding: the whole width to the null block, nothing past it.
        start = part * BLOCK
        while start < width:
            cols = start + lanes
            tl.store(dst + cols, tl.zeros([BLOCK], dtype=tl.int32), mask=cols < width)
            start += parts * BLOCK
    else:
        # Clamp, never trust: a slot or a count outside the table would read or write
        # another request's row.
        req = tl.load(idx_mapping_ptr + row).to(tl.int64)
        req = tl.minimum(tl.maximum(req, 0), max_reqs - 1)
        n = tl.load(num_blocks_ptr + req)
        n = tl.minimum(tl.maximum(n, 0), width)
        src = block_table_ptr + req * src_stride
        start = part * BLOCK
        while start < n:
            cols = start + lanes
            live = cols < n
            tl.store(dst + cols, tl.load(src + cols, mask=live, other=0), mask=live)
            start += parts * BLOCK
