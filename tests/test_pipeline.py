"""Invariant: one pipeline runs every check (``pagegraph.check.pipeline.run_pipeline``): the
phases in order, the replays only after a capture that succeeded, and the release and the
report's last judgments always, also when a phase raises or a stop interrupts the replays;
both benches (tables, decode step) run through it and note the same first phases."""

from __future__ import annotations

import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

from pagegraph.check import pipeline
from pagegraph.check.checker import check_replay_safety
from pagegraph.check.config import CheckConfig
from pagegraph.check.pipeline import process_age_s, run_pipeline
from pagegraph.check.state import CheckHooks


class Recording:
    """A bench that records its phases; ``captures`` and ``raises`` set what it does."""

    def __init__(self, captures: bool = True, raises: str | None = None):
        self.calls: list[str] = []
        self.report = SimpleNamespace(wall_s={})
        self.captures, self.raises = captures, raises
        self.replay_s = 0.0

    def _call(self, name: str):
        self.calls.append(name)
        if self.raises == name:
            raise KeyboardInterrupt(name)

    def set_up(self):
        self._call("set_up")

    def capture(self):
        self._call("capture")
        return self.captures

    def replay(self):
        self._call("replay")
        time.sleep(self.replay_s)

    def after_replays(self):
        self._call("after_replays")

    def release(self):
        self._call("release")

    def finish(self):
        self._call("finish")


def test_the_phases_run_in_order_and_the_report_comes_back():
    bench, notes = Recording(), []
    assert run_pipeline(bench, CheckHooks(on_phase=notes.append)) is bench.report
    assert bench.calls == ["set_up", "capture", "replay", "after_replays", "release", "finish"]
    assert notes == ["setup"]


def test_a_failed_capture_reaches_no_replay():
    bench = Recording(captures=False)
    run_pipeline(bench, CheckHooks())
    assert bench.calls == ["set_up", "capture", "release", "finish"]


@pytest.mark.parametrize("phase", ["set_up", "capture", "replay"])
def test_an_interrupted_phase_still_releases_and_finishes(phase):
    bench = Recording(raises=phase)
    with pytest.raises(KeyboardInterrupt):
        run_pipeline(bench, CheckHooks())
    assert bench.calls[-2:] == ["release", "finish"]
    assert "after_replays" not in bench.calls


@pytest.mark.parametrize("consumer", [None, "paged"], ids=["tables", "step"])
def test_both_benches_note_the_same_first_phases(consumer):
    cfg = CheckConfig(steps=2, max_bs=4, max_context_len=128, page_size=16, seed=3,
                      workload_process="off", consumer=consumer, num_q_heads=4,
                      num_kv_heads=2, head_dim=16, timing_iters=0)  # fmt: skip
    notes: list[str] = []
    report = check_replay_safety("build_page_table", cfg, on_phase=notes.append)
    assert notes[:2] == ["setup", "capture"] and "replay 1" in notes, notes
    assert report.verdict == "SAFE", report.format()
    # both report texts say where the wall time went, as their JSON does
    line = next(x for x in report.format().splitlines() if x.startswith("wall s by phase: "))
    assert line.endswith(f"(total {sum(report.wall_s.values()):.2f})")
    assert {"set-up", "capture", "replays"} <= set(report.wall_s)
    assert report.to_dict()["wall_s"] == report.wall_s


def test_each_phases_wall_time_goes_into_the_report(monkeypatch):
    monkeypatch.setattr(pipeline, "_ran_one", False)
    bench = Recording()
    bench.replay_s = 0.05
    run_pipeline(bench, CheckHooks())
    wall = bench.report.wall_s
    assert list(wall) == ["before", "set-up", "capture", "replays", "after replays", "release"]
    assert wall["replays"] >= 0.05 and all(v >= 0 for v in wall.values())
    assert wall["replays"] > wall["capture"]
    # a warm worker's next check had no start-up of its own: no "before" there
    again = Recording()
    run_pipeline(again, CheckHooks())
    assert "before" not in again.report.wall_s and "replays" in again.report.wall_s


def test_an_interrupted_phase_keeps_its_time_and_the_release_is_timed():
    bench = Recording(raises="replay")
    with pytest.raises(KeyboardInterrupt):
        run_pipeline(bench, CheckHooks())
    assert {"set-up", "capture", "replays", "release"} <= set(bench.report.wall_s)
    assert "after replays" not in bench.report.wall_s


def test_the_process_age_counts_from_the_process_start():
    """A child that sleeps 0.3 s before asking is at least that old, and not minutes old."""
    code = (
        "import time; time.sleep(0.3); "
        "from pagegraph.check.pipeline import process_age_s; print(process_age_s())"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         check=True).stdout  # fmt: skip
    age = float(out)
    assert 0.3 <= age < 30, age
    assert process_age_s() is not None
