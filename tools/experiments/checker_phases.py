"""Where a checked replay's host time goes, piece by piece, with the workload in child processes.

Wraps the pieces the checker calls once a replay (or once a batch) with a timer, runs one
``check_replay_safety`` over a scenario (detectors off by default, as the 5,000/s target is
stated), and prints each piece's mean microseconds per replay next to the report's own
``replays_per_s`` and ``phase_us``. The timers cost a fraction of a microsecond each; the
remainder (``checker us`` minus the wrapped checker pieces) is the loop's own Python.

Usage: PYTHONPATH=src python tools/experiments/checker_phases.py
       [--scenario graphs/sglang-h200.toml] [--replays 5000] [--detectors none|cupti]
       [--streams K] [--window N] [--json OUT]

The timeline splits the run into windows of ``--window`` replays and gives each window's
rate and the time it spent waiting for the workload's batches: a slow first window says the
children were still getting ahead when the replays began.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict

import torch

from pagegraph.check import checker
from pagegraph.check.judges import verify
from pagegraph.check.pipeline import replay_loop
from pagegraph.check.scenario import load_scenario
from pagegraph.graph import runner
from pagegraph.workload import pool as pool_mod
from pagegraph.workload import producer

#: Seconds of every call of each piece; the first call (start-up: a child's first batch, the
#: graphs' first launch) is left out of the means.
TIMES: dict[str, list[float]] = defaultdict(list)
#: ``perf_counter()`` at the start of every call of each piece (for the timeline).
STARTS: dict[str, list[float]] = defaultdict(list)


def timed(owner, attr: str, label: str) -> None:
    fn = getattr(owner, attr)

    def wrapper(*args, **kwargs):
        t0 = time.perf_counter()
        STARTS[label].append(t0)
        try:
            return fn(*args, **kwargs)
        finally:
            TIMES[label].append(time.perf_counter() - t0)

    setattr(owner, attr, wrapper)


def timeline(window: int) -> list[dict]:
    """Per window of ``window`` replays: its rate and the milliseconds spent in next_batch."""
    starts = STARTS["replay: runner.replay"]
    waits = list(zip(STARTS["workload: next_batch (wait + unpack)"],
                     TIMES["workload: next_batch (wait + unpack)"]))  # fmt: skip
    rows = []
    for a in range(1, len(starts) - window, window):
        t0, t1 = starts[a], starts[a + window]
        wait = sum(d for s, d in waits if t0 <= s < t1)
        rate = round(window / (t1 - t0))
        rows.append({"from": a, "per_s": rate, "wait_ms": round(wait * 1e3, 1)})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scenario", default="graphs/sglang-h200.toml")
    ap.add_argument("--replays", type=int, default=5000)
    ap.add_argument("--detectors", default="none", choices=["none", "cupti", "torch"])
    ap.add_argument("--streams", type=int, help="workload streams (default: the scenario's)")
    ap.add_argument("--window", type=int, default=500, help="replays per timeline window")
    ap.add_argument("--json")
    args = ap.parse_args()
    pieces = [
        (verify.BatchModel, "stage", "checker: model.stage"),
        (verify.TableVerifier, "upload", "checker: verifier.upload"),
        (verify.TableVerifier, "verify", "checker: verifier.verify"),
        (verify.TableVerifier, "read", "checker: verifier.read (per chunk)"),
        (replay_loop, "judge_records", "checker: judge records (per chunk)"),
        (torch.cuda.Event, "synchronize", "checker: in-flight event wait"),
        (runner.GraphRunner, "replay", "replay: runner.replay"),
        (producer._ChildStream, "next_batch", "workload: next_batch (wait + unpack)"),
        (producer.ProducedWorkload, "_switch", "workload: stream switch"),
        (pool_mod.WriteAhead, "_stage", "workload: WriteAhead stage (per batch)"),
        (pool_mod._PageWriter, "apply", "workload: writer apply"),
    ]
    for owner, attr, label in pieces:
        timed(owner, attr, label)
    sc = load_scenario(args.scenario)
    cfg = sc.config
    if args.streams:
        cfg = cfg.replace(workload_streams=args.streams)
    report = checker.check_replay_safety(
        sc.builder,
        cfg,
        steps=args.replays,
        detectors=[args.detectors] if args.detectors != "none" else [],
        workload_process="on",
    )
    n = report.replays
    per_replay = {k: round(sum(TIMES[k][1:]) / n * 1e6, 1) for k in sorted(TIMES)}
    first_s = {k: round(TIMES[k][0], 4) for k in sorted(TIMES)}
    out = {
        "scenario": sc.name,
        "streams": cfg.workload_streams,
        "verdict": report.verdict,
        "replays": n,
        "replays_per_s": round(report.replays_per_s),
        "phase_us": report.phase_us,
        "pieces_us_per_replay": per_replay,
        "calls": {k: len(v) for k, v in TIMES.items()},
        "first_call_s": first_s,
        "timeline": timeline(args.window),
    }
    print(json.dumps(out, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
