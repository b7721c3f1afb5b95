"""Invariant: when pagegraph cannot do what was asked, or something failed, it says what
happened and what to do in one line (exit 2 for usage), never a misleading neighbour message:
``profile`` without a GPU, a builder file without ``:function``, ``mutate``'s default
scenarios, an entry never written against one written where it must not be, a capture that a
sync broke, the README's trace command on a fresh clone."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import torch

from pagegraph.check.judges.table_judges import sync_capture_cause
from pagegraph.check.reports.report import Failure
from pagegraph.check.scenario import shipped_scenarios
from pagegraph.cli import main
from pagegraph.detect.probes import EagerCall
from pagegraph.detect.sync_events import SyncEvent
from pagegraph.jobs import mutate
from pagegraph.jobs.profile import NEEDS_GPU
from pagegraph.kernels.contract import POISON

ROOT = Path(__file__).resolve().parent.parent
CUDA = torch.cuda.is_available()


@pytest.mark.skipif(CUDA, reason="the message of a machine without CUDA")
def test_profile_without_a_gpu_says_it_needs_one(capsys):
    assert main(["profile", "default"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [NEEDS_GPU]
    assert NEEDS_GPU.startswith("pagegraph profile needs a CUDA GPU")
    assert "torch" not in NEEDS_GPU.split(";")[0]  # no detector was asked for


def test_a_builder_file_without_a_function_names_its_functions(tmp_path, monkeypatch, capsys):
    (tmp_path / "good.py").write_text(
        textwrap.dedent(
            """
            from pagegraph import build_page_table

            def build(*args, **kwargs):
                build_page_table(*args, **kwargs)

            def helper():
                pass

            def _private():
                pass
            """
        )
    )
    monkeypatch.chdir(tmp_path)
    assert main(["check", "default", "--builder", "good.py"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "pagegraph check: builder 'good.py' names a file but no function: use "
        "good.py:FUNCTION (its functions: build, helper)"
    ]
    assert main(["check", "default", "--builder", "good"]) == 2  # the module, by name
    assert capsys.readouterr().err.strip().splitlines() == [
        "pagegraph check: builder 'good' names a module but no function: use "
        "good:FUNCTION (its functions: build, helper)"
    ]
    assert main(["check", "default", "--builder", "missing.py"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "pagegraph check: builder 'missing.py' names a file but no function, and there is "
        "no such file"
    ]


def test_a_name_that_is_no_file_still_lists_the_builtins(capsys):
    assert main(["check", "default", "--builder", "no_such_builder"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("pagegraph check: unknown builder 'no_such_builder': use one of ")


def test_mutate_help_and_default_are_the_shipped_scenarios(monkeypatch, tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["mutate", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "(default: every scenario shipped with pagegraph, whatever the current folder)" in text
    assert "current folder)" not in text.replace("whatever the current folder)", "")
    # and that is what it runs, from any folder
    seen = {}
    monkeypatch.setattr(
        mutate, "run_mutate", lambda scenarios, **kw: seen.setdefault("s", scenarios) and 0
    )
    monkeypatch.chdir(tmp_path)
    main(["mutate"])
    assert seen["s"] == shipped_scenarios() and len(seen["s"]) > 10


def _failure(expected, got):
    return Failure(
        3, 8, 2, 5, expected, got, max_bs=8, width=16, poison=POISON, seq_len=40, req_pool_index=1
    )


def test_an_entry_never_written_is_told_apart_from_one_written_outside():
    never = str(_failure(17, POISON))
    assert never == (
        f"replay 3 (bucket 8): page_table[2, 5] expected 17 (the live entry), got {POISON} "
        "(the poison: never written); row 2: seq_len 40, req_pool_index 1"
    )
    outside = str(_failure(POISON, 17))
    assert outside == (
        f"replay 3 (bucket 8): page_table[2, 5] expected {POISON} (the poison: an entry past "
        "the row's live pages (the stale tail, or a row past the bucket) must stay untouched), "
        "got 17; row 2: seq_len 40, req_pool_index 1"
    )
    assert "never written" not in str(_failure(17, 12))  # a wrong value written


def _builder_with_a_sync(seq_lens):  # the line below is the sync
    return int(seq_lens.max().item())


def test_a_capture_broken_by_a_sync_points_at_the_sync():
    line = _builder_with_a_sync.__code__.co_firstlineno + 1
    here = __file__
    stack = (
        "(thread MainThread)\n"
        f'  File "{here}", line {line}, in _builder_with_a_sync\n'
        "    return int(seq_lens.max().item())\n"
        f'  File "{torch.__file__}", line 10, in item\n'
    )
    call = EagerCall(
        4, 0, [], [SyncEvent("torch", "sync_debug: seq_lens.max().item()", "build", stack)]
    )
    error = RuntimeError("CUDA error: operation not permitted when stream is capturing")
    assert sync_capture_cause(error, call, _builder_with_a_sync) == (
        f"capture failed: the builder synchronised at {here}:{line} (seq_lens.max().item()), "
        "which a CUDA graph cannot capture"
    )
    # another error, or no sync found before: the exception is told as it is
    assert sync_capture_cause(IndexError("index 9 is out of bounds"), call, None) is None
    assert sync_capture_cause(error, EagerCall(4, 0, [], []), None) is None
    assert sync_capture_cause(error, None, None) is None


def test_the_readme_trace_command_runs_on_a_fresh_clone(capsys, monkeypatch):
    readme = (ROOT / "README.md").read_text()
    command = (
        ".venv/bin/pagegraph trace profiles/traces/h200_replay_clean.sqlite "
        "--forbid-sync 'replay/*'"
    )
    assert command in readme
    trace = ROOT / "profiles" / "traces" / "h200_replay_clean.sqlite"
    assert trace.is_file()
    monkeypatch.chdir(ROOT)
    assert main(["trace", str(trace.relative_to(ROOT)), "--forbid-sync", "replay/*"]) == 0
    assert "PASS: no synchronization or device-to-host copy inside" in capsys.readouterr().out


@pytest.mark.skipif(CUDA, reason="the torch detector runs where there is CUDA")
def test_a_detector_that_cannot_run_is_refused_before_anything_else(capsys):
    # make soak on a CPU: one usage line, not a slow-scenario estimate and then the refusal
    assert main(["check", "sglang-h200", "--replays", "100000", "--detectors", "torch"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert (
        err[0].startswith("pagegraph check: ")
        and "requested detector(s) cannot run: torch" in (err[0])
    )
