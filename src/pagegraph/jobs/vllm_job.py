"""``python -m pagegraph.jobs.vllm_job`` (``make vllm``): vLLM 0.34.0's block-table kernels,
loaded from vLLM's own files (``pagegraph.clients.vllm``), checked on every scenario of their
kind, and its TRITON_ATTN decode step (``STEP_READERS``) on the scenarios that name it, each
check in a child process of its own; runs of a scenario that breaks vLLM's host
guarantees are labelled hostile (``HOSTILE_NOTE``). A Markdown report (and JSON); exit 0 when
the job ran, 2 when vLLM's kernel files are not found or an argument is bad, 130 when
interrupted (docs/ARCHITECTURE.md, "vLLM's block tables").
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ..check.plan import resolve_kind
from ..check.scenario import load_scenario, scenario_path, shipped_scenarios
from ..clients import vllm as vllm_client
from ..clients.vllm_files import vllm_root
from ..kinds import KindSpec
from ..runtime.environment import environment
from .client_runs import (
    ClientRun,
    add_job_arguments,
    job_doc,
    plan_job,
    plan_run,
    run_checks,
    verdict_lines,
    write_reports,
)

__all__ = ["CLIENTS", "main", "plan_runs", "run_job"]

#: vLLM's kernels the job checks, by the name the checker knows them by.
CLIENTS = ("vllm_gather_block_tables", "vllm_compute_slot_mappings")
#: vLLM's decode-step readers (``pagegraph.clients.engine_readers``): each runs on the
#: scenarios that name it (``[consumer] reader``), with the scenario's own builder.
STEP_READERS = ("vllm:triton_attn",)
#: Replays a check without a GPU, where the Triton interpreter runs each kernel on the host.
CPU_REPLAYS = 20
#: Seconds one check may take before its child is killed (reported as a crash).
CHECK_TIMEOUT = 3600
#: What a run on hostile inputs means for vLLM's kernels (the report says it above the table).
HOSTILE_NOTE = (
    "Runs whose inputs are *hostile* break guarantees vLLM's host keeps (`num_blocks_overrun`: "
    "a request's `num_blocks` past its row's capacity, which vLLM's host refuses to write; "
    "`negative`, `bad_index`: lengths and request slots no scheduler sends). A failure there "
    "is outside vLLM's contract: it shows what the kernel does when the guarantee breaks, "
    "not a bug of vLLM's under its own rules. Runs on *engine* inputs are under vLLM's rules."
)

#: What a run over KV-cache groups means (the report says it above the table when it has one).
GROUPS_NOTE = (
    "Scenarios with `kv_groups` check each KV-cache group with its own block size and row "
    "width (`pagegraph.check.pipeline.group_checks`), as `BlockTables` holds them; a run's "
    "verdict is its groups' worst, and a failure names its group. vLLM's slot-mapping kernel "
    "is launched with the group's mapping enabled, `BlockTables`' default "
    "(`slot_mapping_enabled=None`); a ring group (narrower than the sequence: "
    "`CircularBufferSpec`, `KpoolTailSpec`) is judged by the ring's own mapping, "
    "`block_table[r, (pos // block_size) % width]`. Which groups vLLM's runner disables "
    "(`uses_slot_mapping`, decided outside the kernel files loaded here) decides whether a "
    "ring failure is reachable: vLLM #53982, #56469."
)


def _scenario_kind(scenario: Any) -> KindSpec | None:
    """The kind of a scenario's own builder, or None when it cannot load."""
    try:
        return resolve_kind(scenario.builder, scenario.config.outputs)[1]
    except ValueError:
        return None


def plan_runs(scenarios: list[str] | None, replays: int | None) -> list[ClientRun]:
    """Every (client, scenario) pair of one kind, shipped scenarios by default, each planned
    or skipped with the reason (``plan_run``); ``ValueError`` for a scenario that cannot be
    loaded."""
    loaded = [load_scenario(scenario_path(s)) for s in scenarios or shipped_scenarios()]
    runs = []
    for client in CLIENTS:
        _, kind = resolve_kind(client)
        for s in loaded:
            if _scenario_kind(s) is not kind or s.config.reader in STEP_READERS:
                continue
            cfg = s.config if replays is None else s.config.replace(steps=replays)
            runs.append(plan_run(ClientRun(client, s.name, str(s.path), cfg)))
    for s in loaded:
        if s.config.reader in STEP_READERS:
            cfg = s.config if replays is None else s.config.replace(steps=replays)
            runs.append(plan_run(ClientRun(s.builder, s.name, str(s.path), cfg)))
    return runs


def _header(env: dict[str, Any], replays: str) -> list[str]:
    versions = ", ".join(f"{k} {env.get(k)}" for k in ("torch", "triton", "cuda"))
    return [
        f"# vLLM {vllm_client.TESTED_VERSION}'s block-table kernels under pagegraph's checks",
        "",
        f"- date: {env['date']}",
        f"- device: {env['device']}",
        f"- versions: {versions}, python {env['python']}, pagegraph {env['pagegraph']}",
        f"- vLLM's files: {env['vllm_files']}",
        f"- imports stubbed to load them: {env['vllm_stubs']}",
        f"- replays a check: {replays}",
        "",
    ]


def findings_lines(doc: dict[str, Any]) -> list[str]:
    """The findings of ``doc``'s runs, split by contract: UNSAFE runs on the engine's inputs
    (vLLM's own rules: a bug of the kernel's), then those on hostile inputs (outside vLLM's
    contract), each with its failed properties' first failures."""
    lines = ["## Findings", ""]
    for title, hostile in (
        ("Under vLLM's contract (engine inputs)", False),
        ("Outside vLLM's contract (hostile inputs)", True),
    ):
        found = [
            r for r in doc["runs"] if r["verdict"] == "UNSAFE" and bool(r.get("hostile")) == hostile
        ]
        lines += [f"### {title}", ""]
        if not found:
            ran = [r for r in doc["runs"] if r["report"] and bool(r.get("hostile")) == hostile]
            lines += [f"None: no UNSAFE verdict in {len(ran)} run(s)." if ran else "No run.", ""]
            continue
        for r in found:
            lines.append(f"- {r['client']} on {r['scenario']}:")
            lines += [f"  - {f['property']}: {f['first_failure']}" for f in r["failures"]]
        lines.append("")
    return lines


def markdown(doc: dict[str, Any]) -> str:
    """The Markdown report of ``doc`` (``run_job``'s JSON document)."""
    lines = _header(doc["environment"], doc["replays"])
    if any(r.get("hostile") for r in doc["runs"]):
        lines += [HOSTILE_NOTE, ""]
    if doc.get("kv_groups"):
        groups = "; ".join(f"{k}: {', '.join(v)}" for k, v in doc["kv_groups"].items())
        lines += [GROUPS_NOTE, "", f"Groups: {groups}.", ""]
    steps = tuple(dict.fromkeys(r["client"] for r in doc["runs"] if r.get("reader")))
    lines += verdict_lines(doc, CLIENTS + steps, "kernel")
    lines += findings_lines(doc)
    return "\n".join(lines)


def run_job(args: argparse.Namespace) -> int:
    """Plan, check, write the reports; the job's exit code."""
    reason = vllm_client.vllm_unavailable_reason()
    planned = plan_job(
        "vllm_job",
        args,
        cpu_replays=CPU_REPLAYS,
        plan_runs=plan_runs,
        unavailable=None if reason is None else f"vLLM's kernel files unavailable: {reason}",
    )
    if isinstance(planned, int):
        return planned
    replays, runs = planned
    env = environment()
    env["vllm_files"] = str(vllm_root())
    env["vllm_stubs"] = "; ".join(f"{k} ({v})" for k, v in vllm_client.STUBBED_IMPORTS.items())
    completed = run_checks(runs, timeout=args.timeout, quiet=args.quiet, job="vllm_job")
    groups = {
        r.scenario: [str(g.get("name", i)) for i, g in enumerate(r.config.kv_groups)]
        for r in runs
        if r.config is not None and r.config.kv_groups
    }
    doc = job_doc(env, replays, completed, runs, kv_groups=groups)
    write_reports(doc, markdown(doc), args)
    return 0 if completed else 130


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m pagegraph.jobs.vllm_job",
        description=(
            "Check vLLM's block-table kernels (pagegraph.clients.vllm) on every scenario of "
            "their kinds, each check in a child process. Exit 0 when the job ran, 2 when "
            "vLLM's kernel files are not found or an argument is bad, 130 when interrupted."
        ),
    )
    add_job_arguments(
        parser,
        cpu_replays=CPU_REPLAYS,
        check_timeout=CHECK_TIMEOUT,
        scenarios_help="shipped scenario names or scenario files (default: every shipped one "
        "of the kernels' kinds)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    return run_job(build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
