"""``pagegraph mutate``: the checker against the mutant zoo, and the kill table. Every mutant
(one realistic bug each) and every control is checked over the given scenarios on warm worker
processes (``--fresh-processes``: a fresh child each), each mutant stopped at its first kill
(``--every-scenario``: the whole matrix), the checks too big for every worker at once in
shared memory slots; the reports are ``mutate_report``'s. docs/ARCHITECTURE.md ("Mutation
testing") walks through it. Exit code: 0 when every mutant that ran was killed and every
control is SAFE everywhere, 1 otherwise, 2 for bad usage.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, cast

import torch

from ..check.config import CheckConfig
from ..check.plan import PlanError, plan_check
from ..check.reports.report import Report
from ..check.scenario import ScenarioError, load_scenario, scenario_path, shipped_scenarios
from ..mutants.zoo import CONTROLS, MUTANTS
from ..runtime.progress import Progress
from ..supervise.isolate import IsolatedError, Job, run_isolated
from ..supervise.worker_pool import Task, WorkerPool, task_cost
from .mutate_report import (
    Outcome,
    format_kill_table,
    format_matrix,
    killing_property,
    print_results,
    smallest_killing_set,
    write_image,
    write_json,
    write_markdown,
)

#: Seconds between two heartbeat lines of ``--quiet`` (without it: ``progress.EVERY_S``).
QUIET_EVERY_S = 15.0


#: Replays between two read-backs in mutation runs: small, so a mutant that will crash the
#: process later is usually caught by a property first.
MUTATION_CHUNK = 8


def run_mutate(
    scenarios: list[str],
    *,
    mutants: list[str] | None = None,
    replays: int | None = None,
    jobs: int = 1,
    timeout: float | None = None,
    json_path: str | None = None,
    markdown_path: str | None = None,
    gpu_mutants: bool | None = None,
    quiet: bool = False,
    pool: bool = True,
    png_path: str | None = None,
    every_scenario: bool = False,
) -> int:
    """Run the kill table; see the module docstring. ``gpu_mutants``: also run the mutants
    that can only die on a GPU (default: when CUDA is present). ``pool``: warm worker
    processes (False: a fresh child per builder, every scenario checked). ``png_path``: the
    kill-table image there (default: beside ``markdown_path``). ``every_scenario``: check a
    mutant on every scenario even once killed (the whole matrix; else the warm workers drop
    a mutant's checks not yet started once one killed it)."""
    try:
        if timeout is not None and timeout <= 0:
            raise ValueError("--timeout must be > 0 seconds")
        loaded, names = _load_and_validate(scenarios, mutants, replays, jobs)
    except (ScenarioError, ValueError) as exc:
        print(f"pagegraph mutate: {exc}", file=sys.stderr)
        return 2
    if gpu_mutants is None:
        gpu_mutants = torch.cuda.is_available()
    labels = [s.name for s in loaded]
    outcomes = _initial_outcomes(names, gpu_mutants, loaded)

    t0 = time.monotonic()
    progress = Progress(
        "pagegraph mutate",
        _count_checks(outcomes, loaded, replays),
        "checks",
        every=QUIET_EVERY_S if quiet else 5.0,
    )
    if quiet:
        print(
            f"pagegraph mutate: quiet: {progress.total} checks, a progress line every "
            f"{QUIET_EVERY_S:.0f} s, then the summary",
            file=sys.stderr,
            flush=True,
        )
    try:
        _run_checks(outcomes, loaded, replays, jobs, timeout, quiet, progress, pool, every_scenario)
    except IsolatedError as exc:
        print(f"pagegraph mutate: {exc}", file=sys.stderr)
        return 2
    elapsed = time.monotonic() - t0

    ran = [o for o in outcomes if not o.control and not o.skipped]
    survivors = [o.name for o in ran if not o.killed]
    bad_controls = [
        o.name for o in outcomes if o.control and not o.skipped and not o.safe_everywhere
    ]
    smallest = smallest_killing_set(outcomes, labels)
    not_run = sum(1 for o in outcomes if not o.control and o.skipped)
    partial = any(o.not_checked_after_kill for o in outcomes)
    summary = (
        f"pagegraph mutate: {sum(o.killed for o in ran)}/{len(ran)} mutants killed"
        + (f" ({not_run} not run: see the table)" if not_run else "")
        + ", "
        + f"{len(bad_controls)} control(s) not SAFE, over {len(labels)} scenario(s) in "
        f"{elapsed:.0f} s; "
        + (
            "a killing set among the checks run (a mutant stopped at its first kill; "
            "--every-scenario for the smallest): "
            if partial
            else "smallest killing set: "
        )
        + (", ".join(smallest) or "-")
    )
    table = format_kill_table(outcomes, labels)
    matrix = format_matrix(outcomes, labels)
    print_results(table, matrix, survivors, bad_controls, summary)
    if json_path:
        write_json(json_path, loaded, outcomes, smallest, survivors, bad_controls, elapsed)
    image = write_image(png_path, markdown_path, outcomes, labels, summary)
    if markdown_path:
        write_markdown(markdown_path, summary, table, matrix, image)
    return 1 if survivors or bad_controls else 0


def _run_checks(
    outcomes: list[Outcome],
    loaded: list[Any],
    replays: int | None,
    jobs: int,
    timeout: float | None,
    quiet: bool,
    progress: Progress,
    pool: bool,
    every_scenario: bool,
) -> None:
    """Every builder's checks, on warm workers (``pool``) or a fresh child per builder, the
    outcomes filled in place; ``IsolatedError`` when the children cannot run."""
    with tempfile.TemporaryDirectory(prefix="pagegraph-mutate-") as tmp:
        configs = {j.label: j.config for j in _scenario_jobs(loaded, replays, True)}
        if pool:
            tasks = _pool_tasks(outcomes, loaded, replays, {})
            slots = memory_slots(configs, min(jobs, len(tasks)), Path(tmp))
            tasks = _pool_tasks(outcomes, loaded, replays, slots, first_kill=not every_scenario)
            with progress.heartbeat():
                _check_in_pool(
                    outcomes,
                    loaded,
                    tasks,
                    jobs,
                    timeout,
                    quiet,
                    Path(tmp),
                    progress,
                    first_kill=not every_scenario,
                )
        else:
            workers = min(jobs, sum(1 for o in outcomes if not o.skipped))
            slots = memory_slots(configs, workers, Path(tmp))

            def run_one(k: int) -> Outcome:
                return _check_builder(
                    outcomes[k], k, loaded, slots, replays, timeout, quiet, progress
                )

            with progress.heartbeat(), ThreadPoolExecutor(max_workers=jobs) as threads:
                list(threads.map(run_one, range(len(outcomes))))


def _load_and_validate(
    scenarios: list[str], mutants: list[str] | None, replays: int | None, jobs: int
) -> tuple[list[Any], list[str]]:
    """The loaded scenarios and the mutant names to run; ``ScenarioError`` or ``ValueError``
    for bad usage."""
    loaded = [load_scenario(scenario_path(p)) for p in scenarios]
    names = list(MUTANTS) if mutants is None else list(mutants)
    unknown = [n for n in names if n not in MUTANTS]
    if unknown:
        raise ValueError(f"unknown mutant(s) {unknown}: known are {', '.join(MUTANTS)}")
    if replays is not None and replays < 1:
        raise ValueError("--replays must be >= 1")
    if jobs < 1:
        raise ValueError("--jobs must be >= 1")
    return loaded, names


def _initial_outcomes(
    names: list[str], gpu_mutants: bool, loaded: Sequence[Any] = ()
) -> list[Outcome]:
    """An empty outcome per control, then per mutant (skipped: a GPU-only mutant without
    ``gpu_mutants``)."""
    outcomes = [
        Outcome(name, fn.__doc__.strip().splitlines()[0] if fn.__doc__ else "", True)
        for name, fn in CONTROLS.items()
    ]
    for name in names:
        m = MUTANTS[name]
        o = Outcome(name, m.bug, False)
        if not m.cpu and not gpu_mutants:
            o.skipped = "can only die on a GPU" + (f": {m.gpu_only}" if m.gpu_only else "")
        elif m.needs_detector and (why := _detector_missing(m.needs_detector, loaded)):
            o.skipped = f"only the {m.needs_detector} detector sees it, {why}"
        outcomes.append(o)
    return outcomes


#: What a check's child process holds beside its check's own memory (a CUDA context, the
#: compiled kernels, the caching allocator's slack): counted with each check's estimate.
CHILD_BYTES = 1 << 30


def check_need(cfg: CheckConfig) -> int:
    """Bytes a check of ``cfg`` needs in a mutate run: ``memory_fit.memory_need`` for the
    largest of every kind's builder, plus ``CHILD_BYTES``."""
    from ..check.memory_fit import memory_need
    from ..kinds import KINDS

    return max(memory_need(cfg, kind)[0] for kind in KINDS.values()) + CHILD_BYTES


def memory_slots(configs: dict[str, Any], workers: int, tmp: Path) -> dict[str, tuple[str, ...]]:
    """scenario -> the lock files its checks share (``isolate.memory_slot``), for the
    scenarios whose checks would not fit on every worker at once; ``configs``: scenario ->
    the config its jobs run, ``workers``: how many checks run at once.

    The budget is 80% of the memory the tables live in (the GPU's, or the host's without
    CUDA). A scenario whose check needs (``check_need``) more than half an equal share runs
    in one of ``budget / 2 // need`` slots (at least one), shared by every such scenario: the
    big checks together take at most about half the budget and the others, each under half a
    share, the other half.
    """
    if workers < 2:
        return {}
    try:
        if torch.cuda.is_available():
            total = torch.cuda.get_device_properties(0).total_memory
        else:
            total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (RuntimeError, ValueError, OSError):
        return {}  # no size to budget against: the checks run as they come
    budget = 0.8 * total
    needs = {name: check_need(cfg) for name, cfg in configs.items()}
    big = {name: need for name, need in needs.items() if need > budget / (2 * workers)}
    if not big:
        return {}
    count = max(1, int(budget / 2 // max(big.values())))
    paths = tuple(str(tmp / f"memory-slot-{i}") for i in range(count))
    return {name: paths for name in big}


def _detector_missing(name: str, loaded: Sequence[Any] = ()) -> str | None:
    """Why sync detector ``name`` will not run: it cannot run here (a cheap check: package
    and device), or no scenario of ``loaded`` asks for it (``auto`` does); None if it runs."""
    from ..detect.detector_spec import parse_detectors
    from ..detect.sync_record import HUBS

    why = HUBS[name].unavailable_reason(probe=False)
    if why:
        return f"which cannot run: {why}"
    chosen = [parse_detectors(s.config.detectors) for s in loaded]
    if loaded and not any(d == "auto" or name in d for d in chosen):
        return "and no scenario here runs it (detectors = 'auto' or a list naming it)"
    return None


def _scenario_jobs(
    loaded: list[Any],
    replays: int | None,
    control: bool,
    slots: dict[str, tuple[str, ...]] | None = None,
) -> list[Job]:
    """A job per scenario (builder spec left empty): a mutant stops at its first failing
    chunk, in chunks of at most ``MUTATION_CHUNK`` replays (a decode step: at its first
    failing replay); a control runs every replay. A decode step is not timed: the kill table
    needs only verdicts."""
    out = []
    for s in loaded:
        cfg = s.config
        if cfg.consumer:
            cfg = cfg.replace(timing_iters=0)
        if replays is not None:
            cfg = cfg.replace(steps=replays)
        if not control:
            cfg = cfg.replace(chunk=min(cfg.chunk, MUTATION_CHUNK))
        out.append(
            Job(
                "",
                cfg,
                s.name,
                stop_on_failure=not control,
                memory_slots=(slots or {}).get(s.name, ()),
            )
        )
    return out


def _fitted_jobs(spec: str, scenario_jobs: list[Job], o: Outcome) -> list[Job]:
    """The jobs builder ``spec`` can run, each planned (``plan_check``: a mutant or control is
    put on scenarios not its own, so their presets its kind lacks are dropped); a scenario it
    does not fit (a CSR builder on an SWA scenario) goes into ``o.not_applicable`` with the
    reason."""
    out = []
    for j in scenario_jobs:
        try:
            plan, _ = plan_check(spec, j.config)
        except PlanError as exc:
            o.not_applicable[j.label] = str(exc)
            continue
        out.append(dataclasses.replace(j, builder=spec, config=plan.config, plan=plan))
    return out


def _count_checks(outcomes: list[Outcome], loaded: list[Any], replays: int | None) -> int:
    """How many checks (a builder on a scenario) the run will make."""
    return sum(
        len(_fitted_jobs(_builder_spec(o), _scenario_jobs(loaded, replays, o.control), o))
        for o in outcomes
        if not o.skipped
    )


def _builder_spec(o: Outcome) -> str:
    """How a child process finds the builder: a registry name, else the mutant's path."""
    from ..kinds.builders import is_builtin

    return o.name if is_builtin(o.name) else f"pagegraph.mutants.zoo:{o.name}"


def _check_builder(
    o: Outcome,
    k: int,
    loaded: list[Any],
    slots: dict[str, tuple[str, ...]],
    replays: int | None,
    timeout: float | None,
    quiet: bool,
    progress: Progress | None = None,
) -> Outcome:
    """Check builder number ``k`` over every scenario in a child process, into ``o.reports``
    (a skipped one is left as it is); unless ``quiet``, one line on stderr when it is done;
    each check done advances ``progress``. The
    builder starts at scenario ``k`` (modulo their count), so that builders checked at once
    are mostly on different scenarios (and the big ones' slots are seldom waited for)."""
    if o.skipped:
        return o
    spec = _builder_spec(o)
    scenario_jobs = _scenario_jobs(loaded, replays, o.control, slots)
    js = _fitted_jobs(spec, scenario_jobs, o)
    if not js:
        o.skipped = "no scenario here fits its outputs"
        return o
    start = k % len(js)
    js = js[start:] + js[:start]
    t0 = time.monotonic()
    on_report = None if progress is None else (lambda i, r: progress.advance(detail=o.name))
    done = dict(zip((j.label for j in js), run_isolated(js, timeout=timeout, on_report=on_report)))
    o.reports.update((s.name, done[s.name]) for s in loaded if s.name in done)
    if not quiet:
        _print_progress(o, time.monotonic() - t0)
    return o


def _print_progress(o: Outcome, seconds: float) -> None:
    """One line on stderr: the builder's state once all its checks are done."""
    state = (
        ("SAFE everywhere" if o.safe_everywhere else "NOT SAFE")
        if o.control
        else (
            "killed: " + ", ".join(f"{s} ({p})" for s, p in o.killers().items())
            if o.killed
            else "SURVIVED"
        )
    )
    print(f"{o.name}: {state} ({seconds:.1f} s)", file=sys.stderr)


def _pool_tasks(
    outcomes: list[Outcome],
    loaded: list[Any],
    replays: int | None,
    slots: dict[str, tuple[str, ...]],
    first_kill: bool = False,
) -> list[Task]:
    """A pool task per builder and scenario it fits, keyed ``(outcome index, scenario)``;
    a builder that fits no scenario is marked skipped (its ``not_applicable`` filled in).
    With ``first_kill`` a mutant's big checks wait their turn by cost (``in_cost_order``):
    a cheaper check may kill it first, and they are then dropped."""
    tasks = []
    for k, o in enumerate(outcomes):
        if o.skipped:
            continue
        o.not_applicable.clear()
        js = _fitted_jobs(_builder_spec(o), _scenario_jobs(loaded, replays, o.control, slots), o)
        if not js:
            o.skipped = "no scenario here fits its outputs"
        defer = first_kill and not o.control
        tasks += [Task((k, j.label), j, task_cost(j.config), in_cost_order=defer) for j in js]
    return tasks


def _key(task: Task) -> tuple[int, str]:
    """A pool task's key here: ``(the outcome's index, the scenario's label)``."""
    return cast(tuple[int, str], task.key)


def _check_in_pool(
    outcomes: list[Outcome],
    loaded: list[Any],
    tasks: list[Task],
    jobs: int,
    timeout: float | None,
    quiet: bool,
    tmp: Path,
    progress: Progress | None = None,
    first_kill: bool = False,
) -> None:
    """Run ``tasks`` on ``jobs`` warm workers, into the outcomes' reports (in scenario
    order); unless ``quiet``, a builder's progress line once its last check is done (with
    the seconds its checks took). With ``first_kill``, a mutant's checks not yet started
    are dropped once one of its reports fails a property (``Outcome.not_checked_after_kill``
    names their scenarios): the pool hands out the cheapest tasks first, a mutant's big ones
    too (``_pool_tasks``: ``in_cost_order``), so its expensive scenarios run only while
    nothing cheaper has killed it."""
    left = Counter(_key(t)[0] for t in tasks)
    done: dict[int, dict[str, Report]] = {k: {} for k in left}
    seconds = cast(dict[int, float], Counter())

    def on_report(task: Task, report: Report) -> None:
        k, label = _key(task)
        done[k][label] = report
        seconds[k] += task.seconds
        left[k] -= 1
        if progress is not None:
            progress.advance(detail=f"{outcomes[k].name} on {label}", weight=task.cost)
        o = outcomes[k]
        if first_kill and not o.control and killing_property(report) is not None:
            dropped = pool.drop(lambda t: _key(t)[0] == k)
            left[k] -= len(dropped)
            o.not_checked_after_kill += [_key(t)[1] for t in dropped]
            if progress is not None and dropped:
                progress.forgo(len(dropped), weight=sum(t.cost for t in dropped))
        if left[k] == 0:
            o.reports.update((s.name, done[k][s.name]) for s in loaded if s.name in done[k])
            if not quiet:
                _print_progress(o, seconds[k])

    if progress is not None:  # cheapest first: the estimate counts each check by its cost
        progress.total_weight = sum(t.cost for t in tasks)
    pool = WorkerPool(jobs, tmp / "pool", timeout=timeout, on_report=on_report)
    pool.run(tasks)
    if not quiet:
        print(
            f"pagegraph mutate: {len(tasks)} checks on {pool.started} worker process(es)",
            file=sys.stderr,
        )


def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.description = parser.description or (
        "Check every mutant of the zoo (one realistic builder bug each) and the correct "
        "controls over the scenarios, each builder in a child process, and print the kill "
        "table: which scenario and property caught each mutant. Exit 0 when every mutant that "
        "ran was killed and every control is SAFE, 1 otherwise, 2 for bad usage."
    )
    parser.add_argument(
        "scenarios",
        nargs="*",
        default=None,
        metavar="SCENARIO",
        help="scenario names or TOML files (default: every scenario "
        "shipped with pagegraph, whatever the current folder)",
    )
    parser.add_argument(
        "--mutant",
        action="append",
        dest="mutants",
        metavar="NAME",
        help="run only this mutant (repeatable)",
    )
    parser.add_argument("--replays", type=int, help="replays per scenario (default: its steps)")
    parser.add_argument("--jobs", "-j", type=int, default=1, help="builders checked at once")
    parser.add_argument("--timeout", type=float, help="seconds one check may take")
    parser.add_argument(
        "--json",
        dest="json_path",
        metavar="PATH",
        help="write the kill table and every outcome there as JSON",
    )
    parser.add_argument(
        "--markdown",
        dest="markdown_path",
        metavar="PATH",
        help="write the summary, kill table and scenario matrix there as Markdown",
    )
    parser.add_argument(
        "--png",
        dest="png_path",
        metavar="PATH",
        help="write the kill table as an image there (default: beside "
        "--markdown; needs matplotlib)",
    )
    parser.add_argument(
        "--fresh-processes",
        dest="pool",
        action="store_false",
        help="a fresh child process per builder instead of warm workers "
        "(slower; the reports are the same)",
    )
    parser.add_argument(
        "--every-scenario",
        action="store_true",
        help="check each mutant on every scenario even once one killed it "
        "(the whole matrix and the smallest killing set; slower: by default "
        "a mutant's checks stop at its first kill, cheapest scenarios "
        "first)",
    )
    parser.add_argument(
        "--quiet",
        action="store_true",
        help="only a progress line every 15 s on stderr, then the summary",
    )
    return parser


def run(args: Any) -> int:
    scenarios = args.scenarios or shipped_scenarios()
    return run_mutate(
        scenarios,
        mutants=args.mutants,
        replays=args.replays,
        jobs=args.jobs,
        timeout=args.timeout,
        json_path=args.json_path,
        markdown_path=args.markdown_path,
        quiet=args.quiet,
        pool=args.pool,
        png_path=args.png_path,
        every_scenario=args.every_scenario,
    )
