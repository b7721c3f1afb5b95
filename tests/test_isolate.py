"""Invariant: a builder that kills its process (abort, segfault, exit, hang) cannot take a
check down: its scenario is reported UNSAFE with the cause and the last phase reached, what
was found before the crash is kept, and the run goes on with the next check. The decode step
end to end (a scenario with a consumer) runs in a child the same way."""

from __future__ import annotations

import textwrap

import pytest
import torch

from pagegraph.check.config import CheckConfig
from pagegraph.cli import main
from pagegraph.pytest_plugin import assert_replay_safe
from pagegraph.supervise.crash_report import crash_report
from pagegraph.supervise.isolate import (
    IsolatedError,
    Job,
    builder_spec,
    run_isolated,
)

# Starts child processes: scheduled first in a parallel run (see conftest.py).
pytestmark = pytest.mark.heavy

SMALL = CheckConfig(max_bs=6, max_context_len=128, page_size=16, steps=10, buckets="pow2", chunk=2)
#: Replays that call the builder (on the CPU; emulated graphs, like CUDA graphs, do not): a
#: crash planted in the builder's replay calls happens there.
EAGER = SMALL.replace(emulate=False)

CRASHERS = """
import os, ctypes, sys, time
from pagegraph import build_page_table

calls = {"n": 0}

def _count():
    calls["n"] += 1
    return calls["n"]

def aborts(*args, **kwargs):
    os.abort()

def segfaults_in_replays(*args, **kwargs):
    if _count() > 8:  # after the eager call and the warm-ups: during the replays
        ctypes.string_at(0)
    build_page_table(*args, **kwargs)

def exits(*args, **kwargs):
    sys.exit(3)

def hangs(*args, **kwargs):
    time.sleep(3600)

def aborts_in_replays(*args, **kwargs):
    if _count() > 3:  # after the decode step's warm-up, one call per bucket (1, 2, 4)
        os.abort()
    build_page_table(*args, **kwargs)

def wrong_then_abort(req_to_token, rpi, seq_lens, page_table, page_size, **kw):
    build_page_table(req_to_token, rpi, seq_lens, page_table, page_size, **kw)
    page_table[:, :1].add_(1)
    if _count() > 14:
        os.abort()
"""


@pytest.fixture
def crashers(tmp_path, monkeypatch):
    (tmp_path / "crashers.py").write_text(textwrap.dedent(CRASHERS))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}")
    return "crashers"


def test_an_abort_is_reported_and_the_run_goes_on(crashers):
    aborted, fine = run_isolated(
        [Job(f"{crashers}:aborts", SMALL), Job("build_page_table", SMALL)], timeout=120
    )
    assert aborted.verdict == "UNSAFE"
    capture = aborted.property("capture")
    assert capture.status == "FAIL" and "SIGABRT" in capture.detail, aborted.format()
    assert fine.safe, fine.format()


# One child each (a test apiece, so that a parallel run starts them at once).
def test_a_segfault_is_reported(crashers):
    # Eager replays on the CPU (emulated ones, like CUDA graphs, never call the builder).
    (segv,) = run_isolated([Job(f"{crashers}:segfaults_in_replays", EAGER)], timeout=120)
    assert segv.verdict == "UNSAFE"
    # Under CUDA graphs the builder's Python runs only until capture: it dies there.
    died = segv.property("capture" if torch.cuda.is_available() else "replays completed")
    assert "killed by SIGSEGV" in died.detail, segv.format()
    assert segv.property("correct").status == "incomplete"


def test_an_exit_is_reported(crashers):
    (exited,) = run_isolated([Job(f"{crashers}:exits", SMALL)], timeout=120)
    assert exited.verdict == "UNSAFE"
    assert "exited with code 3" in exited.property("capture").detail, exited.format()


@pytest.mark.skipif(
    torch.cuda.is_available(), reason="under CUDA graphs the builder's Python never runs in replays"
)
def test_what_was_found_before_a_crash_is_kept(crashers):
    (report,) = run_isolated([Job(f"{crashers}:wrong_then_abort", EAGER)], timeout=120)
    assert report.property("correct").status == "FAIL", report.format()
    assert "expected" in str(report.property("correct").first_failure)
    assert "SIGABRT" in report.property("replays completed").detail


@pytest.mark.gpu
def test_gpu_a_kernel_that_breaks_its_cuda_context_is_reported():
    """A spill past the row with huge lengths writes far outside the tables: an illegal
    address, which poisons the CUDA context. The child's report says so; the run goes on."""
    cfg = SMALL.replace(overlong=1.0, steps=16)
    bad, fine = run_isolated(
        [
            Job("pagegraph.mutants.zoo:no_row_clamp", cfg, stop_on_failure=False),
            Job("build_page_table", cfg),
        ],
        timeout=120,
    )
    assert bad.verdict == "UNSAFE", bad.format()
    assert fine.safe, fine.format()


@pytest.mark.cpu_heavy  # 5-10 s under the interpreter: make test-heavy (CI runs it)
def test_a_hang_is_killed_at_the_timeout(crashers):
    (report,) = run_isolated([Job(f"{crashers}:hangs", SMALL)], timeout=8)
    assert "timed out" in report.stopped and report.verdict == "UNSAFE"


def test_cli_isolates_a_user_builder_by_default(crashers, capsys):
    code = main(
        ["check", "graphs/default.toml", "--replays", "4", "--builder", f"{crashers}:aborts"]
    )
    out = capsys.readouterr().out
    assert code == 1 and "SIGABRT" in out and "Traceback" not in out


def test_assert_replay_safe_isolated(crashers):
    with pytest.raises(AssertionError, match="SIGABRT"):
        assert_replay_safe(f"{crashers}:aborts", SMALL, isolate=True)
    assert assert_replay_safe("build_page_table", SMALL, isolate=True).safe


def test_unimportable_builders_are_usage_errors():
    with pytest.raises(IsolatedError, match="not importable"):
        builder_spec(lambda *a, **k: None)
    with pytest.raises(IsolatedError, match="cannot load builder"):
        run_isolated([Job("no_such_module:fn", SMALL)])


# -- the decode step (a scenario with a consumer) in a child ----------------------------------

STEP = CheckConfig(
    max_bs=4,
    max_context_len=64,
    page_size=16,
    steps=4,
    seed=3,
    consumer="paged",
    num_q_heads=4,
    num_kv_heads=2,
    head_dim=16,
)


def test_cli_isolates_a_decode_step_user_builder_by_default(tmp_path, capsys):
    """A builder file that aborts on a consumer scenario: the report says it crashed, with
    the cause, in the decode step's table; the command line lives on."""
    path = tmp_path / "step_crasher.py"
    path.write_text("import os\n\ndef aborts(*args, **kwargs):\n    os.abort()\n")
    code = main(["check", "decode-step", "--replays", "2", "--builder", f"{path}:aborts"])
    out = capsys.readouterr().out
    assert code == 1 and "Traceback" not in out, out
    assert "| capture | builder + consumer | FAIL | the check process was killed by SIGABRT" in out
    assert "crash: the check process was killed by SIGABRT during capture" in out
    assert "verdict: UNSAFE (the check process crashed" in out


@pytest.mark.cpu_heavy  # a decode step: long under the Triton interpreter
def test_isolate_runs_the_decode_step_in_a_child(capsys):
    code = main(["check", "decode-step-csr", "--replays", "2", "--isolate"])
    out = capsys.readouterr().out
    assert code == 0 and "verdict: SAFE" in out, out
    assert "| replays completed | builder + consumer | pass |" in out


@pytest.mark.skipif(
    torch.cuda.is_available(), reason="under CUDA graphs the builder's Python never runs in replays"
)
def test_a_decode_step_crash_in_a_replay_is_reported(crashers):
    job = Job(f"{crashers}:aborts_in_replays", STEP.replace(emulate=False))
    (report,) = run_isolated([job], timeout=120)
    assert report.step is not None and report.verdict == "UNSAFE"
    done = report.property("replays completed")
    assert done.status == "FAIL" and "SIGABRT during replay 0" in done.detail, report.format()
    assert report.property("capture").status == "pass"  # kept from the partial report
    assert report.device == "cpu" and report.step.shrunk is None


def test_a_decode_step_crash_report_without_a_partial_report():
    report = crash_report(Job("x", STEP), None, "killed by SIGSEGV", "replay 3", "")
    assert report.step is not None and report.verdict == "UNSAFE"
    assert report.property("replays completed").status == "FAIL"
    assert report.property("sentinel page untouched").status == "incomplete"
    assert "killed by SIGSEGV during replay 3" in report.format()


def test_a_decode_step_crash_while_timing_keeps_what_the_replays_showed():
    blank = crash_report(Job("x", STEP), None, "killed by SIGSEGV", "replay 3", "")
    partial = blank.to_dict()
    for p in partial["properties"]:  # as the child wrote it after its last replay
        p["status"], p["detail"] = "pass", "judged"
    report = crash_report(Job("x", STEP), partial, "killed by SIGABRT", "timing", "")
    assert report.verdict == "UNSAFE"
    done = report.property("replays completed")
    assert done.status == "FAIL" and "SIGABRT during timing" in done.detail
    assert report.property("sentinel page untouched").status == "pass"
    assert report.property("output correct through the consumer").detail == "judged"
