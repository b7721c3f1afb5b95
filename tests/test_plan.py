"""Invariant: a check is validated once, where it is planned (``pagegraph.check.plan``), and
run as planned: ``check_replay_safety`` validates each config once whichever judges it runs
(tables or the decode step), a child process runs its parent's plan without validating it
again, and a check that cannot run is refused in the parent before any child starts."""

from __future__ import annotations

import json

import pytest

from pagegraph.check import plan
from pagegraph.check.checker import check_replay_safety, run_plan
from pagegraph.check.config import CheckConfig, ConfigError
from pagegraph.check.plan import CheckPlan, plan_check
from pagegraph.supervise import isolate
from pagegraph.supervise.isolate import IsolatedError, Job

SMALL = CheckConfig(
    steps=3, max_bs=4, max_context_len=256, page_size=16, seed=5, workload_process="off"
)
STEP = SMALL.replace(consumer="paged", num_q_heads=4, num_kv_heads=2, head_dim=16, timing_iters=0)


def test_a_plan_names_the_kind_and_the_judges_and_drops_other_kinds_presets():
    p, fn = plan_check("build_page_table", SMALL.replace(preset_outputs=("kv_indptr[0]",)))
    assert (p.builder, p.kind, p.pipeline) == ("build_page_table", "page_table", "tables")
    assert p.config.preset_outputs == () and callable(fn)
    p, _ = plan_check("build_page_table", STEP)
    assert p.pipeline == "step"
    assert CheckPlan.from_dict(json.loads(json.dumps(p.to_dict()))) == p


def test_a_check_that_cannot_run_is_refused_at_planning():
    with pytest.raises(ConfigError, match="steps"):
        plan_check("build_page_table", SMALL.replace(steps=0))
    with pytest.raises(ValueError, match="cannot load builder"):
        plan_check("no_such_module:fn", SMALL)
    with pytest.raises(ValueError, match="only a block_table builder reads"):
        plan_check("build_page_table", SMALL.replace(num_blocks_overrun=0.5))


@pytest.mark.parametrize("cfg", [SMALL, STEP], ids=["tables", "step"])
def test_each_check_validates_its_config_once(cfg, monkeypatch):
    calls = []
    real = plan.validate_config
    monkeypatch.setattr(plan, "validate_config", lambda c: calls.append(c) or real(c))
    report = check_replay_safety("build_page_table", cfg)
    assert len(calls) == 1 and report.verdict == "SAFE", report.format()


def test_a_planned_check_runs_without_validating_again(monkeypatch):
    p, fn = plan_check("build_page_table", SMALL)

    def refuse(*_):
        raise AssertionError("validated again")

    monkeypatch.setattr(plan, "validate_config", refuse)
    assert run_plan(p, fn).verdict == "SAFE"


def test_the_parent_plans_each_job_and_refuses_a_bad_one_before_any_child(tmp_path, monkeypatch):
    spec = json.loads(
        isolate._write_spec([Job("build_page_table", SMALL)], 0, tmp_path).read_text()
    )
    (job,) = spec["jobs"]
    assert "config" not in job and job["plan"]["kind"] == "page_table"

    def no_child(*_, **__):
        raise AssertionError("a child was started")

    monkeypatch.setattr(isolate.subprocess, "Popen", no_child)
    with pytest.raises(IsolatedError, match="steps"):
        isolate.run_isolated([Job("build_page_table", SMALL.replace(steps=0))])
