"""The KV-cache slot of every token of a batch, on the device in one launch, sync-free and
capturable in a CUDA graph: ``compute_slot_mappings``, a ``"slot_mapping"`` builder (vLLM's).

The grid, ``(rows + 1, parts)``, comes from host shapes only, so a CUDA graph replays one
launch for any token counts: the programs of row ``i < rows`` map its tokens, those of the
last row fill the tail with ``PAD_SLOT_ID``. The engine's guarantees are not trusted (positions,
slots and token ranges are clamped into their buffers). The contract is
``compute_slot_mappings``'s docstring.
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from .contract import _check_tensor, cdiv, declare_outputs

__all__ = ["PAD_SLOT_ID", "SLOT_BLOCK", "compute_slot_mappings", "slot_mapping_parts"]

#: The slot of a token whose cache write must be dropped.
PAD_SLOT_ID = -1
#: Tokens one program maps per pass.
SLOT_BLOCK = 256
#: Most programs a row; a longer row's blocks are shared in turn.
MAX_PARTS = 4


def slot_mapping_parts(max_num_tokens: int) -> int:
    """Programs per batch row for a ``max_num_tokens``-entry slot mapping."""
    return max(1, min(MAX_PARTS, cdiv(max_num_tokens, SLOT_BLOCK)))


def check_slot_mapping_args(
    block_table: Any,
    idx_mapping: Any,
    query_start_loc: Any,
    positions: Any,
    slot_mapping: Any,
    page_size: Any,
) -> None:
    """The ``"slot_mapping"`` contract's host-side checks, from metadata only (never values):
    ``TypeError`` for a wrong type or dtype, ``ValueError`` for a wrong rank, stride, size,
    page size or device, each naming the argument."""
    _check_tensor("block_table", block_table, 2, (torch.int32,))
    _check_tensor("idx_mapping", idx_mapping, 1, (torch.int32,))
    _check_tensor("query_start_loc", query_start_loc, 1, (torch.int32,))
    _check_tensor("positions", positions, 1, (torch.int64,))
    _check_tensor("slot_mapping", slot_mapping, 1, (torch.int64,))
    if isinstance(page_size, bool) or not isinstance(page_size, int) or page_size < 1:
        raise ValueError(f"page_size must be an integer >= 1, got {page_size!r}")
    max_reqs, width = block_table.shape
    if max_reqs == 0 or width == 0:
        raise ValueError(f"block_table must have rows and columns, got {tuple(block_table.shape)}")
    rows = idx_mapping.shape[0]
    if query_start_loc.shape[0] < rows + 1:
        raise ValueError(
            f"query_start_loc has {query_start_loc.shape[0]} entries, rows + 1 = {rows + 1}"
        )
    tensors = (block_table, idx_mapping, query_start_loc, positions, slot_mapping)
    devices = {t.device for t in tensors}
    if len(devices) != 1:
        raise ValueError(f"tensors on several devices: {sorted(map(str, devices))}")


def compute_slot_mappings(
    block_table: torch.Tensor,
    idx_mapping: torch.Tensor,
    query_start_loc: torch.Tensor,
    positions: torch.Tensor,
    slot_mapping: torch.Tensor,
    page_size: int,
) -> None:
    """Fill ``slot_mapping`` in place: the KV-cache slot of every token of the batch.

    ::

        block_table      [max_reqs, width]   int32   per-request block ids (row r: request slot r)
        idx_mapping      [rows]              int32   batch row -> request slot; -1: a padded row
        query_start_loc  [rows + 1]          int32   first token of each row, non-decreasing
        positions        [>= qsl[rows]]      int64   position of each token in its request
        slot_mapping     [max_num_tokens]    int64   written in place
        page_size        int >= 1

    For row ``i`` with slot ``r = idx_mapping[i] >= 0`` and each token ``t`` in ``[qsl[i],
    qsl[i + 1])``: ``slot_mapping[t] = block_table[r, positions[t] // page_size] * page_size +
    positions[t] % page_size``. A padded row's tokens get ``PAD_SLOT_ID`` (-1), and so does
    every ``t`` in ``[qsl[rows], max_num_tokens)``, so that cache writes of padded tokens are
    dropped. Nothing else is written (tokens before ``qsl[0]`` keep what they held).

    The engine guarantees ``0 <= positions[t] < width * page_size`` for real rows,
    ``idx_mapping < max_reqs`` and ``qsl[rows] <= min(max_num_tokens, len(positions))``; they
    are not trusted: a position is clamped into ``[0, width * page_size)``, a slot to
    ``max_reqs - 1``, every token range into ``[0, min(max_num_tokens, len(positions)))`` (the
    tail into ``[0, max_num_tokens)``). A slot is computed in 64 bits. No host sync, no
    allocation, one launch whose grid comes from shapes only: legal in CUDA-graph capture."""
    check_slot_mapping_args(
        block_table, idx_mapping, query_start_loc, positions, slot_mapping, page_size
    )
    max_num_tokens = slot_mapping.shape[0]
    if max_num_tokens == 0:
        return
    rows = idx_mapping.shape[0]
    grid = (rows + 1, slot_mapping_parts(max_num_tokens))
    _slot_mapping_kernel[grid](
        block_table,
        idx_mapping,
        query_start_loc,
        positions,
        slot_mapping,
        block_table.stride(0),
        block_table.shape[0],
        block_table.shape[1] * page_size,
        max_num_tokens,
        min(max_num_tokens, positions.shape[0]),
        PAGE_SIZE=page_size,
        PAD_ID=PAD_SLOT_ID,
        BLOCK=SLOT_BLOCK,
    )


declare_outputs(compute_slot_mappings, "slot_mapping")


@triton.jit  # type: ignore[untyped-decorator]  # Triton ships no types
def _slot_mapping_kernel(  # type: ignore[no-untyped-def]  # a Triton kernel
    block_table_ptr,  # [max_reqs, bt_stride] int32
    idx_mapping_ptr,  # [rows] int32
    qsl_ptr,  # [rows + 1] int32
    positions_ptr,  # [num_positions] int64
    slot_mapping_ptr,  # [max_num_tokens] int64
    bt_stride,
    max_reqs,
    row_tokens,  # width * PAGE_SIZE: the positions a row's blocks cover
    max_num_tokens,
    token_limit,  # min(max_num_tokens, len(positions)): real tokens are read and written below
    PAGE_SIZE: tl.constexpr,
    PAD_ID: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    part = tl.program_id(1)
    parts = tl.num_programs(1)
    lanes = tl.arange(0, BLOCK)
    if row == tl.num_programs(0) - 1:
        # The tail past the batch's tokens: padded tokens must not write the cache.
        t = tl.minimum(tl.maximum(tl.load(qsl_ptr + row), 0), max_num_tokens) + part * BLOCK
        while t < max_num_tokens:
            offs = t + lanes
            pad = tl.full([BLOCK], PAD_ID, dtype=tl.int64)
            tl.store(slot_mapping_ptr + offs, pad, mask=offs < max_num_tokens)
            t += parts * BLOCK
    else:
        start = tl.minimum(tl.maximum(tl.load(qsl_ptr + row), 0), token_limit)
        end = tl.minimum(tl.maximum(tl.load(qsl_ptr + row + 1), 0), token_limit)
        req = tl.load(idx_mapping_ptr + row).to(tl.int64)
        real = req >= 0
        # A padded row owns no blocks: its row is never read (the clamp keeps the address
        # inside the table anyway).
        req = tl.minimum(tl.maximum(req, 0), max_reqs - 1)
        bt_row = block_table_ptr + req * bt_stride
        t = start + part * BLOCK
        while t < end:
            offs = t + lanes
            live = offs < end
            pos = tl.load(positions_ptr + offs, mask=live, other=0)
            pos = tl.minimum(tl.maximum(pos, 0), row_tokens - 1)
            block = tl.load(bt_row + pos // PAGE_SIZE, mask=live & real, other=0)
            slot = block.to(tl.int64) * PAGE_SIZE + pos % PAGE_SIZE
            tl.store(slot_mapping_ptr + offs, tl.where(real, slot, PAD_ID), mask=live)
            t += parts * BLOCK
