"""What the sync detectors report: offending calls, their grouping, and the errors raised."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

__all__ = [
    "NO_RANGE",
    "DetectorUnavailable",
    "DeviceSyncError",
    "SyncEvent",
    "SyncGroup",
    "format_sync_report",
    "summarize",
]

NO_RANGE = "<no range>"


@dataclass
class SyncEvent:
    """One offending call. ``stack`` is set on the first occurrence of each
    (detector, name, range) only, to keep the detector callbacks cheap."""

    detector: str
    name: str
    range: str | None
    stack: str | None = None


@dataclass(frozen=True)
class SyncGroup:
    detector: str
    name: str
    range: str | None
    count: int
    stack: str | None


def summarize(events: Iterable[SyncEvent]) -> list[SyncGroup]:
    """Group events by (detector, name, range), in order of first occurrence, with counts and
    the stack of the first occurrence that has one."""
    counts: dict[tuple[str, str, str | None], int] = {}
    stacks: dict[tuple[str, str, str | None], str | None] = {}
    for e in events:
        key = (e.detector, e.name, e.range)
        counts[key] = counts.get(key, 0) + 1
        if stacks.get(key) is None:
            stacks[key] = e.stack
    return [SyncGroup(*key, count=n, stack=stacks[key]) for key, n in counts.items()]


def format_sync_report(
    events: Iterable[SyncEvent], detectors: Iterable[str] = (), *, title: str = "no_device_sync"
) -> str:
    """Human-readable list of offending calls, one group per (detector, name, range)."""
    events = list(events)
    detectors = tuple(detectors)
    ran = ", ".join(detectors) if detectors else "none"
    lines = [f"{title}: {len(events)} synchronizing call(s) (detectors that ran: {ran})"]
    for g in summarize(events):
        lines.append(f"  [{g.detector}] {g.name} x{g.count} in {g.range or NO_RANGE}")
        if g.stack:
            lines.append("    first occurrence:")
            lines.extend("      " + ln for ln in g.stack.rstrip("\n").splitlines())
    return "\n".join(lines)


class DeviceSyncError(AssertionError):
    """A region that must not synchronize with the device did.

    ``events``: every offending call (:class:`SyncEvent`); ``detectors``: the detectors that
    ran. The message lists each (detector, call, range) with its count and the Python stack
    of its first occurrence.
    """

    def __init__(self, events: Iterable[SyncEvent], detectors: Iterable[str] = ()):
        self.events = list(events)
        self.detectors = tuple(detectors)
        super().__init__(format_sync_report(self.events, self.detectors))


class DetectorUnavailable(RuntimeError):
    """A requested detector cannot run here (missing package, no GPU, CUPTI taken)."""
