"""What a grid of programs that exit at once costs on this GPU (profiles/bench/NOTES.md).

Each program loads one length and one request index, as the page-table kernel's programs do
before they find their row empty, and exits. Device time per graph node, the bench's timing.

Usage: ``PYTHONPATH=src python tools/experiments/grid_cost.py``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from pagegraph import bench as B


@triton.jit
def _exit_kernel(len_ptr, idx_ptr, out_ptr):
    row = tl.program_id(1)
    n = tl.load(len_ptr + row)
    q = tl.load(idx_ptr + row)
    if n < 0:  # never true: the lengths are positive
        tl.store(out_ptr + row, q)


def main() -> None:
    lens = torch.full((65536,), 5, dtype=torch.int32, device="cuda")
    idx = torch.arange(65536, dtype=torch.int32, device="cuda")
    out = torch.zeros(65536, dtype=torch.int32, device="cuda")
    for warps in (1, 4):
        grids = ((1, 1), (1, 64), (1, 256), (4, 256), (8, 256), (16, 256), (32, 256), (8, 1024))
        for c, rows in grids:
            us, g = B.device_time_us(
                lambda c=c, rows=rows, warps=warps: _exit_kernel[(c, rows)](
                    lens, idx, out, num_warps=warps
                ),
                20,
                30,
            )
            del g
            print(f"warps {warps} grid ({c:2d}, {rows:4d}) = {c * rows:6d} programs: {us:.2f} us")


if __name__ == "__main__":
    main()
