"""Invariant: the test bed kills every mutant it can on this machine. Each mutant of the zoo
is one realistic page-table, decode-metadata or CSR builder bug; `pagegraph mutate` checks
each one, in its own child process, over graphs/default.toml and graphs/spec-metadata.toml
(graphs/csr.toml for the CSR ones, which the SWA scenarios do not fit), and every mutant that
can die without a GPU must die there (under the Triton interpreter) while the correct
builders stay SAFE."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from pagegraph.check.config import PROPERTIES, CheckConfig
from pagegraph.check.pipeline.step_bed import STEP_PROPERTIES
from pagegraph.check.reports.report import Report
from pagegraph.jobs.mutate import run_mutate
from pagegraph.jobs.mutate_report import (
    Outcome,
    format_kill_table,
    format_matrix,
    smallest_killing_set,
)
from pagegraph.kinds import BLOCK_TABLE, SLOT_MAPPING, kind_of
from pagegraph.mutants.zoo import CONTROLS, MUTANTS
from pagegraph.supervise.isolate import run_isolated

ROOT = Path(__file__).resolve().parent.parent
DEFAULT = str(ROOT / "graphs" / "default.toml")
SPEC = str(ROOT / "graphs" / "spec-metadata.toml")
CSR = str(ROOT / "graphs" / "csr.toml")
DECODE_STEP = str(ROOT / "graphs" / "decode-step.toml")
#: vLLM's kinds: their mutants die on their own scenarios (tests/test_vllm_kinds_check.py).
VLLM_KINDS = (BLOCK_TABLE, SLOT_MAPPING)
#: The page-table, decode-metadata and CSR mutants, which the scenarios here run.
TABLE_MUTANTS = [n for n, m in MUTANTS.items() if kind_of(m.builder) not in VLLM_KINDS]


def test_the_zoo_is_big_and_documented():
    assert len(MUTANTS) >= 20
    for m in MUTANTS.values():
        assert m.bug and m.bug.endswith("."), m.name
        assert m.killed_by
        # every mutant names the properties that catch its bug, real property names
        assert m.kills and set(m.kills) <= {*PROPERTIES, *STEP_PROPERTIES}, m.name
    assert sum(m.cpu for m in MUTANTS.values()) >= 18


@pytest.mark.cpu_heavy
@pytest.mark.skipif(torch.cuda.is_available(), reason="the GPU run covers every mutant")
def test_every_cpu_killable_mutant_dies_on_the_cpu_scenarios(tmp_path, capsys):
    out = tmp_path / "kill.json"
    code = run_mutate(
        [DEFAULT, SPEC],
        mutants=TABLE_MUTANTS,
        replays=40,
        jobs=2,
        timeout=300,
        json_path=str(out),
        quiet=True,
        every_scenario=True,
    )
    text = capsys.readouterr().out
    doc = json.loads(out.read_text())
    assert doc["survivors"] == [] and doc["bad_controls"] == [], text
    assert code == 0, text
    builders = {b["name"]: b for b in doc["builders"]}
    for name in CONTROLS:
        if not kind_of(CONTROLS[name]).swa:  # no CSR beside an SWA table: none fits
            assert builders[name]["skipped"] == "no scenario here fits its outputs", name
            continue
        for scenario in ("default", "spec-metadata"):
            assert builders[name]["reports"][scenario]["verdict"] == "SAFE", (name, scenario)
    for name in TABLE_MUTANTS:
        m = MUTANTS[name]
        if name.startswith("csr_"):
            assert "SWA" in builders[name]["not_applicable"]["default"], name
        elif m.cpu:
            assert builders[name]["killed"], name
            assert set(builders[name]["killers"].values()) <= set(PROPERTIES)
            # killed by its own bug's property, not by a crash or another property alone
            assert failed_properties(builders[name]) & set(m.kills), (name, builders[name])
        else:
            assert builders[name]["skipped"] == f"can only die on a GPU: {m.gpu_only}", name
            assert m.gpu_only, name  # every GPU-only mutant says why
    assert "| no_row_clamp |" in text and "smallest killing set: default" in text


@pytest.mark.cpu_heavy
@pytest.mark.skipif(torch.cuda.is_available(), reason="the GPU run covers every mutant")
def test_csr_mutants_die_on_the_csr_scenario_and_its_controls_pass(tmp_path, capsys):
    out = tmp_path / "kill.json"
    csr_mutants = [name for name in MUTANTS if name.startswith("csr_")]
    assert len(csr_mutants) >= 3
    code = run_mutate(
        [CSR], mutants=csr_mutants, replays=30, jobs=2, timeout=300, json_path=str(out), quiet=True
    )
    text = capsys.readouterr().out
    doc = json.loads(out.read_text())
    assert code == 0 and doc["survivors"] == [] and doc["bad_controls"] == [], text
    builders = {b["name"]: b for b in doc["builders"]}
    for name in CONTROLS:  # the page-table and metadata controls run here too, as themselves
        if kind_of(CONTROLS[name]) in VLLM_KINDS:  # defined for vLLM's padding only
            assert "defined for padding" in builders[name]["not_applicable"]["csr"], name
            continue
        assert builders[name]["reports"]["csr"]["verdict"] == "SAFE", name
    expected = {
        "csr_ell_offsets": "correct",
        "csr_one_page_past": "bounded writes",
        "csr_pages_frozen": "correct",
    }
    for name, prop in expected.items():
        assert builders[name]["killers"] == {"csr": prop}, (name, builders[name]["killers"])
        assert prop in MUTANTS[name].kills
        assert failed_properties(builders[name]) & set(MUTANTS[name].kills), name


def failed_properties(builder: dict) -> set[str]:
    """The properties that failed in any scenario of a builder's JSON outcome."""
    return {
        p["name"]
        for report in builder["reports"].values()
        for p in report["properties"]
        if p["status"] == "FAIL"
    }


#: A quick GPU kill set: representative mutants (each kind of bug, the GPU-only ones among
#: them) on the scenario that kills them in ``profiles/mutate.md`` and ``mutate-csr.md``.
GPU_KILL_SET = {
    "no_row_clamp": "default",  # row containment
    "extra_last_page": "default",  # bounded writes
    "floor_last_page": "default",  # correct
    "errors_stored": "default",  # error counters
    "debug_sync_outside_capture": "default",  # sync-free builder call
    "side_stream_not_joined": "default",  # capture / correct
    "width_frozen_per_batch_size": "default",  # graph-safe / correct
    "scan_exclusive": "spec-metadata",  # correct (cu_seqlens_k)
    "csr_one_page_past": "csr",  # kv_indices past kv_indptr[bs]
}


@pytest.mark.gpu
def test_gpu_kill_set_fails_each_mutants_own_property_and_the_control_is_safe():
    """What ``make mutate`` shows at length, in seconds: each mutant, checked in a child
    process (a crash must not take the test process's CUDA context), fails one of its own
    properties (``Mutant.kills``), and the correct builder is SAFE on the same scenario."""
    from pagegraph.check.scenario import load_scenario, scenario_path
    from pagegraph.jobs.mutate import _fitted_jobs, _scenario_jobs

    names = sorted(set(GPU_KILL_SET.values()))
    loaded = {n: load_scenario(scenario_path(n)) for n in names}
    jobs = []
    for name, scenario in GPU_KILL_SET.items():
        (job,) = _scenario_jobs([loaded[scenario]], None, control=False)
        (job,) = _fitted_jobs(f"pagegraph.mutants.zoo:{name}", [job], Outcome(name, "", False))
        jobs.append(dataclasses.replace(job, label=name))
    (control,) = _scenario_jobs([loaded["default"]], None, control=True)
    jobs.append(dataclasses.replace(control, builder="build_page_table", label="control"))
    reports = dict(zip((j.label for j in jobs), run_isolated(jobs, timeout=120)))
    assert reports["control"].verdict == "SAFE", reports["control"].format()
    for name in GPU_KILL_SET:
        report = reports[name]
        failed = {p.name for p in report.properties if p.status == "FAIL"}
        assert failed & set(MUTANTS[name].kills), (name, failed, report.format())


def test_smallest_killing_set_is_a_cover():
    def outcome(name, killers):
        o = Outcome(name, "", False)
        o.killers = lambda: killers  # the matrix, without running anything
        return o

    outcomes = [
        outcome("a", {"s1": "correct", "s2": "correct"}),
        outcome("b", {"s2": "bounded writes"}),
        outcome("c", {"s3": "row containment"}),
        outcome("d", {}),
    ]
    assert smallest_killing_set(outcomes, ["s1", "s2", "s3"]) == ["s2", "s3"]


def test_a_mutant_stopped_at_its_first_kill_says_where_it_was_not_checked():
    o = Outcome("floor_last_page", "a bug.", False)
    o.killers = lambda: {"s2": "correct"}
    o.reports = {"s2": Report("floor_last_page", CheckConfig(), "cpu", False)}
    o.not_checked_after_kill = ["s1", "s3"]
    table = format_kill_table([o], ["s1", "s2", "s3"])
    assert "| killed | s2 | correct | s2 (then not checked on 2 more) |" in table
    matrix = format_matrix([o], ["s1", "s2", "s3"])
    assert "| floor_last_page | (killed before) | correct | (killed before) |" in matrix
    o.not_checked_after_kill = []  # every scenario checked: nothing said
    assert "| killed | s2 | correct | s2 |" in format_kill_table([o], ["s1", "s2", "s3"])


def test_mutate_jobs_skip_the_decode_steps_timing_and_stop_mutants_early():
    """The kill table needs verdicts only: a scenario with a consumer is not timed, and a
    mutant's job stops at its first failure while a control's runs every replay."""
    from pagegraph.check.scenario import load_scenario
    from pagegraph.jobs.mutate import _scenario_jobs

    loaded = [load_scenario(DEFAULT), load_scenario(DECODE_STEP)]
    assert loaded[1].config.timing_iters > 0  # the scenario itself is timed
    for control in (True, False):
        jobs = _scenario_jobs(loaded, 7, control)
        assert [j.config.timing_iters for j in jobs] == [loaded[0].config.timing_iters, 0]
        assert all(j.config.steps == 7 and j.stop_on_failure is not control for j in jobs)


def test_a_scenarios_memory_slots_go_with_its_jobs():
    from pagegraph.check.scenario import load_scenario
    from pagegraph.jobs.mutate import _fitted_jobs, _scenario_jobs

    loaded = [load_scenario(DEFAULT), load_scenario(DECODE_STEP)]
    jobs = _scenario_jobs(loaded, 7, False, {"default": ("/tmp/slot-0", "/tmp/slot-1")})
    assert [j.memory_slots for j in jobs] == [("/tmp/slot-0", "/tmp/slot-1"), ()]
    fitted = _fitted_jobs("build_page_table", jobs, Outcome("build_page_table", "", True))
    assert [(j.builder, j.memory_slots) for j in fitted] == [
        ("build_page_table", ("/tmp/slot-0", "/tmp/slot-1")),
        ("build_page_table", ()),
    ]


@pytest.mark.cpu_heavy  # a decode step: long under the Triton interpreter
def test_a_mutant_killed_by_the_decode_step_is_named_in_the_kill_table():
    """A decode step's reports fail properties the checker does not have: the kill table
    names them (the first in the decode step's order), as the matrix does."""
    from pagegraph.check.checker import check_decode_step
    from pagegraph.check.config import CheckConfig

    cfg = CheckConfig(
        max_bs=4,
        max_context_len=64,
        page_size=16,
        steps=6,
        seed=3,
        consumer="paged",
        num_q_heads=4,
        num_kv_heads=2,
        head_dim=16,
    )
    report = check_decode_step("pagegraph.mutants.zoo:floor_last_page", cfg)
    assert report.verdict == "UNSAFE", report.format()
    o = Outcome("floor_last_page", MUTANTS["floor_last_page"].bug, False)
    o.reports["decode-step"] = report
    assert o.killers() == {"decode-step": "output correct through the consumer"}
    table = format_kill_table([o], ["decode-step"])
    assert "| killed | decode-step | output correct through the consumer | decode-step |" in table
    assert "| floor_last_page | output correct through the consumer |" in format_matrix(
        [o], ["decode-step"]
    )


def test_a_mutant_only_cupti_sees_is_not_run_without_cupti(monkeypatch):
    """Without the one detector that can see it, a mutant is not run (and says why) rather
    than reported as a survivor; with it, it runs."""
    from pagegraph.check.scenario import load_scenario
    from pagegraph.detect.sync_record import HUBS
    from pagegraph.jobs import mutate

    needs = [name for name, m in MUTANTS.items() if m.needs_detector == "cupti"]
    assert needs == ["hidden_dtoh_copy"]
    hub = HUBS["cupti"]
    monkeypatch.setattr(hub, "unavailable_reason", lambda probe=True: "cupti-python is missing")
    (o,) = [o for o in mutate._initial_outcomes(needs, True) if not o.control]
    assert o.skipped == "only the cupti detector sees it, which cannot run: cupti-python is missing"
    monkeypatch.setattr(hub, "unavailable_reason", lambda probe=True: None)
    (o,) = [o for o in mutate._initial_outcomes(needs, True) if not o.control]
    assert o.skipped is None
    # Scenarios that do not run the detector cannot kill it either.
    torch_only = load_scenario(DEFAULT)
    torch_only.config = torch_only.config.replace(detectors="torch")
    (o,) = [o for o in mutate._initial_outcomes(needs, True, [torch_only]) if not o.control]
    assert "no scenario here runs it" in o.skipped
    (o,) = [
        o for o in mutate._initial_outcomes(needs, True, [load_scenario(DEFAULT)]) if not o.control
    ]
    assert o.skipped is None  # detectors = "auto"
