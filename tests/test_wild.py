"""Invariant: every entry of the corpus of bugs from the wild is caught through its named
property, and its fixed twin is SAFE; the corpus holds at least 24 entries, one a defect, at
least three in every class, over at least six engines.

An entry is a public engine's bug written from its report (``pagegraph.wild``). Its record
names the thread, the class and the property, and how faithful it is; its scenario loads; its
buggy twin must fail that very property (not just any), its fixed twin must pass everything.
Entries that need a GPU say why, and run only there.
"""

from __future__ import annotations

import inspect
import re
import textwrap

import pytest
import torch

from pagegraph.check.config import PROPERTIES
from pagegraph.check.reports.step_report import STEP_PROPERTIES
from pagegraph.check.scenario import load_scenario
from pagegraph.consumers.reader import Reader
from pagegraph.jobs import wild_job
from pagegraph.wild import BUG_CLASSES, Fidelity, NotYetExpressible, Twin, WildBug, entries
from pagegraph.wild.pending import NOT_YET_EXPRESSIBLE

CORPUS = entries()
KEYS = [b.key for b in CORPUS]
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def test_the_corpus_holds_24_mechanisms_three_a_class_over_six_engines():
    assert len(CORPUS) >= 24, KEYS
    per_class = {c: sum(b.bug_class == c for b in CORPUS) for c in BUG_CLASSES}
    assert min(per_class.values()) >= 3, per_class
    assert len({b.engine for b in CORPUS}) >= 6
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


@pytest.mark.parametrize("bug", CORPUS, ids=KEYS)
def test_an_entry_says_how_faithful_it_is(bug: WildBug):
    fid = bug.fidelity
    assert isinstance(fid, Fidelity), f"{bug.key}: no fidelity record"
    assert fid.modelled.strip() and fid.fix.strip()
    for ref in fid.refs:
        assert re.fullmatch(r"[\w.-]+/[\w.-]+#\d+", ref), ref
        assert ref != bug.ref


def _source(fn) -> str:
    """A callable's source with its own name taken out (a copy under another name reads
    the same), and the values its closure holds."""
    target = fn.func if hasattr(fn, "func") else fn
    try:
        text = textwrap.dedent(inspect.getsource(target))
    except (OSError, TypeError):
        return repr(target)
    defined = re.match(r"(?:@.*\n)*\s*(?:async\s+)?(?:def|class)\s+(\w+)", text)
    for name in {getattr(target, "__name__", ""), defined.group(1) if defined else ""} - {""}:
        text = re.sub(rf"\b{re.escape(name)}\b", "_", text)
    if inspect.isfunction(target):
        closure = inspect.getclosurevars(target).nonlocals
        text += repr(sorted((k, repr(v)) for k, v in closure.items()))
    return text


def _parts(twin: Twin) -> list:
    """The callables (or names) a twin runs, the reader's pieces one by one."""
    reader = twin.reader
    if isinstance(reader, Reader):
        pieces = [reader.attend, reader.launch_args, reader.plan, reader.workspace]
        pieces.append(reader.write_cache)
    else:
        pieces = [reader]
    return [twin.builder, twin.runner, *pieces]


def _same(a, b) -> bool:
    if a is b:
        return True
    if a is None or b is None or isinstance(a, str) or isinstance(b, str):
        return a == b
    return _source(a) == _source(b)


def test_no_two_entries_share_a_buggy_twin():
    # One defect, one entry: further threads of it go in its Fidelity.refs.
    for i, a in enumerate(CORPUS):
        for b in CORPUS[i + 1 :]:
            pairs = zip(_parts(a.buggy), _parts(b.buggy), strict=True)
            assert not all(_same(x, y) for x, y in pairs), (
                f"{a.key} and {b.key} run the same buggy twin: merge them (Fidelity.refs)"
            )


def test_the_duplicate_check_sees_a_copy_under_another_name(tmp_path, monkeypatch):
    bug = next(b for b in CORPUS if b.key == "lmdeploy-4569")
    module = inspect.getsource(inspect.getmodule(bug.buggy.builder))
    (tmp_path / "renamed_entry.py").write_text(
        module.replace("offsets_tail_kept", "renamed_copy").replace("from ...", "from pagegraph.")
        .replace("from ..", "from pagegraph.wild.")
    )  # fmt: skip
    monkeypatch.syspath_prepend(str(tmp_path))
    import renamed_entry  # noqa: PLC0415 - written just above

    copy = renamed_entry.BUG.buggy
    assert copy.builder is not bug.buggy.builder
    assert all(_same(x, y) for x, y in zip(_parts(bug.buggy), _parts(copy), strict=True))


def test_the_not_yet_expressible_list_is_apart_from_the_corpus():
    refs = {b.ref for b in CORPUS} | {r for b in CORPUS if b.fidelity for r in b.fidelity.refs}
    for item in NOT_YET_EXPRESSIBLE:
        assert isinstance(item, NotYetExpressible)
        assert item.bug_class in BUG_CLASSES and item.why.strip() and item.summary.strip()
        assert item.ref not in refs, f"{item.ref} is both an entry and not yet expressible"


STALE_ENTRIES = [b for b in CORPUS if b.bug_class == "a"]


@pytest.mark.cpu_heavy
@pytest.mark.parametrize("bug", STALE_ENTRIES, ids=[b.key for b in STALE_ENTRIES])
def test_a_stale_tail_entry_names_the_larger_replay_that_left_the_value(bug: WildBug):
    why = bug.runnable(DEVICE)
    if why is not None:
        pytest.skip(why)
    report = bug.check("buggy", DEVICE)
    text = str(report.property(bug.prop).first_failure)
    found = re.search(r"replay (\d+) \(bucket \d+\).*stale: left by replay (\d+) "
                      r"\(bucket \d+, (\d+) real rows\)", text)  # fmt: skip
    assert found, text
    replay, earlier, rows = (int(g) for g in found.groups())
    assert earlier < replay and rows > 0  # an earlier replay with real rows left it
