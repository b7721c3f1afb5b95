"""Invariant: `pagegraph check` exits 0 only when every check it could run passed, says which
checks were skipped and why, exits 2 on bad usage (or a scenario that cannot fit) before
running anything, and when interrupted still writes what it checked, marked incomplete."""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from pagegraph.cli import build_parser, main

from helpers import table_cells, table_row

ROOT = Path(__file__).resolve().parent.parent
DEFAULT = str(ROOT / "graphs" / "default.toml")
CUDA = torch.cuda.is_available()


def test_check_default_scenario(tmp_path, capsys):
    out_json = tmp_path / "r.json"
    out_md = tmp_path / "r.md"
    code = main(
        ["check", DEFAULT, "--replays", "12", "--json", str(out_json), "--markdown", str(out_md)]
    )
    text = capsys.readouterr().out
    assert code == 0, text
    assert "| bucket | replays | out of contract | mismatches | oob writes |" in text
    assert "| property | covers | status | judged | detail |" in text
    assert "verdict: SAFE" in text
    if not CUDA:
        # Judged on the CPU by the cpu detector, with emulated graphs, and said so.
        # Each property's own row (| property | covers | status | judged | detail |).
        for name in ("sync-free builder call", "sync-free replay path"):
            assert table_cells(text, name)[2:4] == ["pass", "emulated"], table_row(text, name)
        graph_safe = "graph-safe (captured short, replayed long)"
        assert table_cells(text, graph_safe)[1:4] == ["builder", "pass", "emulated"]
        assert "verdict: SAFE (on CPU: syncs by the cpu detector, graphs emulated" in text
        assert "no sync detector runs without CUDA" not in text
    doc = json.loads(out_json.read_text())
    assert doc["complete"] is True and doc["interrupted"] is None
    sc = doc["scenarios"][0]
    assert sc["name"] == "default" and sc["safe"] and sc["replays"] == 12
    assert doc["environment"]["torch"] == torch.__version__
    assert "# pagegraph check" in out_md.read_text()


@pytest.mark.heavy
def test_workload_process_flag_overrides_the_scenario(tmp_path, capsys):
    out_json = tmp_path / "r.json"
    argv = ["check", DEFAULT, "--replays", "3", "--workload-process", "on", "--json"]
    assert main([*argv, str(out_json)]) == 0
    assert "workload in child processes" in capsys.readouterr().out
    sc = json.loads(out_json.read_text())["scenarios"][0]
    assert sc["workload_in_process"] is True and sc["config"]["workload_process"] == "on"
    with pytest.raises(SystemExit):
        main(["check", DEFAULT, "--workload-process", "maybe"])


def test_check_unsafe_builder_exits_1(capsys):
    code = main(["check", DEFAULT, "--replays", "4", "--builder", "static_width_gather"])
    out = capsys.readouterr().out
    assert code == 1 and "UNSAFE" in out and "first failure: replay" in out


@pytest.mark.parametrize(
    "argv",
    [
        ["check", DEFAULT, "--builder", "nope"],
        ["check", DEFAULT, "--builder", "no.such.module:fn"],
        ["check", DEFAULT, "--replays", "0"],
        ["check", DEFAULT, "--detectors", "strace"],
        ["check", DEFAULT, "--detectors", "torch,strace"],
        ["mutate", DEFAULT, "--mutant", "no_such_mutant"],
    ],
)
def test_bad_usage_exits_2(argv, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "pagegraph check:" in err or "pagegraph mutate:" in err


@pytest.mark.skipif(CUDA, reason="on a GPU machine the detectors exist")
def test_explicit_detector_without_gpu_exits_2(capsys):
    assert main(["check", DEFAULT, "--replays", "2", "--detectors", "torch"]) == 2
    assert "torch" in capsys.readouterr().err


def test_a_scenario_that_does_not_fit_exits_2_before_allocating(tmp_path, capsys):
    huge = tmp_path / "huge.toml"
    huge.write_text(
        "[graph]\nmax_bs = 64\nmax_context_len = 1099511627776\npage_size = 64\n"
        "[pool]\nmax_reqs = 64\nnum_pages = 1000\n"
    )
    assert main(["check", str(huge)]) == 2
    err = capsys.readouterr().err
    assert "does not fit" in err and "GiB" in err and "available" in err


@pytest.mark.heavy
def test_python_dash_m_entry_point():
    proc = subprocess.run(
        [sys.executable, "-m", "pagegraph", "--help"], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0
    for sub in ("check", "mutate", "bench", "trace", "profile", "kernel-table", "sync-table"):
        assert sub in proc.stdout


def test_kernel_table(capsys):
    assert main(["kernel-table"]) == 0
    out = capsys.readouterr().out
    assert "| bs | max context | page size | SWA | exact | eager us |" in out
    assert "| NO |" not in out


def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
    env["PYTHONUNBUFFERED"] = "1"
    return env


@pytest.mark.cpu_heavy  # 5-10 s under the interpreter: make test-heavy (CI runs it)
@pytest.mark.heavy
@pytest.mark.parametrize("sig,code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_an_interrupted_check_writes_its_reports_marked_incomplete(tmp_path, sig, code):
    out_json, out_md = tmp_path / "r.json", tmp_path / "r.md"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pagegraph",
            "check",
            DEFAULT,
            "--replays",
            "100000",
            "--json",
            str(out_json),
            "--markdown",
            str(out_md),
        ],
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    # Wait until replays are running (a progress line on stderr counts some), then interrupt.
    deadline = time.monotonic() + 120
    seen = ""
    running = re.compile(r" [1-9][0-9]*/100000 replays")
    while time.monotonic() < deadline and not running.search(seen):
        seen += proc.stderr.read(1)
    assert running.search(seen), "the check never started replaying"
    time.sleep(1.0)
    proc.send_signal(sig)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == code, out[-2000:]
    doc = json.loads(out_json.read_text())  # valid JSON, written atomically
    assert doc["complete"] is False and doc["interrupted"] == int(sig)
    sc = doc["scenarios"][0]
    assert 0 < sc["replays"] < 100000 and sc["complete"] is False
    assert "interrupted by" in sc["stopped"]
    statuses = {p["name"]: p["status"] for p in sc["properties"]}
    assert statuses["correct"] == "incomplete" and statuses["replays completed"] == "incomplete"
    assert sc["verdict"] == "INCOMPLETE"
    assert "Incomplete" in out_md.read_text()
    assert "interrupted by" in out
    assert not list(tmp_path.glob(".*.tmp")), "no temporary file left behind"


# -- what a first-time user reads: --version, --help and every option's help ------------------


def test_version_prints_the_version(capsys):
    from pagegraph import __version__

    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.strip() == f"pagegraph {__version__}"


def test_help_says_what_the_tool_does(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    out = capsys.readouterr().out
    assert exc.value.code == 0
    assert "The pagegraph command line" not in out
    assert "safe to replay inside CUDA graphs" in " ".join(out.split())
    for sub in ("check", "mutate", "bench", "trace", "profile", "kernel-table", "sync-table"):
        assert f"pagegraph {sub}" in out


def test_check_help_gives_the_verdict_and_exit_codes(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["check", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert exc.value.code == 0
    assert "exit codes" in out and "SAFE" in out
    for code in ("0 every scenario SAFE", "1 a scenario UNSAFE", "2 bad usage", "130", "143"):
        assert code in out, code


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return {name: sub for a in actions for name, sub in a.choices.items()}


def undocumented(parser: argparse.ArgumentParser) -> list[str]:
    """``COMMAND OPTION`` of every option or positional of ``parser``'s subcommands without a
    help string, and ``COMMAND (description)`` of every subcommand without a description
    (argparse's own -h excepted)."""
    found = []
    for name, sub in _subcommands(parser).items():
        if not (sub.description or "").strip():
            found.append(f"{name} (description)")
        for action in sub._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            if not (action.help or "").strip():
                found.append(f"{name} {'/'.join(action.option_strings) or action.metavar}")
    return found


def test_undocumented_finds_a_missing_help_and_description():
    parser = argparse.ArgumentParser(prog="x")
    sub = parser.add_subparsers()
    sub.add_parser("good", description="does good").add_argument("--a", help="the a")
    bad = sub.add_parser("bad")
    bad.add_argument("--b")
    bad.add_argument("thing", metavar="THING", help="")
    assert undocumented(parser) == ["bad (description)", "bad --b", "bad THING"]


def test_every_command_and_option_is_documented():
    parser = build_parser()
    names = set(_subcommands(parser))
    want = {"check", "mutate", "profile", "trace", "sync-table", "kernel-table", "bench"}
    assert want <= names, f"missing commands: {want - names}"
    assert undocumented(parser) == []
    top = [a for a in parser._actions if a.option_strings and a.dest != "help"]
    assert top and all(a.help for a in top)


def test_profile_names_its_positional_scenario_like_check_and_mutate():
    metavars = {
        name: [a.metavar for a in sub._actions if not a.option_strings]
        for name, sub in _subcommands(build_parser()).items()
        if name in ("check", "mutate", "profile")
    }
    assert metavars == {"check": ["SCENARIO"], "mutate": ["SCENARIO"], "profile": ["SCENARIO"]}
