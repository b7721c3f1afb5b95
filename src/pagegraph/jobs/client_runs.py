"""One engine client's check on one scenario, planned (``plan_run``), run in a child process of
its own, and its report as JSON and Markdown: what ``make sglang`` and ``make vllm`` share
(``pagegraph.jobs.sglang_job``, ``pagegraph.jobs.vllm_job``)."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch

from ..check.config import CheckConfig
from ..check.plan import CheckPlan, PlanError, plan_check
from ..check.reports.report import PropertyResult, Report
from ..runtime.progress import Progress, format_seconds
from ..supervise.isolate import IsolatedError, Job, run_isolated, write_json_atomic
from ..supervise.worker_pool import task_cost
from .check_estimate import check_estimate

__all__ = [
    "ClientRun",
    "add_job_arguments",
    "job_doc",
    "job_replays",
    "plan_job",
    "plan_run",
    "run_checks",
    "run_doc",
    "run_section",
    "say",
    "table_cell",
    "verdict_lines",
    "write_reports",
]


@dataclass
class ClientRun:
    """One client on one scenario: what was run, and its report or why there is none."""

    client: str
    scenario: str
    path: str
    config: CheckConfig | None = None
    skipped: str | None = None
    error: str | None = None
    report: Report | None = None
    #: the check as planned (``plan_run``), what a run not skipped runs
    plan: CheckPlan | None = None

    @property
    def verdict(self) -> str:
        if self.report is not None:
            return self.report.verdict
        return "not run" if self.skipped else "ERROR"

    def with_status(self, status: str) -> list[PropertyResult]:
        return [p for p in self.report.properties if p.status == status] if self.report else []


def _config(run: ClientRun) -> CheckConfig:
    """The scenario's config of a run that was not skipped while loading (it has one)."""
    return cast(CheckConfig, run.config)


def plan_run(
    run: ClientRun,
    *,
    refusal: Callable[[ClientRun, PlanError], str | None] | None = None,
) -> ClientRun:
    """``run`` planned (``plan_check``: the client is a builder put on the scenario, so the
    scenario's presets its kind lacks are dropped, those its engine sets join them; and its tables
    must fit in memory), or skipped with the reason: it was already, or the plan refused it
    (``refusal``: the refusal in the engine's words, None to keep the plan's)."""
    if run.skipped is not None:
        return run
    try:
        run.plan, _ = plan_check(run.client, _config(run), fit_memory=True)
    except PlanError as exc:
        run.skipped = (refusal and refusal(run, exc)) or str(exc)
    return run


def say(quiet: bool, text: str) -> None:
    if not quiet:
        print(text, flush=True)


def _summary(run: ClientRun) -> str:
    head = f"{run.client} on {run.scenario}: {run.verdict}"
    if run.skipped:
        return f"{head} ({run.skipped})"
    if run.error:
        return f"{head} ({run.error})"
    failed = ", ".join(p.name for p in run.with_status("FAIL"))
    advice = ", ".join(p.name for p in run.with_status("advice"))
    extra = "; ".join(
        x for x in (failed and f"failed: {failed}", advice and f"advice: {advice}") if x
    )
    replays = cast(Report, run.report).replays  # neither skipped nor failed: it has one
    return f"{head}, {replays} replays" + (f" ({extra})" if extra else "")


def run_checks(runs: list[ClientRun], *, timeout: float | None, quiet: bool, job: str) -> bool:
    """Run each planned check in a child process; False when interrupted (the runs not
    reached keep no report, the one running keeps what it had found). Unless ``quiet``, a
    progress line on stderr at least every ``progress.EVERY_S``: checks done, the time left,
    the running check's phase (``job`` names the job in it)."""
    total = sum(run.skipped is None for run in runs)
    progress = Progress(job, total, "checks")
    # Checks of very different sizes: the time left counts each by its cost.
    progress.total_weight = sum(task_cost(_config(run)) for run in runs if run.skipped is None)
    if not quiet and not torch.cuda.is_available():
        estimates = [check_estimate(_config(run), "cpu") for run in runs if run.skipped is None]
        seconds = sum(cast(list[float], estimates))  # a CPU's estimates are never None
        print(
            f"{job}: {total} checks on the CPU (Triton interpreter): estimate "
            f"{format_seconds(seconds)} or more; a GPU runs them in minutes",
            file=sys.stderr,
            flush=True,
        )
    with contextlib.ExitStack() as stack:
        if not quiet:
            stack.enter_context(progress.heartbeat())
        return _run_each(runs, timeout, quiet, progress)


def _run_each(
    runs: list[ClientRun], timeout: float | None, quiet: bool, progress: Progress
) -> bool:
    for k, run in enumerate(runs):
        if run.skipped is None:
            label = f"{run.client} on {run.scenario}"
            job = Job.planned(cast(CheckPlan, run.plan), label)  # planned: not skipped
            progress.detail = label

            def on_phase(
                _: int, phase: str, label: str = label, steps: int = _config(run).steps
            ) -> None:
                of = f" of {steps}" if phase.startswith("replay") else ""
                progress.detail = f"{label}: {phase}{of}"

            try:
                run.report = run_isolated([job], timeout=timeout, on_phase=on_phase)[0]
            except IsolatedError as exc:
                run.error = f"could not run: {exc}"
            except KeyboardInterrupt as exc:
                partial = getattr(exc, "reports", [])
                run.report = partial[0] if partial else None
                for rest in runs[k + (run.report is not None) :]:
                    rest.skipped = rest.skipped or "interrupted before it ran"
                return False
            progress.advance(detail="", weight=task_cost(_config(run)))
        say(quiet, _summary(run))
    return True


def inputs_label(doc: dict[str, Any]) -> str:
    """What a run's inputs were: the engine's (``"engine"``, what an engine sends, out of
    contract included), or hostile, with the knobs set (a run doc's ``hostile``)."""
    hostile = doc.get("hostile") or []
    return f"hostile: {', '.join(hostile)}" if hostile else "engine"


def table_cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def run_doc(run: ClientRun) -> dict[str, Any]:
    """One run as JSON: verdict, advice, failures, the full report."""
    return {
        "client": run.client,
        "reader": run.config.reader if run.config is not None else None,
        "scenario": run.scenario,
        "path": run.path,
        "verdict": run.verdict,
        "skipped": run.skipped,
        "error": run.error,
        "replays": run.report.replays if run.report else 0,
        "hostile": list(run.config.hostile_injections()) if run.config else [],
        "advice": [{"property": p.name, "detail": p.detail} for p in run.with_status("advice")],
        "failures": [
            {
                "property": p.name,
                "first_failure": str(p.first_failure or p.detail),
                "detail": p.detail,
            }
            for p in run.with_status("FAIL")
        ],
        "report": run.report.to_dict() if run.report else None,
    }


def run_section(doc: dict[str, Any]) -> list[str]:
    lines = [f"### {doc['client']} on {doc['scenario']}", "", f"Verdict: **{doc['verdict']}**"]
    if doc["skipped"] or doc["error"]:
        return lines + [f"({doc['skipped'] or doc['error']})", ""]
    report = doc["report"]
    lines[-1] += f" ({doc['replays']} replays" + (
        f"; stopped early: {report['stopped']})" if report.get("stopped") else ")"
    )
    lines.append("")
    if report.get("crash"):
        lines += [f"Crash: {report['crash']}", ""]
    if doc["advice"]:
        lines += ["Advice:", ""] + [f"- {a['property']}: {a['detail']}" for a in doc["advice"]]
        lines.append("")
    if doc["failures"]:
        lines += ["Failures:", ""]
        lines += [f"- {f['property']}: {f['first_failure']}" for f in doc["failures"]]
        lines.append("")
    quiet = [p["name"] for p in report["properties"] if p["status"] in ("skip", "incomplete")]
    if quiet:
        lines += [f"Not judged: {', '.join(quiet)}.", ""]
    return lines


# -- what a client job's command line and reports share -----------------------------------------


def add_job_arguments(
    parser: Any, *, cpu_replays: int, check_timeout: float, scenarios_help: str
) -> None:
    """The options every client job takes: ``--out``, ``--json``, ``--replays``,
    ``--scenarios``, ``--timeout``, ``--quiet``."""
    parser.add_argument("--out", help="Markdown report (default: stdout)")
    parser.add_argument("--json", help="the same content as JSON")
    parser.add_argument(
        "--replays",
        type=int,
        help=f"replays a check (default: the scenario's steps on a GPU, {cpu_replays} on the "
        "CPU, where the Triton interpreter runs the kernels)",
    )
    parser.add_argument("--scenarios", nargs="+", metavar="NAME", help=scenarios_help)
    parser.add_argument(
        "--timeout",
        type=float,
        default=check_timeout,
        help=f"seconds one check may take before it is killed (default {check_timeout})",
    )
    parser.add_argument("--quiet", action="store_true", help="print nothing but errors")


def job_replays(args: Any, cpu_replays: int) -> int | None:
    """Replays a check (``None``: each scenario's steps; ``cpu_replays`` without CUDA unless
    given); ``ValueError`` for ``--replays`` below 1 or a ``--timeout`` not above 0."""
    replays: int | None = args.replays
    if replays is None and not torch.cuda.is_available():
        replays = cpu_replays
    if replays is not None and replays < 1:
        raise ValueError("--replays must be >= 1")
    if args.timeout is not None and args.timeout <= 0:
        raise ValueError("--timeout must be > 0 seconds")
    return replays


def plan_job(
    job: str, args: Any, *, unavailable: str | None, cpu_replays: int, plan_runs: Any
) -> tuple[int | None, list[ClientRun]] | int:
    """A client job's replays and runs, or its exit code 2 after one line on stderr: the
    engine's kernels are ``unavailable`` (the line to print, else None), an argument is bad,
    or no scenario fits. ``plan_runs(scenarios, replays)`` lists the job's runs."""
    if unavailable is not None:
        print(f"{job}: {unavailable}", file=sys.stderr)
        return 2
    try:
        replays = job_replays(args, cpu_replays)
        runs = plan_runs(args.scenarios, replays)
    except ValueError as exc:
        print(f"{job}: {exc}", file=sys.stderr)
        return 2
    if not runs:
        print(f"{job}: no scenario of the kernels' kinds among those given", file=sys.stderr)
        return 2
    return replays, runs


def job_doc(
    env: dict[str, Any], replays: int | None, completed: bool, runs: list[ClientRun], **extra: Any
) -> dict[str, Any]:
    """A client job's JSON document: its environment, replays a check, whether every check
    ran, each run (``run_doc``), then ``extra`` sections."""
    return {
        "environment": env,
        "replays": "the scenario's steps" if replays is None else str(replays),
        "complete": completed,
        "runs": [run_doc(r) for r in runs],
        **extra,
    }


def verdict_lines(doc: dict[str, Any], clients: tuple[str, ...], noun: str) -> list[str]:
    """The Markdown of ``doc``'s runs: a table of verdicts (``noun`` heads its first column;
    the reader column names a decode step's reader, ``-`` for a table check), then each
    client's runs in ``clients`` order."""
    lines = [
        "## Verdicts",
        "",
        f"| {noun} | reader | scenario | inputs | verdict | replays | failed | advice |",
        "|---|---|---|---|---|---:|---|---|",
    ]
    for r in doc["runs"]:
        failed = ", ".join(f["property"] for f in r["failures"]) or r["skipped"] or r["error"] or ""
        advice = ", ".join(a["property"] for a in r["advice"])
        lines.append(
            f"| {r['client']} | {r.get('reader') or '-'} | {r['scenario']} | {inputs_label(r)} "
            f"| {r['verdict']} | {r['replays']} | {table_cell(failed)} | {table_cell(advice)} |"
        )
    lines.append("")
    for client in clients:
        runs = [r for r in doc["runs"] if r["client"] == client]
        if runs:
            lines += [f"## {client}", ""]
            for r in runs:
                lines += run_section(r)
    return lines


def write_reports(doc: dict[str, Any], text: str, args: Any) -> None:
    """The Markdown ``text`` to ``args.out`` (else stdout) and ``doc`` as JSON to
    ``args.json``, each said unless ``args.quiet``."""
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text + "\n")
        say(args.quiet, f"wrote {args.out}")
    else:
        print(text)
    if args.json:
        write_json_atomic(args.json, doc)
        say(args.quiet, f"wrote {args.json}")
