"""Invariant: one rule decides what an early end of a check leaves unfinished
(``pagegraph.check.run_end.unfinished``), for the tables' bed, the decode step's and the
report of a check whose process died: a stop or a crash during the replays leaves the
properties judged over them unfinished, a failed capture every property not judged yet, a
crash after the replays (the step's timing) nothing; a failure, an advice or a skip stands
whatever the end, and only a property still passing (or blank) becomes incomplete."""

from __future__ import annotations

import pytest

from pagegraph.check.config import PROPERTIES, REPLAY_PROPERTIES
from pagegraph.check.reports.report import PropertyResult
from pagegraph.check.reports.step_report import STEP_PROPERTIES
from pagegraph.check.run_end import (
    STEP_BED_PROPERTIES,
    TABLE_BED_PROPERTIES,
    BedProperties,
    Ending,
    RunEnd,
    fail_at_capture,
    mark_unfinished,
    unfinished,
)

BEDS = pytest.mark.parametrize(
    "bed", [TABLE_BED_PROPERTIES, STEP_BED_PROPERTIES], ids=["tables", "decode-step"]
)


def _results(bed: BedProperties, status: str = "pass") -> dict[str, PropertyResult]:
    return {name: PropertyResult(name, status) for name in bed.names}


def test_each_bed_declares_its_reports_properties():
    assert TABLE_BED_PROPERTIES.names == tuple(PROPERTIES)
    assert TABLE_BED_PROPERTIES.replayed == (*REPLAY_PROPERTIES, "replays completed")
    assert STEP_BED_PROPERTIES.names == tuple(STEP_PROPERTIES)
    for bed in (TABLE_BED_PROPERTIES, STEP_BED_PROPERTIES):
        assert set(bed.replayed) <= set(bed.names) and "capture" not in bed.replayed


@BEDS
def test_a_stop_leaves_what_the_replays_judge_unfinished(bed):
    results = _results(bed)
    assert unfinished(bed, RunEnd(Ending.STOPPED, "interrupted"), results) == bed.replayed


def test_a_stop_spares_what_the_tables_judged_before_the_replays():
    results = _results(TABLE_BED_PROPERTIES)
    left = unfinished(TABLE_BED_PROPERTIES, RunEnd(Ending.STOPPED, "stopped"), results)
    for name in ("sync-free builder call", "capture", "outputs unaliased"):
        assert name not in left


@BEDS
@pytest.mark.parametrize("how", list(Ending))
@pytest.mark.parametrize("settled", ["FAIL", "advice", "skip"])
def test_a_settled_property_stands_whatever_the_end(bed, how, settled):
    """Planted: every property failed, advised or skipped (with a detail, as judged ones
    have): no end leaves any of them unfinished."""
    results = _results(bed, settled)
    for p in results.values():
        p.detail = "judged"
    assert unfinished(bed, RunEnd(how, "why", "replay 3"), results) == ()


@BEDS
def test_a_failed_capture_leaves_what_was_not_reached(bed):
    results = _results(bed)
    judged = bed.names[0]  # judged before the capture: a detail, still passing
    results[judged].detail = "0 syncs (cpu)"
    left = unfinished(bed, RunEnd(Ending.CAPTURE_FAILED, "not reached"), results)
    assert judged not in left and "capture" not in left
    assert set(left) == set(bed.names) - {judged, "capture"}


@BEDS
def test_a_crash_during_the_replays_leaves_the_blank_and_passing_unfinished(bed):
    """The report of a child that died before writing one lists every property incomplete
    with no detail: the crash names the replays' ones; a stop names them as they pass."""
    blank = _results(bed, "incomplete")
    end = RunEnd(Ending.CRASHED, "crashed", "replay 3")
    assert unfinished(bed, end, blank) == bed.replayed
    assert unfinished(bed, end, _results(bed)) == bed.replayed
    noted = _results(bed, "incomplete")
    for p in noted.values():
        p.detail = "stopped earlier"  # incomplete with a reason already: it stands
    assert unfinished(bed, end, noted) == ()


def test_a_crash_after_the_steps_replays_leaves_nothing_unfinished():
    end = RunEnd(Ending.CRASHED, "crashed", "timing")
    assert unfinished(STEP_BED_PROPERTIES, end, _results(STEP_BED_PROPERTIES)) == ()
    # the tables note no phase after their replays
    assert unfinished(TABLE_BED_PROPERTIES, end, _results(TABLE_BED_PROPERTIES))


def test_marking_turns_what_is_unfinished_incomplete_with_why():
    results = _results(STEP_BED_PROPERTIES)
    results["cache write exact"].fail("slot 3")
    mark_unfinished(results, STEP_BED_PROPERTIES, RunEnd(Ending.STOPPED, "after 2 replays"))
    assert results["capture"].status == "pass" and results["capture"].detail == ""
    assert results["cache write exact"].status == "FAIL"
    assert results["replays completed"].status == "incomplete"
    assert results["replays completed"].detail == "after 2 replays"


@BEDS
def test_a_failed_capture_fails_capture_and_leaves_the_unjudged_unfinished(bed):
    results = _results(bed)
    judged = next(n for n in bed.names if n != "capture")
    results[judged].fail("judged before the capture")  # a failure stands
    fail_at_capture(results, bed, "capture raised X", "not reached: capture failed")
    assert (results["capture"].status, results["capture"].detail) == ("FAIL", "capture raised X")
    assert results[judged].status == "FAIL"
    rest = [results[n] for n in bed.names if n not in ("capture", judged)]
    assert rest and all(
        (r.status, r.detail) == ("incomplete", "not reached: capture failed") for r in rest
    )
