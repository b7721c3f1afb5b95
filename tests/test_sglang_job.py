"""The SGLang job (``python -m pagegraph.jobs.sglang_job``, ``make sglang``): which client runs
on which scenario, how failures map to the reproducers under ``examples/``, the report's
structure, and exit code 2 without SGLang.

Verdicts depend on the checker's judgement and on SGLang's kernels: the tests assert the
reports' structure, never a verdict. Without SGLang installed, the tests that run its kernels
skip with the reason.
"""

from __future__ import annotations

import json

import pytest

from pagegraph.check.config import CheckConfig
from pagegraph.check.report import PropertyResult
from pagegraph.clients import sglang as sg
from pagegraph.jobs import sglang_job
from pagegraph.jobs.sglang_job import FINDINGS, PAGE_TABLE_CLIENT, SGLangRun, classify

REASON = sg.sglang_unavailable_reason()
needs_sglang = pytest.mark.skipif(REASON is not None, reason=f"SGLang unavailable: {REASON}")
GRAPH_METADATA_CLIENT = "sglang_trtllm_mha_graph_metadata"


def test_exit_code_2_with_one_line_when_sglang_is_missing(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(sg, "sglang_unavailable_reason", lambda: "sglang is not installed (x)")
    out = tmp_path / "report.md"
    assert sglang_job.main(["--scenarios", "default", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "sglang is not installed (x)" in err[0]
    assert not out.exists()


def test_help_names_the_options(capsys):
    with pytest.raises(SystemExit) as exc:
        sglang_job.main(["--help"])
    assert exc.value.code == 0
    text = capsys.readouterr().out
    for option in ("--out", "--json", "--replays", "--scenarios", "--quiet", "--timeout"):
        assert option in text


def _run(client: str, **cfg) -> SGLangRun:
    return SGLangRun(client, "planted", "planted.toml", CheckConfig(**cfg))


def test_failures_map_to_their_reproducers():
    # A 100-page table at page size 64: not a multiple of the kernel's 64-page block.
    ragged = _run(PAGE_TABLE_CLIENT, max_context_len=100 * 64, page_size=64, swa=True)
    spill = PropertyResult("row containment", "FAIL", "", "page_table[3, 100]")
    assert classify(ragged, spill) == "page-table-spill"
    assert classify(ragged, PropertyResult("bounded writes", "FAIL", "", "x")) == "page-table-spill"
    swa = PropertyResult("correct", "FAIL", "", "replay 2 (bucket 4): swa_page_table[1, 0] ...")
    assert classify(ragged, swa) == "swa-stride"
    # A whole number of blocks cannot spill; the other client has no known finding.
    even = _run(PAGE_TABLE_CLIENT, max_context_len=128 * 64, page_size=64)
    assert classify(even, spill) is None
    assert classify(_run(GRAPH_METADATA_CLIENT, page_size=64), spill) is None
    assert {f.key for f in FINDINGS} == {"page-table-spill", "swa-stride"}
    assert all(f.reproducer.startswith("examples/") for f in FINDINGS)


@needs_sglang
def test_each_client_runs_on_scenarios_of_its_kind(tmp_path):
    odd = tmp_path / "odd-page.toml"
    odd.write_text(
        'name = "odd-page"\n[graph]\nmax_bs = 2\nmax_context_len = 4800\npage_size = 48\n'
        '[check]\nbuilder = "build_page_table"\n'
    )
    runs = sglang_job.plan_runs(["default", "spec-metadata", str(odd)], 3)
    pairs = {(r.client, r.scenario): r for r in runs}
    assert set(pairs) == {
        (PAGE_TABLE_CLIENT, "default"),
        (PAGE_TABLE_CLIENT, "odd-page"),
        (GRAPH_METADATA_CLIENT, "spec-metadata"),
    }
    assert "does not divide 4096" in pairs[PAGE_TABLE_CLIENT, "odd-page"].skipped
    assert pairs[PAGE_TABLE_CLIENT, "default"].skipped is None
    assert all(r.config.steps == 3 for r in runs)


@needs_sglang
@pytest.mark.heavy
def test_job_writes_the_verdict_table_and_the_reproducers(tmp_path, capsys):
    md, js = tmp_path / "sglang.md", tmp_path / "sglang.json"
    args = ["--scenarios", "default", "--replays", "8", "--out", str(md), "--json", str(js)]
    assert sglang_job.main(args) == 0
    printed = capsys.readouterr().out
    assert f"{PAGE_TABLE_CLIENT} on default:" in printed
    text = md.read_text()
    assert "| client | scenario | verdict | replays | failed | advice |" in text
    assert f"| {PAGE_TABLE_CLIENT} | default |" in text
    assert "## Findings" in text and "### Failures without a reproducer" in text
    for finding in FINDINGS:
        assert f"`{finding.reproducer}`" in text
    assert text.count("Reproducer now:") == len(FINDINGS)
    doc = json.loads(js.read_text())
    # An install of the kernel files alone has no package metadata: the pinned release.
    assert doc["environment"]["sglang"] == (
        sg.sglang_version() or f"{sg.TESTED_VERSION} (kernel files only, no package metadata)"
    )
    [run] = doc["runs"]
    assert run["verdict"] in ("SAFE", "UNSAFE", "INCOMPLETE")
    assert run["replays"] == run["report"]["replays"]
    for finding in doc["found"]["findings"]:
        assert finding["exit_code"] in (0, 1), finding["state"]


def test_a_run_without_a_report_says_why():
    run = _run(PAGE_TABLE_CLIENT)
    run.skipped = "page_size 48 does not divide 4096"
    doc = sglang_job.run_doc(run)
    assert doc["verdict"] == "not run" and doc["report"] is None
    section = "\n".join(sglang_job._run_section(doc))
    assert "does not divide 4096" in section
