"""``python -m pagegraph.jobs.vllm_job`` (``make vllm``): vLLM 0.34.0's block-table kernels,
loaded from vLLM's own files (``pagegraph.clients.vllm``), checked on every scenario of their
kind, and its TRITON_ATTN decode step (``STEP_READERS``) on the scenarios that name it, each
check in a child process of its own; runs of a scenario that breaks vLLM's host
guarantees are labelled hostile (``HOSTILE_NOTE``). A Markdown report (and JSON); exit 0 when
the job ran, 2 when vLLM's kernel files are not found or an argument is bad, 130 when
interrupted (docs/ARCHITECTURE.md, "vLLM's block tables"); the job's skeleton is
``pagegraph.jobs.client_job``'s (``JOB``).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ..clients import vllm as vllm_client
from ..clients.vllm_files import vllm_root
from .client_job import ClientJob, client_job_main, plan_client_runs, run_client_job
from .client_runs import ClientRun, verdict_lines

__all__ = ["CLIENTS", "JOB", "main", "plan_runs", "run_job"]

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


def plan_runs(scenarios: list[str] | None, replays: int | None) -> list[ClientRun]:
    """Every (client, scenario) pair of one kind, shipped scenarios by default, and each
    scenario that names a step reader with its own builder, each planned or skipped with the
    reason (``pagegraph.jobs.client_job.plan_client_runs``); ``ValueError`` for a scenario
    that cannot be loaded."""
    return plan_client_runs(JOB, scenarios, replays)


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


def _unavailable() -> str | None:
    reason = vllm_client.vllm_unavailable_reason()
    return None if reason is None else f"vLLM's kernel files unavailable: {reason}"


def _environment() -> dict[str, Any]:
    return {
        "vllm_files": str(vllm_root()),
        "vllm_stubs": "; ".join(f"{k} ({v})" for k, v in vllm_client.STUBBED_IMPORTS.items()),
    }


def _groups(runs: list[ClientRun], completed: bool, quiet: bool) -> dict[str, Any]:
    """scenario -> its KV-cache groups' names, for the scenarios with ``kv_groups``."""
    groups = {
        r.scenario: [str(g.get("name", i)) for i, g in enumerate(r.config.kv_groups)]
        for r in runs
        if r.config is not None and r.config.kv_groups
    }
    return {"kv_groups": groups}


#: The vLLM job (``pagegraph.jobs.client_job``).
JOB = ClientJob(
    name="vllm_job",
    clients=CLIENTS,
    cpu_replays=CPU_REPLAYS,
    check_timeout=CHECK_TIMEOUT,
    unavailable=_unavailable,
    environment=_environment,
    markdown=markdown,
    description=(
        "Check vLLM's block-table kernels (pagegraph.clients.vllm) on every scenario of "
        "their kinds, each check in a child process. Exit 0 when the job ran, 2 when "
        "vLLM's kernel files are not found or an argument is bad, 130 when interrupted."
    ),
    scenarios_help="shipped scenario names or scenario files (default: every shipped one "
    "of the kernels' kinds)",
    sections=_groups,
    step_readers=STEP_READERS,
)


def run_job(args: argparse.Namespace) -> int:
    """Plan, check, write the reports; the job's exit code."""
    return run_client_job(JOB, args)


def main(argv: list[str] | None = None) -> int:
    return client_job_main(JOB, argv)


if __name__ == "__main__":
    sys.exit(main())
