"""The Triton kernel that writes a pool's page runs into its table on a GPU.

A page run is five int64 ``(base, value, step, lo, hi)``: entries ``base + j`` for lanes ``lo
<= j < hi`` get ``value + j * step``. On a GPU the CPU's chain (torch operators, then
``index_copy_``) cost the largest part of a checked replay's workload phase; this kernel writes
a step's runs in one launch through ``pagegraph.kernels.launch``, and only entries ``0 <= base
+ j < numel`` and lanes ``j < page_size``, whatever the runs say.
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from ..kernels.launch import (
    LaunchEntry,
    device_context,
    hooks_active,
    launch_compiled,
    launch_entry,
)

#: Entries a program covers: as many runs as fit, at least one (a page wider than this
#: takes a program of its own).
PROGRAM_ENTRIES = 1024
#: Widest page the kernel takes: one run's lanes are one block, and Triton's blocks hold
#: at most 2**20 elements (wider pages are written by the operators, ``pool._PageWriter``).
MAX_PAGE_SIZE = 1 << 20
NUM_WARPS = 4


@triton.jit(do_not_specialize=["first", "count", "numel"])  # type: ignore[untyped-decorator]  # Triton ships no types
def _write_runs_kernel(  # type: ignore[no-untyped-def]  # a Triton kernel
    runs,  # [capacity * 5] int64: base, value, step, lo, hi of each run
    table,  # flat int32 / int64 table
    first,  # first run to write
    count,  # runs to write
    numel,  # entries of the table
    PAGE_SIZE: tl.constexpr,
    PAGE_BLOCK: tl.constexpr,  # PAGE_SIZE rounded up to a power of two
    RUNS: tl.constexpr,  # runs a program
):
    r = tl.program_id(0) * RUNS + tl.arange(0, RUNS)
    live = r < count
    at = (first + r).to(tl.int64) * 5
    base = tl.load(runs + at, mask=live, other=0)
    value = tl.load(runs + at + 1, mask=live, other=0)
    step = tl.load(runs + at + 2, mask=live, other=0)
    lo = tl.load(runs + at + 3, mask=live, other=0)
    hi = tl.load(runs + at + 4, mask=live, other=0)
    j = tl.arange(0, PAGE_BLOCK)[None, :].to(tl.int64)
    index = base[:, None] + j
    mask = (
        live[:, None]
        & (j < PAGE_SIZE)
        & (j >= lo[:, None])
        & (j < hi[:, None])
        & (index >= 0)
        & (index < numel)
    )
    entries = value[:, None] + j * step[:, None]
    tl.store(table + index, entries.to(table.dtype.element_ty), mask=mask)


class RunWriter:
    """Writes runs of one fixed upload buffer into one fixed table (both on one GPU, or on
    the CPU under the Triton interpreter).

    Args:
        runs: ``[capacity * 5]`` int64, contiguous: the runs, as uploaded.
        table: the flat table (``[numel]`` int32 or int64, contiguous).
        page_size: entries a page (lanes a run).
    """

    def __init__(self, runs: torch.Tensor, table: torch.Tensor, page_size: int):
        if runs.dtype != torch.int64 or runs.dim() != 1 or not runs.is_contiguous():
            raise ValueError("runs must be a contiguous 1-D int64 tensor")
        if table.dim() != 1 or not table.is_contiguous():
            raise ValueError("table must be a contiguous 1-D tensor")
        if table.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"table must be int32 or int64, got {table.dtype}")
        if runs.device != table.device:
            raise ValueError(f"runs on {runs.device}, table on {table.device}")
        if not 1 <= page_size <= MAX_PAGE_SIZE:
            raise ValueError(f"page_size must be in 1..{MAX_PAGE_SIZE}, got {page_size}")
        self.runs, self.table = runs, table
        self.capacity = runs.numel() // 5
        block = triton.next_power_of_2(page_size)
        self.runs_per_program = max(1, PROGRAM_ENTRIES // block)
        self._constexprs = (page_size, block, self.runs_per_program)
        self._index = table.get_device()
        # The compiled kernel's launcher, once Triton's own path has compiled it (GPU only).
        self._entry: LaunchEntry | None = None
        self._ptrs = (runs.data_ptr(), table.data_ptr())
        self._numel = table.numel()

    def __call__(self, first: int, count: int) -> None:
        """Write runs ``first .. first + count - 1`` on the current stream."""
        if first < 0 or count < 0 or first + count > self.capacity:
            raise ValueError(
                f"runs {first}..{first + count} outside the {self.capacity} of the buffer"
            )
        if not count:
            return
        programs = -(-count // self.runs_per_program)
        index = self._index
        entry = self._entry
        if entry is None or hooks_active():
            # Triton's own path: compiles on first use (and runs under the interpreter).
            with device_context(index):
                kernel = self._jit_launch(programs, first, count)
            if entry is None and index >= 0:
                self._entry = launch_entry(kernel)
            return
        launch_compiled(
            entry, index, programs, 1, self._ptrs, (first, count, self._numel), self._constexprs
        )

    def _jit_launch(self, programs: int, first: int, count: int) -> Any:
        page_size, block, runs = self._constexprs
        return _write_runs_kernel[(programs,)](
            self.runs,
            self.table,
            first,
            count,
            self.table.numel(),
            PAGE_SIZE=page_size,
            PAGE_BLOCK=block,
            RUNS=runs,
            num_warps=NUM_WARPS,
        )
