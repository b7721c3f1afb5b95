"""Compare the verdicts of two runs of the jobs side by side: ``make mutate``, ``make vllm``,
``make sglang`` and ``make wild`` (their ``--json`` files), from two folders.

    python tools/compare_verdicts.py BEFORE_DIR AFTER_DIR

Each folder holds any of ``mutate.json``, ``vllm-0.34.0.json``, ``sglang-0.5.23.json`` and
``wild.json``. What is compared is what a reader of the reports acts on: a mutant killed or
not and the property that killed it in each scenario both runs checked it on (a mutant stops
at its first kill, and with several jobs the first scenario to finish may differ), a control
SAFE or not; a client's verdict on each scenario, the properties that failed and those given
as advice; a corpus entry held or not, with each twin's verdict and the entry's property.
Timings, dates and message details are left out. Exit 1 with the differences listed when a
verdict differs; else 0 when every job found in either folder was compared, 2 when one is in
one folder only, none was found, or a file cannot be read.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

JOBS = ("mutate.json", "vllm-0.34.0.json", "sglang-0.5.23.json", "wild.json")


def mutate_verdicts(doc: dict[str, Any]) -> dict[str, Any]:
    """Per builder: a control's verdict, or a mutant's killed flag and its killers."""
    out: dict[str, Any] = {}
    for b in doc["builders"]:
        out[b["name"]] = {
            "control": b["control"],
            "killed": b["killed"],
            "skipped": b["skipped"],
            "killers": b["killers"],
        }
    out["<survivors>"] = sorted(doc["survivors"])
    out["<bad controls>"] = sorted(doc["bad_controls"])
    return out


def client_verdicts(doc: dict[str, Any]) -> dict[str, Any]:
    """Per (client, reader, scenario): verdict, failed properties, advice."""
    return {
        f"{r['client']} / {r['reader']} / {r['scenario']}": {
            "verdict": r["verdict"],
            "skipped": bool(r["skipped"]),
            "failed": sorted(f["property"] for f in r["failures"]),
            "advice": sorted(a["property"] for a in r["advice"]),
        }
        for r in doc["runs"]
    }


def wild_verdicts(doc: dict[str, Any]) -> dict[str, Any]:
    """Per corpus entry: held, each twin's verdict, the entry's property."""
    return {
        e["key"]: {k: e.get(k) for k in ("held", "buggy", "fixed", "property", "skipped")}
        for e in doc["entries"]
    }


def differences(name: str, before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """Lines naming each key whose verdict differs (a mutant's killers compared only on the
    scenarios both runs list)."""
    out = []
    for key in sorted(set(before) | set(after)):
        a, b = before.get(key), after.get(key)
        if name == "mutate.json" and isinstance(a, dict) and isinstance(b, dict):
            shared = set(a["killers"]) & set(b["killers"])
            a = {**a, "killers": {s: a["killers"][s] for s in sorted(shared)}}
            b = {**b, "killers": {s: b["killers"][s] for s in sorted(shared)}}
        if a != b:
            out.append(f"{name}: {key}: before {a}, after {b}")
    return out


def main(argv: list[str]) -> int:
    """Compare the jobs' files of ``argv``'s two folders; the exit status (module docstring)."""
    if len(argv) != 2:
        print("usage: compare_verdicts.py BEFORE_DIR AFTER_DIR", file=sys.stderr)
        return 2
    readers = {
        "mutate.json": mutate_verdicts,
        "vllm-0.34.0.json": client_verdicts,
        "sglang-0.5.23.json": client_verdicts,
        "wild.json": wild_verdicts,
    }
    diffs: list[str] = []
    incomplete = compared = 0
    for name in JOBS:
        paths = [Path(d) / name for d in argv]
        if not any(p.exists() for p in paths):
            continue
        if not all(p.exists() for p in paths):
            print(f"{name}: in one folder only, not compared")
            incomplete += 1
            continue
        try:
            before, after = (readers[name](json.loads(p.read_text())) for p in paths)
        except (OSError, ValueError, KeyError) as exc:
            print(f"compare_verdicts: cannot read {name}: {exc}", file=sys.stderr)
            return 2
        found = differences(name, before, after)
        compared += 1
        print(f"{name}: {len(before)} verdicts, {len(found)} differ")
        diffs += found
    for line in diffs:
        print(line)
    if diffs:
        return 1
    return 2 if incomplete or not compared else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
