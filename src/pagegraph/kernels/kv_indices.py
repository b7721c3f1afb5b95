"""The CSR page list of a decode batch (FlashInfer's ``kv_indptr`` / ``kv_indices`` format),
built on the device in one launch, sync-free: ``build_kv_indices``, the ``"csr"`` kind's builder.

The grid, ``(bs, parts)``, is static for given buffers, so a CUDA graph replays it for any
lengths: each program sums the clamped page counts of the rows before its own (no second
launch, no scan buffer), then copies its share of its row's pages. The contract is
``build_kv_indices``'s docstring; docs/ARCHITECTURE.md ("The CSR contract") has the design.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .contract import INDEX_DTYPES, _check_tensor, cdiv, declare_outputs

__all__ = ["KV_INDICES_BLOCK", "build_kv_indices", "kv_indices_parts"]

#: Pages one program copies per pass.
KV_INDICES_BLOCK = 256
#: Most programs a row: past this, a long row's blocks are shared in turn.
MAX_PARTS = 8
#: Rows summed per pass of a program's offset scan.
SCAN = 128
_INT32_MAX = 2**31 - 1


def kv_indices_parts(row_pages: int) -> int:
    """Programs per batch row for rows of at most ``row_pages`` pages."""
    return max(1, min(MAX_PARTS, cdiv(row_pages, KV_INDICES_BLOCK)))


def build_kv_indices(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    page_size: int,
    *,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
) -> None:
    """Fill ``kv_indptr[: bs + 1]`` and ``kv_indices[: kv_indptr[bs]]`` in place.

    ::

        req_to_token      [max_reqs, cols]   int32 | int64   slot of each token
        req_pool_indices  [bs]               int32 | int64   request row of each batch row
        seq_lens          [bs]               int32 | int64   tokens of each batch row
        page_size         int >= 1
        kv_indptr         [>= bs + 1]        int32           written: kv_indptr[0 .. bs]
        kv_indices        [capacity]         int32           written: kv_indices[0 : kv_indptr[bs]]

    Row ``i`` owns ``n_i = min(cdiv(max(seq_lens[i], 0), page_size), cdiv(cols, page_size))``
    pages; ``kv_indptr[i + 1] = min(n_0 + ... + n_i, capacity)`` (a batch that would pass the
    end of ``kv_indices`` is cut there, never written past it) and ``kv_indices[kv_indptr[i] +
    p] = req_to_token[req_pool_indices[i], p * page_size] // page_size``. Entries past
    ``kv_indptr[bs]`` keep what they held: a consumer bounds its reads by ``kv_indptr``.
    ``kv_indptr[0] = 0`` is written too, also for an empty batch (an engine that presets it
    loses nothing). No host sync, no allocation: safe inside CUDA-graph capture, one launch,
    one compilation for every batch size."""
    _check_tensor("req_to_token", req_to_token, 2, INDEX_DTYPES)
    _check_tensor("req_pool_indices", req_pool_indices, 1, INDEX_DTYPES)
    _check_tensor("seq_lens", seq_lens, 1, INDEX_DTYPES)
    _check_tensor("kv_indptr", kv_indptr, 1, (torch.int32,))
    _check_tensor("kv_indices", kv_indices, 1, (torch.int32,))
    bs = seq_lens.shape[0]
    if req_pool_indices.shape[0] != bs:
        raise ValueError(f"req_pool_indices has {req_pool_indices.shape[0]} rows, seq_lens {bs}")
    if kv_indptr.shape[0] < bs + 1:
        raise ValueError(f"kv_indptr has {kv_indptr.shape[0]} entries, bs + 1 = {bs + 1} needed")
    if isinstance(page_size, bool) or not isinstance(page_size, int) or page_size < 1:
        raise ValueError(f"page_size must be an integer >= 1, got {page_size!r}")
    if kv_indices.shape[0] > _INT32_MAX:
        raise ValueError("kv_indices has more entries than an int32 kv_indptr can address")
    devices = {t.device for t in (req_to_token, req_pool_indices, seq_lens, kv_indptr, kv_indices)}
    if len(devices) != 1:
        raise ValueError(f"tensors on several devices: {sorted(map(str, devices))}")
    if bs == 0:
        kv_indptr[:1].zero_()  # a device fill: no sync, capturable
        return
    row_pages = cdiv(req_to_token.shape[1], page_size)
    grid = (bs, kv_indices_parts(row_pages))
    _kv_indices_kernel[grid](
        req_to_token,
        req_pool_indices,
        seq_lens,
        kv_indptr,
        kv_indices,
        req_to_token.stride(0),
        req_to_token.shape[0],
        row_pages,
        kv_indices.shape[0],
        PAGE_SIZE=page_size,
        BLOCK=KV_INDICES_BLOCK,
        SCAN=SCAN,
    )


declare_outputs(build_kv_indices, "csr")


@triton.jit(do_not_specialize=["capacity"])  # type: ignore[untyped-decorator]  # Triton ships no types
def _kv_indices_kernel(  # type: ignore[no-untyped-def]  # a Triton kernel
    req_to_token_ptr,  # [r2t_rows, r2t_stride] int32|int64
    req_pool_indices_ptr,  # [bs] int32|int64
    seq_lens_ptr,  # [bs] int32|int64
    kv_indptr_ptr,  # [>= bs + 1] int32
    kv_indices_ptr,  # [capacity] int32
    r2t_stride,
    r2t_rows,
    row_pages,  # pages a request row can supply: cdiv(cols, PAGE_SIZE)
    capacity,
    PAGE_SIZE: tl.constexpr,
    BLOCK: tl.constexpr,
    SCAN: tl.constexpr,
):
    row = tl.program_id(0)
    part = tl.program_id(1)
    parts = tl.num_programs(1)
    # Tokens past the pages a row can supply are clamped before the page count: an int64
    # length near 2^63 would overflow the rounding up.
    # (row_pages * PAGE_SIZE < cols + PAGE_SIZE fits 32 bits; the lengths are int64.)
    row_tokens = row_pages * PAGE_SIZE
    # The row's offset: the clamped page counts of the rows before it.
    acc = tl.zeros([SCAN], dtype=tl.int64)
    start = 0
    while start < row:
        j = start + tl.arange(0, SCAN)
        before = j < row
        lens = tl.load(seq_lens_ptr + j, mask=before, other=0).to(tl.int64)
        pages = (tl.minimum(tl.maximum(lens, 0), row_tokens) + PAGE_SIZE - 1) // PAGE_SIZE
        acc += tl.where(before, pages, 0)
        start += SCAN
    offset = tl.minimum(tl.sum(acc, axis=0), capacity)
    length = tl.load(seq_lens_ptr + row).to(tl.int64)
    n = (tl.minimum(tl.maximum(length, 0), row_tokens) + PAGE_SIZE - 1) // PAGE_SIZE
    n = tl.minimum(n, capacity - offset)  # never past the end of kv_indices
    if part == 0:
        tl.store(kv_indptr_ptr + row + 1, (offset + n).to(tl.int32))
        if row == 0:
            tl.store(kv_indptr_ptr, 0)
    # Clamp, never trust: an index outside req_to_token would read another allocation.
    req = tl.load(req_pool_indices_ptr + row).to(tl.int64)
    req = tl.minimum(tl.maximum(req, 0), r2t_rows - 1)
    r2t_row = req_to_token_ptr + req * r2t_stride
    out = kv_indices_ptr + offset
    blk = part.to(tl.int64)
    while blk * BLOCK < n:
        p = blk * BLOCK + tl.arange(0, BLOCK)
        live = p < n
        slot = tl.load(r2t_row + p * PAGE_SIZE, mask=live, other=0)
        tl.store(out + p, (slot // PAGE_SIZE).to(tl.int32), mask=live)
        blk += parts
