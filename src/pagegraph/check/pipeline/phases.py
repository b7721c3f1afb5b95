"""One check pipeline: a planned check is set up, captured, replayed and finished the same
way whatever its judges (``run_pipeline``), through the stages both beds share: the
capture's outcome (``record_capture``, ``fail_capture``) and the one replay loop
(``drive_replays``). What an early end leaves unfinished is ``pagegraph.check.run_end``'s to
decide; the device is ``pagegraph.runtime.pick_device``'s.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from ...graph.emulate import describe_frozen
from ..reports.report import PropertyResult, Report
from ..run_end import BedProperties, fail_at_capture
from ..signals import stop_requested
from .state import CheckHooks

__all__ = [
    "Bed",
    "LoopEnd",
    "ReplayFailed",
    "drive_replays",
    "fail_capture",
    "process_age_s",
    "record_capture",
    "run_pipeline",
]


class Bed(Protocol):
    """The parts of one pipeline: ``run_pipeline`` calls them in this order, and always
    ``release`` then ``finish``."""

    report: Report
    #: the report's properties by name, judged in place
    props: dict[str, PropertyResult]
    #: replays to run
    steps: int

    def set_up(self) -> None:
        """Allocate the pool, the buffers and the graphs' holder; start the workload."""

    def capture(self) -> bool:
        """The builder's calls before the replays (eager calls, warm-up, capture); False
        when they failed (the report says why, the rest is not reached)."""

    def start_replays(self) -> None:
        """Before the first replay (start the sync recorder, the workload's steps)."""

    def replay_one(self, i: int) -> bool:
        """Replay ``i``, judged or queued for judging; whether judgments came in (the
        loop's ``drive_replays``). Raises ``ReplayFailed`` (or any exception) to end it."""

    def end_replays(self, end: LoopEnd) -> None:
        """After the loop, ``end`` saying why it ended early if it did: the last judgments
        of the replays; ``CheckInterrupted`` when a signal stopped them."""

    def after_replays(self) -> None:
        """Work on the captured graphs once every replay is judged (the step's timing)."""

    def release(self) -> None:
        """Free what the bed holds (graphs, workload processes, counters); safe to call
        after any phase failed."""

    def finish(self) -> None:
        """The judgments made once the run is over (also after an interruption)."""


def process_age_s() -> float | None:
    """Seconds since this process began (Linux's ``/proc``), else None."""
    try:
        with open("/proc/self/stat") as f:
            # the command name (field 2) may hold spaces: count the fields after its ")"
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return None


#: whether this process ran a pipeline already (its later checks get no "before")
_ran_one = False


class _PhaseClock:
    """Wall seconds a phase into ``wall`` (``start`` closes the phase before it)."""

    wall: dict[str, float]
    #: the phase being timed, None before the first and after the last
    phase: str | None
    t: float

    def __init__(self, wall: dict[str, float]) -> None:
        self.wall, self.phase, self.t = wall, None, time.perf_counter()

    def start(self, phase: str | None) -> None:
        now = time.perf_counter()
        if self.phase is not None:
            self.wall[self.phase] = self.wall.get(self.phase, 0.0) + now - self.t
        self.phase, self.t = phase, now


def run_pipeline(bed: Bed, hooks: CheckHooks) -> Report:
    """Run ``bed``'s phases in order (the module docstring); its report, its
    ``wall_s`` filled in."""
    global _ran_one
    age = None if _ran_one else process_age_s()
    _ran_one = True
    if age is not None:
        bed.report.wall_s["before"] = age
    clock = _PhaseClock(bed.report.wall_s)
    hooks.note("setup")
    try:
        clock.start("set-up")
        bed.set_up()
        clock.start("capture")
        if bed.capture():
            clock.start("replays")
            bed.start_replays()
            end = LoopEnd("the loop raised")  # what end_replays sees if the loop itself raised
            try:
                end = drive_replays(bed.steps, bed.replay_one, hooks, bed.report, bed.props)
            finally:
                bed.end_replays(end)
            clock.start("after replays")
            bed.after_replays()
    finally:
        try:
            clock.start("release")
            bed.release()
        finally:
            clock.start(None)
            bed.finish()
    return bed.report


# -- the stages both beds share -----------------------------------------------------------


def record_capture(
    report: Report,
    prop: PropertyResult,
    buckets: int,
    graphs: Mapping[int, object],
    use_graphs: bool,
    emulated: bool,
    t0: float,
) -> None:
    """A capture that went through, begun at ``t0`` (``time.perf_counter``): its time, how the
    graphs replay (CUDA, emulated: naming the ops ``graphs`` froze, or eagerly) in ``prop``."""
    report.capture_ms = (time.perf_counter() - t0) * 1e3
    report.emulated = emulated
    if emulated:
        report.graphs = "emulated"
    how = (
        " captured"
        if use_graphs
        else " captured (emulated)" + describe_frozen(graphs)
        if emulated
        else " warmed up eagerly (no CUDA graphs)"
    )
    prop.detail = f"{buckets} buckets{how}"


def fail_capture(
    report: Report, props: dict[str, PropertyResult], what: str, bed: BedProperties
) -> None:
    """A capture that raised: "capture" fails with ``what``, the run stops there, and what
    ``bed`` had not judged yet is marked not reached (``pagegraph.check.run_end``)."""
    report.stopped = what
    fail_at_capture(props, bed, what, "not reached: capture failed")


class ReplayFailed(Exception):
    """Raised by a replay body when its replay (or reading back its judgments) failed: the
    loop ends, "replays completed" failing with the message."""


@dataclass
class LoopEnd:
    """Why the replay loop ended early (``stopped``, for ``Report.stopped``), and the signal
    that asked for it (``interrupted``); both ``None`` when every replay ran."""

    stopped: str | None = None
    interrupted: int | None = None


def drive_replays(
    steps: int,
    replay: Callable[[int], bool],
    hooks: CheckHooks,
    report: Report,
    props: dict[str, PropertyResult],
) -> LoopEnd:
    """The one replay loop: ``replay(i)`` for each of ``steps`` replays, which returns whether
    judgments came in (a chunk read back, a step judged). Between two replays a stop asked for
    by a signal ends it; a replay that raises ends it with "replays completed" failed; once
    judgments came in the caller hears of them (``on_chunk``) and ``hooks.stop_on_failure``
    ends it at the first failed property; then the caller hears of the progress."""
    i = 0
    try:
        for i in range(steps):
            if stop_requested() is not None:  # a signal asked for a stop (stop_on_signals)
                raise KeyboardInterrupt()
            hooks.note(f"replay {i}")
            try:
                judged = replay(i)
            except ReplayFailed as exc:
                return _failed(props, str(exc))
            except Exception as exc:  # noqa: BLE001 - reported with the replay it came from
                return _failed(props, f"replay {i} raised {type(exc).__name__}: {exc}")
            if judged:
                if hooks.on_chunk is not None:
                    hooks.on_chunk(report)
                if hooks.stop_on_failure and any(p.status == "FAIL" for p in props.values()):
                    return LoopEnd(f"stopped at the first failure, after {report.replays} replays")
            if hooks.progress is not None:
                hooks.progress(i + 1, steps)
    except KeyboardInterrupt as exc:
        signum = stop_requested() or getattr(exc, "signum", signal.SIGINT)
        name = "SIGTERM" if signum == signal.SIGTERM else "SIGINT"
        return LoopEnd(f"interrupted by {name} after {i} replays", signum)
    return LoopEnd()


def _failed(props: dict[str, PropertyResult], why: str) -> LoopEnd:
    props["replays completed"].fail(why)
    return LoopEnd(why)
