"""The check job: what ``pagegraph check`` and ``pagegraph kernel-table`` run. ``run_check``
plans every scenario's check before anything runs (a plan that fails is a usage error), runs
each plan in this process or, for a user's builder, in a child process, and writes the reports
asked for; ``run_check_for_profile`` and ``run_kernel_table`` serve ``pagegraph profile`` and
the kernel table. The command line (``pagegraph.cli``) documents the exit codes
(docs/ARCHITECTURE.md, "One check, from plan to report").
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch

from ..check.checker import run_plan
from ..check.plan import CheckPlan, PlanError, plan_check
from ..check.scenario import load_scenario, scenario_path
from ..check.signals import CheckInterrupted, stop_on_signals, stop_requested
from ..clients.engine_readers import reader_spec_for_child
from ..detect.sync import DetectorUnavailable, parse_detectors
from ..kernels.contract import POISON
from ..kernels.page_table import build_page_table
from ..kernels.registry import builder_spec_for_child
from ..kernels.table_reference import expected_tables
from ..kinds.builders import is_builtin
from ..runtime.device import pick_device
from ..runtime.environment import environment
from ..runtime.progress import Progress
from ..supervise.isolate import IsolatedError, Job, run_isolated, write_json_atomic
from .check_estimate import slow_warning

__all__ = [
    "run_check",
    "run_check_for_profile",
    "run_kernel_table",
    "write_markdown_report",
]

# -- check ------------------------------------------------------------------------------------


class _CheckProgress:
    """Progress lines of the scenarios a check runs, one after another (``Progress``: replays
    done, elapsed, time left), and a heartbeat while a scenario sets up and captures."""

    def __init__(self, plan: _Plan, quiet: bool) -> None:
        self.plan, self.quiet = plan, quiet
        self.current: Progress | None = None
        self.index = -1

    def scenario(self, k: int) -> Progress | None:
        """The progress of scenario ``k``, started when first asked for."""
        if self.quiet:
            return None
        if k != self.index:
            self.index = k
            name, cfg = self.plan.scenarios[k].name, self.plan.checks[k].config
            self.current = Progress(f"pagegraph check: {name}", cfg.steps, "replays")
        return self.current

    def phase(self, k: int, phase: str) -> None:
        """A child's phase note (``run_isolated``'s ``on_phase``): ``replay N`` is N done."""
        p = self.scenario(k)
        if p is None:
            return
        word, _, rest = phase.partition(" ")
        number = rest.split(" ", 1)[0]
        if word == "replay" and number.isdigit():
            p.update(int(number), detail="")
        else:
            p.detail = phase
            p.tick()

    @contextlib.contextmanager
    def heartbeat(self) -> Iterator[_CheckProgress]:
        """While the body runs, the current scenario's line at least every ``EVERY_S``."""
        stop = threading.Event()

        def beat() -> None:
            while not stop.wait(1.0):
                if self.current is not None:
                    self.current.tick()

        thread = threading.Thread(target=beat, name="pagegraph-check-progress", daemon=True)
        if not self.quiet:
            thread.start()
        try:
            yield self
        finally:
            stop.set()
            if thread.is_alive():
                thread.join()


@dataclass
class _Plan:
    """What ``run_check`` validated before running anything: a scenario, its check as
    planned (``plan_check``: the builder as a child resolves it, the config, the reader as a
    child loads it) and the resolved builder, one entry a scenario."""

    scenarios: list[Any]
    checks: list[CheckPlan]
    builders: list[Any]


def _output_problem(option: str, path: str | None) -> str | None:
    """Why a report cannot be written at ``path`` (its folder missing), or None."""
    if path is None:
        return None
    folder = Path(path).resolve().parent
    if not folder.is_dir():
        return f"{option} {path}: the folder {folder} does not exist"
    return None


def _plan(
    scenarios: Any,
    *,
    replays: Any,
    builder: Any,
    detectors: Any,
    workload_process: Any,
    strict: Any,
    json_path: Any,
    markdown_path: Any,
    reader: Any = None,
) -> _Plan:
    """Load every scenario, check the options and plan each check (``plan_check``: the
    scenario's own builder, or ``builder`` put on it, the reader and the memory its tables
    need); ``ValueError`` (a ``ScenarioError``, ``ScenarioNotFound``, ``BuilderLoadError`` or
    ``PlanError`` with the scenario's path among them) on the first problem, before anything
    runs."""
    for problem in (
        _output_problem("--json", json_path),
        _output_problem("--markdown", markdown_path),
    ):
        if problem:
            raise ValueError(problem)
    if replays is not None and replays < 1:
        raise ValueError("--replays must be >= 1")
    loaded = [load_scenario(scenario_path(p)) for p in scenarios]
    dets = None if detectors is None else parse_detectors(detectors)
    reader_spec = None if reader is None else reader_spec_for_child(reader)
    checks, fns = [], []
    for s in loaded:
        cfg = s.config
        if replays is not None:
            cfg = cfg.replace(steps=replays)
        if dets is not None:
            cfg = cfg.replace(detectors=dets)
        if workload_process is not None:
            cfg = cfg.replace(workload_process=workload_process)
        if strict is not None:
            cfg = cfg.replace(strict=tuple(dict.fromkeys((*cfg.strict, *parse_strict(strict)))))
        _refuse_detectors(s.path, cfg.detectors)
        spec = builder or s.builder
        try:
            check, fn = plan_check(
                spec,
                cfg,
                spec=builder_spec_for_child(spec),
                reader=reader_spec,
                own_builder=builder is None,
                fit_memory=True,
            )
        except PlanError as exc:
            raise ValueError(f"{s.path}: {exc}") from None
        checks.append(check)
        fns.append(fn)
    return _Plan(loaded, checks, fns)


def _refuse_detectors(path: Any, detectors: Any) -> None:
    """A ``ValueError`` when a detector asked for by name cannot run here: a usage error
    before anything runs (and before a slow scenario is announced)."""
    from ..detect.sync_record import refuse_unavailable

    if detectors and detectors != "auto":
        try:
            refuse_unavailable(cast(tuple[str, ...], parse_detectors(detectors)))  # not auto
        except DetectorUnavailable as exc:
            raise ValueError(f"{path}: {exc}") from None


def run_check(
    scenarios: list[str],
    *,
    replays: int | None = None,
    builder: str | None = None,
    detectors: str | None = None,
    workload_process: str | None = None,
    json_path: str | None = None,
    markdown_path: str | None = None,
    quiet: bool = False,
    isolate: bool | None = None,
    strict: list[str] | None = None,
    reader: str | None = None,
) -> int:
    """``pagegraph check``: check ``scenarios`` (names of shipped scenarios or paths) and
    return the exit code (see ``pagegraph.cli.CHECK_DESCRIPTION``). ``isolate``: run each
    scenario in a child process (default: when the builder is a user's ``module:function``).
    ``workload_process``: overrides the scenarios' ``[check] workload_process``. ``strict``:
    advice promoted to failures."""
    try:
        plan = _plan(
            scenarios,
            replays=replays,
            builder=builder,
            detectors=detectors,
            workload_process=workload_process,
            strict=strict,
            json_path=json_path,
            markdown_path=markdown_path,
            reader=reader,
        )
    except ValueError as exc:  # a bad file, option or builder must not leave a half-run
        print(f"pagegraph check: {exc}", file=sys.stderr)
        return 2
    if isolate is None:
        isolate = any(c.reader is not None or not is_builtin(c.builder) for c in plan.checks)
    device = pick_device(None).type
    for scenario, check in zip(plan.scenarios, plan.checks):
        warning = slow_warning(scenario.name, check.config, device)
        if warning:  # before it starts: the user may rather shorten it
            print(warning, file=sys.stderr, flush=True)
    results: list[Any] = []

    def show(scenario: Any, report: Any) -> None:
        results.append((scenario, report))
        if not quiet:
            print(f"## {scenario.name} ({scenario.path})")
            if scenario.description:
                print(scenario.description)
            print()
            print(report.format())
            print()

    # SIGINT and SIGTERM ask the check to stop between two replays (stop_on_signals).
    with stop_on_signals():
        try:
            run = _run_isolated if isolate else _run_in_process
            progress = _CheckProgress(plan, quiet)
            with progress.heartbeat():
                interrupted = run(plan, show, results, progress)
        except _UsageError as exc:
            print(f"pagegraph check: {exc}", file=sys.stderr)
            return 2
        except KeyboardInterrupt as exc:  # anywhere else
            interrupted = stop_requested() or getattr(exc, "signum", signal.SIGINT)
    return _finish(plan, results, interrupted, json_path, markdown_path)


class _UsageError(Exception):
    """A problem found only once the check started (a detector that cannot run here)."""


def _run_isolated(plan: _Plan, show: Any, results: Any, progress: _CheckProgress) -> int | None:
    """Each scenario in a child process; the signal number if interrupted, else None."""
    jobs = [Job.planned(check, s.name) for s, check in zip(plan.scenarios, plan.checks)]
    try:
        run_isolated(
            jobs, on_report=lambda k, r: show(plan.scenarios[k], r), on_phase=progress.phase
        )
    except IsolatedError as exc:
        raise _UsageError(str(exc)) from None
    except KeyboardInterrupt as exc:
        done = len(results)
        for s, r in zip(plan.scenarios[done:], getattr(exc, "reports", [])[done:]):
            show(s, r)
        return getattr(exc, "signum", signal.SIGINT)
    return None


def _run_in_process(plan: _Plan, show: Any, results: Any, scenarios: _CheckProgress) -> int | None:
    """Each scenario in this process; the signal number if interrupted, else None."""
    for k, (scenario, fn, check) in enumerate(zip(plan.scenarios, plan.builders, plan.checks)):
        p = scenarios.scenario(k)
        progress = None if p is None else (lambda done, total, p=p: p.update(done))
        try:
            report = run_plan(check, fn, progress=progress)
        except DetectorUnavailable as exc:
            raise _UsageError(f"{scenario.path}: {exc}") from None
        except CheckInterrupted as exc:
            show(scenario, exc.report)
            return exc.signum
        show(scenario, report)
        if stop_requested() is not None:  # between two scenarios
            return stop_requested()
    return None


def _finish(plan: _Plan, results: Any, interrupted: Any, json_path: Any, markdown_path: Any) -> int:
    """The summary line and the reports; the exit code."""
    safe = sum(r.safe for _, r in results)
    line = f"pagegraph check: {safe}/{len(results)} scenario(s) safe"
    if interrupted is not None:
        name = "SIGTERM" if interrupted == signal.SIGTERM else "SIGINT"
        line += f"; interrupted by {name}: {len(plan.scenarios) - len(results)} not started"
    print(line)
    if json_path:
        doc = {
            "environment": environment(),
            "complete": interrupted is None and all(r.stopped is None for _, r in results),
            "interrupted": None if interrupted is None else int(interrupted),
            "scenarios": [{"name": s.name, "path": s.path, **r.to_dict()} for s, r in results],
        }
        write_json_atomic(json_path, doc)
    if markdown_path:
        write_markdown_report(markdown_path, results, incomplete=interrupted is not None)
    if interrupted is not None:
        return 128 + int(interrupted)
    return 0 if all(r.safe for _, r in results) else 1


def write_markdown_report(path: str | Path, results: Any, incomplete: bool = False) -> None:
    """A markdown report with, where matplotlib is present, a PNG of replay latency per
    bucket beside it (``PATH`` with suffix ``.png``)."""
    path = Path(path)
    env = environment()
    lines = ["# pagegraph check", "", f"{env['date']} on {env['device']}", ""]
    if incomplete:
        lines += ["**Incomplete: the run was interrupted; what follows is what was checked.**", ""]
    for scenario, report in results:
        lines += [f"## {scenario.name}", "", scenario.description, "", report.format(), ""]
    png = path.with_suffix(".png")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 4))
        for scenario, report in results:
            stats = sorted(report.buckets.values(), key=lambda b: b.bucket)
            ax.plot(
                [b.bucket for b in stats],
                [b.median_replay_us for b in stats],
                marker="o",
                label=scenario.name,
            )
        ax.set_xlabel("batch bucket")
        ax.set_ylabel("replay() wall time, median (us)")
        ax.set_xscale("log", base=2)
        ax.grid(True, alpha=0.3)
        ax.legend()
        ax.set_title(f"replay latency per bucket ({env['device']})")
        fig.tight_layout()
        fig.savefig(png, dpi=120)
        plt.close(fig)
        lines += [f"![replay latency per bucket]({png.name})", ""]
    except ImportError:
        lines += ["(matplotlib not installed: no plot)", ""]
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text("\n".join(lines))
    tmp.replace(path)


def run_check_for_profile(scenario: str, replays: int | None = None) -> int:
    """``check`` as ``pagegraph profile`` runs it in-process (torch detector only: CUPTI has
    one subscriber per process, and a profiler is it)."""
    return run_check([scenario], replays=replays, detectors="torch", quiet=False)


def parse_strict(names: list[str]) -> tuple[str, ...]:
    """``--strict`` values as advice names (``all`` for every advice); ``ValueError`` on an
    unknown one."""
    from ..check.config import ADVICE

    out: list[str] = []
    for name in names:
        if name == "all":
            out.extend(ADVICE)
        elif name in ADVICE:
            out.append(name)
        else:
            raise ValueError(f"--strict {name!r}: not an advice (known: all, {', '.join(ADVICE)})")
    return tuple(dict.fromkeys(out))


# -- kernel-table -----------------------------------------------------------------------------


def run_kernel_table() -> int:
    """The kernel against the reference over a default set of shapes, on whatever device is
    present (the Triton interpreter on a CPU). Exit 1 on any mismatch."""
    cuda = torch.cuda.is_available()
    dev = "cuda" if cuda else "cpu"
    shapes = (
        [
            (8, 4096, 64, False),
            (64, 32768, 64, False),
            (256, 131072, 64, False),
            (256, 32768, 1, False),
            (128, 65536, 16, True),
            (256, 131072, 256, False),
            (17, 3000, 3, True),
        ]
        if cuda
        else [(4, 256, 16, False), (7, 300, 3, True), (17, 128, 1, False), (3, 1024, 64, True)]
    )
    print(f"kernel vs reference on {environment()['device']}")
    print("| bs | max context | page size | SWA | exact | eager us |")
    print("|---:|---:|---:|:---:|:---:|---:|")
    gen = torch.Generator().manual_seed(0)
    failures = 0
    for bs, ctx, ps, swa in shapes:
        width = -(-ctx // ps)
        num_slots = (bs + 1) * width * ps + 1
        r2t = torch.randint(0, num_slots, (bs + 1, ctx), generator=gen, dtype=torch.int32).to(dev)
        rpi = torch.randperm(bs + 1, generator=gen)[:bs].to(dev)
        sl = torch.randint(0, ctx + 2 * ps, (bs,), generator=gen).to(dev)
        f2s = torch.randint(0, num_slots, (num_slots + 1,), generator=gen).to(dev) if swa else None
        pt = torch.full((bs, width), POISON, dtype=torch.int32, device=dev)
        kw: dict[str, Any] = {}
        if swa:
            kw = {"swa_page_table": torch.full_like(pt, POISON), "full_to_swa": f2s}
        build_page_table(r2t, rpi, sl, pt, ps, **kw)  # warm-up / compile
        t0 = time.perf_counter()
        reps = 20 if cuda else 1
        for _ in range(reps):
            build_page_table(r2t, rpi, sl, pt, ps, **kw)
        if cuda:
            torch.cuda.synchronize()
        us = (time.perf_counter() - t0) / reps * 1e6
        want, want_swa = expected_tables(r2t, rpi, sl, width, ps, f2s)
        swa_want = cast(torch.Tensor, want_swa)  # made with f2s: with swa
        exact = torch.equal(pt, want) and (not swa or torch.equal(kw["swa_page_table"], swa_want))
        failures += not exact
        print(
            f"| {bs} | {ctx} | {ps} | {'yes' if swa else 'no'} | "
            f"{'yes' if exact else 'NO'} | {us:.1f} |"
        )
    if not cuda:
        print("(CPU: Triton interpreter; times are the interpreter's, not a GPU's)")
    return 1 if failures else 0
