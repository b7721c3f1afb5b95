"""Padded rows under the engine's convention, on the reader's side of the decode step: the
convention noted, the guard page after capture, and what the two properties covered (their
judges are ``step_judges.PaddedReadsInPool`` and ``NullBlockUntouched``).

docs/ARCHITECTURE.md ("Inside the checker") has the details.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from ...graph.step_graphs import GUARD_NAME, GUARD_PAGE, StepGraphs
from ..config import CheckConfig
from ..reports.report import PropertyResult

__all__ = [
    "PaddedRun",
    "READS",
    "ReplayedRun",
    "WRITES",
    "describe",
    "judge_capture",
    "nan_page",
    "note_convention",
]

#: The properties this module judges (``pagegraph.check.reports.step_report.STEP_PROPERTIES``).
READS = "padded rows read inside the KV pool"
WRITES = "null block and guard page untouched"


class PaddedRun(Protocol):
    """The decode step's run as this module reads it (``pagegraph.check.pipeline.step_bed``'s,
    ``pagegraph.check.judges.step_judges.StepRun``): its config, graphs and properties."""

    @property
    def cfg(self) -> CheckConfig: ...
    @property
    def graphs(self) -> StepGraphs: ...
    @property
    def props(self) -> Mapping[str, PropertyResult]: ...


class ReplayedRun(PaddedRun, Protocol):
    """The run once its replays are done: ``padded_replays``, those with padded rows."""

    @property
    def padded_replays(self) -> int: ...


def nan_page(null_block: str) -> int:
    """The page id whose K and V are NaN and which no row may read: page 0 where the null
    block holds NaN, else the guard page (-1)."""
    return 0 if null_block == "nan" else GUARD_PAGE


def note_convention(props: Mapping[str, PropertyResult], null_block: str) -> None:
    """Mark "padded rows read inside the KV pool" skipped, with why, where the null block
    holds NaN (before the run)."""
    if null_block == "nan":
        props[READS].skip(
            "null_block = 'nan': page 0 holds NaN, so padded rows' own outputs are not judged "
            "(set [consumer] null_block = 'finite' for a convention whose padded rows may read "
            "the null block)"
        )


def judge_capture(run: PaddedRun) -> None:
    """The guard page after capture (``run``: the decode step's run); page 0's values from
    here on are the ones the replays keep."""
    g = run.graphs
    if GUARD_NAME in g.reserved_changed():
        run.props[WRITES].fail(f"{GUARD_NAME} of the KV cache changed during capture")
    g.snapshot_reserved()


def describe(run: ReplayedRun) -> None:
    """What each property covered, once the replays are done (a pass), or why it had
    nothing to judge (a skip)."""
    reads, writes = run.props[READS], run.props[WRITES]
    if writes.status == "pass":
        writes.detail = (
            "the guard page before page 0 (NaN, no request holds it) unchanged after capture and "
            "every replay; "
            + (
                "page 0 not judged (null_block = 'nan': padding's own page)"
                if run.graphs.null_block == "nan"
                else "page 0 (the null block, data) unchanged after every replay"
            )
        )
    if reads.status != "pass":
        return
    if not run.padded_replays:
        reads.skip("no replay had padded rows")
        return
    reads.detail = (
        f"{run.padded_replays} replays with padded rows ({run.cfg.padding} padding, null block "
        "page 0 finite, NaN in the guard page before it and in the sentinel): every padded "
        "row's output finite with finite queries"
    )
