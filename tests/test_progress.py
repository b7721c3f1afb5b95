"""Invariant: a long job is never silent: its progress lines say done/total, the time elapsed
and the time left at the rate so far, at most one every ``every`` seconds, each a whole line;
a short job prints none; and a check that will be slow on a CPU is announced before it starts,
with an estimate from its size.

The clock is a fake one: the tests advance it by hand, nothing waits.
"""

from __future__ import annotations

import io

import pytest
import torch

from pagegraph.check.config import CheckConfig
from pagegraph.check.scenario import scenario_path
from pagegraph.jobs.check_estimate import check_estimate, slow_warning
from pagegraph.runtime.progress import Progress, format_seconds


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def make(total=10, every=5.0):
    clock, out = FakeClock(), io.StringIO()
    return (
        Progress(
            "pagegraph check: default", total, "replays", every=every, stream=out, clock=clock
        ),
        clock,
        out,
    )


def test_lines_carry_done_total_elapsed_and_the_time_left():
    p, clock, out = make()
    clock.now += 4.0
    p.update(2)  # before the first period: nothing
    assert out.getvalue() == ""
    clock.now += 2.0  # 6 s elapsed, 2 done: 3 s each, 8 left
    p.update(2)
    assert out.getvalue() == (
        "pagegraph check: default: 2/10 replays, 6 s elapsed, about 24 s left\n"
    )


def test_the_time_left_leaves_the_set_up_out():
    p, clock, out = make(total=10)
    clock.now += 30.0  # set-up and captures: nothing done
    p.update(1)
    clock.now += 8.0  # then 2 s a replay
    p.update(5)
    assert out.getvalue().splitlines()[-1] == (
        "pagegraph check: default: 5/10 replays, 38 s elapsed, about 10 s left"
    )


def test_weighed_items_estimate_the_time_left_by_weight():
    # Four cheap checks done, one big one left: counted by items it would be a fifth of the
    # time so far; by weight it is ten times a cheap check's.
    p, clock, out = make(total=5)
    p.total_weight = 14.0
    clock.now += 3.0  # set-up
    p.advance(weight=1.0)
    for _ in range(3):
        clock.now += 2.0  # 2 s for a check of weight 1
        p.advance(weight=1.0)
    assert p.line() == "pagegraph check: default: 4/5 replays, 9 s elapsed, about 20 s left"
    unweighed, clock, _ = make(total=5)
    clock.now += 3.0
    unweighed.advance()
    for _ in range(3):
        clock.now += 2.0
        unweighed.advance()
    assert unweighed.line().endswith("about 2 s left")


def test_items_forgone_leave_the_total_and_the_time_left():
    # Two of five checks of weight 4 dropped (a mutant killed before them): 3 to do, and the
    # time left counts only what is still to run.
    p, clock, out = make(total=5)
    p.total_weight = 20.0
    clock.now += 1.0
    p.advance(weight=4.0)
    clock.now += 4.0  # 1 s a unit of weight
    p.advance(weight=4.0)
    assert p.line() == "pagegraph check: default: 2/5 replays, 5 s elapsed, about 12 s left"
    p.forgo(2, weight=8.0)
    assert p.total == 3
    assert p.line() == "pagegraph check: default: 2/3 replays, 5 s elapsed, about 4 s left"
    clock.now += 4.0
    p.advance(weight=4.0)
    assert out.getvalue().splitlines()[-1].endswith("3/3 replays, 9 s elapsed, done")


def test_at_most_one_line_a_period_and_one_at_the_end():
    p, clock, out = make(total=100)
    for i in range(1, 101):
        clock.now += 0.5  # 50 s in all: a line every 5 s at most
        p.update(i)
    lines = out.getvalue().splitlines()
    assert len(lines) == 10  # every 10th update, the last one the end line
    assert lines[-1] == "pagegraph check: default: 100/100 replays, 50 s elapsed, done"
    assert all("\r" not in line for line in lines)
    p.update(100)
    assert len(out.getvalue().splitlines()) == 10  # the end line once


def test_a_short_job_prints_nothing():
    p, clock, out = make(total=3)
    for i in range(1, 4):
        clock.now += 1.0
        p.update(i)
    assert out.getvalue() == ""


def test_a_heartbeat_before_anything_is_done_says_the_time_left_is_unknown():
    p, clock, out = make()
    clock.now += 7.0
    p.tick()
    assert out.getvalue() == (
        "pagegraph check: default: 0/10 replays, 7 s elapsed, time left not known yet\n"
    )
    p.tick()  # the same second: not again
    assert out.getvalue().count("\n") == 1


def test_advance_from_workers_and_a_detail():
    p, clock, out = make(total=4)
    clock.now += 10.0
    p.advance(detail="mutant_a")
    assert out.getvalue() == (
        "pagegraph check: default: 1/4 replays, 10 s elapsed, about 30 s left (mutant_a)\n"
    )


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0, "0 s"), (59.4, "59 s"), (61, "1 min 1 s"), (3599, "59 min 59 s"), (7260, "2 h 1 min")],
)
def test_format_seconds(seconds, text):
    assert format_seconds(seconds) == text


def _scenario_config(name):
    from pagegraph.check.scenario import load_scenario

    return load_scenario(scenario_path(name)).config


def test_a_big_scenario_on_the_cpu_is_announced_with_an_estimate():
    cfg = _scenario_config("sglang-h200")
    line = slow_warning("sglang-h200", cfg, "cpu")
    assert line is not None
    assert line.startswith("pagegraph check: sglang-h200 will be slow on the CPU")
    assert "estimate" in line and "--replays" in line
    seconds = check_estimate(cfg, "cpu")
    assert format_seconds(seconds) in line
    # the estimate grows with the replays and the table's size
    assert check_estimate(cfg.replace(steps=cfg.steps * 2), "cpu") > seconds
    assert check_estimate(cfg.replace(max_bs=cfg.max_bs // 2), "cpu") < seconds
    assert check_estimate(cfg.replace(initial_len=(1, 1024)), "cpu") < seconds


def test_a_config_without_initial_lengths_has_an_estimate():
    cfg = CheckConfig(max_bs=4, max_context_len=300, page_size=16, steps=8)
    assert cfg.initial_len is None
    # the workload's default: up to a quarter of the context, 75 tokens, 5 pages
    assert check_estimate(cfg, "cpu") > 0
    assert check_estimate(cfg.replace(initial_len=(1, 75)), "cpu") == check_estimate(cfg, "cpu")


def test_the_default_scenario_and_a_gpu_are_not_announced():
    assert slow_warning("default", _scenario_config("default"), "cpu") is None
    assert slow_warning("sglang-h200", _scenario_config("sglang-h200"), "cuda") is None
    assert check_estimate(CheckConfig(), "cuda") is None


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU's announcement")
def test_check_announces_a_slow_scenario_before_it_starts(monkeypatch, capsys):
    from pagegraph.jobs import check_job

    before = {}

    def not_run(plan, show, results, progress):  # the check itself is not the point
        before["err"] = capsys.readouterr().err
        return None

    monkeypatch.setattr(check_job, "_run_in_process", not_run)
    check_job.run_check(["sglang-h200"], replays=1)
    cfg = _scenario_config("sglang-h200").replace(steps=1)
    assert before["err"].splitlines() == [slow_warning("sglang-h200", cfg, "cpu")]
    assert before["err"].startswith("pagegraph check: sglang-h200 will be slow on the CPU")


def test_an_isolated_checks_phase_notes_drive_its_progress():
    from types import SimpleNamespace

    from pagegraph.jobs.check_job import _CheckProgress

    cfg = _scenario_config("default")
    plan = SimpleNamespace(
        scenarios=[SimpleNamespace(name="default")], checks=[SimpleNamespace(config=cfg)]
    )
    shown = _CheckProgress(plan, quiet=False)
    shown.phase(0, "capture")
    p = shown.current
    assert (p.label, p.total, p.done, p.detail) == (
        "pagegraph check: default",
        cfg.steps,
        0,
        "capture",
    )
    shown.phase(0, "replay 7 (bucket 4), rows 2, 3 overlong")  # the explaining re-run's note
    assert (p.done, p.detail) == (7, "")
    shown.phase(0, "replay 12")
    assert p.done == 12
    assert _CheckProgress(plan, quiet=True).scenario(0) is None
