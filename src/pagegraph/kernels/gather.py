"""The page gather shared by the page-table and decode-metadata kernels, as Triton device
functions (inlined into each kernel, so each compiles to what a copy in place would).

A program ``(part, g)`` of either kernel owns rows ``first = g * ROWS .. first + ROWS - 1``
and, of each, the blocks ``part, part + C, ...`` of ``BLOCK`` pages (``C`` programs a row
group). ``gather_row_pages`` writes those blocks of both tables; ``count_group_errors`` counts
the group's out-of-contract lengths and request indices (called by part 0 only, so each row is
counted once). The design: docs/ARCHITECTURE.md, "The page-table kernel".
"""

from __future__ import annotations

import triton
import triton.language as tl

from .contract import ERROR_KINDS

# Positions of the error counters, as constexpr globals the device functions can read. The
# decode-metadata counters (``DECODE_ERROR_KINDS``) start with these, in this order.
ERR_OVER_CAPACITY = tl.constexpr(ERROR_KINDS.index("seq_len_over_capacity"))
ERR_NEGATIVE = tl.constexpr(ERROR_KINDS.index("negative_seq_len"))
ERR_BAD_REQ_INDEX = tl.constexpr(ERROR_KINDS.index("req_pool_index_out_of_range"))
ERR_BAD_SWA_INDEX = tl.constexpr(ERROR_KINDS.index("full_to_swa_index_out_of_range"))


@triton.jit
def count_group_errors(  # type: ignore[no-untyped-def]  # a Triton kernel
    errors_ptr,  # [>= len(ERROR_KINDS)] int32 counters
    req_pool_indices_ptr,  # [bs] int32|int64
    group,  # [ROWS] int32: the group's rows
    in_batch,  # [ROWS] bool: group < bs
    group_lens,  # [ROWS] int32|int64: seq_lens of the group (0 past bs)
    over,  # [ROWS] bool: rows whose length passes their capacity
    r2t_rows,
):
    """Add the group's rows over capacity, with a negative length, and with a request index
    outside ``req_to_token`` to their counters."""
    group_reqs = tl.load(req_pool_indices_ptr + group, mask=in_batch, other=0)
    over = over.to(tl.int32)
    negative = (group_lens < 0).to(tl.int32)
    bad_req = ((group_reqs < 0) | (group_reqs >= r2t_rows)).to(tl.int32)
    tl.atomic_add(errors_ptr + ERR_OVER_CAPACITY, tl.sum(over, axis=0))
    tl.atomic_add(errors_ptr + ERR_NEGATIVE, tl.sum(negative, axis=0))
    tl.atomic_add(errors_ptr + ERR_BAD_REQ_INDEX, tl.sum(bad_req, axis=0))


@triton.jit  # type: ignore[untyped-decorator]  # Triton ships no types
def gather_row_pages(  # type: ignore[no-untyped-def]  # a Triton kernel
    req_to_token_ptr,  # [max_reqs, r2t_stride] int32|int64
    req_pool_indices_ptr,  # [bs] int32|int64
    seq_lens_ptr,  # [bs] int32|int64
    page_table_ptr,  # [bs, pt_stride] int32
    swa_page_table_ptr,  # [bs, swa_stride] int32 (aliases page_table_ptr without SWA)
    full_to_swa_ptr,  # [f2s_len] int32|int64 (unused without SWA)
    errors_ptr,  # [>= len(ERROR_KINDS)] int32 (unused without HAS_ERRORS)
    work_ptr,  # [cdiv(bs, ROWS)] int32 loop passes per row group (unused without HAS_WORK)
    r2t_stride,
    r2t_rows,
    pt_stride,
    swa_stride,
    capacity,  # tokens a row can hold
    f2s_len,
    bs,
    draft_tokens,  # int32 tokens added to every length in the batch (unused without HAS_DRAFT)
    part,  # program_id(0): this program's share of the group's blocks
    first,  # the group's first row
    n_blocks,  # blocks of BLOCK pages of the group's longest clamped row
    PAGE_SIZE: tl.constexpr,
    HAS_SWA: tl.constexpr,
    HAS_ERRORS: tl.constexpr,
    ROW_I32: tl.constexpr,  # in-row page arithmetic fits 32 bits (host-checked)
    BLOCK: tl.constexpr,
    UNROLL: tl.constexpr,
    ROWS: tl.constexpr,  # batch rows per program
    HAS_DRAFT: tl.constexpr,
    HAS_WORK: tl.constexpr,  # count loop passes (a testing hook)
):
    """Write pages ``p < n_i`` of blocks ``part, part + C, ...`` of rows ``first ..
    first + ROWS - 1`` (``C = num_programs(0)``), with ``n_i`` the pages of
    ``min(max(seq_lens[i], 0) (+ draft_tokens), capacity)`` tokens: ``page_table[i, p]`` and,
    with ``HAS_SWA``, ``swa_page_table[i, p]``; with ``HAS_ERRORS`` the slots outside
    ``full_to_swa`` are counted."""
    parts = tl.num_programs(0)
    # One tile per pass: for each of the ROWS rows, blocks blk, blk + C, ...,
    # blk + (UNROLL - 1) C, whose loads are all issued before the first store. Kept
    # one-dimensional so that the gather and the store share a register layout (a 2-D tile
    # gets two, and a shared-memory shuffle with barriers between them). Each lane loads its
    # own row's length and request: lanes of one row read one address, one transaction.
    flat = tl.arange(0, ROWS * UNROLL * BLOCK)
    row = first + flat // (UNROLL * BLOCK)
    pos = flat % (UNROLL * BLOCK)
    tile = (pos // BLOCK) * (parts * BLOCK) + pos % BLOCK
    lane_in_batch = row < bs
    seq_len = tl.load(seq_lens_ptr + row, mask=lane_in_batch, other=0)
    req = tl.load(req_pool_indices_ptr + row, mask=lane_in_batch, other=0).to(tl.int64)
    # Clamp, never trust: an index outside req_to_token would read another allocation.
    req = tl.minimum(tl.maximum(req, 0), r2t_rows - 1)
    tokens = tl.minimum(tl.maximum(seq_len, 0), capacity)
    if ROW_I32:
        tokens = tokens.to(tl.int32)
        blk = part
    else:
        tokens = tokens.to(tl.int64)
        tile = tile.to(tl.int64)
        blk = part.to(tl.int64)
    if HAS_DRAFT:
        # Clamping the length before adding the draft tokens gives the same count (both are
        # non-negative) and keeps the add in range. Lanes of rows past bs get none: with them
        # they would write the row after the batch's last one.
        tokens = tl.minimum(tokens + tl.where(lane_in_batch, draft_tokens, 0), capacity)
    n_pages = (tokens + PAGE_SIZE - 1) // PAGE_SIZE

    r2t_row = req_to_token_ptr + req * r2t_stride
    pt_row = page_table_ptr + row.to(tl.int64) * pt_stride
    swa_row = swa_page_table_ptr + row.to(tl.int64) * swa_stride
    # A while loop rather than range(): the bound is a loaded value, and the interpreter
    # accepts only the while form for that.
    while blk < n_blocks:
        pages = blk * BLOCK + tile
        live = pages < n_pages
        slot = tl.load(r2t_row + pages * PAGE_SIZE, mask=live, other=0)
        tl.store(pt_row + pages, (slot // PAGE_SIZE).to(tl.int32), mask=live)
        if HAS_SWA:
            # full_to_swa is indexed by the slot already loaded: one dependent gather a page.
            idx = slot.to(tl.int64)
            idx_clamped = tl.minimum(tl.maximum(idx, 0), f2s_len - 1)
            swa_slot = tl.load(full_to_swa_ptr + idx_clamped, mask=live, other=0)
            tl.store(swa_row + pages, (swa_slot // PAGE_SIZE).to(tl.int32), mask=live)
            if HAS_ERRORS:
                bad = tl.sum((live & (idx != idx_clamped)).to(tl.int32), axis=0)
                tl.atomic_add(errors_ptr + ERR_BAD_SWA_INDEX, bad)
        if HAS_WORK:
            tl.atomic_add(work_ptr + tl.program_id(1), 1)
        blk += parts * UNROLL
