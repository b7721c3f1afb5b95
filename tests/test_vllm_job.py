"""Invariant: ``make vllm`` (``pagegraph.jobs.vllm_job``) pairs each of vLLM's kernels with
every scenario of its kind and nothing else, and its decode-step readers with the scenarios
that name them, runs each pair in a child process, and writes a
verdict per pair with the stubbed imports named; without vLLM's files it exits 2 in one line.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pagegraph.clients import vllm_files
from pagegraph.clients.vllm import vllm_unavailable_reason
from pagegraph.jobs import vllm_job

ROOT = Path(__file__).resolve().parents[1]
MISSING = vllm_unavailable_reason()
needs_vllm = pytest.mark.skipif(MISSING is not None, reason=f"vLLM's kernel files: {MISSING}")


@needs_vllm
def test_each_kernel_is_planned_on_the_scenarios_of_its_kind_only():
    runs = vllm_job.plan_runs(None, 3)
    pairs = {(r.client, r.scenario) for r in runs}
    assert pairs == {
        ("vllm_gather_block_tables", "vllm-block-table"),
        ("vllm_gather_block_tables", "vllm-block-table-long"),
        ("vllm_gather_block_tables", "vllm-block-table-hostile"),
        ("vllm_gather_block_tables", "vllm-block-table-groups"),
        ("vllm_compute_slot_mappings", "vllm-slot-mapping"),
        ("vllm_compute_slot_mappings", "vllm-slot-mapping-spec"),
        ("vllm_compute_slot_mappings", "vllm-slot-mapping-groups"),
        ("vllm_gather_block_tables", "vllm-triton-attn"),
    }
    assert all(r.skipped is None and r.config.steps == 3 for r in runs)
    step = next(r for r in runs if r.scenario == "vllm-triton-attn")
    assert step.config.reader == "vllm:triton_attn"


def _tiny(tmp_path: Path, name: str) -> Path:
    text = (ROOT / "graphs" / f"{name}.toml").read_text()
    for key, value in (
        ("max_bs", "8"),
        ("max_context_len", "512"),
        ("steps", "4"),
        ("initial_len", "[1, 400]"),
    ):
        text = "\n".join(
            f"{key} = {value}" if line.startswith(f"{key} =") else line
            for line in text.splitlines()
        )
    path = tmp_path / f"{name}.toml"
    path.write_text(text)
    return path


@needs_vllm
def test_the_job_writes_a_verdict_per_pair(tmp_path, capsys):
    scenarios = [str(_tiny(tmp_path, n)) for n in ("vllm-block-table", "vllm-slot-mapping")]
    out, js = tmp_path / "vllm.md", tmp_path / "vllm.json"
    code = vllm_job.main(["--scenarios", *scenarios, "--out", str(out), "--json", str(js)])
    assert code == 0, capsys.readouterr()
    doc = json.loads(js.read_text())
    verdicts = {(r["client"], r["scenario"]): r["verdict"] for r in doc["runs"]}
    assert verdicts == {
        ("vllm_gather_block_tables", "vllm-block-table"): "SAFE",
        ("vllm_compute_slot_mappings", "vllm-slot-mapping"): "SAFE",
    }
    text = out.read_text()
    assert "| vllm_gather_block_tables | - | vllm-block-table | engine | SAFE |" in text
    assert "vllm.triton_utils.triton" in text  # the stubbed imports are named
    assert "outside vLLM's contract" not in text  # no hostile run, no note
    assert (
        "### Under vLLM's contract (engine inputs)\n\nNone: no UNSAFE verdict in 2 run(s)." in text
    )


@needs_vllm
def test_a_hostile_run_is_labelled_outside_vllms_contract(tmp_path, capsys):
    # vLLM's gather trusts num_blocks: past the width, it writes past the row. The scenario
    # breaks that host guarantee, so the finding is labelled as outside vLLM's contract.
    path = _tiny(tmp_path, "vllm-block-table-hostile")
    text = path.read_text().replace("steps = 4", "steps = 40")
    path.write_text(text.replace("num_blocks_overrun = 0.35", "num_blocks_overrun = 0.6"))
    out, js = tmp_path / "vllm.md", tmp_path / "vllm.json"
    code = vllm_job.main(["--scenarios", str(path), "--out", str(out), "--json", str(js)])
    assert code == 0, capsys.readouterr()
    (run,) = json.loads(js.read_text())["runs"]
    assert run["hostile"] == ["negative", "num_blocks_overrun"]
    assert run["verdict"] == "UNSAFE"
    assert [f["property"] for f in run["failures"]] == ["row containment"]
    assert "num_blocks past the width" in run["failures"][0]["first_failure"]
    text = out.read_text()
    assert vllm_job.HOSTILE_NOTE in text
    assert "| vllm-block-table-hostile | hostile: negative, num_blocks_overrun | UNSAFE |" in text
    outside = text.split("### Outside vLLM's contract (hostile inputs)")[1]
    assert "- vllm_gather_block_tables on vllm-block-table-hostile:" in outside
    assert "  - row containment: replay" in outside


def test_without_vllms_files_the_job_exits_2_in_one_line(monkeypatch, capsys):
    monkeypatch.setattr(vllm_job.vllm_client, "vllm_unavailable_reason", lambda: "no files here")
    assert vllm_job.main(["--replays", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["vllm_job: vLLM's kernel files unavailable: no files here"]


def test_a_scenario_of_no_kernels_kind_is_a_usage_error(capsys):
    if MISSING is not None:
        pytest.skip(f"vLLM's kernel files: {MISSING}")
    assert vllm_job.main(["--scenarios", "default", "--replays", "1"]) == 2
    assert "no scenario of the kernels' kinds" in capsys.readouterr().err


@pytest.mark.parametrize("job", ["vllm", "sglang", "mutate"])
def test_a_timeout_that_is_not_positive_is_a_usage_error(job, capsys):
    from pagegraph.cli import main as cli_main
    from pagegraph.jobs import sglang_job

    main = {
        "vllm": vllm_job.main,
        "sglang": sglang_job.main,
        "mutate": lambda argv: cli_main(["mutate", "default", *argv]),
    }[job]
    if job == "vllm" and MISSING is not None:
        pytest.skip(f"vLLM's kernel files: {MISSING}")
    if job == "sglang":
        from pagegraph.clients.sglang import sglang_unavailable_reason

        if sglang_unavailable_reason() is not None:
            pytest.skip("SGLang's kernel files are not installed")
    assert main(["--timeout", "0"]) == 2
    assert "--timeout must be > 0 seconds" in capsys.readouterr().err


def test_the_stubs_are_named():
    assert "vllm.v1.attention.backends.utils.PAD_SLOT_ID" in vllm_files.STUBBED_IMPORTS
