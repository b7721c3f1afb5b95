"""Does the shared-memory ring speed up the checker, on this host, against the queue alone?

Checks sglang-h200 and swa-hybrid (CUPTI on, the workload in child processes, as
``make soak``) with each child's page runs through a ``batch_ring`` ring and through the
``multiprocessing`` queue alone (``ring_bytes=0``), in alternating rounds in one process, so
that both see the same host. Prints each run's checked replays per second and mean phase
times, then the medians per arm. Needs a GPU.

Usage: PYTHONPATH=src python tools/experiments/ring_ab.py [--replays 10000] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import statistics

from pagegraph.check.checker import check_replay_safety
from pagegraph.check.scenario import load_scenario
from pagegraph.workload.batch_ring import RING_BYTES
from pagegraph.workload.producer import ProducedWorkload

SCENARIOS = ("graphs/sglang-h200.toml", "graphs/swa-hybrid.toml")


def run(path: str, replays: int, ring_bytes: int, detectors: str = "cupti") -> dict:
    # The checker makes its ProducedWorkload with the default: set it for this process.
    ProducedWorkload.__init__.__kwdefaults__["ring_bytes"] = ring_bytes
    sc = load_scenario(path)
    report = check_replay_safety(
        sc.builder,
        sc.config,
        steps=replays,
        detectors=[detectors] if detectors != "none" else [],
        workload_process="on",
    )
    return {
        "scenario": sc.name,
        "ring_bytes": ring_bytes,
        "verdict": report.verdict,
        "replays_per_s": round(report.replays_per_s),
        "phase_us": report.phase_us,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--replays", type=int, default=10_000)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--detectors", default="cupti", choices=["cupti", "torch", "none"])
    ap.add_argument("--json")
    args = ap.parse_args()
    rows = []
    for _ in range(args.rounds):
        for path in SCENARIOS:
            for ring_bytes in (0, RING_BYTES):
                rows.append(run(path, args.replays, ring_bytes, args.detectors))
                print(json.dumps(rows[-1]), flush=True)
    print("| scenario | transport | replays/s (median) | workload us | replay us | checker us |")
    print("|---|---|---:|---:|---:|---:|")
    for path in SCENARIOS:
        for ring_bytes in (0, RING_BYTES):
            mine = [
                r
                for r in rows
                if r["ring_bytes"] == ring_bytes and path.endswith(r["scenario"] + ".toml")
            ]
            phases = {
                k: statistics.median(r["phase_us"][k] for r in mine) for k in mine[0]["phase_us"]
            }
            print(
                f"| {mine[0]['scenario']} | {'ring' if ring_bytes else 'queue'} "
                f"| {statistics.median(r['replays_per_s'] for r in mine):.0f} "
                f"| {phases['workload']:.0f} | {phases['replay']:.1f} | {phases['checker']:.0f} |"
            )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
