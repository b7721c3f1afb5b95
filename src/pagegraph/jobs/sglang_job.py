"""``python -m pagegraph.jobs.sglang_job`` (``make sglang``): SGLang's metadata kernels under
every check that fits them, each in a child process of its own, their failures matched with
the known findings (``FINDINGS``), whose reproducers under ``examples/`` run again. A Markdown
report (and JSON); exit 0 when the job ran (findings are its output), 2 when SGLang's kernel
files are not installed or an argument is bad, 130 when interrupted; the job's skeleton is
``pagegraph.jobs.client_job``'s (``JOB``). Which client fits which scenario, and how a
failure is matched: docs/ARCHITECTURE.md, "SGLang's kernels behind the contracts".
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from ..check.config import CheckConfig
from ..check.plan import PlanError
from ..clients import sglang as sglang_client
from ..supervise.isolate import child_env
from ..workload.lifetime import script_command
from .client_job import ClientJob, client_job_main, plan_client_runs, run_client_job
from .client_runs import ClientRun, say, verdict_lines

__all__ = [
    "CLIENTS",
    "FINDINGS",
    "JOB",
    "Finding",
    "SGLangRun",
    "grid_columns",
    "main",
    "plan_runs",
    "run_job",
]

#: One client on one scenario (``pagegraph.jobs.client_runs.ClientRun``).
SGLangRun = ClientRun

PAGE_TABLE_CLIENT = "sglang_trtllm_mha_page_table"
FLASHMLA_CLIENT = "sglang_flashmla_kv_indices"
#: SGLang's FlashInfer decode CSR build, one program a row and token-block parallel.
CSR_CLIENTS = ("sglang_flashinfer_kv_indices", "sglang_flashinfer_kv_indices_blocks")
#: The SGLang clients the job checks, by the name the checker's registry knows them by.
CLIENTS = (PAGE_TABLE_CLIENT, FLASHMLA_CLIENT, "sglang_trtllm_mha_graph_metadata", *CSR_CLIENTS)
#: Tokens in one program's block of the page-table clients' kernels: ``page_size`` must
#: divide it, and their grids cover a row in blocks of ``BLOCK_TOKENS // page_size`` pages.
BLOCK_TOKENS = 4096
#: Why each page-table client needs ``page_size`` to divide ``BLOCK_TOKENS``.
BLOCK_REASONS = {
    PAGE_TABLE_CLIENT: "build_trtllm_mha_page_table asserts it",
    FLASHMLA_CLIENT: "create_flashmla_kv_indices_triton's block is 4096 // page_size pages",
}
#: Replays a check without a GPU, where the Triton interpreter runs each kernel on the host.
CPU_REPLAYS = 30
#: Seconds one check may take before its child is killed (reported as a crash).
CHECK_TIMEOUT = 3600
#: Seconds a reproducer may run.
REPRODUCER_TIMEOUT = 600
SPILL_PROPERTIES = ("row containment", "bounded writes")
ROOT = Path(__file__).resolve().parents[3]


@dataclass(frozen=True)
class Finding:
    """A known bug of SGLang's kernels, with the script that shows it alone."""

    key: str
    title: str
    reproducer: str  # relative to the repository root


FINDINGS = (
    Finding(
        "page-table-spill",
        "build_trtllm_mha_page_table bounds its writes by seq_len only: a row past the table's "
        "width writes into the next row (or past the buffer), when the width is not a "
        "multiple of 4096 // page_size pages",
        "examples/sglang_trtllm_page_table_spill.py",
    ),
    Finding(
        "flashmla-spill",
        "create_flashmla_kv_indices_triton, launched as FlashMLABackend's CUDA-graph path "
        "does, bounds its writes by seq_len only: a row past the table's width writes into the "
        "row's padding and the next row (or past the buffer), when its grid, the row stride "
        "rounded up to whole blocks of 4096 // page_size pages, passes the width",
        "examples/sglang_flashmla_kv_indices_spill.py",
    ),
    Finding(
        "swa-stride",
        "build_trtllm_mha_page_table writes the SWA table with the full table's row stride",
        "examples/sglang_trtllm_swa_stride.py",
    ),
    Finding(
        "flashinfer-overlong",
        "create_flashinfer_kv_indices_triton copies a row's whole seq_len: a length past the "
        "request's req_to_token row reads the next request's slots, and the batch's stream "
        "runs past the end of kv_indices (a length near 2^31: an illegal memory access)",
        "examples/sglang_flashinfer_kv_indices_overflow.py",
    ),
)
#: What a crash of a CSR client on an overlong length says (``pagegraph.supervise.isolate``).
OVERLONG_CRASH = "seq_len past the row's capacity"


# -- plan ---------------------------------------------------------------------------------------


def _kernel_problem(client: str, cfg: CheckConfig) -> str | None:
    """Why SGLang's kernel of ``client`` cannot run on ``cfg`` for a reason its adapter does
    not declare (a page size the kernel asserts on), or None."""
    if client in BLOCK_REASONS and BLOCK_TOKENS % cfg.page_size:
        why = BLOCK_REASONS[client]
        return f"page_size {cfg.page_size} does not divide {BLOCK_TOKENS} ({why})"
    return None


def _in_sglangs_words(run: ClientRun, refused: PlanError) -> str | None:
    """A CSR client's refusal for its page size (the page sizes its adapter declares:
    ``PlanError.page_sizes``) said as SGLang's reason; None: the plan's words."""
    sizes = refused.page_sizes
    page_size = cast(CheckConfig, run.config).page_size  # loaded: the plan refused it
    if run.client not in CSR_CLIENTS or sizes is None or page_size in sizes:
        return None
    return (
        f"page_size {page_size}: SGLang's FlashInfer backend builds token slots "
        f"(page size {' or '.join(map(str, sizes))})"
    )


def plan_runs(scenarios: list[str] | None, replays: int | None) -> list[ClientRun]:
    """Every (client, scenario) pair whose kinds match, shipped scenarios by default, each
    planned or skipped with the reason (``pagegraph.jobs.client_job.plan_client_runs``, after
    the kernel's own preconditions); ``ValueError`` for a scenario that cannot be loaded."""
    return plan_client_runs(JOB, scenarios, replays)


# -- findings -----------------------------------------------------------------------------------


def grid_columns(client: str, cfg: CheckConfig) -> int:
    """The columns of each table row a page-table client's grid covers: whole blocks of
    ``BLOCK_TOKENS // page_size`` pages over the width (trtllm_mha) or over the row stride,
    width plus padding columns (FlashMLA). Each program masks by ``seq_len`` only, so an
    overlong row writes every one of them."""
    block = BLOCK_TOKENS // cfg.page_size
    span = cfg.width + (cfg.table_pad_cols if client == FLASHMLA_CLIENT else 0)
    return -(-span // block) * block


def classify(run: ClientRun, prop: Any) -> str | None:
    """The key of the finding a failed property shows (``FINDINGS``), or None."""
    if run.client in CSR_CLIENTS and run.config is not None:
        return "flashinfer-overlong" if _overlong_csr_failure(run, prop) else None
    if run.client not in BLOCK_REASONS or run.config is None:
        return None
    cfg = run.config
    if prop.name in SPILL_PROPERTIES and grid_columns(run.client, cfg) > cfg.width:
        return "page-table-spill" if run.client == PAGE_TABLE_CLIENT else "flashmla-spill"
    if (
        run.client == PAGE_TABLE_CLIENT
        and cfg.swa
        and "swa_page_table" in str(prop.first_failure or prop.detail)
    ):
        return "swa-stride"
    return None


def _overlong_csr_failure(run: ClientRun, prop: Any) -> bool:
    """Whether a CSR client's failure is its unbounded copy of an overlong row: a crash the
    serialised re-run tied to a replay whose only out-of-contract rows are overlong, or a
    write past the end of ``kv_indices`` on such a replay."""
    if run.report is not None and run.report.crash:
        text = run.report.crash
    elif prop.name in SPILL_PROPERTIES:
        text = str(prop.first_failure or prop.detail)
        if "past the end of kv_indices" not in text:
            return False
    else:
        return False
    others = ("negative seq_len", "req_pool_index outside")
    return OVERLONG_CRASH in text and not any(other in text for other in others)


def run_reproducer(path: str, timeout: float = REPRODUCER_TIMEOUT) -> dict[str, Any]:
    """Run one reproducer script; its exit code (None when it could not finish) and what
    that means."""
    script = ROOT / path
    if not script.is_file():
        return {"exit_code": None, "state": f"not found at {script}"}
    try:
        done = subprocess.run(
            script_command(str(script)),
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=timeout,
            env=child_env(),
        )
    except subprocess.TimeoutExpired:
        return {"exit_code": None, "state": f"timed out after {timeout:.0f} s"}
    states = {0: "fixed (exit 0)", 1: "bug present (exit 1)"}
    state = states.get(done.returncode)
    if state is None:
        last = (done.stderr.strip().splitlines() or ["no error output"])[-1][:300]
        state = f"error (exit {done.returncode}): {last}"
    return {"exit_code": done.returncode, "state": state}


def collect_findings(runs: list[ClientRun], *, reproducers: bool = True) -> dict[str, Any]:
    """Each finding with the checks that hit it and its reproducer's exit code now, and the
    failures that match no finding."""
    hits: dict[str, list[dict[str, Any]]] = {f.key: [] for f in FINDINGS}
    unexplained: list[dict[str, Any]] = []
    for run in runs:
        for prop in run.with_status("FAIL"):
            entry = {
                "client": run.client,
                "scenario": run.scenario,
                "property": prop.name,
                "first_failure": str(prop.first_failure or prop.detail),
            }
            key = classify(run, prop)
            (hits[key] if key else unexplained).append(entry)
        if run.error:
            unexplained.append(
                {
                    "client": run.client,
                    "scenario": run.scenario,
                    "property": "(none)",
                    "first_failure": run.error,
                }
            )
    # The reproducers are separate processes: run them side by side.
    with ThreadPoolExecutor(max_workers=len(FINDINGS)) as pool:
        states = list(
            pool.map(
                lambda f: (
                    run_reproducer(f.reproducer)
                    if reproducers
                    else {"exit_code": None, "state": "not run"}
                ),
                FINDINGS,
            )
        )
    findings = [
        {"key": f.key, "title": f.title, "reproducer": f.reproducer, **ran, "hits": hits[f.key]}
        for f, ran in zip(FINDINGS, states)
    ]
    return {"findings": findings, "unexplained": unexplained}


# -- reports ------------------------------------------------------------------------------------


def _header(env: dict[str, Any], replays: str) -> list[str]:
    versions = ", ".join(f"{k} {env.get(k)}" for k in ("sglang", "torch", "triton", "cuda"))
    return [
        f"# SGLang {env.get('sglang') or '?'} under pagegraph's checks",
        "",
        f"- date: {env['date']}",
        f"- device: {env['device']}",
        f"- versions: {versions}, python {env['python']}, pagegraph {env['pagegraph']}",
        f"- replays a check: {replays}",
        "",
    ]


def _findings_section(found: dict[str, Any]) -> list[str]:
    lines = ["## Findings", ""]
    for f in found["findings"]:
        lines += [f"### {f['key']}: `{f['reproducer']}`", "", f["title"] + ".", ""]
        lines.append(f"Reproducer now: {f['state']}.")
        lines.append("")
        if f["hits"]:
            lines += ["Hit by:", ""]
            lines += [
                f"- {h['client']} on {h['scenario']}, {h['property']}: {h['first_failure']}"
                for h in f["hits"]
            ]
        else:
            lines.append("Hit by: none of the checks run (the reproducer shows it alone).")
        lines.append("")
    lines += ["### Failures without a reproducer", ""]
    lines += [
        f"- {u['client']} on {u['scenario']}, {u['property']}: {u['first_failure']}"
        for u in found["unexplained"]
    ] or ["None."]
    return lines + [""]


def step_readers(runs: list[ClientRun]) -> dict[str, str]:
    """scenario -> the decode step's reader its checks run, for the scenarios that name one
    (``[consumer] reader``: SGLang's own attention, ``sglang:triton_decode``)."""
    return {r.scenario: r.plan.reader for r in runs if r.plan is not None and r.plan.reader}


def _readers_lines(readers: dict[str, str]) -> list[str]:
    if not readers:
        return []
    lines = ["## Decode-step readers", ""]
    lines += [f"- {scenario}: `{reader}`" for scenario, reader in sorted(readers.items())]
    lines += [
        "- every other decode-step scenario: pagegraph's attention of its format",
        "",
        "A reader that builds its own metadata from the staged inputs (SGLang's Triton backend "
        "builds its CSR from req_to_token) does not read the client's table: there the "
        "client's outputs are judged by the step's other properties only.",
        "",
    ]
    return lines


def markdown(doc: dict[str, Any]) -> str:
    """The Markdown report of ``doc`` (``run_job``'s JSON document)."""
    lines = _header(doc["environment"], doc["replays"])
    lines += _readers_lines(doc.get("readers", {}))
    lines += verdict_lines(doc, CLIENTS, "client")
    lines += _findings_section(doc["found"])
    return "\n".join(lines)


# -- the job ------------------------------------------------------------------------------------


def _unavailable() -> str | None:
    reason = sglang_client.sglang_unavailable_reason()
    return None if reason is None else f"SGLang unavailable: {reason}"


def _environment() -> dict[str, Any]:
    # An install of the kernel files alone (no package metadata) is the pinned release's.
    version = sglang_client.sglang_version()
    return {
        "sglang": version
        or f"{sglang_client.TESTED_VERSION} (kernel files only, no package metadata)"
    }


def _findings(runs: list[ClientRun], completed: bool, quiet: bool) -> dict[str, Any]:
    """The report's findings (``collect_findings``: reproducers run when the checks all ran)
    and the decode-step readers the checks ran."""
    if completed:
        say(
            quiet,
            f"running the {len(FINDINGS)} findings' reproducers (at most "
            f"{REPRODUCER_TIMEOUT:.0f} s each, side by side)",
        )
    found = collect_findings(runs, reproducers=completed)
    for f in found["findings"]:
        say(
            quiet,
            f"finding {f['key']}: {len(f['hits'])} check(s) hit it; "
            f"{f['reproducer']}: {f['state']}",
        )
    return {"found": found, "readers": step_readers(runs)}


#: The SGLang job (``pagegraph.jobs.client_job``).
JOB = ClientJob(
    name="sglang_job",
    clients=CLIENTS,
    cpu_replays=CPU_REPLAYS,
    check_timeout=CHECK_TIMEOUT,
    unavailable=_unavailable,
    environment=_environment,
    markdown=markdown,
    description=(
        "Check SGLang's metadata kernels (pagegraph.clients.sglang) on every scenario "
        "that fits them, each check in a child process, and rerun the reproducers of "
        "the findings under examples/. Exit 0 when the job ran (findings are its output), "
        "2 when SGLang is not installed or an argument is bad, 130 when interrupted."
    ),
    scenarios_help="shipped scenario names or scenario files (default: every shipped one)",
    sections=_findings,
    precondition=_kernel_problem,
    refusal=_in_sglangs_words,
)


def run_job(args: argparse.Namespace) -> int:
    """Plan, check, match findings, write the reports; the job's exit code."""
    return run_client_job(JOB, args)


def main(argv: list[str] | None = None) -> int:
    return client_job_main(JOB, argv)


if __name__ == "__main__":
    sys.exit(main())
