"""Invariant: every entry of the corpus of bugs from the wild is caught through its named
property, and its fixed twin is SAFE; the corpus spans the six classes and five engines.

An entry is a public engine's bug written from its report (``pagegraph.wild``). Its record
names the thread, the class and the property; its scenario loads; its buggy twin must fail
that very property (not just any), its fixed twin must pass everything. Entries that need a
GPU say why, and run only there.
"""

from __future__ import annotations

import re

import pytest
import torch

from pagegraph.check.config import PROPERTIES
from pagegraph.check.reports.step_report import STEP_PROPERTIES
from pagegraph.check.scenario import load_scenario
from pagegraph.jobs import wild_job
from pagegraph.wild import BUG_CLASSES, Twin, WildBug, entries

CORPUS = entries()
KEYS = [b.key for b in CORPUS]
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def test_the_corpus_spans_every_class_and_five_engines():
    assert len(CORPUS) >= 14, KEYS
    assert {b.bug_class for b in CORPUS} == set(BUG_CLASSES)
    assert len({b.engine for b in CORPUS}) >= 5
    assert len(set(KEYS)) == len(KEYS)


@pytest.mark.parametrize("bug", CORPUS, ids=KEYS)
def test_an_entry_names_its_thread_class_scenario_and_a_property_of_the_bed(bug: WildBug):
    assert re.fullmatch(r"[\w.-]+/[\w.-]+#\d+", bug.ref), bug.ref
    assert bug.key.endswith(bug.ref.split("#")[1])
    assert bug.bug_class in BUG_CLASSES
    assert bug.symptom and bug.cause and bug.state and bug.version
    scenario = load_scenario(bug.scenario_path)
    known = STEP_PROPERTIES if scenario.config.consumer else PROPERTIES
    assert bug.prop in known, f"{bug.key}: {bug.prop!r} is not a property of its check"
    assert bug.buggy != bug.fixed
    assert isinstance(bug.buggy, Twin) and isinstance(bug.fixed, Twin)


@pytest.mark.cpu_heavy
@pytest.mark.parametrize("bug", CORPUS, ids=KEYS)
def test_the_buggy_twin_fails_its_property_and_the_fixed_twin_is_safe(bug: WildBug):
    why = bug.runnable(DEVICE)
    if why is not None:
        pytest.skip(why)
    result = wild_job.judge_entry(bug, DEVICE)
    assert not result.errors, result.errors
    buggy, fixed = result.reports["buggy"], result.reports["fixed"]
    assert buggy.verdict == "UNSAFE", buggy.format()
    assert buggy.property(bug.prop).status == "FAIL", buggy.format()
    assert fixed.safe, fixed.format()
    assert result.held


def test_the_job_refuses_an_unknown_entry_in_one_line(capsys):
    assert (
        wild_job.run_wild(
            ["no-such-bug"], device="cpu", markdown=None, json_path=None, reports=None
        )
        == 2
    )
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "no entry no-such-bug" in err


def test_an_entry_that_did_not_hold_fails_the_job_and_names_why(tmp_path, monkeypatch):
    # The fixed twin swapped for the buggy one: the entry cannot hold.
    bug = next(b for b in CORPUS if b.key == "lmdeploy-4569")
    broken = WildBug(**{**bug.__dict__, "fixed": bug.buggy})
    monkeypatch.setattr(wild_job, "entries", lambda: [broken])
    md = tmp_path / "wild.md"
    code = wild_job.run_wild(
        [], device="cpu", markdown=str(md), json_path=None, reports=str(tmp_path / "wild")
    )
    assert code == 1
    text = md.read_text()
    assert "0 of 1 entries held, 1 not" in text
    assert "(wild/lmdeploy-4569-fixed.md)" in text
    assert (tmp_path / "wild" / "lmdeploy-4569-buggy.json").is_file()


def test_a_gpu_only_entry_is_skipped_with_its_reason_on_a_cpu():
    bug = next(b for b in CORPUS if b.key == "lmdeploy-4569")
    gpu_only = WildBug(**{**bug.__dict__, "needs": "a real stream capture"})
    result = wild_job.judge_entry(gpu_only, torch.device("cpu"))
    assert result.held is None and result.reports == {}
    assert result.skipped == "needs CUDA: a real stream capture"
