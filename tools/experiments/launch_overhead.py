"""Where the host time of one eager build_page_table call goes (GPU machine).

Prints the median host time of the whole call and of its pieces, and a cProfile of the call,
so a regression of the eager-launch figure can be traced to its piece.

Usage: ``PYTHONPATH=src python tools/experiments/launch_overhead.py`` (``tools/gpu_validate.sh
OUT launch`` runs it).
"""

from __future__ import annotations

import cProfile
import pstats
import statistics
import time

import torch

from pagegraph import build_page_table
from pagegraph.kernels import launch
from pagegraph.kernels import page_table as k
from pagegraph.kernels.contract import check_builder_args


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


def idle_vs_busy_us(fn, n=400, batch=50) -> tuple[float, float]:
    """Median host time of ``fn`` when each call finds the GPU idle (the queue drained before
    it, outside the timed region) and when it finds the GPU busy (a ~1 ms sleep kernel queued
    ahead of each batch of calls, so every launch lands behind queued work)."""
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    idle = []
    for _ in range(n):
        torch.cuda.synchronize()
        t = time.perf_counter_ns()
        fn()
        idle.append(time.perf_counter_ns() - t)
    busy = []
    for i in range(n):
        if i % batch == 0:
            torch.cuda.synchronize()
            torch.cuda._sleep(2_000_000)
        t = time.perf_counter_ns()
        fn()
        busy.append(time.perf_counter_ns() - t)
    torch.cuda.synchronize()
    return statistics.median(idle) / 1e3, statistics.median(busy) / 1e3


def main():
    bs, ctx, ps = 256, 131072, 64
    r2t = torch.randint(0, 1 << 20, (bs + 1, ctx), dtype=torch.int32, device="cuda")
    rpi = torch.arange(1, bs + 1, dtype=torch.int32, device="cuda")
    sl = torch.randint(1, ctx, (bs,), dtype=torch.int32, device="cuda")
    pt = torch.empty((bs, ctx // ps), dtype=torch.int32, device="cuda")
    f2s = torch.arange(1 << 21, device="cuda")
    swa = torch.empty_like(pt)
    print("launch hooks active:", launch.hooks_active())
    build_page_table(r2t, rpi, sl, pt, ps)
    print("fast-path entries:", len(k.launch_cache))
    tensors, ints, constexprs, max_pages, _ = k._plan(
        r2t, rpi, sl, pt, ps, None, None, None, "build_page_table"
    )
    parts = k.programs_per_row(bs, max_pages)
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
    # Short builds (a skewed batch: the device time is ~2 us, less than the host time), so
    # whether a launch finds the GPU idle or busy is up to the caller.
    short = torch.full((bs,), 100, dtype=torch.int32, device="cuda")
    short[0] = ctx
    prepared = k.prepare_build(r2t, rpi, short, pt, ps)
    print("GPU idle vs busy at each call (short builds), median host us:")
    for name, fn in {
        "build_page_table": lambda: build_page_table(r2t, rpi, short, pt, ps),
        "PreparedBuild call": prepared,
    }.items():
        idle, busy = idle_vs_busy_us(fn)
        print(f"  {name:38s} idle {idle:7.2f}  busy {busy:7.2f}")
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(3000):
        build_page_table(r2t, rpi, sl, pt, ps)
    prof.disable()
    torch.cuda.synchronize()
    pstats.Stats(prof).sort_stats("tottime").print_stats(12)


if __name__ == "__main__":
    main()
