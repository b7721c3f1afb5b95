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
from pagegraph.check.reports.report import PropertyResult, Report
from pagegraph.clients import sglang as sg
from pagegraph.jobs import client_runs, sglang_job
from pagegraph.jobs.sglang_job import (
    FINDINGS,
    FLASHMLA_CLIENT,
    PAGE_TABLE_CLIENT,
    SGLangRun,
    classify,
    grid_columns,
)

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


#: A small page-table scenario without SWA (FlashMLA has no SWA table), rows past the width.
SMALL = (
    'name = "small"\n[graph]\nmax_bs = 4\nmax_context_len = 300\npage_size = 16\n'
    '[workload]\ninjections = "engine"\noverlong = 0.2\n[check]\nbuilder = "build_page_table"\n'
)


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
    assert {f.key for f in FINDINGS} == {
        "page-table-spill",
        "flashmla-spill",
        "swa-stride",
        "flashinfer-overlong",
    }
    assert all(f.reproducer.startswith("examples/") for f in FINDINGS)


def test_a_flashinfer_crash_on_an_overlong_row_is_its_finding():
    client = sglang_job.CSR_CLIENTS[0]
    run = _run(client, max_context_len=1024, page_size=1)
    completed = PropertyResult("replays completed", "FAIL", "", "the check process was killed")
    run.report = Report(client, run.config, "cuda", True)
    run.report.crash = (
        "CUDA error: an illegal memory access was encountered. Replayed again with launches "
        "serialised, it came from replay 45 (bucket 32), seq_len past the row's capacity "
        "(16384 tokens): row(s) 3 (seq_len 2147483464)"
    )
    assert classify(run, completed) == "flashinfer-overlong"
    run.report.crash = "CUDA error: an illegal memory access was encountered"
    assert classify(run, completed) is None  # a crash the re-run did not tie to a length
    run.report.crash = None
    past = PropertyResult(
        "row containment",
        "FAIL",
        "",
        "replay 3 (bucket 4): kv_indices[4096] (past the end of kv_indices (4096 entries)) "
        "...; the replay's out-of-contract rows: seq_len past the row's capacity (1024 "
        "tokens): row(s) 2 (seq_len 5000)",
    )
    assert classify(run, past) == "flashinfer-overlong"
    # A negative length on the same replay could be the cause too: not matched.
    mixed = PropertyResult(
        "row containment",
        "FAIL",
        "",
        past.first_failure + "; negative seq_len: row(s) 1 (seq_len -3)",
    )
    assert classify(run, mixed) is None
    inside = PropertyResult("row containment", "FAIL", "", "kv_indptr[3] expected ...")
    assert classify(run, inside) is None


def test_flashmla_spill_is_its_own_finding():
    # SGLang's FlashMLA table for a 50,000-token context: 782 pages, 13 blocks of 64.
    ragged = _run(FLASHMLA_CLIENT, max_context_len=50000, page_size=64)
    assert ragged.config.width == 782 and grid_columns(FLASHMLA_CLIENT, ragged.config) == 832
    spill = PropertyResult("row containment", "FAIL", "", "page_table[3, 0]")
    assert classify(ragged, spill) == "flashmla-spill"
    assert classify(ragged, PropertyResult("bounded writes", "FAIL", "", "x")) == "flashmla-spill"
    # A whole number of blocks cannot spill, unless padding columns widen the row stride
    # that FlashMLA's grid follows (trtllm_mha's grid follows the width).
    even = dict(max_context_len=128 * 64, page_size=64)
    assert classify(_run(FLASHMLA_CLIENT, **even), spill) is None
    padded = dict(even, table_pad_cols=8)
    assert classify(_run(FLASHMLA_CLIENT, **padded), spill) == "flashmla-spill"
    assert classify(_run(PAGE_TABLE_CLIENT, **padded), spill) is None
    # The SWA stride is trtllm_mha's alone; FlashMLA has no SWA table.
    swa = PropertyResult("correct", "FAIL", "", "swa_page_table[1, 0] ...")
    assert classify(_run(FLASHMLA_CLIENT, **even, swa=True), swa) is None


@needs_sglang
def test_each_client_runs_on_scenarios_of_its_kind(tmp_path):
    odd = tmp_path / "odd-page.toml"
    odd.write_text(
        'name = "odd-page"\n[graph]\nmax_bs = 2\nmax_context_len = 4800\npage_size = 48\n'
        '[check]\nbuilder = "build_page_table"\n'
    )
    small = tmp_path / "small.toml"
    small.write_text(SMALL)
    scenarios = ["default", "spec-metadata", str(odd), str(small), "csr", "sglang-flashinfer"]
    runs = sglang_job.plan_runs(scenarios, 3)
    pairs = {(r.client, r.scenario): r for r in runs}
    csr_pairs = {(c, s) for c in sglang_job.CSR_CLIENTS for s in ("csr", "sglang-flashinfer")}
    assert (
        set(pairs)
        == {
            (client, scenario)
            for client in (PAGE_TABLE_CLIENT, FLASHMLA_CLIENT)
            for scenario in ("default", "odd-page", "small")
        }
        | {(GRAPH_METADATA_CLIENT, "spec-metadata")}
        | csr_pairs
    )
    for client in sglang_job.CSR_CLIENTS:
        assert "(page size 1)" in pairs[client, "csr"].skipped
        flashinfer = pairs[client, "sglang-flashinfer"]
        assert flashinfer.skipped is None
        assert flashinfer.config.preset_outputs == ("kv_indptr[0]",)
    for client in (PAGE_TABLE_CLIENT, FLASHMLA_CLIENT):
        assert "does not divide 4096" in pairs[client, "odd-page"].skipped
        assert pairs[client, "small"].skipped is None
    assert pairs[PAGE_TABLE_CLIENT, "default"].skipped is None
    # default has an SWA table, which FlashMLA's kernel does not write.
    assert "takes no swa_page_table" in pairs[FLASHMLA_CLIENT, "default"].skipped
    assert all(r.config.steps == 3 for r in runs)


@pytest.mark.cpu_heavy  # 5-10 s under the interpreter: make test-heavy (CI runs it)
@needs_sglang
@pytest.mark.heavy
def test_job_writes_the_verdict_table_and_the_reproducers(tmp_path, capsys):
    # One small scenario: which client runs where is test_each_client_runs_on_scenarios_of_
    # its_kind's; here the job runs end to end (checks in children, every reproducer).
    md, js = tmp_path / "sglang.md", tmp_path / "sglang.json"
    small = tmp_path / "small.toml"
    small.write_text(SMALL)
    args = ["--scenarios", str(small), "--replays", "8", "--out", str(md), "--json", str(js)]
    assert sglang_job.main(args) == 0
    printed = capsys.readouterr().out
    text = md.read_text()
    assert "| client | reader | scenario | inputs | verdict | replays | failed | advice |" in text
    for client in (PAGE_TABLE_CLIENT, FLASHMLA_CLIENT):
        assert f"{client} on small:" in printed
        assert f"| {client} | - | small |" in text  # a table check: no reader
    assert "## Findings" in text and "### Failures without a reproducer" in text
    for finding in FINDINGS:
        assert f"`{finding.reproducer}`" in text
    assert text.count("Reproducer now:") == len(FINDINGS)
    doc = json.loads(js.read_text())
    # An install of the kernel files alone has no package metadata: the pinned release.
    assert doc["environment"]["sglang"] == (
        sg.sglang_version() or f"{sg.TESTED_VERSION} (kernel files only, no package metadata)"
    )
    runs = {(r["client"], r["scenario"]): r for r in doc["runs"]}
    assert list(runs) == [(PAGE_TABLE_CLIENT, "small"), (FLASHMLA_CLIENT, "small")]
    for run in runs.values():
        assert run["verdict"] in ("SAFE", "UNSAFE", "INCOMPLETE")
        assert run["replays"] == run["report"]["replays"]
    for finding in doc["found"]["findings"]:
        assert finding["exit_code"] in (0, 1), finding["state"]


def test_a_run_without_a_report_says_why():
    run = _run(PAGE_TABLE_CLIENT)
    run.skipped = "page_size 48 does not divide 4096"
    doc = client_runs.run_doc(run)
    assert doc["verdict"] == "not run" and doc["report"] is None
    section = "\n".join(client_runs.run_section(doc))
    assert "does not divide 4096" in section
