"""``pagegraph profile`` must record the check with the one nsys command line known to work on
the GPU machine, and, where nsys is missing, still produce an analyzed trace and a report
instead of silently proving nothing.

Only what runs on a CPU is tested here: the command lines, the torch.profiler fallback (with a
fake check that opens a ``replay/bs=1`` range), and the nsys path with subprocess faked.
"""

from __future__ import annotations

import sqlite3
import sys
from pathlib import Path

import pytest
import torch
from torch.profiler import record_function

from pagegraph.jobs import profile as pr

# The fallback path starts torch.profiler in-process: these run last (tests/conftest.py).
pytestmark = pytest.mark.torch_profiler


def test_check_command():
    assert pr.check_command("graphs/a.toml", python="py") == [
        "py",
        "-m",
        "pagegraph",
        "check",
        "graphs/a.toml",
        "--detectors",
        "torch",
    ]
    assert pr.check_command(Path("g.toml"), replays=7)[-2:] == ["--replays", "7"]
    assert pr.check_command("g.toml")[0] == sys.executable


def test_nsys_command():
    got = pr.nsys_command("graphs/default.toml", "profiles/default", replays=50, python="py")
    assert got == [
        "nsys",
        "profile",
        "-t",
        "cuda,nvtx",
        "--sample=none",
        "--cpuctxsw=none",
        "--cuda-graph-trace=node",
        "--force-overwrite=true",
        "-o",
        "profiles/default",
        "py",
        "-m",
        "pagegraph",
        "check",
        "graphs/default.toml",
        "--detectors",
        "torch",
        "--replays",
        "50",
    ]
    assert "--replays" not in pr.nsys_command("g.toml", "o/g", nsys="/opt/nsys")
    assert pr.nsys_command("g.toml", "o/g", nsys="/opt/nsys")[0] == "/opt/nsys"


def test_nsys_export_command():
    assert pr.nsys_export_command("o/g.nsys-rep", "o/g.sqlite") == [
        "nsys",
        "export",
        "--type",
        "sqlite",
        "--force-overwrite=true",
        "-o",
        "o/g.sqlite",
        "o/g.nsys-rep",
    ]


def test_arguments_defaults():
    import argparse

    args = pr.add_arguments(argparse.ArgumentParser()).parse_args([])
    assert (args.scenario, args.out, args.name, args.replays) == (
        "default",
        "profiles",
        None,
        None,
    )


@pytest.fixture
def no_nsys(monkeypatch):
    monkeypatch.setattr(pr.shutil, "which", lambda name: None)
    switches = []

    def fake_switch(enabled):
        switches.append(enabled)
        return False

    monkeypatch.setattr(pr, "_set_record_function", fake_switch)
    return switches


def fake_check(rc=0, range_name="replay/bs=1"):
    calls = []

    def run_check(scenario, replays):
        calls.append((scenario, replays))
        with record_function("warmup/bs=1"):
            torch.ones(8).sum()
        device = "cuda" if torch.cuda.is_available() else "cpu"
        for _ in range(3):
            with record_function(range_name):
                (torch.arange(16, device=device) * 2).sum()  # CUDA activity where there is CUDA
        return rc

    return run_check, calls


def test_without_nsys_records_torch_trace(no_nsys, monkeypatch, tmp_path, capsys):
    run_check, calls = fake_check()
    monkeypatch.setattr(pr, "_run_check_hook", lambda: run_check)
    rc = pr.profile("graphs/default.toml", out_dir=tmp_path, replays=3)
    out = capsys.readouterr().out
    # Without CUDA the replay ranges hold no CUDA activity: nothing was checked, exit 2.
    assert rc == (0 if torch.cuda.is_available() else 2), out
    assert calls == [("graphs/default.toml", 3)]
    assert no_nsys == [True, False]  # ranges mirrored into record_function, then restored
    assert "nsys is not on PATH" in out
    assert (tmp_path / "default.json").is_file()
    md = (tmp_path / "default.md").read_text()
    assert "torch.profiler (nsys not on PATH)" in md
    assert "| replay/bs=1 | 3 |" in md
    if torch.cuda.is_available():
        assert "PASS" in md and "Exit code: 0" in md
    else:  # the fake check made no CUDA call at all
        assert "CANNOT CHECK" in md and "no CUDA activity" in md
    assert "--detectors torch --replays 3" in md


def test_failed_check_is_nonzero(no_nsys, monkeypatch, tmp_path):
    run_check, _ = fake_check(rc=3)
    monkeypatch.setattr(pr, "_run_check_hook", lambda: run_check)
    assert pr.profile("g.toml", out_dir=tmp_path, name="failed") == 3
    assert "The check itself failed (exit code 3)" in (tmp_path / "failed.md").read_text()


def test_crashed_check_still_reports(no_nsys, monkeypatch, tmp_path):
    def crash(scenario, replays):
        with record_function("replay/bs=1"):
            raise RuntimeError("boom")

    monkeypatch.setattr(pr, "_run_check_hook", lambda: crash)
    assert pr.profile("g.toml", out_dir=tmp_path) == 1
    assert (tmp_path / "g.md").is_file()


def test_trace_without_replay_ranges_cannot_pass(no_nsys, monkeypatch, tmp_path):
    run_check, _ = fake_check(range_name="capture/bs=1")
    monkeypatch.setattr(pr, "_run_check_hook", lambda: run_check)
    assert pr.profile("g.toml", out_dir=tmp_path) == 2
    assert "CANNOT CHECK" in (tmp_path / "g.md").read_text()


def _fake_nsys_sqlite(path: Path, *, planted: bool) -> None:
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT)")
    con.executemany(
        "INSERT INTO StringIds VALUES (?, ?)",
        [(1, "cudaGraphLaunch_v10000"), (2, "cudaStreamSynchronize_v3020"), (3, "k")],
    )
    tid = (77 << 24) | 77
    con.execute(
        "CREATE TABLE NVTX_EVENTS (start INT, end INT, eventType INT, text TEXT, "
        "globalTid INT, textId INT, domainId INT)"
    )
    con.execute("INSERT INTO NVTX_EVENTS VALUES (0, 1000, 59, 'replay/bs=1', ?, NULL, 0)", (tid,))
    con.execute(
        "CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (start INT, end INT, globalTid INT, "
        "correlationId INT, nameId INT)"
    )
    con.execute("INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (10, 20, ?, 1, 1)", (tid,))
    if planted:
        con.execute("INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (30, 40, ?, 2, 2)", (tid,))
    con.execute(
        "CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INT, end INT, "
        "correlationId INT, shortName INT, graphNodeId INT)"
    )
    con.execute("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (25, 35, 1, 3, 5)")
    con.commit()
    con.close()


@pytest.mark.parametrize("planted, want", [(False, 0), (True, 1)])
def test_with_nsys_profiles_exports_and_checks(planted, want, monkeypatch, tmp_path):
    monkeypatch.setattr(pr.shutil, "which", lambda name: "/opt/nsys/bin/nsys")
    commands = []

    def fake_run(cmd, env=None, check=False, **kwargs):
        commands.append((cmd, env))
        if cmd[1] == "profile":
            Path(cmd[cmd.index("-o") + 1] + ".nsys-rep").write_bytes(b"rep")
        else:
            _fake_nsys_sqlite(Path(cmd[cmd.index("-o") + 1]), planted=planted)
        return pr.subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(pr.subprocess, "run", fake_run)
    assert pr.profile("graphs/h200.toml", out_dir=tmp_path, replays=2) == want
    (prof, env), (export, _) = commands
    assert prof == pr.nsys_command(
        "graphs/h200.toml", tmp_path / "h200", replays=2, nsys="/opt/nsys/bin/nsys"
    )
    # The child must import this pagegraph even from an uninstalled source tree.
    assert str(Path(pr.__file__).resolve().parents[2]) in env["PYTHONPATH"].split(":")
    assert export == pr.nsys_export_command(
        tmp_path / "h200.nsys-rep", tmp_path / "h200.sqlite", nsys="/opt/nsys/bin/nsys"
    )
    md = (tmp_path / "h200.md").read_text()
    assert "Nsight Systems" in md and "| replay/bs=1 |" in md
    assert ("FAIL" in md) is planted
    # The timeline of the replay window, beside the report and shown in it, with the planted
    # sync named.
    assert "![replay timeline](h200-timeline.png)" in md
    assert (tmp_path / "h200-timeline.png").stat().st_size > 0
    assert ("cudaStreamSynchronize in replay/bs=1" in md) is planted


def test_nsys_without_report_exits_2(monkeypatch, tmp_path):
    monkeypatch.setattr(pr.shutil, "which", lambda name: "/usr/bin/nsys")
    monkeypatch.setattr(
        pr.subprocess, "run", lambda cmd, **kw: pr.subprocess.CompletedProcess(cmd, 1)
    )
    assert pr.profile("g.toml", out_dir=tmp_path) == 2
    assert "nsys wrote no report" in (tmp_path / "g.md").read_text()
