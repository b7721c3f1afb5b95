"""The decode step's judges, each on planted replay outputs: a case where its property must
fail and one where it must pass."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from pagegraph.check.judges.reader_judges import reader_judges
from pagegraph.check.judges.step_judges import (
    STEP_JUDGES,
    PaddedRowsContained,
    ReadsWithinLength,
    SentinelUntouched,
    StepBatch,
    StepReplays,
    StepSeen,
    changed_rows,
)
from pagegraph.check.pipeline.step_bed import step_properties
from pagegraph.check.reports.step_report import STEP_PROPERTIES


def _run():
    report = SimpleNamespace(buckets={})
    return SimpleNamespace(
        props=step_properties(), report=report, graphs=SimpleNamespace(sentinel=9)
    )


def _batch(n: int = 3, bucket: int = 4) -> StepBatch:
    return StepBatch(
        5, bucket, list(range(n)), [7] * n, [([1], 7)] * n, torch.tensor([1], dtype=torch.int32)
    )


def _outs(seed: int = 1, n: int = 3) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn((n, 2, 4), generator=gen).to(torch.bfloat16)


def test_every_judge_names_a_step_property_and_each_once():
    names = [j.property_name for j in (*STEP_JUDGES, *reader_judges())]
    assert len(set(names)) == len(names)
    assert set(names) <= set(STEP_PROPERTIES)
    # capture and replays completed are the pipeline's, the reader's syncs the capture's
    left = {"capture", "replays completed", "sync-free reader"}
    assert set(STEP_PROPERTIES) - set(names) == left


def test_changed_rows_compares_bits_so_a_nan_row_that_stays_nan_is_unchanged():
    a = _outs()
    b = a.clone()
    a[1] = float("nan")
    b[1] = float("nan")
    assert changed_rows(a, b) == []
    b[2, 0, 0] += 1
    assert changed_rows(a, b) == [2]


def test_reads_within_length_fails_on_a_changed_row_and_passes_on_identical_ones():
    run, judge, out = _run(), ReadsWithinLength(), _outs()
    judge.observe(StepSeen(run, _batch(), StepReplays(out, out.clone(), None, True)))
    assert run.props[judge.property_name].status == "pass"
    changed = out.clone()
    changed[2, 1, 3] = -changed[2, 1, 3] - 1
    judge.observe(StepSeen(run, _batch(), StepReplays(out, changed, None, True)))
    prop = run.props[judge.property_name]
    assert prop.status == "FAIL"
    assert "row 2" in prop.first_failure and "1 row(s) changed" in prop.first_failure


@pytest.mark.parametrize("plant", ["nan", "changed"])
def test_padded_rows_contained_fails_on_a_nan_or_changed_real_row(plant):
    run, judge, out = _run(), PaddedRowsContained(), _outs()
    with_nan_pads = out.clone()
    finite_pads = out.clone()
    if plant == "nan":
        with_nan_pads[0] = float("nan")
    else:
        finite_pads[1, 0, 0] += 2
    judge.observe(StepSeen(run, _batch(), StepReplays(out, with_nan_pads, finite_pads, True)))
    prop = run.props[judge.property_name]
    assert prop.status == "FAIL"
    assert ("is non-finite" if plant == "nan" else "changed") in prop.first_failure
    assert "padded rows 3..3" in prop.first_failure


def test_padded_rows_contained_passes_when_equal_and_without_padded_rows():
    run, judge, out = _run(), PaddedRowsContained(), _outs()
    judge.observe(StepSeen(run, _batch(), StepReplays(out, out.clone(), out.clone(), True)))
    nan_out = out.clone()
    nan_out[0] = float("nan")
    judge.observe(StepSeen(run, _batch(3, 3), StepReplays(out, nan_out, None, True)))  # no replay C
    assert run.props[judge.property_name].status == "pass"


def test_sentinel_judge_fails_only_when_the_sentinel_changed():
    run, judge, out = _run(), SentinelUntouched(), _outs()
    judge.observe(StepSeen(run, _batch(), StepReplays(out, out, None, True)))
    assert run.props[judge.property_name].status == "pass"
    judge.observe(StepSeen(run, _batch(), StepReplays(out, out, None, False)))
    prop = run.props[judge.property_name]
    assert (
        prop.status == "FAIL"
        and "page 9" in prop.first_failure
        and "replay 5" in prop.first_failure
    )
