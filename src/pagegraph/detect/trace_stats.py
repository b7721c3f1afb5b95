"""What happened inside each range of a trace: calls, GPU work, host syncs, D2H copies.

A host API call belongs to every range of its thread that holds its start (an NVTX start/end
range takes calls from any thread); GPU work belongs to the API call with its correlation id,
and through it to that call's ranges. GPU work no call claims is counted under
``<unattributed>``, never guessed into a range by time: a guess could hide a sync or invent one.
"""

from __future__ import annotations

import bisect
import re
from collections import defaultdict
from dataclasses import dataclass, field
from os import PathLike
from typing import Any

from .sync_calls import api_base_name, is_sync_api
from .trace_loaders import load_trace
from .trace_model import (
    D2H_COPY,
    SYNC_API,
    SYNC_EVENT,
    TOTAL,
    UNATTRIBUTED,
    ApiCall,
    GpuActivity,
    Trace,
)

__all__ = [
    "RangeStats",
    "TraceSummary",
    "analyze",
    "is_d2h_copy",
    "is_graph_launch",
    "is_host_blocking_sync",
    "summarize",
]

# --------------------------------------------------------------------------------------------
# Classification of API calls and activities (the sync calls themselves: .sync_calls).

_GRAPH_LAUNCH_NAMES = frozenset(("cudagraphlaunch", "cugraphlaunch"))


def is_graph_launch(name: str) -> bool:
    return api_base_name(name).lower() in _GRAPH_LAUNCH_NAMES


def _is_d2h_async_api(name: str) -> bool:
    base = api_base_name(name).lower()
    return base.startswith("cumemcpydtoh") and "async" in base


def is_d2h_copy(activity: GpuActivity) -> bool:
    return activity.kind == "memcpy" and activity.subkind in ("DtoH", "AtoH")


def is_host_blocking_sync(activity: GpuActivity) -> bool:
    """Sync records where the host waits. A stream waiting on an event is a device-side
    dependency (legal in graphs, used by every side-stream warm-up), so it does not count."""
    return activity.kind == "sync" and activity.subkind != "stream_wait_event"


def _is_query_api(name: str | None) -> bool:
    return bool(name) and re.fullmatch(r"cu(?:da)?(?:Event|Stream)Query", name or "") is not None


# --------------------------------------------------------------------------------------------
# Summaries.


@dataclass
class RangeStats:
    """What happened inside every occurrence of one range name (or the whole trace)."""

    name: str
    domains: list[str] = field(default_factory=list)
    occurrences: int = 0
    total_ns: int = 0
    first_start_ns: int | None = None
    api_calls: int = 0
    kernels: int = 0
    graph_kernels: int = 0
    graph_launches: int = 0
    memcpys: dict[str, int] = field(default_factory=dict)
    memsets: int = 0
    sync_events: int = 0
    sync_types: dict[str, int] = field(default_factory=dict)
    sync_api_calls: dict[str, int] = field(default_factory=dict)
    d2h_copies: int = 0
    #: (kind, name) -> [count, first time in ns] for every host sync and device-to-host copy.
    hazards: dict[tuple[str, str], list[int]] = field(default_factory=dict)

    def _hazard(self, kind: str, name: str, t: int) -> None:
        h = self.hazards.setdefault((kind, name), [0, t])
        h[0] += 1
        h[1] = min(h[1], t)

    def _add_activity(self, a: GpuActivity, via: ApiCall | None) -> None:
        # A hazard reached through a call is timed by the call, on the host timeline the
        # ranges live on; an unclaimed one only has its own time.
        t = via.start if via is not None else a.start
        issuer = via.base_name if via is not None else None
        if a.kind == "kernel":
            self.kernels += 1
            self.graph_kernels += a.in_graph
        elif a.kind == "memcpy":
            self.memcpys[a.subkind] = self.memcpys.get(a.subkind, 0) + 1
            if is_d2h_copy(a):
                self.d2h_copies += 1
                self._hazard(D2H_COPY, f"{issuer} {a.subkind}" if issuer else a.name, t)
        elif a.kind == "memset":
            self.memsets += 1
        elif a.kind == "sync":
            self.sync_events += 1
            self.sync_types[a.subkind] = self.sync_types.get(a.subkind, 0) + 1
            # CUPTI also files an "event sync" record under cudaEventQuery, which returns at
            # once whether or not the event is done: a poll, not a wait.
            if is_host_blocking_sync(a) and not _is_query_api(issuer):
                self._hazard(SYNC_EVENT, a.subkind, t)

    def _add_call(self, call: ApiCall, linked: list[GpuActivity]) -> None:
        self.api_calls += 1
        base = call.base_name
        if is_graph_launch(base):
            self.graph_launches += 1
        if is_sync_api(base):
            self.sync_api_calls[base] = self.sync_api_calls.get(base, 0) + 1
            self._hazard(SYNC_API, base, call.start)
        if _is_d2h_async_api(base) and not any(a.kind == "memcpy" for a in linked):
            # The copy record is missing (not traced), but the API name says what it was.
            self.d2h_copies += 1
            self.memcpys["DtoH"] = self.memcpys.get("DtoH", 0) + 1
            self._hazard(D2H_COPY, f"{base} DtoH", call.start)
        for a in linked:
            self._add_activity(a, call)

    @property
    def has_events(self) -> bool:
        return bool(
            self.api_calls or self.kernels or self.memcpys or self.memsets or self.sync_events
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "domains": list(self.domains),
            "occurrences": self.occurrences,
            "total_ns": self.total_ns,
            "first_start_ns": self.first_start_ns,
            "api_calls": self.api_calls,
            "kernels": self.kernels,
            "graph_kernels": self.graph_kernels,
            "graph_launches": self.graph_launches,
            "memcpys": dict(sorted(self.memcpys.items())),
            "memsets": self.memsets,
            "sync_events": self.sync_events,
            "sync_types": dict(sorted(self.sync_types.items())),
            "sync_api_calls": dict(sorted(self.sync_api_calls.items())),
            "d2h_copies": self.d2h_copies,
            "hazards": [
                {"kind": k, "name": n, "count": c, "first_time_ns": t}
                for (k, n), (c, t) in sorted(self.hazards.items())
            ],
        }


@dataclass
class TraceSummary:
    path: str
    format: str
    #: Range name -> stats, in order of first occurrence.
    ranges: dict[str, RangeStats]
    unattributed: RangeStats
    total: RangeStats
    start_ns: int
    end_ns: int
    counts: dict[str, int]
    device: str | None = None
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "format": self.format,
            "device": self.device,
            "start_ns": self.start_ns,
            "end_ns": self.end_ns,
            "counts": dict(self.counts),
            "warnings": list(self.warnings),
            "ranges": [s.to_dict() for s in self.ranges.values()],
            "unattributed": self.unattributed.to_dict(),
            "total": self.total.to_dict(),
        }


def _call_for(a: GpuActivity, by_corr: dict[int, list[int]], calls: list[ApiCall]) -> int | None:
    if a.correlation is None:
        return None
    candidates = by_corr.get(a.correlation)
    if not candidates:
        return None
    if len(candidates) == 1:
        return candidates[0]
    # Correlation ids are per process: several processes in one nsys capture reuse them.
    same = [i for i in candidates if calls[i].process == a.process]
    return same[0] if len(same) == 1 else None


def _link(trace: Trace) -> tuple[list[list[GpuActivity]], list[GpuActivity]]:
    """The GPU activities of each API call (by index), and those no call claims."""
    calls = trace.api_calls
    by_corr: dict[int, list[int]] = defaultdict(list)
    for i, c in enumerate(calls):
        if c.correlation is not None:
            by_corr[c.correlation].append(i)
    linked: list[list[GpuActivity]] = [[] for _ in calls]
    unclaimed: list[GpuActivity] = []
    for a in trace.gpu:
        owner = _call_for(a, by_corr, calls)
        if owner is None:
            unclaimed.append(a)
        else:
            linked[owner].append(a)
    return linked, unclaimed


def _range_stats(trace: Trace) -> tuple[dict[str, RangeStats], dict[str, set[int]]]:
    """Stats per range name (occurrences, time, domains) and the API calls (by index) each
    name holds."""
    calls = trace.api_calls
    by_thread: dict[object, tuple[list[int], list[int]]] = {}
    for i in sorted(range(len(calls)), key=lambda i: calls[i].start):
        starts, idx = by_thread.setdefault(calls[i].thread, ([], []))
        starts.append(calls[i].start)
        idx.append(i)

    stats: dict[str, RangeStats] = {}
    members: dict[str, set[int]] = defaultdict(set)
    for r in sorted(trace.ranges, key=lambda r: (r.start, -r.end)):
        s = stats.get(r.name)
        if s is None:
            s = stats[r.name] = RangeStats(r.name, first_start_ns=r.start)
        s.occurrences += 1
        s.total_ns += r.end - r.start
        if r.domain and r.domain not in s.domains:
            s.domains.append(r.domain)
        threads = [r.thread] if r.thread is not None else list(by_thread)
        for t in threads:
            if t not in by_thread:
                continue
            starts, idx = by_thread[t]
            lo, hi = bisect.bisect_left(starts, r.start), bisect.bisect_right(starts, r.end)
            # A set per name: a call inside two nested occurrences of one name counts once.
            members[r.name].update(idx[lo:hi])
    return stats, members


def summarize(trace: Trace) -> TraceSummary:
    """Group a trace by range name and attribute every call and activity (see module doc)."""
    calls = trace.api_calls
    linked, unclaimed = _link(trace)
    stats, members = _range_stats(trace)
    for name, ids in members.items():
        for i in sorted(ids):
            stats[name]._add_call(calls[i], linked[i])

    unattributed = RangeStats(UNATTRIBUTED)
    for a in unclaimed:
        unattributed._add_activity(a, None)

    start, end = trace.bounds()
    total = RangeStats(TOTAL, occurrences=1, total_ns=end - start, first_start_ns=start)
    for i, c in enumerate(calls):
        total._add_call(c, linked[i])
    for a in unclaimed:
        total._add_activity(a, None)

    counts = {
        "ranges": len(trace.ranges),
        "range_names": len(stats),
        "api_calls": len(calls),
        "gpu_activities": len(trace.gpu),
        "unattributed_gpu_activities": len(unclaimed),
    }
    return TraceSummary(
        path=trace.path,
        format=trace.format,
        ranges=stats,
        unattributed=unattributed,
        total=total,
        start_ns=start,
        end_ns=end,
        counts=counts,
        device=trace.device,
        warnings=list(trace.warnings),
    )


def analyze(path: str | PathLike[str]) -> TraceSummary:
    """Read a trace file (Nsight SQLite or torch.profiler JSON) and summarize it by range."""
    return summarize(load_trace(path))
