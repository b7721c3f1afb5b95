"""Invariant: a check is validated once, where it is planned (``pagegraph.check.plan``), and
run as planned: ``check_replay_safety`` validates each config once whichever judges it runs
(tables or the decode step), a child process runs its parent's plan without validating it
again, and a check that cannot run is refused in the parent before any child starts.

Planning is the one place that decides whether a builder fits a scenario and which preset
outputs its check keeps: the scenario's own builder must have every preset (else a
``PlanError``), another builder put on it drops those its kind lacks; the jobs (``check``,
``mutate``, the engine clients') take the decision from ``plan_check``, and a job that planned
hands its plan to the child, which runs it without planning again.

The plan also decides, each once and each with a refused case beside a planned twin: the
memory fit (the pool's own figure), the reader's need of a decode step, the builder's page
sizes, the error counters, the engine's presets, and a scenario's kind for the engine
clients' jobs, which agree on it."""

from __future__ import annotations

import functools
import json
import textwrap

import pytest

from pagegraph.check import plan
from pagegraph.check.checker import check_replay_safety, run_plan
from pagegraph.check.config import CheckConfig, ConfigError
from pagegraph.check.plan import CheckPlan, PlanError, plan_check
from pagegraph.check.scenario import load_scenario
from pagegraph.graph.builder_names import resolve_builder
from pagegraph.jobs import check_job, client_runs, mutate
from pagegraph.kernels.declarations import declaration_of, declare_builder
from pagegraph.kernels.registry import BuilderLoadError
from pagegraph.kinds import PAGE_TABLE, kind_named
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
    with pytest.raises(BuilderLoadError, match="cannot load builder"):
        plan_check("no_such_module:fn", SMALL)
    # A builder that does not fit the scenario, and only that, is a PlanError.
    with pytest.raises(PlanError, match="only a block_table builder reads"):
        plan_check("build_page_table", SMALL.replace(num_blocks_overrun=0.5))
    for not_a_fit in (ConfigError, BuilderLoadError):
        assert not issubclass(not_a_fit, PlanError)


def test_the_scenarios_own_builder_must_have_its_presets_another_drops_them():
    presets = ("cu_seqlens_k[0]", "kv_indptr[0]")
    cfg = SMALL.replace(preset_outputs=presets)
    with pytest.raises(PlanError) as refused:
        plan_check("build_kv_indices", cfg, own_builder=True)
    message = str(refused.value)
    assert "\n" not in message
    assert "preset_outputs ['cu_seqlens_k[0]'] are not outputs of a csr builder" in message
    fits = SMALL.replace(preset_outputs=("kv_indptr[0]",))
    p, _ = plan_check("build_kv_indices", fits, own_builder=True)
    assert p.config.preset_outputs == ("kv_indptr[0]",)
    p, _ = plan_check("build_kv_indices", cfg)  # another builder put on the scenario
    assert p.config.preset_outputs == ("kv_indptr[0]",)
    p, _ = plan_check("build_page_table", cfg)
    assert p.config.preset_outputs == ()


SMALL_SCENARIO = """name = "small"
[graph]
buckets = [1, 2, 4]
max_bs = 4
max_context_len = 256
page_size = 16
[workload]
steps = 3
initial_len = [1, 200]
[check]
builder = "{builder}"
preset_outputs = ["kv_indptr[0]"]
"""


def _check_plan(path, builder=None):
    return check_job._plan([str(path)], replays=None, builder=builder, detectors=None,
                           workload_process=None, strict=None, json_path=None,
                           markdown_path=None)  # fmt: skip


def test_pagegraph_check_plans_by_the_one_rule(tmp_path):
    own = tmp_path / "own.toml"
    own.write_text(SMALL_SCENARIO.format(builder="build_kv_indices"))
    (check,) = _check_plan(own).checks
    assert check.config.preset_outputs == ("kv_indptr[0]",) and check.kind == "csr"
    (check,) = _check_plan(own, builder="build_page_table").checks
    assert check.config.preset_outputs == () and check.kind == "page_table"
    wrong = tmp_path / "wrong.toml"
    wrong.write_text(SMALL_SCENARIO.format(builder="build_page_table"))
    with pytest.raises(ValueError, match=r"wrong.toml: preset_outputs \['kv_indptr\[0\]'\]"):
        _check_plan(wrong)


def test_pagegraph_check_hands_its_plans_to_the_children(tmp_path, monkeypatch):
    own = tmp_path / "own.toml"
    own.write_text(SMALL_SCENARIO.format(builder="build_kv_indices"))
    planned = _check_plan(own)
    handed = []
    monkeypatch.setattr(check_job, "run_isolated", lambda jobs, **_: handed.extend(jobs))
    check_job._run_isolated(planned, None, [], check_job._CheckProgress(planned, quiet=True))
    assert [j.plan for j in handed] == planned.checks


def test_the_jobs_take_the_fit_from_plan_check(monkeypatch, tmp_path):
    def refuse(builder, config, *_, **__):
        raise PlanError(f"refused by the plan: {builder}")

    scenario = tmp_path / "small.toml"
    scenario.write_text(SMALL_SCENARIO.format(builder="build_kv_indices"))
    scenario_jobs = mutate._scenario_jobs([load_scenario(str(scenario))], 3, True)
    # A control is put on a scenario not its own: the presets its kind lacks go.
    o = mutate.Outcome("build_page_table", "", True)
    (job,) = mutate._fitted_jobs("build_page_table", scenario_jobs, o)
    assert job.plan.config.preset_outputs == () and job.plan.builder == "build_page_table"
    assert job.config == job.plan.config and not o.not_applicable
    monkeypatch.setattr(mutate, "plan_check", refuse)
    assert mutate._fitted_jobs("build_page_table", scenario_jobs, o) == []
    assert o.not_applicable == {"small": "refused by the plan: build_page_table"}
    # An engine's client is a builder put on the scenario: the presets its kind lacks go.
    cfg = SMALL.replace(preset_outputs=("kv_indptr[0]",))
    run = client_runs.plan_run(client_runs.ClientRun("build_page_table", "small", "", cfg))
    assert run.skipped is None and run.plan.config.preset_outputs == ()
    monkeypatch.setattr(client_runs, "plan_check", refuse)
    run = client_runs.plan_run(client_runs.ClientRun("build_page_table", "small", "", cfg))
    assert run.skipped == "refused by the plan: build_page_table" and run.plan is None


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


#: Installed in a child process (its ``sitecustomize``): planning there fails the check.
NO_PLANNING = """
from pagegraph.check import plan

def refuse(*_, **__):
    raise AssertionError("planned again in the child")

plan.plan_check = plan.validate_config = refuse
"""


def test_a_planned_job_runs_in_a_child_without_planning_again(tmp_path, monkeypatch):
    p, _ = plan_check("build_page_table", SMALL)
    calls = []
    monkeypatch.setattr(isolate, "plan_check", lambda *a, **k: calls.append(a))
    (tmp_path / "sitecustomize.py").write_text(textwrap.dedent(NO_PLANNING))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    (report,) = isolate.run_isolated([Job.planned(p, "small")], timeout=300)
    assert report.verdict == "SAFE" and calls == [], report.format()
    # A child that planned again would fail the same way: the check above can fail.
    replans = "plan.CheckPlan.from_dict = lambda d: plan.plan_check(d)\n"
    (tmp_path / "sitecustomize.py").write_text(textwrap.dedent(NO_PLANNING) + replans)
    with pytest.raises(IsolatedError, match="planned again in the child"):
        isolate.run_isolated([Job.planned(p, "small")], timeout=300)


# -- what else the plan decides: each decision made there once, the jobs taking its answer ----


def test_memory_fit_is_the_plans_with_the_pools_own_figure(monkeypatch, tmp_path):
    from pagegraph.check import memory_fit
    from pagegraph.check.pipeline.workload_setup import pool_kwargs
    from pagegraph.workload.pool import KVPool, pool_sizing

    cfg = SMALL.replace(swa=True, full_to_swa_dtype="int32", r2t_offset=5, r2t_extra_cols=3)
    # The figure is the pool's: what KVPool allocates, one set of formulas.
    kwargs = pool_kwargs(cfg)
    pool, sizing = KVPool(**kwargs, device="cpu"), pool_sizing(**kwargs).device_bytes()
    assert sizing["req_to_token"] == pool.req_to_token.untyped_storage().nbytes()
    assert sizing["full_to_swa"] == pool.full_to_swa.untyped_storage().nbytes()
    need, parts = memory_fit.memory_need(cfg, PAGE_TABLE)
    assert parts["req_to_token"] == sizing["req_to_token"] != 0
    assert parts["full_to_swa"] == sizing["full_to_swa"] != 0
    # Too little memory: refused by the plan, with the pool's figure.
    free = [need - 1]
    monkeypatch.setattr(memory_fit, "available_memory", lambda: (free[0], "GPU memory"))
    figure = f"does not fit: needs about {need / 2**30:.2f} GiB of GPU memory"
    with pytest.raises(PlanError, match=figure):
        plan_check("build_page_table", cfg, fit_memory=True)
    assert plan_check("build_page_table", cfg)[0].memory_need is None  # not asked
    # The jobs take the refusal from the plan: pagegraph check's usage error, a client's skip.
    scenario = tmp_path / "small.toml"
    scenario.write_text(SMALL_SCENARIO.format(builder="build_kv_indices"))
    run = client_runs.plan_run(client_runs.ClientRun("build_page_table", "small", "", cfg))
    assert run.plan is None and run.skipped.startswith(figure)
    free[0] = 1
    with pytest.raises(ValueError, match="small.toml: does not fit: needs about"):
        _check_plan(scenario)
    # Enough memory: planned, the figure kept.
    free[0] = need
    p, _ = plan_check("build_page_table", cfg, fit_memory=True)
    assert p.memory_need == need
    assert CheckPlan.from_dict(json.loads(json.dumps(p.to_dict()))) == p
    (check,) = _check_plan(scenario).checks
    assert check.memory_need is not None
    run = client_runs.plan_run(client_runs.ClientRun("build_page_table", "small", "", cfg))
    assert run.skipped is None and run.plan.memory_need == need


def test_a_reader_without_a_decode_step_is_refused_once_by_the_plan(tmp_path, monkeypatch):
    with pytest.raises(PlanError) as refused:
        plan_check("build_page_table", SMALL, reader="sglang:triton_decode")
    assert str(refused.value) == plan.READER_NEEDS_CONSUMER
    p, _ = plan_check("build_page_table", STEP, reader="sglang:triton_decode")
    assert p.reader == "sglang:triton_decode" and p.pipeline == "step"
    # pagegraph check --reader: the plan's one message, with the scenario's path.
    scenario = tmp_path / "small.toml"
    scenario.write_text(SMALL_SCENARIO.format(builder="build_kv_indices"))
    plan_it = dict(replays=None, builder=None, detectors=None, workload_process=None,
                   strict=None, json_path=None, markdown_path=None)  # fmt: skip
    with pytest.raises(ValueError) as refused:
        check_job._plan([str(scenario)], reader="sglang:triton_decode", **plan_it)
    assert str(refused.value) == f"{scenario}: {plan.READER_NEEDS_CONSUMER}"
    # The job asks the plan and nothing else: a plan that takes the reader is the answer.
    taken = []
    real = check_job.plan_check
    monkeypatch.setattr(
        check_job, "plan_check", lambda *a, **k: taken.append(k["reader"]) or real(*a, **k)
    )
    with pytest.raises(ValueError):
        check_job._plan([str(scenario)], reader="sglang:triton_decode", **plan_it)
    assert taken == ["sglang:triton_decode"]


def _no_errors_builder(
    req_to_token, req_pool_indices, seq_lens, page_table, page_size, *, swa_page_table=None,
    full_to_swa=None,
):  # fmt: skip
    from pagegraph.kernels.page_table import build_page_table

    build_page_table(req_to_token, req_pool_indices, seq_lens, page_table, page_size,
                     swa_page_table=swa_page_table, full_to_swa=full_to_swa)  # fmt: skip


def test_the_error_counters_are_the_plans_decision():
    import dataclasses

    counters = SMALL.replace(errors=True)  # the scenario asks for them
    assert plan_check("build_page_table", counters)[0].errors
    assert not plan_check(_no_errors_builder, counters)[0].errors
    assert not plan_check("build_page_table", SMALL)[0].errors
    # The bed reads the plan's decision: a plan without the counters skips them.
    p, fn = plan_check("build_page_table", counters)
    counted = run_plan(p, fn).property("error counters")
    skipped = run_plan(dataclasses.replace(p, errors=False), fn).property("error counters")
    assert counted.status == "pass", counted
    assert skipped.status == "skip" and "takes no errors=" in skipped.detail


def test_the_builders_page_sizes_are_the_plans_and_sglang_words_them():
    from pagegraph.jobs import sglang_job

    def only_16(*args, **kwargs):
        return _no_errors_builder(*args, **kwargs)

    declare_builder(only_16, page_sizes=(16,))
    p, _ = plan_check(only_16, SMALL)
    assert p.page_sizes == (16,) and plan_check("build_page_table", SMALL)[0].page_sizes is None
    with pytest.raises(PlanError, match="takes page_size 16 only") as refused:
        plan_check(only_16, SMALL.replace(page_size=8))
    assert refused.value.page_sizes == (16,)
    # SGLang's job says a CSR client's page-size refusal in SGLang's words, from the plan's.
    client = sglang_job.CSR_CLIENTS[0]
    run = client_runs.ClientRun(client, "csr", "", SMALL)
    words = sglang_job.JOB.refusal(run, PlanError("x", page_sizes=(1,)))
    assert words == ("page_size 16: SGLang's FlashInfer backend builds token slots (page size 1)")
    assert sglang_job.JOB.refusal(run, PlanError("x", page_sizes=(16,))) is None
    assert sglang_job.JOB.refusal(run, PlanError("x")) is None


def _with_engine_presets(builtin: str, presets: tuple[str, ...]):
    """A built-in builder re-declared as one whose engine presets ``presets``."""
    fn = resolve_builder(builtin)

    @functools.wraps(fn)
    def engine_builder(*args, **kwargs):
        return fn(*args, **kwargs)

    declare_builder(engine_builder, engine_presets=presets)
    return engine_builder


def test_engine_presets_join_the_scenarios_by_the_one_rule():
    engine = ("kv_indptr[0]",)
    p, _ = plan_check(_with_engine_presets("build_kv_indices", engine), SMALL)
    assert p.config.preset_outputs == engine
    assert plan_check("build_kv_indices", SMALL)[0].config.preset_outputs == ()  # undeclared
    p, _ = plan_check(_with_engine_presets("build_page_table", engine), SMALL)
    assert p.config.preset_outputs == ()
    with pytest.raises(PlanError, match="not outputs of a page_table builder"):
        plan_check(_with_engine_presets("build_page_table", engine), SMALL, own_builder=True)


def test_sglangs_clients_declare_what_sglang_presets():
    from pagegraph.clients import CLIENT_BUILDERS

    clients = CLIENT_BUILDERS()
    for name in ("sglang_flashinfer_kv_indices", "sglang_flashinfer_kv_indices_blocks"):
        assert declaration_of(clients[name]).engine_presets == ("kv_indptr[0]",)
    metadata = declaration_of(clients["sglang_trtllm_mha_graph_metadata"])
    assert metadata.engine_presets == ("cu_seqlens_k[0]", "cu_seqlens_q[0]")
    with pytest.raises(ValueError, match="engine_presets must be a sequence of names"):
        declare_builder(lambda: None, engine_presets="kv_indptr[0]")


UNLOADABLE = SMALL_SCENARIO.replace('preset_outputs = ["kv_indptr[0]"]\n', "{outputs}")


@pytest.mark.parametrize("declared", ["", 'outputs = "page_table"\n'], ids=["auto", "declared"])
def test_the_client_jobs_agree_on_a_scenarios_kind(tmp_path, declared):
    import dataclasses

    from pagegraph.jobs import sglang_job, vllm_job
    from pagegraph.jobs.client_job import plan_client_runs

    path = tmp_path / "unloadable.toml"
    path.write_text(UNLOADABLE.format(builder="no_such_module:fn", outputs=declared))
    s = load_scenario(str(path))
    # Its builder does not load: its kind is the one it declares, else unknown.
    assert plan.scenario_kind(s.builder, s.config) is (
        kind_named("page_table") if declared else None
    )
    pairs = []
    for job in (sglang_job.JOB, vllm_job.JOB):
        job = dataclasses.replace(job, clients=("build_page_table", "build_kv_indices"))
        pairs.append([(r.client, r.skipped) for r in plan_client_runs(job, [str(path)], 3)])
    assert pairs[0] == pairs[1] == ([("build_page_table", None)] if declared else [])
    # SGLang's own clients: none of a kind unknown (not taken for a page table).
    clients = {r.client for r in sglang_job.plan_runs([str(path)], 3)}
    assert clients == ({*sglang_job.CLIENTS[:2]} if declared else set())
