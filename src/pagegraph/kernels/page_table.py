"""The sync-free page-table builder ``build_page_table``: one Triton kernel, SWA in the same pass.

For every batch row ``i`` and page ``p < min(cdiv(seq_lens[i], page_size), width)`` it writes
``page_table[i, p] = req_to_token[req_pool_indices[i], p * page_size] // page_size`` (and the
SWA table through ``full_to_swa``) and nothing else. The lengths are read on the device, so a
call needs no host sync, allocates nothing and is legal inside CUDA-graph capture; its grid
follows the batch size and its work the live pages (docs/ARCHITECTURE.md, "The page-table
kernel", with the measurements behind the design in profiles/bench/NOTES.md).
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from .contract import check_builder_args, cuda_call_metadata, interpreter_active
from .gather import count_group_errors, gather_row_pages
from .launch import LaunchCache, LaunchEntry, hooks_active, launch_compiled, launch_key

#: Pages per block, blocks of each row per loop iteration, the cap on the grid
#: (``C * row_groups(bs)``) when choosing programs per row group, and warps per program.
#: Chosen on an H200 by sweeps of kernel variants (profiles/bench/NOTES.md, docs/HISTORY.md):
#: a gather of scattered 32-byte sectors wants many independent loads in flight spread over
#: many SMs, and every program costs launch throughput even when it exits at once, so
#: 128-page blocks two to a pass (256 pages of a row a program per pass, loads issued
#: together) beat both fewer, fatter programs and more, thinner ones.
BLOCK_PAGES = 128
UNROLL = 2
TARGET_PROGRAMS = 8192
NUM_WARPS = 4
#: Batch rows per program. A program that finds no live page of its rows still costs launch
#: throughput once the grid is large (see profiles/bench/NOTES.md), and with one row a
#: program most programs of a batch of short rows are such programs; two rows a program
#: halve them at no cost to long rows. Four lose on page size 1 and SWA, where the wider
#: tile holds more registers per thread.
ROWS_PER_PROGRAM = 2

#: CUDA's limit on grid axis 1, which carries the batch rows (kept on rows, though they go
#: there ROWS_PER_PROGRAM to a program).
MAX_BATCH = 65535


def row_groups(bs: int) -> int:
    """Programs along the batch axis: ``cdiv(bs, ROWS_PER_PROGRAM)``."""
    return -(-bs // ROWS_PER_PROGRAM)


def programs_per_row(bs: int, max_pages: int) -> int:
    """Programs that share one row group (``C``): enough that one pass of tiles covers the
    widest possible row, capped so the whole grid, ``C * row_groups(bs)``, stays near
    ``TARGET_PROGRAMS``. Host metadata only: the batch size and the static width, never the
    lengths."""
    cap = TARGET_PROGRAMS // max(row_groups(bs), 1)
    return max(1, min(-(-max_pages // (BLOCK_PAGES * UNROLL)), cap))


def row_fits_int32(max_pages: int, page_size: int) -> bool:
    """Whether every in-row page offset the kernel computes (masked tile lanes included, up
    to about twice the row) times ``page_size`` stays below 2^31."""
    return (2 * max_pages + (UNROLL + 1) * BLOCK_PAGES) * page_size < 2**31


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
    work_counter: torch.Tensor | None = None,
) -> None:
    """Fill ``page_table[:bs]`` (and ``swa_page_table``) in place from device-side lengths.

    Args:
        req_to_token: ``[max_reqs, max_context_len]`` int32/int64, inner stride 1.
        req_pool_indices: ``[bs]`` int32/int64, request row of each batch row.
        seq_lens: ``[bs]`` int32/int64, tokens of each batch row (read on the device).
        page_table: ``[bs, width]`` int32, inner stride 1; only live entries are written.
            ``bs <= 65535`` (``MAX_BATCH``).
        page_size: tokens per page, ``>= 1`` (a compile-time constant of the kernel).
        swa_page_table: ``[bs, width]`` int32, given together with ``full_to_swa``.
        full_to_swa: ``[num_slots + 1]`` int32/int64, SWA slot of each full slot.
        errors: optional ``[len(ERROR_KINDS)]`` int32 counters, incremented (never reset) on
            the device for out-of-contract values; see ``pagegraph.kernels.contract.ERROR_KINDS``.
        work_counter: a testing hook, optional ``[row_groups(bs)]`` int32, incremented by one
            for every pass of the page loop each program of a row group makes (compiled out
            without it). Tests use it to show the work follows the lengths, not the width.

    No host sync, no allocation: safe inside CUDA-graph capture. For repeated eager calls on
    the same buffers, ``prepare_build`` does the checks once.
    """
    tensors, ints, constexprs, max_pages, bs = _plan(
        req_to_token,
        req_pool_indices,
        seq_lens,
        page_table,
        page_size,
        swa_page_table,
        full_to_swa,
        errors,
        "build_page_table",
        work_counter,
    )
    if bs == 0 or max_pages == 0:
        return
    _launch(programs_per_row(bs, max_pages), bs, tensors, ints, constexprs)


class BuffersChanged(ValueError):
    """A tensor given to ``prepare_build`` no longer has the storage it was prepared with."""


_TENSOR_NAMES = (
    "req_to_token",
    "req_pool_indices",
    "seq_lens",
    "page_table",
    "swa_page_table",
    "full_to_swa",
    "errors",
    "work_counter",
)


class PreparedBuild:
    """``build_page_table`` on fixed buffers with the checks done once (``prepare_build``).

    ``build(bs=None)`` fills ``page_table[:bs]`` (default: every row it was prepared with)
    from ``seq_lens[:bs]`` and ``req_pool_indices[:bs]``, exactly as ``build_page_table``
    would on those prefixes. Each call still confirms that every tensor has the address it
    was prepared with (``BuffersChanged`` otherwise), but it reads no other metadata: like a
    CUDA graph's static buffers, the tensors must not be resized, re-strided or retyped in
    place after ``prepare_build``. Under Triton launch hooks a call takes the normal launch
    path, so the hooks see it; on a device other than the current one it launches on the
    tensors' device.
    """

    __slots__ = (
        "_tensors",
        "_ptrs",
        "_ints",
        "_constexprs",
        "_max_pages",
        "_rows",
        "_index",
        "_key",
        "_entry",
        "_parts",
    )

    def __init__(
        self,
        tensors: tuple[Any, ...],
        ints: tuple[Any, ...],
        constexprs: tuple[Any, ...],
        max_pages: int,
        rows: int,
    ):
        self._tensors = tensors
        self._ptrs = [t.data_ptr() for t in tensors]
        self._ints = ints
        self._constexprs = constexprs
        self._max_pages = max_pages
        self._rows = rows
        self._index = tensors[3].get_device()
        self._key = _launch_key(self._index, tensors, self._ptrs, ints, constexprs)
        self._entry: LaunchEntry | None = (
            None  # the compiled launch, once a first call has compiled it
        )
        self._parts: dict[int, int] = {}

    @property
    def rows(self) -> int:
        """Batch rows prepared: the largest ``bs`` a call accepts."""
        return self._rows

    def __call__(self, bs: int | None = None) -> None:
        rows = self._rows if bs is None else bs
        if not 0 <= rows <= self._rows:
            raise ValueError(f"bs must be in 0..{self._rows} (rows prepared), got {bs}")
        t, ptrs = self._tensors, self._ptrs
        for k in range(8):
            if t[k].data_ptr() != ptrs[k]:
                raise BuffersChanged(
                    f"{_TENSOR_NAMES[k]} moved since prepare_build "
                    f"({ptrs[k]:#x} -> {t[k].data_ptr():#x}): prepare again"
                )
        if rows == 0 or self._max_pages == 0:
            return
        parts = self._parts.get(rows)
        if parts is None:
            parts = self._parts[rows] = programs_per_row(rows, self._max_pages)
        entry = self._entry
        if entry is None or hooks_active():
            _launch(parts, rows, t, self._ints, self._constexprs)
            self._entry = launch_cache.get(self._key) if self._index >= 0 else None
            return
        launch_compiled(
            entry, self._index, parts, row_groups(rows), ptrs, self._ints, (rows, *self._constexprs)
        )


def prepare_build(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    page_table: torch.Tensor,
    page_size: int,
    *,
    swa_page_table: torch.Tensor | None = None,
    full_to_swa: torch.Tensor | None = None,
    errors: torch.Tensor | None = None,
) -> PreparedBuild:
    """Check a ``build_page_table`` call once and return it as a ``PreparedBuild``, for an
    engine that builds eagerly, every step, into the same buffers. Arguments and errors as
    ``build_page_table``; nothing is launched here."""
    plan = _plan(
        req_to_token,
        req_pool_indices,
        seq_lens,
        page_table,
        page_size,
        swa_page_table,
        full_to_swa,
        errors,
        "prepare_build",
    )
    return PreparedBuild(*plan)


def _plan(
    req_to_token: Any,
    req_pool_indices: Any,
    seq_lens: Any,
    page_table: Any,
    page_size: Any,
    swa_page_table: Any,
    full_to_swa: Any,
    errors: Any,
    builder: str,
    work_counter: Any = None,
) -> tuple[Any, ...]:
    """Checked arguments of one build: ``(tensors, ints, constexprs, max_pages, bs)``."""
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
    if meta is None:
        # Not the common case: the full checks name what is wrong (or accept CPU tensors
        # under the interpreter), and the metadata is read the slow way.
        check_builder_args(
            req_to_token,
            req_pool_indices,
            seq_lens,
            page_table,
            page_size,
            swa_page_table,
            full_to_swa,
            errors,
            builder=builder,
            cpu_ok=False,
        )
        bs, width = page_table.shape
        r2t_rows, r2t_cols = req_to_token.shape
        r2t_stride, pt_stride = req_to_token.stride(0), page_table.stride(0)
        swa_stride = swa_page_table.stride(0) if has_swa else None
        f2s_len = full_to_swa.shape[0] if has_swa else None
    else:
        _, bs, width, r2t_rows, r2t_cols, r2t_stride, pt_stride, swa_stride, f2s_len = meta
    # Pages a row of req_to_token can supply: a wider table must not read past that row.
    max_pages = min(width, -(-r2t_cols // page_size))
    if bs > MAX_BATCH:
        raise ValueError(f"{builder}: batch size {bs} exceeds {MAX_BATCH} rows")
    if work_counter is not None:
        _check_work_counter(work_counter, page_table, bs)
    # Unused pointer arguments alias page_table: never dereferenced (the constexpr flags
    # compile those paths out), and aliasing keeps the signature free of None.
    tensors = (
        req_to_token,
        req_pool_indices,
        seq_lens,
        page_table,
        swa_page_table if has_swa else page_table,
        full_to_swa if has_swa else page_table,
        page_table if errors is None else errors,
        page_table if work_counter is None else work_counter,
    )
    ints = (
        r2t_stride,
        r2t_rows,
        pt_stride,
        swa_stride if has_swa else pt_stride,
        max_pages * page_size,
        # Without SWA a constant, not the aliased table's row count: an int argument that
        # followed the batch size would be specialised (1, multiple of 16) per bucket.
        f2s_len if has_swa else 1,
    )
    constexprs = (
        page_size,
        has_swa,
        errors is not None,
        row_fits_int32(max_pages, page_size),
        BLOCK_PAGES,
        UNROLL,
        ROWS_PER_PROGRAM,
        work_counter is not None,
    )
    return tensors, ints, constexprs, max_pages, bs


def _check_work_counter(work_counter: Any, page_table: torch.Tensor, bs: int) -> None:
    if not isinstance(work_counter, torch.Tensor) or work_counter.dtype != torch.int32:
        raise TypeError("work_counter must be an int32 torch.Tensor")
    if work_counter.dim() != 1 or work_counter.shape[0] < row_groups(bs):
        raise ValueError(
            f"work_counter must have shape [>= row_groups(bs)] = [{row_groups(bs)}], "
            f"got {tuple(work_counter.shape)}"
        )
    if work_counter.device != page_table.device or work_counter.stride(0) != 1:
        raise ValueError("work_counter must be contiguous and on page_table's device")


# -- launcher ---------------------------------------------------------------------------------

#: Launch entries of ``_page_table_kernel`` by launch key (``_launch_key``); cleared by whoever
#: changes the module's tunables (``BLOCK_PAGES``, ``NUM_WARPS``, ...) between launches.
launch_cache = LaunchCache()


def _launch(
    parts: int,
    bs: int,
    tensors: tuple[Any, ...],
    ints: tuple[Any, ...],
    constexprs: tuple[Any, ...],
) -> None:
    index = tensors[3].get_device()
    if index < 0:  # Triton interpreter: no compiled kernel to cache.
        _jit_launch(parts, bs, tensors, ints, constexprs)
        return
    ptrs = [t.data_ptr() for t in tensors]
    key = _launch_key(index, tensors, ptrs, ints, constexprs)
    entry = launch_cache.get(key)
    if entry is None or hooks_active():
        launch_cache.first_launch(key, index, _jit_launch, parts, bs, tensors, ints, constexprs)
        return
    launch_compiled(entry, index, parts, row_groups(bs), ptrs, ints, (bs, *constexprs))


def _launch_key(
    index: int,
    tensors: tuple[Any, ...],
    ptrs: list[Any],
    ints: tuple[Any, ...],
    constexprs: tuple[Any, ...],
) -> tuple[Any, ...]:
    """The batch size is not in it: that argument is not specialised, so one key serves every
    bucket."""
    dtypes = (tensors[0].dtype, tensors[1].dtype, tensors[2].dtype, tensors[5].dtype)
    return launch_key(index, dtypes, ptrs, ints, constexprs, NUM_WARPS)


def _jit_launch(
    parts: int,
    bs: int,
    tensors: tuple[Any, ...],
    ints: tuple[Any, ...],
    constexprs: tuple[Any, ...],
) -> Any:
    """Triton's own launch path (binds, specialises, compiles on first use); returns the
    compiled kernel. Only the first call of a launch key, the interpreter and calls under
    launch hooks come here, so its keyword arguments stay off the fast path."""
    page_size, has_swa, has_errors, row_i32, block, unroll, rows, has_work = constexprs
    return _page_table_kernel[(parts, -(-bs // rows))](
        *tensors,
        *ints,
        bs,
        PAGE_SIZE=page_size,
        HAS_SWA=has_swa,
        HAS_ERRORS=has_errors,
        ROW_I32=row_i32,
        BLOCK=block,
        UNROLL=unroll,
        ROWS=rows,
        HAS_WORK=has_work,
        num_warps=NUM_WARPS,
    )


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


@triton.jit(do_not_specialize=["bs"])  # type: ignore[untyped-decorator]  # Triton ships no types
def _page_table_kernel(  # type: ignore[no-untyped-def]  # a Triton kernel
    req_to_token_ptr,  # [max_reqs, r2t_stride] int32|int64
    req_pool_indices_ptr,  # [bs] int32|int64
    seq_lens_ptr,  # [bs] int32|int64
    page_table_ptr,  # [bs, pt_stride] int32
    swa_page_table_ptr,  # [bs, swa_stride] int32 (aliases page_table_ptr without SWA)
    full_to_swa_ptr,  # [f2s_len] int32|int64 (unused without SWA)
    errors_ptr,  # [len(ERROR_KINDS)] int32 (unused without HAS_ERRORS)
    work_ptr,  # [cdiv(bs, ROWS)] int32 loop passes per row group (unused without HAS_WORK)
    r2t_stride,
    r2t_rows,
    pt_stride,
    swa_stride,
    capacity,  # tokens a row can hold: PAGE_SIZE * min(width, cdiv(r2t row, PAGE_SIZE))
    f2s_len,
    bs,  # batch rows; not specialised, so every bucket shares one compiled kernel
    PAGE_SIZE: tl.constexpr,
    HAS_SWA: tl.constexpr,
    HAS_ERRORS: tl.constexpr,
    ROW_I32: tl.constexpr,  # in-row page arithmetic fits 32 bits (host-checked)
    BLOCK: tl.constexpr,
    UNROLL: tl.constexpr,
    ROWS: tl.constexpr,  # batch rows per program
    HAS_WORK: tl.constexpr,  # count loop passes (a testing hook, compiled out by default)
):
    # Grid (C, cdiv(bs, ROWS)): the C programs of one row group are C apart in launch order,
    # so the live programs of a long row spread over many SMs instead of filling a few.
    part = tl.program_id(0)
    first = tl.program_id(1) * ROWS

    # The group's rows as [ROWS] vectors: the loop bound is the longest of them, and the
    # error counters count each row once (in part 0). Rows past bs read as empty.
    group = first + tl.arange(0, ROWS)
    in_batch = group < bs
    group_lens = tl.load(seq_lens_ptr + group, mask=in_batch, other=0)
    # Clamped in the loaded dtype before any narrowing: a negative length writes nothing and
    # an overlong one stops at the row's capacity.
    group_tokens = tl.minimum(tl.maximum(group_lens, 0), capacity)
    if ROW_I32:
        group_tokens = group_tokens.to(tl.int32)
    else:
        group_tokens = group_tokens.to(tl.int64)
    n_blocks = tl.max((group_tokens + (PAGE_SIZE * BLOCK - 1)) // (PAGE_SIZE * BLOCK), axis=0)

    if HAS_ERRORS:
        if part == 0:
            over = group_lens > capacity
            count_group_errors(
                errors_ptr, req_pool_indices_ptr, group, in_batch, group_lens, over, r2t_rows
            )

    gather_row_pages(
        req_to_token_ptr, req_pool_indices_ptr, seq_lens_ptr, page_table_ptr,
        swa_page_table_ptr, full_to_swa_ptr, errors_ptr, work_ptr, r2t_stride, r2t_rows,
        pt_stride, swa_stride, capacity, f2s_len, bs, 0, part, first, n_blocks,
        PAGE_SIZE, HAS_SWA, HAS_ERRORS, ROW_I32, BLOCK, UNROLL, ROWS, False, HAS_WORK,
    )  # fmt: skip
