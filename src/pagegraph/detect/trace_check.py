"""The ``--forbid-sync`` check: no range matching a glob holds a host-blocking
synchronization (a sync API call or a blocking sync record) or a device-to-host copy.

A check that cannot see any matching range, or sees one with no CUDA activity in it, fails
with exit code 2 instead of passing.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from os import PathLike
from typing import Any

from .trace_model import Trace
from .trace_stats import TraceSummary, analyze, summarize

__all__ = ["CheckResult", "Violation", "check", "find_violations"]


@dataclass(frozen=True)
class Violation:
    range: str
    kind: str  # "sync_api" | "sync_event" | "d2h_copy"
    name: str
    count: int
    first_time_ns: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "range": self.range,
            "kind": self.kind,
            "name": self.name,
            "count": self.count,
            "first_time_ns": self.first_time_ns,
        }


#: What the checks accept: a summary, a trace, or a trace file's path.
TraceSource = TraceSummary | Trace | str | PathLike[str]


def _as_summary(summary_or_trace: TraceSource) -> TraceSummary:
    if isinstance(summary_or_trace, TraceSummary):
        return summary_or_trace
    if isinstance(summary_or_trace, Trace):
        return summarize(summary_or_trace)
    return analyze(summary_or_trace)


def _matching(summary: TraceSummary, pattern: str) -> list[str]:
    return [n for n in summary.ranges if fnmatch.fnmatchcase(n, pattern)]


def find_violations(summary_or_trace: TraceSource, patterns: list[str]) -> list[Violation]:
    """Host syncs and device-to-host copies inside ranges whose name matches a glob.

    Accepts a TraceSummary, a Trace, or a path to a trace file. One Violation per
    (range name, kind, name), in order of first occurrence.
    """
    summary = _as_summary(summary_or_trace)
    out: list[Violation] = []
    for name, s in summary.ranges.items():
        if not any(fnmatch.fnmatchcase(name, p) for p in patterns):
            continue
        for (kind, what), (count, first) in s.hazards.items():
            out.append(Violation(name, kind, what, count, first))
    return sorted(out, key=lambda v: (v.first_time_ns, v.range, v.kind, v.name))


@dataclass
class CheckResult:
    """Verdict of ``--forbid-sync``: exit code 1 on violations, 2 when the check was blind."""

    patterns: list[str]
    violations: list[Violation]
    unmatched: list[str]
    checked_ranges: list[str]
    error: str | None = None
    start_ns: int = 0
    notes: list[str] = field(default_factory=list)
    #: matching ranges that hold no CUDA activity at all: nothing in them was checked
    blind: list[str] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        if self.violations:
            return 1
        return 2 if self.error or self.unmatched or self.blind else 0

    @property
    def verdict(self) -> str:
        return {0: "PASS", 1: "FAIL", 2: "CANNOT CHECK"}[self.exit_code]

    def format_text(self) -> str:
        pats = ", ".join(repr(p) for p in self.patterns)
        lines = []
        if self.error:
            lines.append(f"{self.verdict}: {self.error}")
        elif self.violations:
            lines.append(
                f"{self.verdict}: host synchronization or device-to-host copy inside ranges "
                f"matching {pats}:"
            )
            for v in self.violations:
                at = (v.first_time_ns - self.start_ns) / 1e6
                lines.append(f"  {v.range}: {v.kind} {v.name} x{v.count} (first at +{at:.3f} ms)")
        elif not self.unmatched:
            lines.append(
                f"{self.verdict}: no synchronization or device-to-host copy inside "
                f"{len(self.checked_ranges)} range name(s) matching {pats}"
            )
        for p in self.unmatched:
            lines.append(
                f"{'CANNOT CHECK' if not self.violations else 'warning'}: "
                f"no range matches {p!r}: cannot check it"
            )
        if self.blind:
            shown = ", ".join(self.blind[:5]) + (" ..." if len(self.blind) > 5 else "")
            lines.append(
                f"{'CANNOT CHECK' if not self.violations else 'warning'}: "
                f"{len(self.blind)} matching range(s) hold no CUDA activity at all ({shown}): "
                "nothing in them was checked (was the trace recorded without CUDA tracing, "
                "e.g. nsys -t nvtx?)"
            )
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {
            "patterns": list(self.patterns),
            "notes": list(self.notes),
            "verdict": self.verdict,
            "exit_code": self.exit_code,
            "error": self.error,
            "unmatched_patterns": list(self.unmatched),
            "ranges_without_cuda_activity": list(self.blind),
            "checked_ranges": list(self.checked_ranges),
            "violations": [v.to_dict() for v in self.violations],
        }


def check(summary_or_trace: TraceSource, patterns: list[str]) -> CheckResult:
    """Run the ``--forbid-sync`` check. A trace without ranges, a pattern that matches no
    range, or a matching range with no CUDA activity in it (a trace recorded without CUDA
    tracing) cannot prove anything and gives exit code 2 rather than a silent pass."""
    summary = _as_summary(summary_or_trace)
    patterns = list(patterns)
    if not summary.ranges:
        error = "no NVTX ranges in trace: cannot check"
        if summary.format == "torch-json":
            error += " (in a torch.profiler trace, record_function ranges stand for them)"
        return CheckResult(patterns, [], [], [], error=error, start_ns=summary.start_ns)
    checked = sorted({n for p in patterns for n in _matching(summary, p)})
    unmatched = [p for p in patterns if not _matching(summary, p)]
    notes = []
    if not summary.counts.get("api_calls"):
        notes.append(
            "the trace holds no CUDA API calls (CUDA not traced, or a CPU-only run): "
            "nothing could synchronize, so a pass proves little"
        )
    blind = [name for name in checked if not summary.ranges[name].has_events]
    return CheckResult(
        patterns,
        find_violations(summary, patterns),
        unmatched,
        checked,
        start_ns=summary.start_ns,
        notes=notes,
        blind=blind,
    )
