"""``python -m pagegraph.jobs.sglang_job``: SGLang's metadata kernels under every check that
fits them, and the findings with their reproducers (``make sglang``).

For each SGLang client of ``pagegraph.clients.sglang`` (``CLIENTS``) and each scenario whose
builder kind (``pagegraph.kernels.registry.builder_kind``) is the client's, the job runs the
check in a child process of its own (``pagegraph.check.isolate.run_isolated``), so a client
that kills its process is reported with the cause and the next check still runs. A page-table
client is not run on a scenario whose page size does not divide 4096 (its kernel works in
blocks of 4096 tokens), a FlashInfer CSR client on one whose page size is not 1 (SGLang's
FlashInfer backend builds token slots), nor any client on a scenario whose builder signature
(FlashMLA's and the CSR clients' have no SWA table) or memory does not fit; the report says
why. Entries SGLang sets at allocation (``CLIENT_PRESETS``) are preset by the check too.

Then every failure is matched with the known findings (``FINDINGS``): a "row containment" or
"bounded writes" failure of a page-table client whose grid covers more than the width (in
blocks of ``4096 // page_size`` pages over the width for trtllm_mha, over the row stride for
FlashMLA) is that client's spill past the width; a failure on the SWA table that the spill
does not explain is the trtllm_mha SWA row stride. Each finding's standalone reproducer
under ``examples/`` runs again as a subprocess (exit 1 while the bug is there, 0 once fixed),
and failures that match no finding are listed apart, without a reproducer.

Output: a Markdown report (``--out``, or stdout) and the same content as JSON (``--json``).
Exit code: 0 when the job ran (findings are its output, not its failure), 2 when SGLang's
kernel files are not installed or the arguments are bad, 130 when interrupted.
"""

from __future__ import annotations

import argparse
import contextlib
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch

from ..check.config import CheckConfig
from ..check.isolate import IsolatedError, Job, child_env, run_isolated, write_json_atomic
from ..check.report import Report
from ..check.scenario import load_scenario
from ..clients import sglang as sglang_client
from ..kernels.registry import builder_kind, resolve_builder, signature_problem
from ..workload.lifetime import script_command
from .check_job import _memory_problem
from .environment import environment
from .progress import Progress, check_estimate, format_seconds
from .scenario_paths import scenario_path, shipped_scenarios

__all__ = ["CLIENTS", "FINDINGS", "Finding", "SGLangRun", "grid_columns", "main", "run_job"]

PAGE_TABLE_CLIENT = "sglang_trtllm_mha_page_table"
FLASHMLA_CLIENT = "sglang_flashmla_kv_indices"
#: SGLang's FlashInfer decode CSR build, one program a row and token-block parallel.
CSR_CLIENTS = ("sglang_flashinfer_kv_indices", "sglang_flashinfer_kv_indices_blocks")
#: The SGLang clients the job checks, by the name the checker's registry knows them by.
CLIENTS = (PAGE_TABLE_CLIENT, FLASHMLA_CLIENT, "sglang_trtllm_mha_graph_metadata", *CSR_CLIENTS)
#: Outputs a client never writes because SGLang sets them once, at allocation: on a generic
#: scenario the check presets them too, as the engine would, rather than report SGLang's
#: contract as a failure.
CLIENT_PRESETS = {
    "sglang_trtllm_mha_graph_metadata": ("cu_seqlens_k[0]", "cu_seqlens_q[0]"),
    **dict.fromkeys(CSR_CLIENTS, ("kv_indptr[0]",)),
}
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
#: What a crash of a CSR client on an overlong length says (``pagegraph.check.isolate``).
OVERLONG_CRASH = "seq_len past the row's capacity"


@dataclass
class SGLangRun:
    """One client on one scenario: what was run, and its report or why there is none."""

    client: str
    scenario: str
    path: str
    config: CheckConfig | None = None
    skipped: str | None = None
    error: str | None = None
    report: Report | None = None

    @property
    def verdict(self) -> str:
        if self.report is not None:
            return self.report.verdict
        return "not run" if self.skipped else "ERROR"

    def with_status(self, status: str):
        return [p for p in self.report.properties if p.status == status] if self.report else []


# -- plan ---------------------------------------------------------------------------------------


def _scenario_kind(scenario) -> str:
    """What a scenario's own builder outputs; its ``outputs`` when that builder cannot load."""
    try:
        return builder_kind(resolve_builder(scenario.builder), scenario.config.outputs)
    except ValueError:
        declared = scenario.config.outputs
        return "page_table" if declared == "auto" else declared


def _why_not(client: str, fn, kind: str, cfg: CheckConfig) -> str | None:
    """Why ``client`` cannot run on ``cfg``, or None."""
    if client in BLOCK_REASONS and BLOCK_TOKENS % cfg.page_size:
        why = BLOCK_REASONS[client]
        return f"page_size {cfg.page_size} does not divide {BLOCK_TOKENS} ({why})"
    sizes = getattr(fn, "pagegraph_page_sizes", None)  # what the adapter declares
    if client in CSR_CLIENTS and sizes is not None and cfg.page_size not in sizes:
        return (
            f"page_size {cfg.page_size}: SGLang's FlashInfer backend builds token slots "
            f"(page size {' or '.join(map(str, sizes))})"
        )
    return signature_problem(fn, kind, swa=cfg.swa, consumer=bool(cfg.consumer)) or (
        _memory_problem(cfg, kind)
    )


def plan_runs(scenarios: list[str] | None, replays: int | None) -> list[SGLangRun]:
    """Every (client, scenario) pair whose kinds match, shipped scenarios by default;
    ``ValueError`` for a scenario that cannot be loaded."""
    loaded = [load_scenario(scenario_path(s)) for s in scenarios or shipped_scenarios()]
    runs = []
    for client in CLIENTS:
        fn = resolve_builder(client)
        kind = builder_kind(fn)
        for s in loaded:
            if _scenario_kind(s) != kind:
                continue
            cfg = s.config if replays is None else s.config.replace(steps=replays)
            presets = CLIENT_PRESETS.get(client, ())
            if presets and hasattr(cfg, "preset_outputs"):
                merged = tuple(dict.fromkeys((*cfg.preset_outputs, *presets)))
                cfg = cfg.replace(preset_outputs=merged)
            run = SGLangRun(client, s.name, str(s.path), cfg)
            run.skipped = _why_not(client, fn, kind, cfg)
            runs.append(run)
    return runs


# -- checks -------------------------------------------------------------------------------------


def _say(quiet: bool, text: str) -> None:
    if not quiet:
        print(text, flush=True)


def _summary(run: SGLangRun) -> str:
    head = f"{run.client} on {run.scenario}: {run.verdict}"
    if run.skipped:
        return f"{head} ({run.skipped})"
    if run.error:
        return f"{head} ({run.error})"
    failed = ", ".join(p.name for p in run.with_status("FAIL"))
    advice = ", ".join(p.name for p in run.with_status("advice"))
    extra = "; ".join(x for x in (failed and f"failed: {failed}", advice and f"advice: {advice}")
                      if x)  # fmt: skip
    return f"{head}, {run.report.replays} replays" + (f" ({extra})" if extra else "")


def run_checks(runs: list[SGLangRun], *, timeout: float | None, quiet: bool) -> bool:
    """Run each planned check in a child process; False when interrupted (the runs not
    reached keep no report, the one running keeps what it had found). Unless ``quiet``, a
    progress line on stderr at least every ``progress.EVERY_S``: checks done, the time left,
    the running check's phase."""
    total = sum(run.skipped is None for run in runs)
    progress = Progress("sglang_job", total, "checks")
    if not quiet and not torch.cuda.is_available():
        seconds = sum(check_estimate(run.config, "cpu") for run in runs if run.skipped is None)
        print(f"sglang_job: {total} checks on the CPU (Triton interpreter): estimate "
              f"{format_seconds(seconds)} or more; a GPU runs them in minutes",
              file=sys.stderr, flush=True)  # fmt: skip
    with contextlib.ExitStack() as stack:
        if not quiet:
            stack.enter_context(progress.heartbeat())
        return _run_each(runs, timeout, quiet, progress)


def _run_each(runs: list[SGLangRun], timeout: float | None, quiet: bool,
              progress: Progress) -> bool:  # fmt: skip
    for k, run in enumerate(runs):
        if run.skipped is None:
            label = f"{run.client} on {run.scenario}"
            job = Job(run.client, run.config, label)
            progress.detail = label

            def on_phase(_, phase: str, label=label, steps=run.config.steps) -> None:
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
            progress.advance(detail="")
        _say(quiet, _summary(run))
    return True


# -- findings -----------------------------------------------------------------------------------


def grid_columns(client: str, cfg: CheckConfig) -> int:
    """The columns of each table row a page-table client's grid covers: whole blocks of
    ``BLOCK_TOKENS // page_size`` pages over the width (trtllm_mha) or over the row stride,
    width plus padding columns (FlashMLA). Each program masks by ``seq_len`` only, so an
    overlong row writes every one of them."""
    block = BLOCK_TOKENS // cfg.page_size
    span = cfg.width + (cfg.table_pad_cols if client == FLASHMLA_CLIENT else 0)
    return -(-span // block) * block


def classify(run: SGLangRun, prop) -> str | None:
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


def _overlong_csr_failure(run: SGLangRun, prop) -> bool:
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


def run_reproducer(path: str, timeout: float = REPRODUCER_TIMEOUT) -> dict:
    """Run one reproducer script; its exit code (None when it could not finish) and what
    that means."""
    script = ROOT / path
    if not script.is_file():
        return {"exit_code": None, "state": f"not found at {script}"}
    try:
        done = subprocess.run(
            script_command(str(script)), cwd=ROOT, capture_output=True, text=True,
            timeout=timeout, env=child_env(),
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return {"exit_code": None, "state": f"timed out after {timeout:.0f} s"}
    states = {0: "fixed (exit 0)", 1: "bug present (exit 1)"}
    state = states.get(done.returncode)
    if state is None:
        last = (done.stderr.strip().splitlines() or ["no error output"])[-1][:300]
        state = f"error (exit {done.returncode}): {last}"
    return {"exit_code": done.returncode, "state": state}


def collect_findings(runs: list[SGLangRun], *, reproducers: bool = True) -> dict:
    """Each finding with the checks that hit it and its reproducer's exit code now, and the
    failures that match no finding."""
    hits = {f.key: [] for f in FINDINGS}
    unexplained = []
    for run in runs:
        for prop in run.with_status("FAIL"):
            entry = {"client": run.client, "scenario": run.scenario, "property": prop.name,
                     "first_failure": str(prop.first_failure or prop.detail)}  # fmt: skip
            key = classify(run, prop)
            (hits[key] if key else unexplained).append(entry)
        if run.error:
            unexplained.append({"client": run.client, "scenario": run.scenario,
                                "property": "(none)", "first_failure": run.error})  # fmt: skip
    # The reproducers are separate processes: run them side by side.
    with ThreadPoolExecutor(max_workers=len(FINDINGS)) as pool:
        states = list(pool.map(
            lambda f: run_reproducer(f.reproducer) if reproducers
            else {"exit_code": None, "state": "not run"},
            FINDINGS,
        ))  # fmt: skip
    findings = [
        {"key": f.key, "title": f.title, "reproducer": f.reproducer, **ran, "hits": hits[f.key]}
        for f, ran in zip(FINDINGS, states)
    ]
    return {"findings": findings, "unexplained": unexplained}


# -- reports ------------------------------------------------------------------------------------


def _cell(text) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def run_doc(run: SGLangRun) -> dict:
    """One run as JSON: verdict, advice, failures, the full report."""
    return {
        "client": run.client,
        "scenario": run.scenario,
        "path": run.path,
        "verdict": run.verdict,
        "skipped": run.skipped,
        "error": run.error,
        "replays": run.report.replays if run.report else 0,
        "advice": [{"property": p.name, "detail": p.detail} for p in run.with_status("advice")],
        "failures": [
            {
                "property": p.name,
                "first_failure": str(p.first_failure or p.detail),
                "detail": p.detail,
            }
            for p in run.with_status("FAIL")
        ],  # fmt: skip
        "report": run.report.to_dict() if run.report else None,
    }


def _header(env: dict, replays: str) -> list[str]:
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


def _run_section(doc: dict) -> list[str]:
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


def _findings_section(found: dict) -> list[str]:
    lines = ["## Findings", ""]
    for f in found["findings"]:
        lines += [f"### {f['key']}: `{f['reproducer']}`", "", f["title"] + ".", ""]
        lines.append(f"Reproducer now: {f['state']}.")
        lines.append("")
        if f["hits"]:
            lines += ["Hit by:", ""]
            lines += [f"- {h['client']} on {h['scenario']}, {h['property']}: {h['first_failure']}"
                      for h in f["hits"]]  # fmt: skip
        else:
            lines.append("Hit by: none of the checks run (the reproducer shows it alone).")
        lines.append("")
    lines += ["### Failures without a reproducer", ""]
    lines += [f"- {u['client']} on {u['scenario']}, {u['property']}: {u['first_failure']}"
              for u in found["unexplained"]] or ["None."]  # fmt: skip
    return lines + [""]


def markdown(doc: dict) -> str:
    """The Markdown report of ``doc`` (``run_job``'s JSON document)."""
    lines = _header(doc["environment"], doc["replays"])
    lines += ["## Verdicts", "", "| client | scenario | verdict | replays | failed | advice |",
              "|---|---|---|---:|---|---|"]  # fmt: skip
    for r in doc["runs"]:
        failed = ", ".join(f["property"] for f in r["failures"]) or r["skipped"] or r["error"] or ""
        advice = ", ".join(a["property"] for a in r["advice"])
        lines.append(f"| {r['client']} | {r['scenario']} | {r['verdict']} | {r['replays']} | "
                     f"{_cell(failed)} | {_cell(advice)} |")  # fmt: skip
    lines.append("")
    for client in CLIENTS:
        runs = [r for r in doc["runs"] if r["client"] == client]
        if runs:
            lines += [f"## {client}", ""]
            for r in runs:
                lines += _run_section(r)
    lines += _findings_section(doc["found"])
    return "\n".join(lines)


# -- the job ------------------------------------------------------------------------------------


def run_job(args: argparse.Namespace) -> int:
    """Plan, check, match findings, write the reports; the job's exit code."""
    reason = sglang_client.sglang_unavailable_reason()
    if reason is not None:
        print(f"sglang_job: SGLang unavailable: {reason}", file=sys.stderr)
        return 2
    replays = args.replays
    if replays is None and not torch.cuda.is_available():
        replays = CPU_REPLAYS
    try:
        if replays is not None and replays < 1:
            raise ValueError("--replays must be >= 1")
        runs = plan_runs(args.scenarios, replays)
    except ValueError as exc:
        print(f"sglang_job: {exc}", file=sys.stderr)
        return 2
    env = environment()
    # An install of the kernel files alone (no package metadata) is the pinned release's.
    env["sglang"] = sglang_client.sglang_version() or (
        f"{sglang_client.TESTED_VERSION} (kernel files only, no package metadata)"
    )
    completed = run_checks(runs, timeout=args.timeout, quiet=args.quiet)
    if completed:
        _say(args.quiet, f"running the {len(FINDINGS)} findings' reproducers (at most "
                         f"{REPRODUCER_TIMEOUT:.0f} s each, side by side)")  # fmt: skip
    found = collect_findings(runs, reproducers=completed)
    for f in found["findings"]:
        _say(args.quiet, f"finding {f['key']}: {len(f['hits'])} check(s) hit it; "
                         f"{f['reproducer']}: {f['state']}")  # fmt: skip
    doc = {
        "environment": env,
        "replays": "the scenario's steps" if replays is None else str(replays),
        "complete": completed,
        "runs": [run_doc(r) for r in runs],
        "found": found,
    }
    text = markdown(doc)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text + "\n")
        _say(args.quiet, f"wrote {args.out}")
    else:
        print(text)
    if args.json:
        write_json_atomic(args.json, doc)
        _say(args.quiet, f"wrote {args.json}")
    return 0 if completed else 130


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m pagegraph.jobs.sglang_job",
        description=(
            "Check SGLang's metadata kernels (pagegraph.clients.sglang) on every scenario "
            "that fits them, each check in a child process, and rerun the reproducers of "
            "the findings under examples/. Exit 0 when the job ran (findings are its output), "
            "2 when SGLang is not installed or an argument is bad, 130 when interrupted."
        ),
    )
    parser.add_argument("--out", help="Markdown report (default: stdout)")
    parser.add_argument("--json", help="the same content as JSON")
    parser.add_argument(
        "--replays", type=int,
        help=f"replays a check (default: the scenario's steps on a GPU, {CPU_REPLAYS} on the "
        "CPU, where the Triton interpreter runs the kernels)",
    )  # fmt: skip
    parser.add_argument(
        "--scenarios", nargs="+", metavar="NAME",
        help="shipped scenario names or scenario files (default: every shipped one)",
    )  # fmt: skip
    parser.add_argument(
        "--timeout", type=float, default=CHECK_TIMEOUT,
        help=f"seconds one check may take before it is killed (default {CHECK_TIMEOUT})",
    )  # fmt: skip
    parser.add_argument("--quiet", action="store_true", help="print nothing but errors")
    return parser


def main(argv: list[str] | None = None) -> int:
    return run_job(build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
