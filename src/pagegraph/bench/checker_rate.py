"""The "checker" section: how many replays per second the checker verifies.

``check_replay_safety("build_page_table", ...)`` runs four times on one scenario (no sync
detector and CUPTI, each with the workload's host models in this process and in children) and
the rate of checked replays, the verdict, the wall time and the host time of a replay's phases
are recorded: ``graphs/sglang-h200.toml`` with 5000 replays on a GPU, ``graphs/default.toml``
with 8 on a CPU, which only shows that the section runs (docs/ARCHITECTURE.md, "The bench").
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

from ..check.checker import check_replay_safety
from ..check.scenario import load_scenario
from ..detect.ranges import phase
from ..detect.sync import available_detectors
from .bench_settings import error, recover

CHECKER_SCENARIO = "graphs/sglang-h200.toml"
CHECKER_REPLAYS = 5000
#: The quick run's replays (``--quick``): enough to pass the start-up and reach a steady rate.
CHECKER_REPLAYS_QUICK = 500
SMOKE_CHECKER_SCENARIO = "graphs/default.toml"
SMOKE_CHECKER_REPLAYS = 8

#: The runs: (detector label, ``CheckConfig.detectors``, ``CheckConfig.workload_process``).
CHECKER_RUNS: tuple[tuple[str, str | tuple[str, ...], str], ...] = (
    ("none", "none", "off"),
    ("cupti", ("cupti",), "off"),
    ("none", "none", "on"),
    ("cupti", ("cupti",), "on"),
)

#: The repository root, for scenario paths when the bench does not run from it.
_REPO = Path(__file__).resolve().parents[3]


def find_scenario(path: str | Path) -> Path:
    """``path`` as given when it exists (relative to the working directory), else relative
    to the repository root this package was loaded from; ``FileNotFoundError`` otherwise."""
    p = Path(path)
    if p.exists():
        return p
    q = _REPO / p
    if not p.is_absolute() and q.exists():
        return q
    raise FileNotFoundError(f"scenario {path} not found (looked in . and {_REPO})")


def finite_or_none(x: float | None) -> float | None:
    """``x``, or ``None`` when it is ``None``, NaN or infinite (JSON has no NaN)."""
    if x is None or not math.isfinite(x):
        return None
    return float(x)


def checker_row(
    scenario: str, path: str, detectors: str, replays: int, workload_process: str = "off"
) -> dict[str, Any]:
    """A row of the checker section with every field present, the measured ones ``None``."""
    return {
        "scenario": scenario,
        "path": path,
        "builder": "build_page_table",
        "detectors": detectors,
        "workload_process": workload_process,
        "replays_requested": replays,
        "replays": None,
        "replays_per_s": None,
        "verdict": None,
        "stopped": None,
        "wall_s": None,
        # Mean host time a replay spends in each phase (Report.phase_us): generating the
        # workload step, in runner.replay(), in the checker's own work.
        "workload_us": None,
        "replay_us": None,
        "checker_us": None,
        "skipped": None,
        "error": None,
    }


def bench_checker(cuda: bool, quick: bool = False) -> list[dict[str, Any]]:
    """One row per run of ``CHECKER_RUNS``; a failure or a skip is recorded in its row, never
    raised. Without CUDA only the in-process runs (a child's start-up would dominate 8
    replays)."""
    if cuda:
        scenario_path = CHECKER_SCENARIO
        steps = CHECKER_REPLAYS_QUICK if quick else CHECKER_REPLAYS
    else:
        scenario_path, steps = SMOKE_CHECKER_SCENARIO, SMOKE_CHECKER_REPLAYS
    name = Path(scenario_path).stem
    runs = [r for r in CHECKER_RUNS if cuda or r[2] == "off"]
    rows = [checker_row(name, scenario_path, label, steps, wp) for label, _, wp in runs]
    try:
        scenario = load_scenario(find_scenario(scenario_path))
    except Exception as exc:  # noqa: BLE001
        for row in rows:
            row["error"] = f"scenario: {error(exc)}"
        return rows
    for row, (label, detectors, workload_process) in zip(rows, runs):
        row["scenario"] = scenario.name
        if label != "none":
            reason = available_detectors().get(label, f"no detector {label!r}")
            if reason is not None:
                row["skipped"] = reason
                continue
        cfg = scenario.config.replace(
            steps=steps, detectors=detectors, workload_process=workload_process
        )
        try:
            with phase("bench"):
                t0 = time.perf_counter()
                report = check_replay_safety("build_page_table", cfg)
                row["wall_s"] = time.perf_counter() - t0
            row["replays"] = report.replays
            row["replays_per_s"] = finite_or_none(report.replays_per_s)
            row["verdict"] = report.verdict
            row["stopped"] = report.stopped
            for name in ("workload", "replay", "checker"):
                row[f"{name}_us"] = report.phase_us.get(name)
        except Exception as exc:  # noqa: BLE001
            row["error"] = error(exc)
        finally:
            recover(cuda)
    return rows
