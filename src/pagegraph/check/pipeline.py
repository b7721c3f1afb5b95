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
``pagegraph.graph.capture`` and fills one ``Report``.
"""

from __future__ import annotations

from typing import Protocol

from .report import Report
from .state import CheckHooks

__all__ = ["Bench", "run_pipeline"]


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


def run_pipeline(bench: Bench, hooks: CheckHooks) -> Report:
    """Run ``bench``'s phases in order (the module docstring); its report."""
    hooks.note("setup")
    try:
        bench.set_up()
        if bench.capture():
            bench.replay()
            bench.after_replays()
    finally:
        try:
            bench.release()
        finally:
            bench.finish()
    return bench.report
