"""What the end of a run leaves unfinished: one rule (``unfinished``) for both beds and
for the report of a check whose process died. A bed declares its properties
(``BedProperties``: the tables' ``TABLE_BED_PROPERTIES``, the decode step's
``STEP_BED_PROPERTIES``); a run ends early in one of three ways (``Ending``: stopped during
the replays, capture failed, the process crashed), told as a ``RunEnd``; ``mark_unfinished``
turns what ``unfinished`` names "incomplete", the end's ``why`` its detail. Only finished
checks pass: a run that stopped has not shown what it did not finish.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

from .config import PROPERTIES, REPLAY_PROPERTIES
from .reports.report import PropertyResult
from .reports.step_report import STEP_PROPERTIES

__all__ = [
    "STEP_BED_PROPERTIES",
    "TABLE_BED_PROPERTIES",
    "BedProperties",
    "Ending",
    "RunEnd",
    "fail_at_capture",
    "mark_unfinished",
    "unfinished",
]


class Ending(enum.Enum):
    """How a run ended before it judged everything."""

    #: the replay loop ended before its last replay (a signal, the first failure with
    #: ``stop_on_failure``, a replay that raised): the replays' properties are unfinished
    STOPPED = "stopped"
    #: no replay ran (the builder's eager call, the runner factory or the capture raised):
    #: every property not judged yet is not reached
    CAPTURE_FAILED = "capture failed"
    #: the check process died (its parent writes the report, ``pagegraph.supervise``): the
    #: replays' properties are unfinished, unless it died after judging every replay
    CRASHED = "crashed"


@dataclass(frozen=True)
class BedProperties:
    """The properties a bed declares, and when it judges them."""

    #: every property, in the report's order
    names: tuple[str, ...]
    #: those judged over the replays: a stop or a crash before the last replay leaves the ones
    #: still passing unfinished
    replayed: tuple[str, ...]
    #: the phases a process notes after every replay was judged (the step's "timing"): a
    #: crash there leaves nothing unfinished
    after_replays: tuple[str, ...] = ()


#: The tables' bed (``pagegraph.check.pipeline.table_bed.TableBed``): the builder's calls,
#: capture and set-up judged before the replays, ``REPLAY_PROPERTIES`` and "replays
#: completed" over them.
TABLE_BED_PROPERTIES = BedProperties(
    names=tuple(PROPERTIES), replayed=(*REPLAY_PROPERTIES, "replays completed")
)
#: The decode step's bed (``pagegraph.check.pipeline.step_bed.StepBed``): every property
#: but "capture" judged over the replays; the timing comes after them.
STEP_BED_PROPERTIES = BedProperties(
    names=tuple(STEP_PROPERTIES),
    replayed=tuple(name for name in STEP_PROPERTIES if name != "capture"),
    after_replays=("timing",),
)


@dataclass(frozen=True)
class RunEnd:
    """How a run ended early (``how``), the detail every unfinished property gets (``why``),
    and, for a crash, the phase the process had noted (``"capture"``, ``"replay 17"``,
    ``"timing"``)."""

    how: Ending
    why: str
    phase: str = ""


def _open(p: PropertyResult) -> bool:
    """Whether ``p`` still stands to be judged: passing so far, or blank (the report of a
    process that died before writing one lists every property incomplete, with no detail)."""
    return p.status == "pass" or (p.status == "incomplete" and not p.detail)


def unfinished(
    bed: BedProperties, end: RunEnd, results: Mapping[str, PropertyResult]
) -> tuple[str, ...]:
    """The names of ``bed``'s properties that ``end`` leaves unfinished, given their
    ``results`` so far (by name): a failure, an advice or a skip stands whatever the end.

    * capture failed: every property but "capture" not judged yet (no detail: what the set-up
      and the eager call judged before the capture stands);
    * stopped during the replays: the properties judged over them;
    * crashed: the same, unless the phase reached comes after the replays.
    """
    if end.how is Ending.CAPTURE_FAILED:
        return tuple(
            name
            for name in bed.names
            if name != "capture" and _open(results[name]) and not results[name].detail
        )
    if end.how is Ending.CRASHED and end.phase in bed.after_replays:
        return ()
    return tuple(name for name in bed.replayed if _open(results[name]))


def mark_unfinished(results: Mapping[str, PropertyResult], bed: BedProperties, end: RunEnd) -> None:
    """Every property ``unfinished`` names becomes "incomplete", ``end.why`` its detail."""
    for name in unfinished(bed, end, results):
        results[name].status, results[name].detail = "incomplete", end.why


def fail_at_capture(
    results: Mapping[str, PropertyResult], bed: BedProperties, what: str, why: str
) -> None:
    """No replay ran: "capture" fails with ``what`` (its detail too), and every property of
    ``bed`` not judged yet is marked unfinished with ``why`` (``Ending.CAPTURE_FAILED``)."""
    results["capture"].fail(what)
    results["capture"].detail = what
    mark_unfinished(results, bed, RunEnd(Ending.CAPTURE_FAILED, why))
