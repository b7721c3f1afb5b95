"""Invariant: warm worker processes (``pagegraph.supervise.worker_pool``) run isolated checks as
fresh child processes do: the tasks are spread over the workers, a check that kills its
worker is reported exactly as ``run_isolated`` reports it and a fresh worker takes the next
task, a check that may have left its process unfit ends its worker, and ``pagegraph mutate``
writes the same kill table with the pool as with a fresh child per builder."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from pagegraph.check.config import CheckConfig
from pagegraph.check.reports.report import PropertyResult, Report
from pagegraph.jobs.mutate import run_mutate
from pagegraph.supervise.isolate import Job, run_isolated
from pagegraph.supervise.worker_pool import Task, WorkerPool, needs_fresh_process, task_cost

# Starts child processes: scheduled first in a parallel run (see conftest.py).
pytestmark = pytest.mark.heavy

ROOT = Path(__file__).resolve().parent.parent
SMALL = CheckConfig(max_bs=6, max_context_len=128, page_size=16, steps=6, buckets="pow2", chunk=2)

CRASHERS = """
import ctypes, os
from pagegraph import build_page_table

calls = {"n": 0}

def exits_hard(*args, **kwargs):
    os._exit(7)

def segfaults_in_replays(*args, **kwargs):
    calls["n"] += 1
    if calls["n"] > 8:  # after the eager call and the warm-ups: during the replays
        ctypes.string_at(0)
    build_page_table(*args, **kwargs)
"""


@pytest.fixture
def crashers(tmp_path, monkeypatch):
    # A module name of its own: the parent imports it too (it plans each job), and another
    # test's "crashers" may already be imported in this process.
    (tmp_path / "pool_crashers.py").write_text(textwrap.dedent(CRASHERS))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}")
    return "pool_crashers"


def _verdicts(report: Report) -> list[tuple]:
    """What a report judged, without its timings."""
    return [(p.name, p.status, p.detail if p.status == "FAIL" else "") for p in report.properties]


def test_tasks_are_spread_over_warm_workers(tmp_path):
    tasks = [Task(i, Job("build_page_table", SMALL.replace(seed=100 + i))) for i in range(4)]
    pool = WorkerPool(2, tmp_path, timeout=300)
    reports = pool.run(tasks)
    assert sorted(reports) == [0, 1, 2, 3]
    assert all(r.safe for r in reports.values()), [r.format() for r in reports.values()]
    # Two workers, both used, and none replaced after a SAFE check.
    assert pool.started == 2
    assert len({t.worker_pid for t in tasks}) == 2


@pytest.mark.cpu_heavy
def test_a_crashing_check_is_reported_as_a_fresh_child_reports_it(crashers, tmp_path):
    jobs = [
        Job(f"{crashers}:exits_hard", SMALL),
        Job(f"{crashers}:segfaults_in_replays", SMALL),
        Job("build_page_table", SMALL),
    ]
    tasks = [Task(i, job) for i, job in enumerate(jobs)]  # equal costs: run in this order
    pool = WorkerPool(1, tmp_path / "pool", timeout=300)
    pooled = pool.run(tasks)
    alone = run_isolated(jobs, timeout=300)
    for i in (0, 1):
        assert pooled[i].verdict == alone[i].verdict == "UNSAFE"
        assert pooled[i].crash == alone[i].crash, (pooled[i].crash, alone[i].crash)
        assert _verdicts(pooled[i]) == _verdicts(alone[i])
    assert "exited with code 7" in pooled[0].crash
    assert "SIGSEGV" in pooled[1].crash
    assert pooled[2].safe, pooled[2].format()
    # Each crash cost its worker: three processes for three checks, one each.
    assert pool.started == 3 and len({t.worker_pid for t in tasks}) == 3


def test_a_check_that_may_leave_its_process_unfit_ends_its_worker():
    def report(failed: str | None) -> Report:
        r = Report("b", SMALL, "cpu", True)
        r.properties = [
            PropertyResult(n, "FAIL" if n == failed else "pass", "")
            for n in ("capture", "correct", "bounded writes")
        ]
        return r

    assert needs_fresh_process(report("capture"))
    # A wrong table, or a write the checker caught in its own guarded buffers: the process
    # is fine.
    assert not needs_fresh_process(report("correct"))
    assert not needs_fresh_process(report("bounded writes"))
    assert not needs_fresh_process(report(None))
    crashed = report(None)
    crashed.crash = "the check process was killed by SIGSEGV during replay 3"
    assert needs_fresh_process(crashed)


def test_checks_sharing_slots_go_first_while_a_slot_is_free(tmp_path):
    slots = (str(tmp_path / "slot-0"),)
    big = [Task(f"big{i}", Job("b", SMALL, memory_slots=slots), cost=100.0) for i in range(2)]
    small = [Task(f"small{i}", Job("b", SMALL), cost=float(i)) for i in range(3)]
    pool = WorkerPool(3, tmp_path)
    pool._pending = sorted([*big, *small], key=lambda t: t.cost)
    # The one slot is free: a big check first, though it costs the most; then, the slot
    # taken, the cheapest plain ones, and no worker waits for the slot while they last.
    assert [pool._take().key for _ in range(3)] == ["big0", "small0", "small1"]
    pool._done(big[0], None, None)  # the slot is free again
    assert [pool._take().key for _ in range(2)] == ["big1", "small2"]
    assert pool._busy_slots[slots] == 1 and not pool._pending


def test_checks_in_cost_order_wait_their_turn_and_drop_takes_them_out(tmp_path):
    """A mutant's big check waits behind cheaper ones (one of which may kill it), and the
    checks dropped once it is killed are never handed out."""
    slots = (str(tmp_path / "slot-0"),)
    big = Task("big", Job("b", SMALL, memory_slots=slots), cost=100.0, in_cost_order=True)
    small = [Task(f"small{i}", Job("b", SMALL), cost=float(i)) for i in range(3)]
    pool = WorkerPool(3, tmp_path)
    pool._pending = sorted([big, *small], key=lambda t: t.cost)
    assert [pool._take().key for _ in range(2)] == ["small0", "small1"]
    assert pool.drop(lambda t: t.key in ("big", "small0")) == [big]  # small0 already out
    assert [pool._take().key] == ["small2"] and not pool._pending
    assert pool._take() is None


def test_tasks_are_ordered_by_cost():
    small, big = SMALL, SMALL.replace(steps=60, max_bs=12)
    assert task_cost(small) < task_cost(big)
    assert task_cost(big.replace(consumer="paged")) > task_cost(big)


def _builders(doc: dict) -> dict:
    """A mutate JSON's builders without timings: each report's verdicts only."""
    out = {}
    for b in doc["builders"]:
        reports = {
            s: [(p["name"], p["status"], p.get("first_failure")) for p in r["properties"]]
            for s, r in b["reports"].items()
        }
        out[b["name"]] = (b["killed"], b["killers"], b["skipped"], b["not_applicable"], reports)
    return out


@pytest.mark.cpu_heavy
def test_mutate_with_warm_workers_matches_a_fresh_child_per_builder(tmp_path, capsys):
    """A small kill table, once with the pool and once the old way: the same table."""
    runs = {}
    for pool in (True, False):
        out = tmp_path / f"{pool}.json"
        md = tmp_path / f"{pool}.md"
        code = run_mutate(
            [str(ROOT / "graphs" / "default.toml")],
            mutants=["floor_last_page", "extra_last_page"],
            replays=8,
            jobs=2,
            timeout=300,
            json_path=str(out),
            markdown_path=str(md),
            quiet=True,
            pool=pool,
        )
        text = capsys.readouterr().out
        runs[pool] = (code, text.rsplit("\n", 2)[0], _builders(json.loads(out.read_text())))
    assert runs[True][0] == runs[False][0] == 0, runs[True][1]
    assert runs[True][1] == runs[False][1]  # the kill table and the matrix, line for line
    assert runs[True][2] == runs[False][2]
    assert "| extra_last_page |" in runs[True][1] and "bounded writes" in runs[True][1]
    # The kill-table image, beside the Markdown report and shown in it.
    assert (tmp_path / "True.png").stat().st_size > 0
    assert "![kill table](True.png)" in (tmp_path / "True.md").read_text()


@pytest.mark.cpu_heavy
def test_a_mutant_stops_at_its_first_kill_and_the_killed_set_is_the_same(tmp_path, capsys):
    """By default a killed mutant's checks not yet started are dropped (the pool runs
    cheapest first): fewer checks, the same mutants killed, the same controls SAFE, and
    each mutant's dropped scenarios named; --every-scenario checks them all."""
    scenarios = [str(ROOT / "graphs" / name) for name in ("default.toml", "spec-metadata.toml")]
    mutants = ["floor_last_page", "no_row_clamp"]
    docs = {}
    for every in (False, True):
        out = tmp_path / f"{every}.json"
        code = run_mutate(
            scenarios,
            mutants=mutants,
            replays=8,
            jobs=2,
            timeout=300,
            json_path=str(out),
            quiet=True,
            every_scenario=every,
        )
        assert code == 0, capsys.readouterr().out
        docs[every] = {b["name"]: b for b in json.loads(out.read_text())["builders"]}
    first, every = docs[False], docs[True]
    for name in mutants:
        assert first[name]["killed"] and every[name]["killed"]
        assert set(first[name]["killers"]) <= set(every[name]["killers"])
        assert every[name]["not_checked_after_kill"] == []
        ran = set(first[name]["reports"])
        assert ran.isdisjoint(first[name]["not_checked_after_kill"])
        assert ran | set(first[name]["not_checked_after_kill"]) == {"default", "spec-metadata"}
    # floor_last_page dies on both scenarios: one of its checks need not have run
    assert every["floor_last_page"]["killers"].keys() == {"default", "spec-metadata"}
    dropped = sum(len(first[n]["not_checked_after_kill"]) for n in mutants)
    assert dropped >= 1, first
    for name, b in first.items():
        if b["control"] and not b["skipped"]:
            assert b["not_checked_after_kill"] == [] and set(b["reports"]) == set(
                every[name]["reports"]
            ), name
