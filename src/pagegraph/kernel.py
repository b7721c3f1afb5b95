"""The sync-free page-table builder: one Triton kernel, SWA in the same pass.

``build_page_table`` fills, for every batch row ``i`` and page ``p < n_i`` with
``n_i = min(cdiv(seq_lens[i], page_size), width)``::

    slot                 = req_to_token[req_pool_indices[i], p * page_size]
    page_table[i, p]     = slot // page_size
    swa_page_table[i, p] = full_to_swa[slot] // page_size

and writes nothing else. ``seq_lens`` is read on the device, so the call needs no host sync,
allocates nothing, and is legal inside CUDA-graph capture.

Design: a row-owned grid whose cost follows the live pages
-----------------------------------------------------------
The grid is ``(bs, C)``: ``C`` programs own each batch row, and program ``j`` of row ``i`` walks
that row's page blocks ``j, j + C, j + 2C, ...`` up to the row's own ``n_i`` (a loop with a
data-dependent bound). Consequences:

* Work is bounded by the real lengths. A row of 100 tokens in a 2048-page table costs one
  masked block in one program, and the other ``C - 1`` programs of that row exit after two
  scalar loads. The number of programs, ``bs * C``, depends on the batch size and the static
  width (host metadata), never on the lengths, and ``C`` is capped so the grid stays within
  a few waves of resident programs (``TARGET_PROGRAMS``) instead of growing as ``bs * width``.
  (A fixed grid of page blocks covering the whole width launches ``bs * width / block``
  programs, nearly all of them empty when lengths are short.)
* A row never writes outside itself: ``n_i`` is clamped to the width of the table, and to the
  pages ``req_to_token`` can supply, before any store, so an overlong ``seq_len`` (speculative
  draft tokens, dummy runs) cannot spill into the next request's row.
* Long rows are split across ``C`` programs, so one 1M-token request does not serialise on a
  single program while the rest of the batch is short.
* SWA costs one extra dependent gather per live page, in the same program: ``full_to_swa`` is
  indexed by the slot already loaded for the full table.

Index arithmetic is 64-bit wherever ``index * stride`` can pass 2^31 (request row offsets,
page starts inside a row, ``full_to_swa`` indices).

Out-of-contract values are clamped on the device, never trusted: a ``req_pool_index`` outside
``req_to_token`` is clamped into it, a slot outside ``full_to_swa`` is clamped to its ends, and
a negative ``seq_len`` writes nothing. With the optional ``errors`` buffer the kernel also
counts them (see ``pagegraph.contract.ERROR_KINDS``); without it that code is compiled out.

What is specialised (and so compiled separately)
------------------------------------------------
``HAS_SWA``, ``HAS_ERRORS`` and ``BLOCK`` are constexprs; the dtypes of the index tensors are
part of the signature; Triton's default integer and pointer specialisation applies (an int
argument equal to 1, such as ``page_size=1``, or divisible by 16; a pointer 16-byte aligned).
Nothing depends on the batch size or on any value: the batch size is the grid, so every CUDA
graph bucket of one static buffer reuses one compiled kernel.

Launch cost
-----------
``kernel[grid](...)`` spends tens of microseconds in Python binding and hashing arguments. The
launcher keeps each compiled kernel under a key that is at least as fine as Triton's own
specialisation (dtypes, flags, the 1 / 16-divisible / 64-bit classes of every int, 16-byte
alignment of every pointer) and calls its low-level ``run`` directly on later calls; the first
call of each key goes through the normal JIT path, which compiles and returns the kernel.
"""

from __future__ import annotations

from contextlib import nullcontext

import torch
import triton
import triton.language as tl

from .contract import ERROR_KINDS, cdiv, check_builder_args, interpreter_active

#: Pages handled by one program per loop iteration, and the cap on ``bs * C`` when choosing
#: programs per row. Chosen by ``pagegraph bench --tune`` on an H200 (profiles/bench/NOTES.md):
#: small blocks and many programs keep more independent page-start loads in flight, which is
#: what a gather of scattered 32-byte sectors needs; 256 / 8192 / 4 warps was fastest or
#: within noise of the fastest on every tuned config.
BLOCK_PAGES = 256
TARGET_PROGRAMS = 8192
NUM_WARPS = 4

# Positions of the error counters, as constexpr globals the kernel can read.
ERR_OVER_CAPACITY = tl.constexpr(ERROR_KINDS.index("seq_len_over_capacity"))
ERR_NEGATIVE = tl.constexpr(ERROR_KINDS.index("negative_seq_len"))
ERR_BAD_REQ_INDEX = tl.constexpr(ERROR_KINDS.index("req_pool_index_out_of_range"))
ERR_BAD_SWA_INDEX = tl.constexpr(ERROR_KINDS.index("full_to_swa_index_out_of_range"))


def programs_per_row(bs: int, max_pages: int, block: int | None = None) -> int:
    """Programs that share one row: enough to split the widest possible row into blocks,
    capped so the whole grid stays near ``TARGET_PROGRAMS``. Host metadata only."""
    block = block or BLOCK_PAGES
    return max(1, min(cdiv(max_pages, block), TARGET_PROGRAMS // max(bs, 1)))


def build_page_table(
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
    """Fill ``page_table[:bs]`` (and ``swa_page_table``) in place from device-side lengths.

    Args:
        req_to_token: ``[max_reqs, max_context_len]`` int32/int64, inner stride 1.
        req_pool_indices: ``[bs]`` int32/int64, request row of each batch row.
        seq_lens: ``[bs]`` int32/int64, tokens of each batch row (read on the device).
        page_table: ``[bs, width]`` int32, inner stride 1; only live entries are written.
        page_size: tokens per page, ``>= 1``.
        swa_page_table: ``[bs, width]`` int32, given together with ``full_to_swa``.
        full_to_swa: ``[num_slots + 1]`` int32/int64, SWA slot of each full slot.
        errors: optional ``[len(ERROR_KINDS)]`` int32 counters, incremented (never reset) on
            the device for out-of-contract values; see ``pagegraph.contract.ERROR_KINDS``.

    No host sync, no allocation: safe inside CUDA-graph capture.
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
        builder="build_page_table",
        cpu_ok=False,
    )
    bs, width = page_table.shape
    # Pages a row of req_to_token can supply: a wider table must not read past that row.
    max_pages = min(width, cdiv(req_to_token.shape[1], page_size))
    if bs == 0 or max_pages == 0:
        return
    has_swa = full_to_swa is not None
    has_errors = errors is not None
    # Unused pointer arguments alias page_table: never dereferenced (the constexpr flags
    # compile those paths out), and aliasing keeps the signature free of None.
    swa_pt = swa_page_table if has_swa else page_table
    f2s = full_to_swa if has_swa else page_table
    err = errors if has_errors else page_table
    tensors = (req_to_token, req_pool_indices, seq_lens, page_table, swa_pt, f2s, err)
    ints = (
        req_to_token.stride(0),
        req_to_token.shape[0],
        page_table.stride(0),
        swa_pt.stride(0),
        max_pages,
        page_size,
        # Without SWA a constant, not the aliased table's row count: an int argument that
        # followed the batch size would be specialised (1, multiple of 16) per bucket.
        full_to_swa.shape[0] if has_swa else 1,
    )
    grid = (bs, programs_per_row(bs, max_pages))
    _launch(grid, tensors, ints, has_swa, has_errors)


# -- launcher ---------------------------------------------------------------------------------

#: Compiled kernels by launch key (see ``_launch``).
_compiled: dict[tuple, object] = {}


def _hooks_active() -> bool:
    """Whether Triton launch hooks are installed (a profiler, say): then the normal launch
    path runs, so they see every launch. Triton 3.6 keeps them in (possibly empty) chains."""
    runtime = triton.knobs.runtime
    for hook in (runtime.launch_enter_hook, runtime.launch_exit_hook):
        if hook is not None and getattr(hook, "calls", True):
            return True
    return False


def _launch(grid, tensors: tuple, ints: tuple, has_swa: bool, has_errors: bool) -> None:
    device = tensors[3].device
    if device.type != "cuda":  # Triton interpreter: no compiled kernel to cache.
        _jit_launch(grid, tensors, ints, has_swa, has_errors)
        return
    ptrs = [t.data_ptr() for t in tensors]
    # At least as fine as Triton's own specialisation: dtypes, 16-byte alignment of every
    # pointer, and for every int whether it is 1, a multiple of 16, or past 32 bits. Same
    # key, same compiled kernel, so the cached one is exactly what Triton would pick.
    aligned = 0
    for i, p in enumerate(ptrs):
        aligned |= (p % 16 == 0) << i
    key = (
        device.index,
        has_swa,
        has_errors,
        BLOCK_PAGES,
        NUM_WARPS,
        tensors[0].dtype,
        tensors[1].dtype,
        tensors[2].dtype,
        tensors[5].dtype,
        aligned,
        tuple((v == 1) | (v % 16 == 0) << 1 | (not -(2**31) <= v < 2**31) << 2 for v in ints),
    )
    kernel = _compiled.get(key)
    # Launch on the tensors' device; entering a device context costs microseconds, so only
    # when it is not the current one already.
    switch = device.index != torch._C._cuda_getDevice()
    with torch.cuda.device(device) if switch else nullcontext():
        if kernel is None or _hooks_active():
            # Triton's own path: compiles on first use, and returns the compiled kernel.
            _compiled.setdefault(key, _jit_launch(grid, tensors, ints, has_swa, has_errors))
            return
        # The low-level launcher: every argument in signature order, constexprs included.
        # Raw pointers instead of tensors spare it a data_ptr() call and a driver pointer
        # query per tensor (the pointers were read for the key anyway).
        kernel.run(
            grid[0],
            grid[1],
            1,
            _current_raw_stream(device.index),
            kernel.function,
            kernel.packed_metadata,
            None,
            None,
            None,
            *ptrs,
            *ints,
            has_swa,
            has_errors,
            BLOCK_PAGES,
        )


def _jit_launch(grid, tensors: tuple, ints: tuple, has_swa: bool, has_errors: bool):
    """Triton's own launch path (binds, specialises, compiles on first use); returns the
    compiled kernel. Only the first call of a launch key, the interpreter and calls under
    launch hooks come here, so its keyword arguments stay off the fast path."""
    return _page_table_kernel[grid](
        *tensors,
        *ints,
        HAS_SWA=has_swa,
        HAS_ERRORS=has_errors,
        BLOCK=BLOCK_PAGES,
        num_warps=NUM_WARPS,
    )


def _current_raw_stream(index: int) -> int:
    getter = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if getter is not None:
        return getter(index)
    return torch.cuda.current_stream(index).cuda_stream


def compiled_variants() -> int:
    """Number of compiled kernel variants so far (all devices): a count that must not grow
    after warm-up, whatever the batch bucket."""
    if interpreter_active():
        return 0
    total = 0
    for cache in _page_table_kernel.device_caches.values():
        total += len(cache[0])
    return total


# -- kernel -----------------------------------------------------------------------------------


@triton.jit
def _page_table_kernel(
    req_to_token_ptr,  # [max_reqs, r2t_stride] int32|int64
    req_pool_indices_ptr,  # [bs] int32|int64
    seq_lens_ptr,  # [bs] int32|int64
    page_table_ptr,  # [bs, pt_stride] int32
    swa_page_table_ptr,  # [bs, swa_stride] int32 (aliases page_table_ptr without SWA)
    full_to_swa_ptr,  # [f2s_len] int32|int64 (unused without SWA)
    errors_ptr,  # [len(ERROR_KINDS)] int32 (unused without HAS_ERRORS)
    r2t_stride,
    r2t_rows,
    pt_stride,
    swa_stride,
    max_pages,  # min(width, cdiv(req_to_token.shape[1], page_size))
    page_size,
    f2s_len,
    HAS_SWA: tl.constexpr,
    HAS_ERRORS: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    part = tl.program_id(1)
    parts = tl.num_programs(1)

    seq_len = tl.load(seq_lens_ptr + row).to(tl.int64)
    req = tl.load(req_pool_indices_ptr + row).to(tl.int64)
    # Clamp, never trust: an index outside req_to_token would read another allocation.
    req_clamped = tl.minimum(tl.maximum(req, 0), r2t_rows - 1)
    n_pages = tl.minimum((tl.maximum(seq_len, 0) + page_size - 1) // page_size, max_pages)

    if HAS_ERRORS:
        if part == 0:
            tl.atomic_add(
                errors_ptr + ERR_OVER_CAPACITY, (seq_len > max_pages * page_size).to(tl.int32)
            )
            tl.atomic_add(errors_ptr + ERR_NEGATIVE, (seq_len < 0).to(tl.int32))
            tl.atomic_add(errors_ptr + ERR_BAD_REQ_INDEX, (req != req_clamped).to(tl.int32))

    r2t_row = req_to_token_ptr + req_clamped * r2t_stride
    pt_row = page_table_ptr + row.to(tl.int64) * pt_stride
    swa_row = swa_page_table_ptr + row.to(tl.int64) * swa_stride
    n_blocks = (n_pages + BLOCK - 1) // BLOCK
    lane = tl.arange(0, BLOCK)
    # A while loop rather than range(): the bound is a loaded value, and the interpreter
    # accepts only the while form for that.
    blk = part.to(tl.int64)
    while blk < n_blocks:
        pages = blk * BLOCK + lane
        live = pages < n_pages
        slot = tl.load(r2t_row + pages * page_size, mask=live, other=0)
        tl.store(pt_row + pages, (slot // page_size).to(tl.int32), mask=live)
        if HAS_SWA:
            idx = slot.to(tl.int64)
            idx_clamped = tl.minimum(tl.maximum(idx, 0), f2s_len - 1)
            swa_slot = tl.load(full_to_swa_ptr + idx_clamped, mask=live, other=0)
            tl.store(swa_row + pages, (swa_slot // page_size).to(tl.int32), mask=live)
            if HAS_ERRORS:
                bad = tl.sum((live & (idx != idx_clamped)).to(tl.int32), axis=0)
                tl.atomic_add(errors_ptr + ERR_BAD_SWA_INDEX, bad)
        blk += parts
