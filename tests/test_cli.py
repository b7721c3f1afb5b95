"""Invariant: `pagegraph check` exits 0 only when every check it could run passed, says which
GPU-only checks were skipped, and exits 2 on bad usage."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from pagegraph.cli import main

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
    assert "| bucket | replays | mismatches | syncs | oob writes |" in text
    assert "verdict: SAFE" in text
    if not CUDA:
        assert "skipped, need a GPU" in text
        assert "| sync-free replay path | skip |" in text
    doc = json.loads(out_json.read_text())
    sc = doc["scenarios"][0]
    assert sc["name"] == "default" and sc["safe"] and sc["replays"] == 12
    assert doc["environment"]["torch"] == torch.__version__
    assert "# pagegraph check" in out_md.read_text()


def test_check_unsafe_builder_exits_1(capsys):
    code = main(["check", DEFAULT, "--replays", "4", "--builder", "static_width_gather"])
    out = capsys.readouterr().out
    assert code == 1 and "UNSAFE" in out and "first: replay" in out


@pytest.mark.parametrize(
    "argv",
    [
        ["check", DEFAULT, "--builder", "nope"],
        ["check", DEFAULT, "--builder", "no.such.module:fn"],
        ["check", DEFAULT, "--replays", "0"],
        ["check", DEFAULT, "--detectors", "strace"],
    ],
)
def test_check_bad_usage_exits_2(argv, capsys):
    assert main(argv) == 2
    assert "pagegraph check:" in capsys.readouterr().err


@pytest.mark.skipif(CUDA, reason="on a GPU machine the detectors exist")
def test_explicit_detector_without_gpu_exits_2(capsys):
    assert main(["check", DEFAULT, "--replays", "2", "--detectors", "torch"]) == 2
    assert "torch" in capsys.readouterr().err


def test_python_dash_m_entry_point():
    proc = subprocess.run(
        [sys.executable, "-m", "pagegraph", "--help"], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0
    for sub in ("check", "bench", "trace", "profile", "kernel-table", "sync-table"):
        assert sub in proc.stdout


def test_kernel_table(capsys):
    assert main(["kernel-table"]) == 0
    out = capsys.readouterr().out
    assert "| bs | max context | page size | SWA | exact | eager us |" in out
    assert "| NO |" not in out
