"""Invariant: one pipeline runs every check (``pagegraph.check.pipeline.run_pipeline``): the
phases in order, the replays only after a capture that succeeded, and the release and the
report's last judgments always, also when a phase raises or a stop interrupts the replays;
both benches (tables, decode step) run through it and note the same first phases."""

from __future__ import annotations

import pytest

from pagegraph.check.checker import check_replay_safety
from pagegraph.check.config import CheckConfig
from pagegraph.check.pipeline import run_pipeline
from pagegraph.check.state import CheckHooks


class Recording:
    """A bench that records its phases; ``captures`` and ``raises`` set what it does."""

    def __init__(self, captures: bool = True, raises: str | None = None):
        self.calls: list[str] = []
        self.report = object()
        self.captures, self.raises = captures, raises

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
