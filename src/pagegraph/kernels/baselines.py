"""The block-grid baseline: the rejected design of the page-table kernel, kept to measure against.

``block_grid`` launches a fixed grid ``(bs, cdiv(width, BLOCK_GRID_PAGES))`` of 64-page blocks
over the whole static width: its work is bounded by the real lengths, but its program count,
and so its cost, follows the width of the table. It is graph-safe, sync-free and exact (the
contract and outputs of ``build_page_table``, SWA included, ``errors`` ignored), so the checker
accepts it (``pagegraph check --builder block_grid``) and the bench times it beside the kernel.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import cast

import torch
import triton
import triton.language as tl

from .contract import cdiv, check_builder_args

__all__ = ["BLOCK_GRID_PAGES", "BLOCK_GRID_WARPS", "block_grid"]

#: Pages per program of the fixed block grid, and warps per program.
BLOCK_GRID_PAGES = 64
BLOCK_GRID_WARPS = 2


def block_grid(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    page_table: torch.Tensor,
    page_size: int,
    *,
    swa_page_table: torch.Tensor | None = None,
    full_to_swa: torch.Tensor | None = None,
    errors: torch.Tensor | None = None,
) -> None:
    """The rejected design, as a baseline: a fixed grid ``(bs, cdiv(width, 64))`` of 64-page
    blocks covering the whole static width. Each program loads its row's ``seq_len`` and exits
    when its block starts past the row's page count, so the work is bounded, but the number
    of programs is ``bs * width / 64`` whatever the lengths.

    Same contract and outputs as ``pagegraph.build_page_table`` (SWA included; the width is
    clamped, so an overlong ``seq_len`` stays in its row). ``errors`` is accepted and ignored.
    Shapes as ``build_page_table``: ``req_to_token [max_reqs, ctx]`` int32/int64,
    ``req_pool_indices [bs]`` and ``seq_lens [bs]`` int32/int64, ``page_table [bs, width]``
    int32 written in place, ``full_to_swa [num_slots + 1]`` int32/int64.
    """
    check_builder_args(
        req_to_token,
        req_pool_indices,
        seq_lens,
        page_table,
        page_size,
        swa_page_table,
        full_to_swa,
        errors,
        builder="block_grid",
        cpu_ok=False,
    )
    bs, width = page_table.shape
    max_pages = min(width, cdiv(req_to_token.shape[1], page_size))
    if bs == 0 or max_pages == 0:
        return
    has_swa = full_to_swa is not None
    # Unused pointer arguments alias page_table: the HAS_SWA constexpr compiles them out.
    swa_pt = cast(torch.Tensor, swa_page_table) if has_swa else page_table
    f2s = cast(torch.Tensor, full_to_swa) if has_swa else page_table
    grid = (bs, cdiv(max_pages, BLOCK_GRID_PAGES))
    # A device context costs host time: enter one only when not on that device already.
    dev = page_table.device
    switch = dev.type == "cuda" and dev.index != torch.cuda.current_device()
    with torch.cuda.device(dev) if switch else nullcontext():
        _block_grid_kernel[grid](
            req_to_token,
            req_pool_indices,
            seq_lens,
            page_table,
            swa_pt,
            f2s,
            req_to_token.stride(0),
            req_to_token.shape[0],
            page_table.stride(0),
            swa_pt.stride(0),
            max_pages,
            page_size,
            f2s.shape[0],
            HAS_SWA=has_swa,
            BLOCK=BLOCK_GRID_PAGES,
            num_warps=BLOCK_GRID_WARPS,
        )


@triton.jit  # type: ignore[untyped-decorator]  # Triton ships no types
def _block_grid_kernel(  # type: ignore[no-untyped-def]  # a Triton kernel
    req_to_token_ptr,  # [max_reqs, r2t_stride] int32|int64
    req_pool_indices_ptr,  # [bs] int32|int64
    seq_lens_ptr,  # [bs] int32|int64
    page_table_ptr,  # [bs, pt_stride] int32
    swa_page_table_ptr,  # [bs, swa_stride] int32 (aliases page_table_ptr without SWA)
    full_to_swa_ptr,  # [f2s_len] int32|int64 (unused without SWA)
    r2t_stride,
    r2t_rows,
    pt_stride,
    swa_stride,
    max_pages,  # min(width, cdiv(req_to_token.shape[1], page_size))
    page_size,
    f2s_len,
    HAS_SWA: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    start = tl.program_id(1).to(tl.int64) * BLOCK
    seq_len = tl.load(seq_lens_ptr + row).to(tl.int64)
    # Clamped to the width: the guard alone (seq_len) would let an overlong row spill into
    # the next one, which is what the contract forbids.
    n_pages = tl.minimum((tl.maximum(seq_len, 0) + page_size - 1) // page_size, max_pages)
    if start >= n_pages:
        return
    req = tl.load(req_pool_indices_ptr + row).to(tl.int64)
    req = tl.minimum(tl.maximum(req, 0), r2t_rows - 1)
    pages = start + tl.arange(0, BLOCK)
    live = pages < n_pages
    slot = tl.load(req_to_token_ptr + req * r2t_stride + pages * page_size, mask=live, other=0)
    pt_row = page_table_ptr + row.to(tl.int64) * pt_stride
    tl.store(pt_row + pages, (slot // page_size).to(tl.int32), mask=live)
    if HAS_SWA:
        idx = tl.minimum(tl.maximum(slot.to(tl.int64), 0), f2s_len - 1)
        swa_slot = tl.load(full_to_swa_ptr + idx, mask=live, other=0)
        swa_row = swa_page_table_ptr + row.to(tl.int64) * swa_stride
        tl.store(swa_row + pages, (swa_slot // page_size).to(tl.int32), mask=live)
