"""The job ``make sglang`` and ``make vllm`` both are, written once: an engine's clients (its
kernels behind pagegraph's contracts) paired with every scenario of their kind, each pair
planned (``plan_check``) and checked in a child process of its own, and a Markdown report
(and JSON). A ``ClientJob`` says what differs from one engine to the other
(``pagegraph.jobs.sglang_job.JOB``, ``pagegraph.jobs.vllm_job.JOB``); ``plan_client_runs``
pairs and plans, ``run_client_job`` runs the whole job and returns its exit code: 0 when it
ran, 2 when the engine's kernels are unavailable or an argument is bad, 130 when interrupted.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..check.config import CheckConfig
from ..check.plan import PlanError, resolve_kind, scenario_kind
from ..check.scenario import load_scenario, scenario_path, shipped_scenarios
from ..runtime.environment import environment
from .client_runs import (
    ClientRun,
    add_job_arguments,
    job_doc,
    plan_job,
    plan_run,
    run_checks,
    write_reports,
)

__all__ = ["ClientJob", "client_job_main", "plan_client_runs", "run_client_job"]


def _no_sections(runs: list[ClientRun], completed: bool, quiet: bool) -> dict[str, Any]:
    return {}


def _no_precondition(client: str, cfg: CheckConfig) -> str | None:
    return None


@dataclass(frozen=True)
class ClientJob:
    """What one engine's client job is; the rest is ``run_client_job``'s.

    ``name``: the job's name, heading its lines on stderr (``"sglang_job"``). ``clients``:
    the engine's builders by the name the checker knows them by, in report order.
    ``cpu_replays``: replays a check without a GPU. ``check_timeout``: seconds a check may
    take. ``unavailable()``: why the engine's kernels cannot run here (the line to print), or
    None. ``environment()``: the engine's entries in the report's environment.
    ``markdown(doc)``: the report of the JSON document. ``sections(runs, completed, quiet)``:
    the document's sections after the checks (the engine's findings). ``step_readers``:
    decode-step readers of the engine: a scenario that names one (``[consumer] reader``) runs
    with its own builder instead of the clients.
    ``precondition(client, cfg)``: why the engine's kernel cannot run on a config for a
    reason its adapter does not declare, or None. ``refusal(run, error)``: a plan's refusal
    in the engine's words, or None to keep the plan's. ``description``,
    ``scenarios_help``: the command line's help.
    """

    name: str
    clients: tuple[str, ...]
    cpu_replays: int
    check_timeout: float
    unavailable: Callable[[], str | None]
    environment: Callable[[], dict[str, Any]]
    markdown: Callable[[dict[str, Any]], str]
    description: str
    scenarios_help: str
    sections: Callable[[list[ClientRun], bool, bool], dict[str, Any]] = _no_sections
    step_readers: tuple[str, ...] = ()
    precondition: Callable[[str, CheckConfig], str | None] = _no_precondition
    refusal: Callable[[ClientRun, PlanError], str | None] | None = None


def plan_client_runs(
    job: ClientJob, scenarios: list[str] | None, replays: int | None
) -> list[ClientRun]:
    """Every (client, scenario) pair whose kinds match (``scenario_kind``), shipped scenarios
    by default, then each scenario that names one of the job's step readers with its own
    builder; each planned or skipped with the reason (``plan_run``, after the kernel's own
    ``precondition``). ``ValueError`` for a scenario that cannot be loaded."""
    loaded = [load_scenario(scenario_path(s)) for s in scenarios or shipped_scenarios()]
    runs = []
    for client in job.clients:
        _, kind = resolve_kind(client)
        for s in loaded:
            if s.config.reader in job.step_readers:
                continue
            if scenario_kind(s.builder, s.config) is not kind:
                continue
            cfg = s.config if replays is None else s.config.replace(steps=replays)
            run = ClientRun(client, s.name, str(s.path), cfg, skipped=job.precondition(client, cfg))
            runs.append(plan_run(run, refusal=job.refusal))
    for s in loaded:
        if s.config.reader in job.step_readers:
            cfg = s.config if replays is None else s.config.replace(steps=replays)
            runs.append(plan_run(ClientRun(s.builder, s.name, str(s.path), cfg)))
    return runs


def run_client_job(job: ClientJob, args: argparse.Namespace) -> int:
    """Plan, check, add the engine's sections, write the reports; the job's exit code."""
    planned = plan_job(
        job.name,
        args,
        unavailable=job.unavailable(),
        cpu_replays=job.cpu_replays,
        plan_runs=lambda scenarios, replays: plan_client_runs(job, scenarios, replays),
    )
    if isinstance(planned, int):
        return planned
    replays, runs = planned
    env = {**environment(), **job.environment()}
    completed = run_checks(runs, timeout=args.timeout, quiet=args.quiet, job=job.name)
    doc = job_doc(env, replays, completed, runs, **job.sections(runs, completed, args.quiet))
    write_reports(doc, job.markdown(doc), args)
    return 0 if completed else 130


def client_job_main(job: ClientJob, argv: list[str] | None = None) -> int:
    """``python -m pagegraph.jobs.<job>``: the command line parsed, the job run."""
    parser = argparse.ArgumentParser(
        prog=f"python -m pagegraph.jobs.{job.name}", description=job.description
    )
    add_job_arguments(
        parser,
        cpu_replays=job.cpu_replays,
        check_timeout=job.check_timeout,
        scenarios_help=job.scenarios_help,
    )
    return run_client_job(job, parser.parse_args(argv))
