"""One check pipeline: a planned check is set up, captured, replayed and finished the same
way whatever its judges (``run_pipeline``).

A plan (``pagegraph.check.plan``) names the judges: ``"tables"``, the builder's outputs
compared exactly with the checker's model (``pagegraph.check.checker.TableBench``, its judges
plugged into ``pagegraph.check.replay_loop``), or ``"step"``, the decode step's attention
output (``pagegraph.check.decode_step.StepBench``). Each is a ``Bench``: the pipeline calls
its phases in order, tells the caller the phase reached (``CheckHooks.note``: ``"setup"``,
then the bench's own ``"capture"``, ``"replay K"``, ...), and always releases what the bench
holds, then lets it finish its report (also when a stop interrupts the replays: the report
that ``CheckInterrupted`` carries is finished too). Every bench captures through
``pagegraph.graph.capture`` and fills one ``Report``, into whose ``wall_s`` the pipeline
writes the wall seconds of each phase, after the process's own start-up ("before": the
interpreter, the imports and the planning, where the platform says when the process began;
only for a process's first check, as a warm worker's later checks had no start-up of their
own).
"""

from __future__ import annotations

import os
import time
from typing import Protocol

from .report import Report
from .state import CheckHooks

__all__ = ["Bench", "process_age_s", "run_pipeline"]


class Bench(Protocol):
    """The parts of one pipeline (see the module docstring)."""

    report: Report

    def set_up(self) -> None:
        """Allocate the pool, the buffers and the graphs' holder; start the workload."""

    def capture(self) -> bool:
        """The builder's calls before the replays (eager calls, warm-up, capture); False
        when they failed (the report says why, the rest is not reached)."""

    def replay(self) -> None:
        """Replay the workload and judge every replay."""

    def after_replays(self) -> None:
        """Work on the captured graphs once every replay is judged (the step's timing)."""

    def release(self) -> None:
        """Free what the bench holds (graphs, workload processes, counters); safe to call
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

    def __init__(self, wall: dict) -> None:
        self.wall, self.phase, self.t = wall, None, time.perf_counter()

    def start(self, phase: str | None) -> None:
        now = time.perf_counter()
        if self.phase is not None:
            self.wall[self.phase] = self.wall.get(self.phase, 0.0) + now - self.t
        self.phase, self.t = phase, now


def run_pipeline(bench: Bench, hooks: CheckHooks) -> Report:
    """Run ``bench``'s phases in order (the module docstring); its report, its
    ``wall_s`` filled in."""
    global _ran_one
    age = None if _ran_one else process_age_s()
    _ran_one = True
    if age is not None:
        bench.report.wall_s["before"] = age
    clock = _PhaseClock(bench.report.wall_s)
    hooks.note("setup")
    try:
        clock.start("set-up")
        bench.set_up()
        clock.start("capture")
        if bench.capture():
            clock.start("replays")
            bench.replay()
            clock.start("after replays")
            bench.after_replays()
    finally:
        try:
            clock.start("release")
            bench.release()
        finally:
            clock.start(None)
            bench.finish()
    return bench.report
