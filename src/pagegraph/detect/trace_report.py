"""Output of the trace analyzer, and the ``pagegraph trace FILE`` command line.

``add_arguments`` and ``run`` are what the ``pagegraph`` CLI calls; ``main`` is the same
command on its own (``python -m pagegraph.detect.trace``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .trace_check import CheckResult, check
from .trace_model import TOTAL, UNATTRIBUTED, TraceError
from .trace_stats import TraceSummary, analyze

__all__ = ["add_arguments", "format_markdown", "main", "run"]


def _us(ns: int) -> str:
    return f"{ns / 1000:.1f}"


def _counts(d: dict[str, int]) -> str:
    return ", ".join(f"{k}:{v}" for k, v in sorted(d.items())) or "0"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def format_markdown(summary: TraceSummary, result: CheckResult | None = None) -> str:
    """A markdown table, one row per range name, then ``<unattributed>`` and ``<total>``."""
    header = (
        "| range | n | time (us) | kernels | graph launches | memcpy | memsets | "
        "sync events | sync API calls | D2H |"
    )
    lines = [
        f"Trace: `{summary.path}` ({summary.format}"
        + (f", {summary.device}" if summary.device else "")
        + ")",
        "",
        header,
        "|" + "---|" * 10,
    ]
    rows = list(summary.ranges.values())
    if summary.unattributed.has_events:
        rows.append(summary.unattributed)
    rows.append(summary.total)
    for s in rows:
        name = _cell(s.name) + (f" [{', '.join(s.domains)}]" if s.domains else "")
        if s.name == TOTAL:
            name = f"**{name}**"
        unattributed = s.name == UNATTRIBUTED
        occ = "-" if unattributed else str(s.occurrences)
        time_us = "-" if unattributed else _us(s.total_ns)
        sync = str(s.sync_events)
        if s.sync_types:
            sync += f" ({_counts(s.sync_types)})"
        lines.append(
            f"| {name} | {occ} | {time_us} | {s.kernels} | {s.graph_launches} | "
            f"{_counts(s.memcpys)} | {s.memsets} | {sync} | {_counts(s.sync_api_calls)} | "
            f"{s.d2h_copies} |"
        )
    for w in summary.warnings:
        lines.append(f"\n> warning: {w}")
    if result is not None:
        lines += ["", "**Verdict:** " + result.format_text().replace("\n", "  \n")]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------------
# Command line.


def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.description = parser.description or (
        "Summarize a trace by NVTX range and check ranges for host syncs. Exit 0 clean, 1 "
        "when a sync or device-to-host copy falls inside a --forbid-sync range, 2 when the "
        "trace is unreadable or a matching range holds no CUDA activity."
    )
    parser.add_argument("file", help="Nsight Systems SQLite export or torch.profiler JSON trace")
    parser.add_argument(
        "--forbid-sync",
        metavar="PATTERN",
        action="append",
        default=[],
        help="glob on range names (e.g. 'replay/*'); exit 1 if a matching range holds a host "
        "sync or a device-to-host copy (repeatable)",
    )
    parser.add_argument("--json", metavar="PATH", help="also write the summary as JSON")
    parser.add_argument("--markdown", metavar="PATH", help="also write the table as markdown")
    return parser


def run(args: argparse.Namespace) -> int:
    """Exit codes: 0 clean, 1 violations, 2 unreadable trace or a check that cannot see."""
    try:
        summary = analyze(args.file)
    except TraceError as e:
        print(f"pagegraph trace: error: {e}", file=sys.stderr)
        return 2
    for w in summary.warnings:
        print(f"pagegraph trace: warning: {w}", file=sys.stderr)
    patterns = list(getattr(args, "forbid_sync", None) or [])
    result = check(summary, patterns) if patterns else None
    print(format_markdown(summary), end="")
    if result is not None:
        print(result.format_text(), file=sys.stdout if result.exit_code != 2 else sys.stderr)
    try:
        if args.json:
            doc = summary.to_dict()
            if result is not None:
                doc["check"] = result.to_dict()
            Path(args.json).write_text(json.dumps(doc, indent=2) + "\n")
        if args.markdown:
            Path(args.markdown).write_text(format_markdown(summary, result))
    except OSError as e:
        print(f"pagegraph trace: error: cannot write output: {e}", file=sys.stderr)
        return 2
    return result.exit_code if result is not None else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="pagegraph trace",
        description="Summarize a trace by NVTX range and check ranges for host syncs.",
    )
    add_arguments(parser)
    return run(parser.parse_args(argv))
