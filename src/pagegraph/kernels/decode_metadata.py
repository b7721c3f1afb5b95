"""``build_decode_metadata``: a decode step's attention metadata in one Triton launch.

One launch writes ``cache_seqlens``, the prefix sums ``cu_seqlens_k`` (and ``cu_seqlens_q``)
and both page tables, the tables exactly as ``build_page_table`` builds them for lengths
``cache_seqlens``: the chain engines build from a dozen small ops, as one graph node with no
host sync and no allocation. ``prepare_decode_metadata`` does the host checks once for repeated
eager calls. The design (one program also scans the batch), overflow and specialisation:
docs/ARCHITECTURE.md, "One launch for a decode step's metadata".
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from .contract import cuda_call_metadata, interpreter_active
from .decode_contract import (
    DECODE_ERROR_KINDS,
    MAX_DRAFT_TOKENS,
    check_decode_args,
    fast_decode_checks,
)
from .gather import count_group_errors, gather_row_pages
from .launch import MAX_KEYS, LaunchCache, LaunchEntry, hooks_active, launch_compiled, launch_key
from .page_table import (
    BLOCK_PAGES,
    NUM_WARPS,
    ROWS_PER_PROGRAM,
    UNROLL,
    BuffersChanged,
    programs_per_row,
    row_fits_int32,
    row_groups,
)

__all__ = [
    "DECODE_ERROR_KINDS",
    "MAX_DRAFT_TOKENS",
    "SCAN_BLOCK",
    "PreparedDecodeMetadata",
    "build_decode_metadata",
    "check_decode_args",
    "compiled_variants",
    "prepare_decode_metadata",
]

#: Rows per step of the ``cu_seqlens_k`` scan (a power of two, at least ``SCAN_WIDTH``): small,
#: so that the scan does not raise the kernel's registers a thread (docs/ARCHITECTURE.md).
SCAN_BLOCK = 128

_INT32_MAX = 2**31 - 1

# The counter position the scan needs, as a constexpr global the kernel can read (the others
# are ``gather``'s: ``DECODE_ERROR_KINDS`` starts with ``ERROR_KINDS``).
ERR_CU_K_OVERFLOW = tl.constexpr(DECODE_ERROR_KINDS.index("cu_seqlens_k_overflow"))
INT32_MAX = tl.constexpr(_INT32_MAX)
#: Rows a thread scans sequentially in a scan tile (``_scan_tile``).
SCAN_WIDTH = tl.constexpr(8)


def build_decode_metadata(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    page_size: int,
    *,
    cache_seqlens: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    page_table: torch.Tensor,
    draft_tokens: int = 0,
    cu_seqlens_q: torch.Tensor | None = None,
    swa_page_table: torch.Tensor | None = None,
    full_to_swa: torch.Tensor | None = None,
    errors: torch.Tensor | None = None,
) -> None:
    """Fill a decode step's metadata in place, in one kernel launch.

    For ``bs`` rows and ``d = draft_tokens``::

        cache_seqlens[i]     = max(seq_lens[i], 0) + d               (saturated at 2^31 - 1)
        cu_seqlens_k[0]      = 0
        cu_seqlens_k[i+1]    = cache_seqlens[0] + ... + cache_seqlens[i]
        cu_seqlens_q[i]      = i * max(d, 1)                         (optional, i in 0..bs)
        page_table[i, p]     = req_to_token[req_pool_indices[i], p * page_size] // page_size
        swa_page_table[i, p] = full_to_swa[that slot] // page_size   (optional)

    for ``p < min(cdiv(cache_seqlens[i], page_size), width)``, and nothing else: the stale
    tail of each table row is left as it was.

    Args:
        req_to_token: ``[max_reqs, max_context_len]`` int32/int64, inner stride 1.
        req_pool_indices: ``[bs]`` int32/int64, request row of each batch row.
        seq_lens: ``[bs]`` int32/int64, tokens already in the cache (read on the device).
        page_size: tokens per page, ``>= 1`` (a compile-time constant of the kernel).
        cache_seqlens: ``[bs]`` int32, contiguous; written ``max(seq_lens, 0) + draft_tokens``.
        cu_seqlens_k: ``[bs + 1]`` int32/int64, contiguous; written 0 then the running sum of
            ``cache_seqlens`` (int32: saturated at 2^31 - 1).
        page_table: ``[bs, width]`` int32, inner stride 1; only live entries are written, as
            ``build_page_table`` would for lengths ``cache_seqlens``. ``bs <= MAX_BATCH``.
        draft_tokens: host int in ``0..MAX_DRAFT_TOKENS``, query tokens beyond one per row.
        cu_seqlens_q: optional ``[bs + 1]`` int32, contiguous; written ``i * max(draft, 1)``.
        swa_page_table: ``[bs, width]`` int32, given together with ``full_to_swa``.
        full_to_swa: ``[num_slots + 1]`` int32/int64, SWA slot of each full slot.
        errors: optional ``[>= len(DECODE_ERROR_KINDS)]`` int32 counters, incremented (never
            reset) on the device for out-of-contract values.

    Every argument is checked from metadata before anything is launched: a mistake raises a
    ``TypeError`` or ``ValueError`` naming the argument, and nothing is written. For repeated
    eager calls on the same buffers, ``prepare_decode_metadata`` does the checks once.
    """
    tensors, ints, constexprs, grid, bs, draft, _ = _plan(
        req_to_token,
        req_pool_indices,
        seq_lens,
        page_size,
        cache_seqlens,
        cu_seqlens_k,
        page_table,
        draft_tokens,
        cu_seqlens_q,
        swa_page_table,
        full_to_swa,
        errors,
        "build_decode_metadata",
    )
    # Launched even for bs == 0 or a zero-width table: cu_seqlens_k[0] (and cu_seqlens_q[0])
    # must still be written, and cache_seqlens does not depend on the width.
    _launch(grid, bs, draft, tensors, ints, constexprs)


#: Names of the kernel's tensor arguments, in signature order (aliases included).
_TENSOR_NAMES = (
    "req_to_token",
    "req_pool_indices",
    "seq_lens",
    "cache_seqlens",
    "cu_seqlens_k",
    "cu_seqlens_q",
    "page_table",
    "swa_page_table",
    "full_to_swa",
    "errors",
)


class PreparedDecodeMetadata:
    """``build_decode_metadata`` on fixed buffers with the checks done once.

    ``meta(bs=None)`` fills the metadata of the first ``bs`` rows (default: every row it was
    prepared with), exactly as ``build_decode_metadata`` would on the prefixes
    ``seq_lens[:bs]``, ``req_pool_indices[:bs]``, ``cache_seqlens[:bs]``,
    ``cu_seqlens_k[:bs + 1]``, ``cu_seqlens_q[:bs + 1]`` and ``page_table[:bs]``, with the
    ``draft_tokens`` it was prepared with. Each call confirms that every tensor still has the
    address it was prepared with (``kernel.BuffersChanged`` otherwise) but reads no other
    metadata: like a CUDA graph's static buffers, the tensors must not be resized, re-strided
    or retyped in place afterwards. Under Triton launch hooks a call takes the normal launch
    path, so the hooks see it.
    """

    __slots__ = (
        "_tensors",
        "_ptrs",
        "_checked",
        "_ints",
        "_constexprs",
        "_max_pages",
        "_rows",
        "_draft",
        "_index",
        "_key",
        "_entry",
        "_grids",
    )

    def __init__(
        self,
        tensors: tuple[Any, ...],
        ints: tuple[Any, ...],
        constexprs: tuple[Any, ...],
        grid: tuple[Any, ...],
        rows: int,
        draft: int,
        max_pages: int,
    ):
        self._tensors = tensors
        self._ptrs = [t.data_ptr() for t in tensors]
        # The given tensors only, once each: an absent optional argument aliases page_table.
        self._checked = tuple(
            (_TENSOR_NAMES[k], t, self._ptrs[k])
            for k, t in enumerate(tensors)
            if k == 6 or t is not tensors[6]
        )
        self._ints = ints
        self._constexprs = constexprs
        self._max_pages = max_pages
        self._rows = rows
        self._draft = draft
        self._index = tensors[6].get_device()
        self._key = _launch_key(self._index, tensors, self._ptrs, ints, constexprs)
        self._entry: LaunchEntry | None = (
            None  # the compiled launch, once a first call has compiled it
        )
        self._grids: dict[int, tuple[Any, ...]] = {rows: grid}

    @property
    def rows(self) -> int:
        """Batch rows prepared: the largest ``bs`` a call accepts."""
        return self._rows

    @property
    def draft_tokens(self) -> int:
        """The ``draft_tokens`` every call uses."""
        return self._draft

    def __call__(self, bs: int | None = None) -> None:
        rows = self._rows if bs is None else bs
        if type(rows) is not int or not 0 <= rows <= self._rows:
            raise ValueError(f"bs must be an int in 0..{self._rows} (rows prepared), got {bs!r}")
        for name, t, ptr in self._checked:
            if t.data_ptr() != ptr:
                raise BuffersChanged(
                    f"{name} moved since prepare_decode_metadata "
                    f"({ptr:#x} -> {t.data_ptr():#x}): prepare again"
                )
        grid = self._grids.get(rows)
        if grid is None:
            grid = self._grids[rows] = _geometry(rows, self._max_pages, self._constexprs[0])[0]
        entry = self._entry
        if entry is None or hooks_active():
            _launch(grid, rows, self._draft, self._tensors, self._ints, self._constexprs)
            self._entry = launch_cache.get(self._key) if self._index >= 0 else None
            return
        launch_compiled(
            entry,
            self._index,
            grid[0],
            grid[1],
            self._ptrs,
            self._ints,
            (rows, self._draft, *self._constexprs),
        )


def prepare_decode_metadata(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    page_size: int,
    *,
    cache_seqlens: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    page_table: torch.Tensor,
    draft_tokens: int = 0,
    cu_seqlens_q: torch.Tensor | None = None,
    swa_page_table: torch.Tensor | None = None,
    full_to_swa: torch.Tensor | None = None,
    errors: torch.Tensor | None = None,
) -> PreparedDecodeMetadata:
    """Check a ``build_decode_metadata`` call once and return it as a
    ``PreparedDecodeMetadata``, for an engine that builds eagerly, every step, into the same
    buffers. Arguments and errors as ``build_decode_metadata``; nothing is launched here."""
    plan = _plan(
        req_to_token,
        req_pool_indices,
        seq_lens,
        page_size,
        cache_seqlens,
        cu_seqlens_k,
        page_table,
        draft_tokens,
        cu_seqlens_q,
        swa_page_table,
        full_to_swa,
        errors,
        "prepare_decode_metadata",
    )
    return PreparedDecodeMetadata(*plan)


def _plan(
    req_to_token: Any,
    req_pool_indices: Any,
    seq_lens: Any,
    page_size: Any,
    cache_seqlens: Any,
    cu_seqlens_k: Any,
    page_table: Any,
    draft_tokens: Any,
    cu_seqlens_q: Any,
    swa_page_table: Any,
    full_to_swa: Any,
    errors: Any,
    caller: str,
) -> tuple[Any, ...]:
    """Checked arguments of one launch: ``(tensors, ints, constexprs, grid, bs, draft,
    max_pages)``."""
    meta = cuda_call_metadata(
        req_to_token,
        req_pool_indices,
        seq_lens,
        page_table,
        page_size,
        swa_page_table,
        full_to_swa,
        errors,
    )
    has_swa = full_to_swa is not None
    if meta is None or not fast_decode_checks(
        meta[0], meta[1], cache_seqlens, cu_seqlens_k, cu_seqlens_q, draft_tokens, errors
    ):
        # Not the common case: the full checks name what is wrong (or accept what the fast
        # checks do not judge: CPU tensors under the interpreter, int subclasses).
        check_decode_args(
            req_to_token, req_pool_indices, seq_lens, page_size, cache_seqlens, cu_seqlens_k,
            page_table, draft_tokens, cu_seqlens_q, swa_page_table, full_to_swa, errors,
            caller=caller, cpu_ok=False,
        )  # fmt: skip
        draft_tokens = int(draft_tokens)  # a plain int for the launcher
    if meta is None:
        bs, width = page_table.shape
        r2t_rows, r2t_cols = req_to_token.shape
        r2t_stride, pt_stride = req_to_token.stride(0), page_table.stride(0)
        swa_stride = swa_page_table.stride(0) if has_swa else None
        f2s_len = full_to_swa.shape[0] if has_swa else None
    else:
        _, bs, width, r2t_rows, r2t_cols, r2t_stride, pt_stride, swa_stride, f2s_len = meta
    has_errors = errors is not None
    has_cu_q = cu_seqlens_q is not None
    # Pages a row of req_to_token can supply: a wider table must not read past that row.
    max_pages = min(width, -(-r2t_cols // page_size))
    geometry = _geometries.get((bs, max_pages, page_size))
    if geometry is None:
        geometry = _geometry(bs, max_pages, page_size)
    # Unused pointer arguments alias page_table: never dereferenced (the constexpr flags
    # compile those paths out), and aliasing keeps the signature free of None.
    tensors = (
        req_to_token,
        req_pool_indices,
        seq_lens,
        cache_seqlens,
        cu_seqlens_k,
        cu_seqlens_q if has_cu_q else page_table,
        page_table,
        swa_page_table if has_swa else page_table,
        full_to_swa if has_swa else page_table,
        errors if has_errors else page_table,
    )
    ints = (
        r2t_stride,
        r2t_rows,
        pt_stride,
        swa_stride if has_swa else pt_stride,
        # A row's capacity in tokens, capped at the largest cache_seqlens value: the cap
        # changes no page count and keeps the argument (and every length) in int32.
        min(max_pages * page_size, _INT32_MAX),
        # Without SWA a constant, not something that follows the batch size: an int argument
        # is specialised on its value (1, multiple of 16), so it would split the buckets.
        f2s_len if has_swa else 1,
    )
    constexprs = (
        page_size,
        has_swa,
        has_errors,
        has_cu_q,
        cu_seqlens_k.dtype is torch.int32,
        geometry[1],
        BLOCK_PAGES,
        UNROLL,
        ROWS_PER_PROGRAM,
        SCAN_BLOCK,
    )
    return tensors, ints, constexprs, geometry[0], bs, draft_tokens, max_pages


# -- launcher ---------------------------------------------------------------------------------

#: Launch entries of ``_decode_metadata_kernel`` by launch key (``_launch_key``).
launch_cache = LaunchCache()

#: ``(bs, max_pages, page_size)`` -> ``(grid, row_i32)``: host arithmetic that every eager call
#: would otherwise repeat, kept per shape.
_geometries: dict[tuple[Any, ...], tuple[Any, ...]] = {}


def _geometry(bs: int, max_pages: int, page_size: int) -> tuple[Any, ...]:
    """The grid ``(C, row groups)`` and whether in-row offsets fit 32 bits. One row group even
    for ``bs == 0``: program (0, 0) still writes ``cu_seqlens_k[0]``."""
    geometry = _geometries.get((bs, max_pages, page_size))
    if geometry is None:
        if len(_geometries) >= MAX_KEYS:
            _geometries.clear()
        grid = (programs_per_row(bs, max_pages), row_groups(bs) if bs else 1)
        geometry = (grid, row_fits_int32(max_pages, page_size))
        _geometries[(bs, max_pages, page_size)] = geometry
    return geometry


def _launch(
    grid: tuple[Any, ...],
    bs: int,
    draft: int,
    tensors: tuple[Any, ...],
    ints: tuple[Any, ...],
    constexprs: tuple[Any, ...],
) -> None:
    index = tensors[6].get_device()
    if index < 0:  # Triton interpreter: no compiled kernel to cache.
        _jit_launch(grid, bs, draft, tensors, ints, constexprs)
        return
    ptrs = [t.data_ptr() for t in tensors]
    key = _launch_key(index, tensors, ptrs, ints, constexprs)
    entry = launch_cache.get(key)
    if entry is None or hooks_active():
        launch_cache.first_launch(
            key, index, _jit_launch, grid, bs, draft, tensors, ints, constexprs
        )
        return
    launch_compiled(entry, index, grid[0], grid[1], ptrs, ints, (bs, draft, *constexprs))


def _launch_key(
    index: int,
    tensors: tuple[Any, ...],
    ptrs: list[Any],
    ints: tuple[Any, ...],
    constexprs: tuple[Any, ...],
) -> tuple[Any, ...]:
    """``cu_seqlens_k``'s dtype is the constexpr ``CU_K_I32``. ``bs`` and ``draft_tokens`` are
    not in it: neither is specialised, so one key serves every bucket and every draft count."""
    dtypes = (tensors[0].dtype, tensors[1].dtype, tensors[2].dtype, tensors[8].dtype)
    return launch_key(index, dtypes, ptrs, ints, constexprs, NUM_WARPS)


def _jit_launch(
    grid: tuple[Any, ...],
    bs: int,
    draft: int,
    tensors: tuple[Any, ...],
    ints: tuple[Any, ...],
    constexprs: tuple[Any, ...],
) -> Any:
    """Triton's own launch path (binds, specialises, compiles on first use); returns the
    compiled kernel. Only the first call of a launch key, the interpreter and calls under
    launch hooks come here."""
    page_size, has_swa, has_errors, has_cu_q, cu_k_i32, row_i32, block, unroll, rows, scan = (
        constexprs
    )
    return _decode_metadata_kernel[grid](
        *tensors,
        *ints,
        bs,
        draft,
        PAGE_SIZE=page_size,
        HAS_SWA=has_swa,
        HAS_ERRORS=has_errors,
        HAS_CU_Q=has_cu_q,
        CU_K_I32=cu_k_i32,
        ROW_I32=row_i32,
        BLOCK=block,
        UNROLL=unroll,
        ROWS=rows,
        SCAN_BLOCK=scan,
        num_warps=NUM_WARPS,
    )


def compiled_variants() -> int:
    """Number of compiled variants of the decode-metadata kernel so far (all devices): a count
    that must not grow after warm-up, whatever the batch bucket or draft count."""
    if interpreter_active():
        return 0
    return sum(len(cache[0]) for cache in _decode_metadata_kernel.device_caches.values())


# -- kernel -----------------------------------------------------------------------------------


@triton.jit(do_not_specialize=["bs", "draft_tokens"])  # type: ignore[untyped-decorator]  # Triton ships no types
def _decode_metadata_kernel(  # type: ignore[no-untyped-def]  # a Triton kernel
    req_to_token_ptr,  # [max_reqs, r2t_stride] int32|int64
    req_pool_indices_ptr,  # [bs] int32|int64
    seq_lens_ptr,  # [bs] int32|int64
    cache_seqlens_ptr,  # [bs] int32, written
    cu_seqlens_k_ptr,  # [bs + 1] int32|int64, written
    cu_seqlens_q_ptr,  # [bs + 1] int32, written (aliases page_table_ptr without HAS_CU_Q)
    page_table_ptr,  # [bs, pt_stride] int32
    swa_page_table_ptr,  # [bs, swa_stride] int32 (aliases page_table_ptr without SWA)
    full_to_swa_ptr,  # [f2s_len] int32|int64 (unused without SWA)
    errors_ptr,  # [len(DECODE_ERROR_KINDS)] int32 (unused without HAS_ERRORS)
    r2t_stride,
    r2t_rows,
    pt_stride,
    swa_stride,
    capacity,  # min(PAGE_SIZE * min(width, cdiv(r2t row, PAGE_SIZE)), 2^31 - 1) tokens
    f2s_len,
    bs,  # batch rows; not specialised, so every bucket shares one compiled kernel
    draft_tokens,  # 0..MAX_DRAFT_TOKENS; not specialised, so every draft count shares it too
    PAGE_SIZE: tl.constexpr,
    HAS_SWA: tl.constexpr,
    HAS_ERRORS: tl.constexpr,
    HAS_CU_Q: tl.constexpr,
    CU_K_I32: tl.constexpr,  # cu_seqlens_k is int32: store the running sum saturated
    ROW_I32: tl.constexpr,  # in-row page arithmetic fits 32 bits (host-checked)
    BLOCK: tl.constexpr,
    UNROLL: tl.constexpr,
    ROWS: tl.constexpr,  # batch rows per program
    SCAN_BLOCK: tl.constexpr,  # rows per step of program (0, 0)'s prefix sum
):
    # Grid (C, max(cdiv(bs, ROWS), 1)), as build_page_table's: the C programs of one row
    # group are C apart in launch order, so a long row's programs spread over many SMs.
    part = tl.program_id(0)
    first = tl.program_id(1) * ROWS
    if (part == 0) & (first == 0):
        # The one program that also scans. Its first tile of lengths is loaded before its own
        # rows' gathers, so the two load latencies overlap instead of adding up; it is
        # consumed only after them. (The rows' code is inlined in both branches: the other
        # programs carry no trace of the scan.)
        offs = _scan_tile(SCAN_BLOCK)
        head = tl.load(seq_lens_ptr + offs, mask=offs < bs, other=0)
        _build_rows(
            req_to_token_ptr, req_pool_indices_ptr, seq_lens_ptr, cache_seqlens_ptr,
            page_table_ptr, swa_page_table_ptr, full_to_swa_ptr, errors_ptr, r2t_stride,
            r2t_rows, pt_stride, swa_stride, capacity, f2s_len, bs, draft_tokens, part, first,
            PAGE_SIZE, HAS_SWA, HAS_ERRORS, ROW_I32, BLOCK, UNROLL, ROWS,
        )  # fmt: skip
        _scan_cu_seqlens(
            head,
            seq_lens_ptr,
            cu_seqlens_k_ptr,
            cu_seqlens_q_ptr,
            errors_ptr,
            bs,
            draft_tokens,
            HAS_ERRORS,
            HAS_CU_Q,
            CU_K_I32,
            SCAN_BLOCK,
        )
    else:
        _build_rows(
            req_to_token_ptr, req_pool_indices_ptr, seq_lens_ptr, cache_seqlens_ptr,
            page_table_ptr, swa_page_table_ptr, full_to_swa_ptr, errors_ptr, r2t_stride,
            r2t_rows, pt_stride, swa_stride, capacity, f2s_len, bs, draft_tokens, part, first,
            PAGE_SIZE, HAS_SWA, HAS_ERRORS, ROW_I32, BLOCK, UNROLL, ROWS,
        )  # fmt: skip


@triton.jit  # type: ignore[untyped-decorator]  # Triton ships no types
def _build_rows(  # type: ignore[no-untyped-def]  # a Triton kernel
    req_to_token_ptr,
    req_pool_indices_ptr,
    seq_lens_ptr,
    cache_seqlens_ptr,
    page_table_ptr,
    swa_page_table_ptr,
    full_to_swa_ptr,
    errors_ptr,
    r2t_stride,
    r2t_rows,
    pt_stride,
    swa_stride,
    capacity,
    f2s_len,
    bs,
    draft_tokens,
    part,
    first,
    PAGE_SIZE: tl.constexpr,
    HAS_SWA: tl.constexpr,
    HAS_ERRORS: tl.constexpr,
    ROW_I32: tl.constexpr,
    BLOCK: tl.constexpr,
    UNROLL: tl.constexpr,
    ROWS: tl.constexpr,
):
    """Program ``(part, first // ROWS)``'s share of rows ``first .. first + ROWS - 1``: their
    ``cache_seqlens`` and error counts (part 0), and their pages ``part, part + C, ...``:
    ``build_page_table``'s algorithm with the length ``cache_seqlens``."""
    # The group's rows as [ROWS] vectors: cache_seqlens and the error counts (each row once,
    # in part 0) and the loop bound (the longest row). Rows past bs read as empty.
    group = first + tl.arange(0, ROWS)
    in_batch = group < bs
    group_lens = tl.load(seq_lens_ptr + group, mask=in_batch, other=0)
    # Saturated before the add, so no int64 length can wrap; exactly the scan's value.
    group_cache = tl.minimum(
        tl.minimum(tl.maximum(group_lens.to(tl.int64), 0), INT32_MAX) + draft_tokens, INT32_MAX
    )
    # Rows past bs hold draft_tokens, not 0: zeroed, so they neither extend the loop nor (below)
    # count as over capacity.
    group_tokens = tl.where(in_batch, tl.minimum(group_cache, capacity), 0)
    if ROW_I32:
        group_tokens = group_tokens.to(tl.int32)
    n_blocks = tl.max((group_tokens + (PAGE_SIZE * BLOCK - 1)) // (PAGE_SIZE * BLOCK), axis=0)

    if part == 0:
        tl.store(cache_seqlens_ptr + group, group_cache.to(tl.int32), mask=in_batch)
        if HAS_ERRORS:
            over = in_batch & (group_cache > capacity)
            count_group_errors(
                errors_ptr, req_pool_indices_ptr, group, in_batch, group_lens, over, r2t_rows
            )

    # Each lane's pages follow its row's cache_seqlens clamped to the capacity, the value
    # stored above. There is no work counter here: page_table_ptr stands in for it.
    gather_row_pages(
        req_to_token_ptr, req_pool_indices_ptr, seq_lens_ptr, page_table_ptr,
        swa_page_table_ptr, full_to_swa_ptr, errors_ptr, page_table_ptr, r2t_stride, r2t_rows,
        pt_stride, swa_stride, capacity, f2s_len, bs, draft_tokens, part, first, n_blocks,
        PAGE_SIZE, HAS_SWA, HAS_ERRORS, ROW_I32, BLOCK, UNROLL, ROWS, True, False,
    )  # fmt: skip


@triton.jit  # type: ignore[untyped-decorator]  # Triton ships no types
def _scan_tile(SCAN_BLOCK: tl.constexpr):  # type: ignore[no-untyped-def]  # a Triton kernel
    """Row offsets of one scan tile as ``[SCAN_BLOCK // SCAN_WIDTH, SCAN_WIDTH]``, row-major:
    a scan along rows of SCAN_WIDTH within each thread, then one across the row totals, is
    faster than a single 1-D scan over the tile."""
    rows = tl.arange(0, SCAN_BLOCK // SCAN_WIDTH)[:, None] * SCAN_WIDTH
    return rows + tl.arange(0, SCAN_WIDTH)[None, :]


@triton.jit  # type: ignore[untyped-decorator]  # Triton ships no types
def _scan_cu_seqlens(  # type: ignore[no-untyped-def]  # a Triton kernel
    head,
    seq_lens_ptr,
    cu_seqlens_k_ptr,
    cu_seqlens_q_ptr,
    errors_ptr,
    bs,
    draft_tokens,
    HAS_ERRORS: tl.constexpr,
    HAS_CU_Q: tl.constexpr,
    CU_K_I32: tl.constexpr,
    SCAN_BLOCK: tl.constexpr,
):
    """Program (0, 0)'s extra work: ``cu_seqlens_k[0..bs]`` (and ``cu_seqlens_q``) in tiles of
    ``SCAN_BLOCK`` rows with an int64 running carry. ``head``: the first tile of ``seq_lens``
    (``_scan_tile`` offsets, masked to ``bs``), already loaded."""
    tl.store(cu_seqlens_k_ptr, tl.zeros((), cu_seqlens_k_ptr.dtype.element_ty))
    if HAS_CU_Q:
        tl.store(cu_seqlens_q_ptr, tl.zeros((), tl.int32))
    q_step = tl.maximum(draft_tokens, 1)
    offs = _scan_tile(SCAN_BLOCK)
    carry = tl.full((), 0, tl.int64)
    overflow = tl.full((), 0, tl.int32)
    lens = head
    start = bs * 0  # an i32 loop variable (the interpreter wants a while loop, not range)
    while start < bs:
        idx = start + offs
        m = idx < bs
        # The next tile's load goes out before this tile's scan: one load latency a step,
        # not a load and a scan.
        nxt = idx + SCAN_BLOCK
        lens_next = tl.load(seq_lens_ptr + nxt, mask=nxt < bs, other=0)
        # The same clamp as cache_seqlens, with the saturation first so no int64 add can wrap.
        sl = lens.to(tl.int64)
        kv = tl.minimum(tl.minimum(tl.maximum(sl, 0), INT32_MAX) + draft_tokens, INT32_MAX)
        # Inclusive sums in row-major order. Lanes past bs (loaded as 0, so holding
        # draft_tokens) come only at the end of the last tile, after every entry stored, and
        # the carry is not used after that tile.
        row_sums = tl.sum(kv, axis=1)
        row_starts = carry + tl.cumsum(row_sums, axis=0) - row_sums
        run = row_starts[:, None] + tl.cumsum(kv, axis=1)
        if CU_K_I32:
            tl.store(cu_seqlens_k_ptr + idx + 1, tl.minimum(run, INT32_MAX).to(tl.int32), mask=m)
            if HAS_ERRORS:
                overflow += tl.sum((m & (run > INT32_MAX)).to(tl.int32))
        else:
            tl.store(cu_seqlens_k_ptr + idx + 1, run, mask=m)
        if HAS_CU_Q:
            # < MAX_BATCH * MAX_DRAFT_TOKENS < 2^31: int32 is exact.
            tl.store(cu_seqlens_q_ptr + idx + 1, (idx + 1) * q_step, mask=m)
        carry += tl.sum(row_sums, axis=0)
        lens = lens_next
        start += SCAN_BLOCK
    if HAS_ERRORS:
        if CU_K_I32:
            tl.atomic_add(errors_ptr + ERR_CU_K_OVERFLOW, overflow)
