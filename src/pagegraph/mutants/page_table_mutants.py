"""The page-table kind's mutants: page-table builders with one realistic bug each, named in the
docstring's first line.

Device bugs live in ``_mutant_kernel``, a plain one-program-per-row Triton kernel (simpler than
``pagegraph.kernels.page_table``, on purpose) whose ``BUG`` constexpr switches one mistake in;
host bugs wrap the correct kernel (syncs, frozen or stale host values, caches, streams).
``MUTANTS`` maps each name to its ``Mutant``; ``CONTROLS`` are the kind's correct builders.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import triton
import triton.language as tl

from ..kernels.contract import cdiv, check_builder_args
from ..kernels.page_table import build_page_table
from .mutant import GRAPH, OUTSIDE, SPILL, WRONG, Mutant, Zoo

# Bug codes of _mutant_kernel (0: none, the plain kernel is correct).
CORRECT = 0
NO_ROW_CLAMP = 1
SWA_UNCLAMPED = 2
PT_STRIDE_FROM_WIDTH = 3
R2T_STRIDE_FROM_WIDTH = 4
INT32_ROW_OFFSET = 5
HARD_CODED_PAGE_SIZE = 6
FLOOR_LAST_PAGE = 7
EXTRA_LAST_PAGE = 8
ZERO_LEN_WRITES = 9
NO_INDIRECTION = 10
SWA_PAGE_IDS = 11
SWA_NOT_DIVIDED = 12
CLEARS_TAIL = 13
ROWS_TO_LONGEST = 14
LENGTHS_AS_INT32 = 15
ERRORS_STORED = 16
SWA_EVICTED_AS_FULL = 17
R2T_AS_INT32 = 18

#: The page size HARD_CODED_PAGE_SIZE assumes (the trtllm_mha default).
HARD_CODED = 64
BLOCK = 64

# The kernel compares BUG with these constexpr globals (plain ints are not readable there).
NO_ROW_CLAMP_C = tl.constexpr(NO_ROW_CLAMP)
SWA_UNCLAMPED_C = tl.constexpr(SWA_UNCLAMPED)
PT_STRIDE_FROM_WIDTH_C = tl.constexpr(PT_STRIDE_FROM_WIDTH)
R2T_STRIDE_FROM_WIDTH_C = tl.constexpr(R2T_STRIDE_FROM_WIDTH)
INT32_ROW_OFFSET_C = tl.constexpr(INT32_ROW_OFFSET)
HARD_CODED_PAGE_SIZE_C = tl.constexpr(HARD_CODED_PAGE_SIZE)
FLOOR_LAST_PAGE_C = tl.constexpr(FLOOR_LAST_PAGE)
EXTRA_LAST_PAGE_C = tl.constexpr(EXTRA_LAST_PAGE)
ZERO_LEN_WRITES_C = tl.constexpr(ZERO_LEN_WRITES)
NO_INDIRECTION_C = tl.constexpr(NO_INDIRECTION)
SWA_PAGE_IDS_C = tl.constexpr(SWA_PAGE_IDS)
SWA_NOT_DIVIDED_C = tl.constexpr(SWA_NOT_DIVIDED)
CLEARS_TAIL_C = tl.constexpr(CLEARS_TAIL)
ROWS_TO_LONGEST_C = tl.constexpr(ROWS_TO_LONGEST)
LENGTHS_AS_INT32_C = tl.constexpr(LENGTHS_AS_INT32)
ERRORS_STORED_C = tl.constexpr(ERRORS_STORED)
SWA_EVICTED_AS_FULL_C = tl.constexpr(SWA_EVICTED_AS_FULL)
R2T_AS_INT32_C = tl.constexpr(R2T_AS_INT32)


@triton.jit  # type: ignore[untyped-decorator]  # Triton ships no types
def _mutant_lengths(  # type: ignore[no-untyped-def]  # a Triton kernel
    seq_lens_ptr, req_pool_indices_ptr, row, bs, BUG: tl.constexpr, BLOCK: tl.constexpr
):
    """Batch row ``row``'s length and request index, both int64 and unclamped, read as bug
    ``BUG`` reads them."""
    if BUG == LENGTHS_AS_INT32_C:
        seq = tl.load(seq_lens_ptr.to(tl.pointer_type(tl.int32)) + row).to(tl.int64)
        req = tl.load(req_pool_indices_ptr.to(tl.pointer_type(tl.int32)) + row).to(tl.int64)
    else:
        seq = tl.load(seq_lens_ptr + row).to(tl.int64)
        req = tl.load(req_pool_indices_ptr + row).to(tl.int64)
    if BUG == NO_INDIRECTION_C:
        req = row.to(tl.int64)
    if BUG == ROWS_TO_LONGEST_C:
        # Every row to the batch's longest length (a device max: no sync, but wrong).
        longest = seq
        start = 0
        while start < bs:
            idx = start + tl.arange(0, BLOCK)
            lens = tl.load(seq_lens_ptr + idx, mask=idx < bs, other=0).to(tl.int64)
            longest = tl.maximum(longest, tl.max(lens, axis=0))
            start += BLOCK
        seq = longest
    return seq, req


@triton.jit  # type: ignore[untyped-decorator]  # Triton ships no types
def _mutant_pages(seq, PS: tl.constexpr, BUG: tl.constexpr):  # type: ignore[no-untyped-def]  # a Triton kernel
    """Pages of a row of ``seq`` tokens (int64) of ``PS`` tokens a page, as bug ``BUG``
    counts them."""
    tokens = tl.maximum(seq, 0)
    if BUG == FLOOR_LAST_PAGE_C:
        n = tokens // PS
    elif BUG == EXTRA_LAST_PAGE_C:
        n = tokens // PS + (tokens > 0).to(tl.int64)
    else:
        n = (tokens + PS - 1) // PS
    if BUG == ZERO_LEN_WRITES_C:
        n = tl.maximum(n, 1)
    return n


@triton.jit  # type: ignore[untyped-decorator]  # Triton ships no types
def _mutant_clear_tail(pt_row, n_full, width, BLOCK: tl.constexpr):  # type: ignore[no-untyped-def]  # a Triton kernel
    """CLEARS_TAIL's bug: pages ``n_full .. width - 1`` of the row at ``pt_row`` set to 0."""
    p = n_full
    while p < width:
        pages = p + tl.arange(0, BLOCK).to(tl.int64)
        tl.store(pt_row + pages, tl.zeros([BLOCK], dtype=tl.int32), mask=pages < width)
        p += BLOCK


@triton.jit  # type: ignore[untyped-decorator]  # Triton ships no types
def _mutant_errors(  # type: ignore[no-untyped-def]  # a Triton kernel
    errors_ptr,
    req_pool_indices_ptr,
    row,
    seq,
    cap,
    r2t_rows,
    PAGE_SIZE: tl.constexpr,
    BUG: tl.constexpr,
):
    """Row ``row``'s out-of-contract values added to (ERRORS_STORED: stored into) the first
    three counters of ``errors_ptr`` (``[len(ERROR_KINDS)]`` int32)."""
    over = (seq > cap * PAGE_SIZE).to(tl.int32)
    negative = (seq < 0).to(tl.int32)
    bad = tl.load(req_pool_indices_ptr + row).to(tl.int64)
    bad_req = ((bad < 0) | (bad >= r2t_rows)).to(tl.int32)
    if BUG == ERRORS_STORED_C:
        # A store, not an add: rows overwrite each other's counts.
        tl.store(errors_ptr + 0, over)
        tl.store(errors_ptr + 1, negative)
        tl.store(errors_ptr + 2, bad_req)
    else:
        tl.atomic_add(errors_ptr + 0, over)
        tl.atomic_add(errors_ptr + 1, negative)
        tl.atomic_add(errors_ptr + 2, bad_req)


@triton.jit(do_not_specialize=["bs"])  # type: ignore[untyped-decorator]  # Triton ships no types
def _mutant_kernel(  # type: ignore[no-untyped-def]  # a Triton kernel
    req_to_token_ptr,  # [r2t_rows, r2t_stride] int32|int64
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
    width,  # pages of a table row
    r2t_pages,  # pages a req_to_token row can supply
    f2s_len,
    bs,
    PAGE_SIZE: tl.constexpr,
    HAS_SWA: tl.constexpr,
    HAS_ERRORS: tl.constexpr,
    BUG: tl.constexpr,
    HARD_PS: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    seq, req = _mutant_lengths(seq_lens_ptr, req_pool_indices_ptr, row, bs, BUG, BLOCK)
    req = tl.minimum(tl.maximum(req, 0), r2t_rows - 1)
    if BUG == HARD_CODED_PAGE_SIZE_C:
        ps = HARD_PS
    else:
        ps = PAGE_SIZE
    n = _mutant_pages(seq, ps, BUG)
    cap = tl.minimum(width, r2t_pages)
    n_full = tl.minimum(n, cap)
    n_swa = tl.minimum(n, cap)
    if BUG == NO_ROW_CLAMP_C:
        n_full = n
        n_swa = n
    if BUG == SWA_UNCLAMPED_C:
        n_swa = n
    r2t_row_stride = r2t_stride
    if BUG == R2T_STRIDE_FROM_WIDTH_C:
        r2t_row_stride = width * PAGE_SIZE
    pt_row_stride = pt_stride
    swa_row_stride = swa_stride
    if BUG == PT_STRIDE_FROM_WIDTH_C:
        pt_row_stride = width
        swa_row_stride = width
    if BUG == INT32_ROW_OFFSET_C:
        row_offset = (req.to(tl.int32) * r2t_row_stride.to(tl.int32)).to(tl.int64)
    else:
        row_offset = req * r2t_row_stride
    if BUG == R2T_AS_INT32_C:
        r2t = req_to_token_ptr.to(tl.pointer_type(tl.int32))
    else:
        r2t = req_to_token_ptr
    pt_row = page_table_ptr + row.to(tl.int64) * pt_row_stride
    swa_row = swa_page_table_ptr + row.to(tl.int64) * swa_row_stride
    p = 0
    end = tl.maximum(n_full, n_swa)
    while p < end:
        pages = p + tl.arange(0, BLOCK).to(tl.int64)
        live_full = pages < n_full
        live_swa = pages < n_swa
        slot = tl.load(r2t + row_offset + pages * ps, mask=live_full | live_swa, other=0)
        slot = slot.to(tl.int64)
        tl.store(pt_row + pages, (slot // ps).to(tl.int32), mask=live_full)
        if HAS_SWA:
            if BUG == SWA_PAGE_IDS_C:
                idx = slot // ps
            else:
                idx = slot
            idx = tl.minimum(tl.maximum(idx, 0), f2s_len - 1)
            swa_slot = tl.load(full_to_swa_ptr + idx, mask=live_swa, other=0).to(tl.int64)
            if BUG == SWA_NOT_DIVIDED_C:
                value = swa_slot
            elif BUG == SWA_EVICTED_AS_FULL_C:
                value = tl.where(swa_slot == 0, slot // ps, swa_slot // ps)
            else:
                value = swa_slot // ps
            tl.store(swa_row + pages, value.to(tl.int32), mask=live_swa)
        p += BLOCK
    if BUG == CLEARS_TAIL_C:
        _mutant_clear_tail(pt_row, n_full, width, BLOCK)
    if HAS_ERRORS:
        _mutant_errors(errors_ptr, req_pool_indices_ptr, row, seq, cap, r2t_rows, PAGE_SIZE, BUG)


def plain_page_table(
    req_to_token: Any,
    req_pool_indices: Any,
    seq_lens: Any,
    page_table: Any,
    page_size: Any,
    *,
    swa_page_table: Any = None,
    full_to_swa: Any = None,
    errors: Any = None,
    bug: int = CORRECT,
) -> None:
    """The mutants' kernel with no bug: a correct, simple builder (one program per row).

    Same contract as ``pagegraph.build_page_table``; ``bug`` switches one mistake in."""
    check_builder_args(
        req_to_token,
        req_pool_indices,
        seq_lens,
        page_table,
        page_size,
        swa_page_table,
        full_to_swa,
        errors,
        builder="plain_page_table",
    )
    bs, width = page_table.shape
    if bs == 0 or width == 0:
        return
    has_swa = full_to_swa is not None
    _mutant_kernel[(bs,)](
        req_to_token,
        req_pool_indices,
        seq_lens,
        page_table,
        swa_page_table if has_swa else page_table,
        full_to_swa if has_swa else page_table,
        errors if errors is not None else page_table,
        req_to_token.stride(0),
        req_to_token.shape[0],
        page_table.stride(0),
        swa_page_table.stride(0) if has_swa else page_table.stride(0),
        width,
        cdiv(req_to_token.shape[1], page_size),
        full_to_swa.shape[0] if has_swa else 1,
        bs,
        PAGE_SIZE=page_size,
        HAS_SWA=has_swa,
        HAS_ERRORS=errors is not None,
        BUG=bug,
        HARD_PS=HARD_CODED,
        BLOCK=BLOCK,
    )


def _kernel_mutant(bug: int, doc: str) -> Callable[..., object]:
    def builder(
        req_to_token: Any,
        req_pool_indices: Any,
        seq_lens: Any,
        page_table: Any,
        page_size: Any,
        **kw: Any,
    ) -> None:
        plain_page_table(
            req_to_token, req_pool_indices, seq_lens, page_table, page_size, bug=bug, **kw
        )

    builder.__doc__ = doc
    return builder


# -- host bugs around the correct kernel -------------------------------------------------------


def _capturing() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def debug_sync_outside_capture(
    req_to_token: Any,
    req_pool_indices: Any,
    seq_lens: Any,
    page_table: Any,
    page_size: Any,
    **kw: Any,
) -> None:
    """A debug check of the lengths that reads them on the host, skipped only during capture."""
    if not _capturing():
        if not bool((seq_lens >= 0).all()):
            pass  # the check itself is the bug: bool() of a device tensor syncs
    build_page_table(req_to_token, req_pool_indices, seq_lens, page_table, page_size, **kw)


_logged: dict[int, torch.Tensor] = {}


def hidden_dtoh_copy(
    req_to_token: Any,
    req_pool_indices: Any,
    seq_lens: Any,
    page_table: Any,
    page_size: Any,
    **kw: Any,
) -> None:
    """The lengths copied to pageable host memory with ``non_blocking=True`` for logging."""
    if seq_lens.is_cuda and not _capturing():
        host = _logged.get(seq_lens.data_ptr())
        if host is None or host.shape != seq_lens.shape:
            host = _logged[seq_lens.data_ptr()] = torch.empty(seq_lens.shape, dtype=seq_lens.dtype)
        host.copy_(seq_lens, non_blocking=True)  # pageable: the driver blocks until it is done
    build_page_table(req_to_token, req_pool_indices, seq_lens, page_table, page_size, **kw)


_streams: dict[int, torch.cuda.Stream] = {}


def side_stream_not_joined(
    req_to_token: Any,
    req_pool_indices: Any,
    seq_lens: Any,
    page_table: Any,
    page_size: Any,
    **kw: Any,
) -> None:
    """The build launched on a side stream that never waits for, nor joins, the caller's."""
    if not page_table.is_cuda:
        build_page_table(req_to_token, req_pool_indices, seq_lens, page_table, page_size, **kw)
        return
    stream = _streams.get(page_table.device.index)
    if stream is None:
        stream = _streams[page_table.device.index] = torch.cuda.Stream(page_table.device)
    with torch.cuda.stream(stream):
        build_page_table(req_to_token, req_pool_indices, seq_lens, page_table, page_size, **kw)


_frozen_pages: dict[tuple[int, int], int] = {}


def width_frozen_per_batch_size(
    req_to_token: Any,
    req_pool_indices: Any,
    seq_lens: Any,
    page_table: Any,
    page_size: Any,
    **kw: Any,
) -> None:
    """Pages per row frozen per batch size from that size's first call (its warm-up)."""
    key = (page_table.data_ptr(), page_table.shape[0])
    if key not in _frozen_pages:
        # Read once per size, on the host, during warm-up (outside any capture).
        longest = int(seq_lens.cpu().numpy().max()) if seq_lens.numel() else 0
        _frozen_pages[key] = max(1, min(cdiv(max(longest, 0), page_size), page_table.shape[1]))
    n = _frozen_pages[key]
    if "swa_page_table" in kw:
        kw = dict(kw, swa_page_table=kw["swa_page_table"][:, :n])
    build_page_table(req_to_token, req_pool_indices, seq_lens, page_table[:, :n], page_size, **kw)


def width_from_host_max(
    req_to_token: Any,
    req_pool_indices: Any,
    seq_lens: Any,
    page_table: Any,
    page_size: Any,
    **kw: Any,
) -> None:
    """The width read on the host from the batch's longest length at every call."""
    # Right at every eager call (one sync each); a capture freezes the capture-time width.
    longest = int(seq_lens.max()) if seq_lens.numel() else 0
    n = max(1, min(cdiv(max(longest, 0), page_size), page_table.shape[1]))
    if "swa_page_table" in kw:
        kw = dict(kw, swa_page_table=kw["swa_page_table"][:, :n])
    build_page_table(req_to_token, req_pool_indices, seq_lens, page_table[:, :n], page_size, **kw)


_host_lengths: dict[int, torch.Tensor] = {}


def stale_host_copy_grid(
    req_to_token: Any,
    req_pool_indices: Any,
    seq_lens: Any,
    page_table: Any,
    page_size: Any,
    **kw: Any,
) -> None:
    """The width sized from a host copy of the lengths taken without a sync: one call stale."""
    key = page_table.data_ptr()
    host = _host_lengths.get(key)
    if host is None:
        host = torch.zeros(1 << 16, dtype=seq_lens.dtype)
        if seq_lens.is_cuda:
            host = host.pin_memory()
        _host_lengths[key] = host
    bs = seq_lens.shape[0]
    # What the previous call's copy left (no sync: it may not even have landed yet).
    n = max(1, min(cdiv(max(int(host.numpy()[:bs].max()), 0), page_size), page_table.shape[1]))
    if "swa_page_table" in kw:
        kw = dict(kw, swa_page_table=kw["swa_page_table"][:, :n])
    build_page_table(req_to_token, req_pool_indices, seq_lens, page_table[:, :n], page_size, **kw)
    host[:bs].copy_(seq_lens, non_blocking=True)


_plans: dict[int, int] = {}


def launch_plan_cached_by_address(
    req_to_token: Any,
    req_pool_indices: Any,
    seq_lens: Any,
    page_table: Any,
    page_size: Any,
    **kw: Any,
) -> None:
    """A launch plan cached by the table's address that keeps the first call's batch size."""
    bs = _plans.setdefault(page_table.data_ptr(), page_table.shape[0])
    rows = min(bs, page_table.shape[0])
    if "swa_page_table" in kw:
        kw = dict(kw, swa_page_table=kw["swa_page_table"][:rows])
    build_page_table(
        req_to_token, req_pool_indices[:rows], seq_lens[:rows], page_table[:rows], page_size, **kw
    )


_mappings: dict[int, torch.Tensor] = {}


def swa_mapping_copied_once(
    req_to_token: Any,
    req_pool_indices: Any,
    seq_lens: Any,
    page_table: Any,
    page_size: Any,
    **kw: Any,
) -> None:
    """``full_to_swa`` copied once at the first call; later builds use the stale copy."""
    f2s = kw.get("full_to_swa")
    if f2s is not None:
        copy = _mappings.get(f2s.data_ptr())
        if copy is None:
            copy = _mappings[f2s.data_ptr()] = f2s.clone()
        kw = dict(kw, full_to_swa=copy)
    build_page_table(req_to_token, req_pool_indices, seq_lens, page_table, page_size, **kw)


# -- the zoo -----------------------------------------------------------------------------------


def _k(
    name: str,
    bug: int,
    doc: str,
    cpu: bool,
    killed_by: str,
    kills: tuple[str, ...],
    gpu_only: str = "",
) -> Mutant:
    fn = _kernel_mutant(bug, doc)
    fn.__name__ = fn.__qualname__ = name
    fn.__module__ = __name__
    return Mutant(name, fn, cpu, killed_by, kills=kills, gpu_only=gpu_only)


MUTANTS: dict[str, Mutant] = {
    m.name: m
    for m in [
        _k("no_row_clamp", NO_ROW_CLAMP,
           "Pages per row not clamped to the table width: an overlong row spills into the "
           "next request's row (the trtllm_mha failure).", True, "row containment", SPILL),
        _k("swa_unclamped", SWA_UNCLAMPED,
           "The full table is clamped to its width, the SWA table is not.", True,
           "row containment", SPILL),
        _k("pt_stride_from_width", PT_STRIDE_FROM_WIDTH,
           "The tables' row stride taken from their width, not their stride.", True,
           "correct (tables as column slices)", ("correct", "bounded writes")),
        _k("r2t_stride_from_width", R2T_STRIDE_FROM_WIDTH,
           "req_to_token's row length assumed to be width * page_size.", True,
           "correct (req_to_token rows longer than the table)", WRONG),
        _k("int32_row_offset", INT32_ROW_OFFSET,
           "req_pool_index * stride computed in 32 bits: wraps past 2^31 pool entries.",
           False, "correct (big-pool)", ("correct", "capture", "replays completed"),
           "needs req_pool_index * stride past 2^31: big-pool's 10 GB req_to_token"),
        _k("hard_coded_page_size", HARD_CODED_PAGE_SIZE,
           f"Page size {HARD_CODED} hard-coded in the kernel.", True,
           "correct (a page size other than 64)", WRONG),
        _k("floor_last_page", FLOOR_LAST_PAGE,
           "Pages per row as seq_len // page_size: the partial last page is missed.", True,
           "correct", WRONG),
        _k("extra_last_page", EXTRA_LAST_PAGE,
           "Pages per row as seq_len // page_size + 1: a page too many when page-aligned.",
           True, "bounded writes", OUTSIDE),
        _k("zero_len_writes", ZERO_LEN_WRITES,
           "A zero-length row still writes its first page.", True,
           "bounded writes (zero lengths, vLLM padding)", OUTSIDE),
        _k("no_request_indirection", NO_INDIRECTION,
           "Batch row i read as request row i: the req_pool_indices lookup forgotten.", True,
           "correct", WRONG),
        _k("swa_page_ids", SWA_PAGE_IDS,
           "The SWA table translates page ids instead of token slots.", True,
           "correct (SWA)", WRONG),
        _k("swa_not_divided", SWA_NOT_DIVIDED,
           "SWA entries written as slots: the // page_size forgotten.", True, "correct (SWA)",
           WRONG),
        _k("swa_evicted_as_full", SWA_EVICTED_AS_FULL,
           "Evicted SWA slots (mapped to 0) translated to the full page instead.", True,
           "correct (SWA eviction)", WRONG),
        _k("clears_tail", CLEARS_TAIL,
           "The stale tail cleared to 0 up to the width.", True, "bounded writes", OUTSIDE),
        _k("rows_to_longest", ROWS_TO_LONGEST,
           "Every row written to the batch's longest length (a device max, no sync).", True,
           "bounded writes", OUTSIDE),
        _k("lengths_as_int32", LENGTHS_AS_INT32,
           "int64 req_pool_indices and seq_lens read through int32 pointers.", True,
           "correct (int64 indices)", WRONG),
        _k("r2t_as_int32", R2T_AS_INT32,
           "An int64 req_to_token read through an int32 pointer.", True,
           "correct (int64 req_to_token)", WRONG),
        _k("errors_stored", ERRORS_STORED,
           "Error counters stored, not added: rows overwrite each other's counts.", True,
           "error counters", ("error counters",)),
        Mutant("debug_sync_outside_capture", debug_sync_outside_capture, True,
               "sync-free builder call", kills=("sync-free builder call",)),
        Mutant("hidden_dtoh_copy", hidden_dtoh_copy, False, "sync-free builder call (cupti)",
               needs_detector="cupti", kills=("sync-free builder call",),
               gpu_only="a non-blocking copy into pageable memory blocks inside the CUDA "
               "driver: only CUPTI sees it"),
        Mutant("side_stream_not_joined", side_stream_not_joined, False, "capture",
               kills=("capture", "correct"),  # the capture fails, or misses the build
               gpu_only="needs real CUDA streams: a side stream the graph never joins"),
        Mutant("width_frozen_per_batch_size", width_frozen_per_batch_size, True,
               "graph-safe (captured short, replayed long)", kills=GRAPH),
        Mutant("width_from_host_max", width_from_host_max, True,
               "graph-safe (on a CPU through emulated graphs); on a GPU also the eager call's "
               "sync and the capture",
               kills=(*GRAPH, "sync-free builder call", "capture")),
        Mutant("stale_host_copy_grid", stale_host_copy_grid, True,
               "correct / graph-safe; on a GPU also sync-free builder call (cupti)",
               kills=(*GRAPH, "sync-free builder call")),
        Mutant("launch_plan_cached_by_address", launch_plan_cached_by_address, True,
               "correct", kills=("correct", "row containment")),
        Mutant("swa_mapping_copied_once", swa_mapping_copied_once, True, "correct (SWA)",
               kills=WRONG),
    ]
}  # fmt: skip

#: The kind's correct builders, run as controls: each must be SAFE everywhere.
CONTROLS: dict[str, Callable[..., object]] = {
    "build_page_table": build_page_table,
    "plain_page_table": plain_page_table,
}


def reset_caches() -> None:
    """Forget what host-bug mutants cached (tests run several checks in one process)."""
    for cache in (_logged, _streams, _frozen_pages, _host_lengths, _plans, _mappings):
        cache.clear()


#: The kind's zoo (``pagegraph.mutants.zoo.ZOOS``).
ZOO = Zoo(MUTANTS, CONTROLS, reset_caches)

__all__ = ["CONTROLS", "MUTANTS", "ZOO", "plain_page_table", "reset_caches"]
