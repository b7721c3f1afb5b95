"""Where the host time of one eager build_page_table call goes (GPU machine).

Prints the median host time of each piece of the launch path and a cProfile of the whole call,
so a regression of the eager-launch figure can be traced to its piece.
"""

from __future__ import annotations

import cProfile
import pstats
import statistics
import time

import torch
import triton

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
    print("launch hooks:", triton.knobs.runtime.launch_enter_hook, triton.knobs.runtime.launch_exit_hook)
    build_page_table(r2t, rpi, sl, pt, ps)
    args = (r2t, rpi, sl, pt, pt, pt, pt, r2t.stride(0), r2t.shape[0], pt.stride(0), pt.stride(0),
            pt.shape[1], ps, pt.shape[0])
    key = (0, *k._launch_key(args, False, False))
    compiled = k._compiled.get(key)
    print("fast-path entries:", len(k._compiled), "hit:", compiled is not None)
    grid = (bs, k.programs_per_row(bs, pt.shape[1]))
    rows = {
        "build_page_table": lambda: build_page_table(r2t, rpi, sl, pt, ps),
        "check_builder_args": lambda: check_builder_args(r2t, rpi, sl, pt, ps, cpu_ok=False),
        "_launch_key": lambda: k._launch_key(args, False, False),
        "current_device": torch.cuda.current_device,
        "raw stream": lambda: k._current_raw_stream(0),
        "knobs.launch_enter_hook": lambda: triton.knobs.runtime.launch_enter_hook,
        "kernel[grid](...) (Triton's path)": lambda: k._page_table_kernel[grid](
            *args, HAS_SWA=False, HAS_ERRORS=False, BLOCK=k.BLOCK_PAGES, num_warps=k.NUM_WARPS),
    }
    if compiled is not None:
        stream = k._current_raw_stream(0)
        rows["compiled.run (launcher only)"] = lambda: compiled.run(
            grid[0], grid[1], 1, stream, compiled.function, compiled.packed_metadata, None, None,
            None, *args, False, False, k.BLOCK_PAGES)
    for name, fn in rows.items():
        print(f"{name:40s} {median_us(fn):8.2f} us")
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(3000):
        build_page_table(r2t, rpi, sl, pt, ps)
    prof.disable()
    torch.cuda.synchronize()
    pstats.Stats(prof).sort_stats("tottime").print_stats(14)


if __name__ == "__main__":
    main()
