"""Where the host time of one eager build_page_table call goes (GPU machine).

Prints the median host time of the whole call and of its pieces, and a cProfile of the call,
so a regression of the eager-launch figure can be traced to its piece.
"""

from __future__ import annotations

import cProfile
import pstats
import statistics
import time

import torch

from pagegraph import build_page_table
from pagegraph import kernel as k
from pagegraph.contract import check_builder_args


def median_us(fn, n=2000):
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    times = []
    for i in range(n):
        if i % 100 == 0:
            torch.cuda.synchronize()
        t = time.perf_counter_ns()
        fn()
        times.append(time.perf_counter_ns() - t)
    torch.cuda.synchronize()
    return statistics.median(times) / 1e3


def main():
    bs, ctx, ps = 256, 131072, 64
    r2t = torch.randint(0, 1 << 20, (bs + 1, ctx), dtype=torch.int32, device="cuda")
    rpi = torch.arange(1, bs + 1, dtype=torch.int32, device="cuda")
    sl = torch.randint(1, ctx, (bs,), dtype=torch.int32, device="cuda")
    pt = torch.empty((bs, ctx // ps), dtype=torch.int32, device="cuda")
    f2s = torch.arange(1 << 21, device="cuda")
    swa = torch.empty_like(pt)
    print("launch hooks active:", k._hooks_active())
    build_page_table(r2t, rpi, sl, pt, ps)
    print("fast-path entries:", len(k._compiled))
    parts = k.programs_per_row(bs, pt.shape[1])
    tensors = (r2t, rpi, sl, pt, pt, pt, pt)
    ints = (r2t.stride(0), r2t.shape[0], pt.stride(0), pt.stride(0), pt.shape[1] * ps, 1)
    constexprs = (ps, False, False, True, k.BLOCK_PAGES, k.UNROLL)
    rows = {
        "build_page_table": lambda: build_page_table(r2t, rpi, sl, pt, ps),
        "build_page_table, SWA": lambda: build_page_table(
            r2t, rpi, sl, pt, ps, swa_page_table=swa, full_to_swa=f2s
        ),
        "check_builder_args": lambda: check_builder_args(r2t, rpi, sl, pt, ps, cpu_ok=False),
        "kernel[grid](...) (Triton's path)": lambda: k._jit_launch(
            parts, bs, tensors, ints, constexprs
        ),
        "PreparedBuild call": k.prepare_build(r2t, rpi, sl, pt, ps),
        "empty Python function call": lambda: None,
    }
    for name, fn in rows.items():
        print(f"{name:40s} {median_us(fn):8.2f} us")
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(3000):
        build_page_table(r2t, rpi, sl, pt, ps)
    prof.disable()
    torch.cuda.synchronize()
    pstats.Stats(prof).sort_stats("tottime").print_stats(12)


if __name__ == "__main__":
    main()
