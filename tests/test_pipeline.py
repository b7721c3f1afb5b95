"""Invariant: one pipeline runs every check (``pagegraph.check.pipeline.phases.run_pipeline``): the
phases in order, the replays only after a capture that succeeded, and the release and the
report's last judgments always, also when a phase raises or a stop interrupts the replays;
both beds (tables, decode step) run through it and note the same first phases."""

from __future__ import annotations

import inspect
import io
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

from pagegraph.check.checker import check_replay_safety
from pagegraph.check.config import CheckConfig
from pagegraph.check.pipeline import phases as pipeline
from pagegraph.check.pipeline.phases import process_age_s, run_pipeline
from pagegraph.check.pipeline.state import CheckHooks


class FakeClock:
    """``time.perf_counter`` for the pipeline: it moves only when a phase says so."""

    def __init__(self):
        self.now = 1000.0

    def perf_counter(self) -> float:
        return self.now


#: Seconds each phase of a ``Recording`` bed takes on a ``FakeClock``: powers of two, so
#: every phase's share is told apart from any sum of the others.
PHASE_S = {
    "set_up": 1.0,
    "capture": 2.0,
    "replay": 4.0,
    "after_replays": 8.0,
    "release": 16.0,
    "finish": 32.0,
}


class Recording:
    """A bed that records its phases; ``captures`` and ``raises`` set what it does. With a
    ``clock``, each phase advances it by its ``PHASE_S`` (before raising, if it raises)."""

    def __init__(
        self, captures: bool = True, raises: str | None = None, clock: FakeClock | None = None
    ):
        self.calls: list[str] = []
        self.report = SimpleNamespace(wall_s={}, replays=0)
        self.props: dict = {}
        self.steps = 2
        self.captures, self.raises, self.clock = captures, raises, clock

    def _call(self, name: str):
        self.calls.append(name)
        if self.clock is not None:
            self.clock.now += PHASE_S[name]
        if self.raises == name:
            raise KeyboardInterrupt(name)

    def set_up(self):
        self._call("set_up")

    def capture(self):
        self._call("capture")
        return self.captures

    def start_replays(self):
        self._call("replay")

    def replay_one(self, i):
        self.calls.append(f"replay {i}")
        return True

    def end_replays(self, end):
        self.calls.append("end_replays")

    def after_replays(self):
        self._call("after_replays")

    def release(self):
        self._call("release")

    def finish(self):
        self._call("finish")


def test_the_phases_run_in_order_and_the_report_comes_back():
    bed, notes = Recording(), []
    assert run_pipeline(bed, CheckHooks(on_phase=notes.append)) is bed.report
    assert bed.calls == ["set_up", "capture", "replay", "replay 0", "replay 1", "end_replays",
                           "after_replays", "release", "finish"]  # fmt: skip
    assert notes == ["setup", "replay 0", "replay 1"]


def test_a_failed_capture_reaches_no_replay():
    bed = Recording(captures=False)
    run_pipeline(bed, CheckHooks())
    assert bed.calls == ["set_up", "capture", "release", "finish"]


@pytest.mark.parametrize("phase", ["set_up", "capture", "replay"])
def test_an_interrupted_phase_still_releases_and_finishes(phase):
    bed = Recording(raises=phase)
    with pytest.raises(KeyboardInterrupt):
        run_pipeline(bed, CheckHooks())
    assert bed.calls[-2:] == ["release", "finish"]
    assert "after_replays" not in bed.calls


@pytest.mark.parametrize("consumer", [None, "paged"], ids=["tables", "step"])
def test_both_benches_note_the_same_first_phases(consumer):
    cfg = CheckConfig(
        steps=2,
        max_bs=4,
        max_context_len=128,
        page_size=16,
        seed=3,
        workload_process="off",
        consumer=consumer,
        num_q_heads=4,
        num_kv_heads=2,
        head_dim=16,
        timing_iters=0,
    )
    notes: list[str] = []
    report = check_replay_safety("build_page_table", cfg, on_phase=notes.append)
    assert notes[:2] == ["setup", "capture"] and "replay 1" in notes, notes
    assert report.verdict == "SAFE", report.format()
    # both report texts say where the wall time went, as their JSON does
    line = next(x for x in report.format().splitlines() if x.startswith("wall s by phase: "))
    assert line.endswith(f"(total {sum(report.wall_s.values()):.2f})")
    assert {"set-up", "capture", "replays"} <= set(report.wall_s)
    assert report.to_dict()["wall_s"] == report.wall_s


@pytest.fixture
def clock(monkeypatch):
    """The pipeline's clock, faked: the wall times are the phases' ``PHASE_S``, exactly."""
    fake = FakeClock()
    monkeypatch.setattr(pipeline, "time", fake)
    return fake


def test_each_phases_wall_time_goes_into_the_report(monkeypatch, clock):
    monkeypatch.setattr(pipeline, "_ran_one", False)
    monkeypatch.setattr(pipeline, "process_age_s", lambda: 7.5)
    bed = Recording(clock=clock)
    run_pipeline(bed, CheckHooks())
    # Each phase's own time, in order; "finish" comes after the last phase closed (untimed).
    assert bed.report.wall_s == {
        "before": 7.5,
        "set-up": 1.0,
        "capture": 2.0,
        "replays": 4.0,
        "after replays": 8.0,
        "release": 16.0,
    }
    assert list(bed.report.wall_s) == [
        "before",
        "set-up",
        "capture",
        "replays",
        "after replays",
        "release",
    ]
    # a warm worker's next check had no start-up of its own: no "before" there
    again = Recording(clock=clock)
    run_pipeline(again, CheckHooks())
    assert again.report.wall_s == {
        "set-up": 1.0,
        "capture": 2.0,
        "replays": 4.0,
        "after replays": 8.0,
        "release": 16.0,
    }


def test_a_failed_capture_times_no_replay(clock):
    bed = Recording(captures=False, clock=clock)
    run_pipeline(bed, CheckHooks())
    assert {k: v for k, v in bed.report.wall_s.items() if k != "before"} == {
        "set-up": 1.0,
        "capture": 2.0,
        "release": 16.0,
    }


def test_an_interrupted_phase_keeps_its_time_and_the_release_is_timed(clock):
    bed = Recording(raises="replay", clock=clock)
    with pytest.raises(KeyboardInterrupt):
        run_pipeline(bed, CheckHooks())
    wall = {k: v for k, v in bed.report.wall_s.items() if k != "before"}
    assert wall == {"set-up": 1.0, "capture": 2.0, "replays": 4.0, "release": 16.0}


def test_the_process_age_counts_from_the_process_start(monkeypatch):
    """The age is the system's uptime less the process's start time (field 22 of
    ``/proc/self/stat``, in clock ticks, counted after the command name, which may hold
    spaces and parentheses)."""
    ticks = os.sysconf("SC_CLK_TCK")
    fields = ["S", *[str(k) for k in range(4, 22)], str(250 * ticks), "0", "0"]
    files = {
        "/proc/self/stat": f"4242 (a) b (c) {' '.join(fields)}\n",
        "/proc/uptime": "1000.50 3000.00\n",
    }

    def fake_open(path):
        if path not in files:
            raise FileNotFoundError(path)
        return io.StringIO(files[path])

    monkeypatch.setattr(pipeline, "open", fake_open, raising=False)
    assert process_age_s() == pytest.approx(750.5)
    files["/proc/uptime"] = "100.00 300.00\n"  # started "after" now: never negative
    assert process_age_s() == 0.0
    del files["/proc/uptime"]  # no /proc (another platform): no age
    assert process_age_s() is None


def test_a_child_process_is_younger_than_its_parent():
    """On the real ``/proc``: a child started after this process, asked before it, is younger
    (an order, not a speed)."""
    # The function's own source, run bare: the child needs no pagegraph (nor torch) import.
    code = f"import os\n{inspect.getsource(process_age_s)}\nprint(process_age_s())"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    child = float(out)
    parent = process_age_s()
    assert parent is not None and 0.0 <= child <= parent, (child, parent)


# -- the shared replay loop and stages ----------------------------------------------------------


def _loop_props():
    from pagegraph.check.reports.report import PropertyResult

    return {n: PropertyResult(n) for n in ("capture", "replays completed", "correct")}


def _report(replays: int = 0):
    return SimpleNamespace(replays=replays)


def test_the_loop_runs_every_replay_and_tells_the_caller():
    seen, chunks, progress = [], [], []
    hooks = CheckHooks(progress=lambda d, t: progress.append(d), on_chunk=chunks.append)
    report = _report()
    end = pipeline.drive_replays(5, lambda i: seen.append(i) or i % 2 == 1, hooks, report,
                                 _loop_props())  # fmt: skip
    assert end == pipeline.LoopEnd() and seen == [0, 1, 2, 3, 4]
    assert len(chunks) == 2 and progress == [1, 2, 3, 4, 5]  # judged after replays 1 and 3


def test_a_replay_that_raises_ends_the_loop_and_fails_replays_completed():
    props = _loop_props()

    def replay(i):
        if i == 2:
            raise RuntimeError("device lost")
        return True

    end = pipeline.drive_replays(5, replay, CheckHooks(), _report(), props)
    assert end.stopped == "replay 2 raised RuntimeError: device lost" and end.interrupted is None
    assert props["replays completed"].status == "FAIL"


def test_stop_on_failure_waits_for_judgments():
    props, report = _loop_props(), _report()

    def replay(i):
        props["correct"].fail("wrong") if i == 1 else None
        report.replays = i + 1
        return i == 3  # a chunk of four is read back after replay 3

    end = pipeline.drive_replays(8, replay, CheckHooks(stop_on_failure=True), report, props)
    assert end.stopped == "stopped at the first failure, after 4 replays"


def test_a_stop_asked_for_by_a_signal_ends_the_loop_as_interrupted(monkeypatch):
    import signal

    asked = {"signum": None}
    monkeypatch.setattr(pipeline, "stop_requested", lambda: asked["signum"])

    def replay(i):
        if i == 2:
            asked["signum"] = signal.SIGTERM
        return True

    end = pipeline.drive_replays(5, replay, CheckHooks(), _report(), _loop_props())
    assert end == pipeline.LoopEnd("interrupted by SIGTERM after 3 replays", signal.SIGTERM)


def test_marking_unfinished_spares_capture_and_settled_properties():
    from pagegraph.check.reports.report import PropertyResult
    from pagegraph.check.run_end import TABLE_BED_PROPERTIES, Ending, RunEnd, mark_unfinished

    props = {n: PropertyResult(n) for n in TABLE_BED_PROPERTIES.names}
    props["correct"].fail("wrong")
    mark_unfinished(props, TABLE_BED_PROPERTIES, RunEnd(Ending.STOPPED, "stopped"))
    assert props["capture"].status == "pass" and props["correct"].status == "FAIL"
    assert props["replays completed"].status == "incomplete"
    assert props["replays completed"].detail == "stopped"


def test_a_decode_step_stopped_by_a_signal_raises_with_its_report(monkeypatch):
    """The step's replays end on a stop as the tables' do: ``CheckInterrupted`` carries the
    report, what it did not finish marked incomplete."""
    import signal

    from pagegraph.check.checker import check_decode_step
    from pagegraph.check.signals import CheckInterrupted

    calls = {"n": 0}

    def stop_after_two():
        calls["n"] += 1
        return signal.SIGINT if calls["n"] > 2 else None

    monkeypatch.setattr(pipeline, "stop_requested", stop_after_two)
    cfg = CheckConfig(max_bs=4, max_context_len=128, page_size=16, buckets=[4], steps=6,
                      seed=3, consumer="paged")  # fmt: skip
    with pytest.raises(CheckInterrupted) as info:
        check_decode_step("build_page_table", cfg)  # the default device: kernels run there
    report = info.value.report
    assert report.replays == 2 and report.stopped == "interrupted by SIGINT after 2 replays"
    assert report.property("output correct through the consumer").status == "incomplete"
