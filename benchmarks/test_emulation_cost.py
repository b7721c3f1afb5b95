"""What emulated graphs cost a CPU check: ``check_replay_safety("build_page_table")`` on
``graphs/default.toml``, its replays through ``EmulatedGraph`` (the CPU's default) against the
eager replays of ``GraphRunner(emulate=False)``, in one process. The figure is the ratio of the
two medians of the whole call's wall time (set-up, capture and every replay).

With pytest-benchmark: ``pytest benchmarks/test_emulation_cost.py --benchmark-only`` (one row
per mode, ``extra_info`` carries the verdicts). Alone, interleaving the modes round by round so
that a busy machine weighs on both alike: ``python benchmarks/test_emulation_cost.py
[rounds]`` prints each median and the ratio.
"""

from __future__ import annotations

import functools
import statistics
import sys
import time
from pathlib import Path

import pytest
import torch

from pagegraph.check.checker import check_replay_safety
from pagegraph.check.scenario import load_scenario
from pagegraph.graph.runner import GraphRunner

SCENARIO = Path(__file__).resolve().parent.parent / "graphs" / "default.toml"
MODES = {"emulated": GraphRunner, "eager": functools.partial(GraphRunner, emulate=False)}

pytestmark = [
    pytest.mark.bench,
    pytest.mark.skipif(torch.cuda.is_available(), reason="emulation is the CPU's"),
]


def check_once(mode: str) -> str:
    """One whole check of the scenario in ``mode``; its verdict."""
    cfg = load_scenario(SCENARIO).config
    return check_replay_safety("build_page_table", cfg, runner_factory=MODES[mode]).verdict


@pytest.mark.parametrize("mode", list(MODES))
def test_check_default(benchmark, mode):
    verdicts = []
    benchmark.pedantic(lambda: verdicts.append(check_once(mode)), rounds=3, iterations=1)
    benchmark.extra_info["verdicts"] = verdicts
    assert set(verdicts) == {"SAFE"}


def compare(rounds: int = 3) -> dict[str, float]:
    """Median wall seconds of each mode over ``rounds`` interleaved rounds, and their ratio."""
    check_once("eager")  # the interpreter's first rewrite of each kernel, outside the timing
    times: dict[str, list[float]] = {mode: [] for mode in MODES}
    for _ in range(rounds):
        for mode in MODES:
            t0 = time.perf_counter()
            verdict = check_once(mode)
            times[mode].append(time.perf_counter() - t0)
            if verdict != "SAFE":
                raise RuntimeError(f"{mode}: verdict {verdict}")
    medians = {mode: statistics.median(ts) for mode, ts in times.items()}
    return {**medians, "ratio": medians["emulated"] / medians["eager"]}


if __name__ == "__main__":
    result = compare(int(sys.argv[1]) if len(sys.argv) > 1 else 3)
    print(
        f"default, build_page_table: emulated {result['emulated']:.2f} s, eager "
        f"{result['eager']:.2f} s (medians), emulated / eager = {result['ratio']:.2f}"
    )
