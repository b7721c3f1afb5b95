"""Where the host time of one eager ``build_page_table`` call goes: the whole call against its
pieces (the argument checks, a ``PreparedBuild`` call, Triton's own ``kernel[grid](...)``
launch path, an empty Python call), on decode-large's shape (256 rows of up to 131,072 tokens,
page size 64), so a regression of the eager-launch figure can be traced to its piece.

With pytest-benchmark: ``pytest benchmarks/test_launch_overhead.py --benchmark-only`` (one row
a piece; needs a GPU). Alone, ``python benchmarks/test_launch_overhead.py`` prints each piece's
median host time, the short builds' host time when each call finds the GPU idle and when it
finds it busy, and a cProfile of the call (``tools/gpu_validate.sh OUT launch`` runs it).
Its figures are in ``profiles/bench/NOTES.md`` ("Where it stands against the targets").
"""

from __future__ import annotations

import cProfile
import pstats
import statistics
import time
from collections.abc import Callable

import pytest
import torch

from pagegraph import build_page_table
from pagegraph.kernels import launch
from pagegraph.kernels import page_table as k
from pagegraph.kernels.contract import check_builder_args

pytestmark = [pytest.mark.bench, pytest.mark.gpu]

BS, CTX, PS = 256, 131072, 64


def make_inputs() -> dict[str, torch.Tensor]:
    """decode-large's tensors on the GPU (random token slots, random lengths)."""
    dev = "cuda"
    pt = torch.empty((BS, CTX // PS), dtype=torch.int32, device=dev)
    return {
        "r2t": torch.randint(0, 1 << 20, (BS + 1, CTX), dtype=torch.int32, device=dev),
        "rpi": torch.arange(1, BS + 1, dtype=torch.int32, device=dev),
        "sl": torch.randint(1, CTX, (BS,), dtype=torch.int32, device=dev),
        "pt": pt,
        "f2s": torch.arange(1 << 21, device=dev),
        "swa": torch.empty_like(pt),
    }


def pieces(t: dict[str, torch.Tensor]) -> dict[str, Callable[[], object]]:
    """The whole call and each piece of it, as calls of no arguments."""
    r2t, rpi, sl, pt = t["r2t"], t["rpi"], t["sl"], t["pt"]
    build_page_table(r2t, rpi, sl, pt, PS)
    tensors, ints, constexprs, max_pages, _ = k._plan(
        r2t, rpi, sl, pt, PS, None, None, None, "build_page_table"
    )
    parts = k.programs_per_row(BS, max_pages)
    return {
        "build_page_table": lambda: build_page_table(r2t, rpi, sl, pt, PS),
        "build_page_table, SWA": lambda: build_page_table(
            r2t, rpi, sl, pt, PS, swa_page_table=t["swa"], full_to_swa=t["f2s"]
        ),
        "check_builder_args": lambda: check_builder_args(r2t, rpi, sl, pt, PS, cpu_ok=False),
        "kernel[grid](...) (Triton's path)": lambda: k._jit_launch(
            parts, BS, tensors, ints, constexprs
        ),
        "PreparedBuild call": k.prepare_build(r2t, rpi, sl, pt, PS),
        "empty Python function call": lambda: None,
    }


@pytest.fixture(scope="module")
def calls():
    t = make_inputs()
    yield pieces(t)
    del t
    torch.cuda.empty_cache()


@pytest.mark.parametrize("piece", ["build_page_table", "check_builder_args", "PreparedBuild call"])
def test_launch_piece(benchmark, calls, piece):
    fn = calls[piece]
    benchmark.pedantic(fn, rounds=200, iterations=10, warmup_rounds=5)
    torch.cuda.synchronize()


def median_us(fn: Callable[[], object], n: int = 2000) -> float:
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


def idle_vs_busy_us(fn: Callable[[], object], n: int = 400, batch: int = 50) -> tuple[float, float]:
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


def main() -> None:
    t = make_inputs()
    print("launch hooks active:", launch.hooks_active())
    rows = pieces(t)
    print("fast-path entries:", len(k.launch_cache))
    for name, fn in rows.items():
        print(f"{name:40s} {median_us(fn):8.2f} us")
    # Short builds (a skewed batch: the device time is ~2 us, less than the host time), so
    # whether a launch finds the GPU idle or busy is up to the caller.
    r2t, rpi, pt = t["r2t"], t["rpi"], t["pt"]
    short = torch.full((BS,), 100, dtype=torch.int32, device="cuda")
    short[0] = CTX
    prepared = k.prepare_build(r2t, rpi, short, pt, PS)
    print("GPU idle vs busy at each call (short builds), median host us:")
    for name, fn in {
        "build_page_table": lambda: build_page_table(r2t, rpi, short, pt, PS),
        "PreparedBuild call": prepared,
    }.items():
        idle, busy = idle_vs_busy_us(fn)
        print(f"  {name:38s} idle {idle:7.2f}  busy {busy:7.2f}")
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(3000):
        build_page_table(r2t, rpi, t["sl"], pt, PS)
    prof.disable()
    torch.cuda.synchronize()
    pstats.Stats(prof).sort_stats("tottime").print_stats(12)


if __name__ == "__main__":
    main()
