"""The entry points of a replay-safety check: ``check_replay_safety(builder, config)`` (any
builder, any scenario), ``check_decode_step`` (a scenario's decode step end to end) and
``run_plan`` (a planned check, as a child process runs its parent's). Each plans the check
once (``plan``) and hands it to the pipeline (``pipeline.run_pipeline``) with its bench:
``table_bench.TableBench`` (the builder's outputs compared exactly with the checker's model)
or ``decode_step.StepBench`` (the attention's output); a scenario with ``kv_groups`` runs once
a group (``kv_groups``). Only passed properties count (``Report.safe``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypedDict

import torch

from ..consumers.reader import Reader
from ..graph.runner import GraphRunner
from .config import CheckConfig
from .pipeline.kv_groups import GroupRuns
from .pipeline.phases import run_pipeline
from .pipeline.state import CheckHooks
from .pipeline.step_bench import StepBench
from .pipeline.table_bench import TableBench, start_run
from .plan import CheckPlan, plan_check, resolve_reader
from .reports.report import Report

__all__ = ["check_decode_step", "check_replay_safety", "run_decode_step", "run_plan"]


class _Options(TypedDict):
    """``run_plan``'s options that every group's ``_run_one`` gets as given."""

    device: str | torch.device | None
    runner_factory: Callable[..., GraphRunner] | None
    on_phase: Callable[[str], None] | None
    stop_on_failure: bool
    explain_replays: bool


def check_replay_safety(
    builder: Callable[..., object] | str = "build_page_table",
    config: CheckConfig | None = None,
    *,
    device: str | torch.device | None = None,
    progress: Callable[[int, int], None] | None = None,
    runner_factory: Callable[..., GraphRunner] | None = None,
    on_phase: Callable[[str], None] | None = None,
    on_chunk: Callable[[Report], None] | None = None,
    stop_on_failure: bool = False,
    explain_replays: bool = False,
    reader: Reader | Callable[..., object] | str | None = None,
    **overrides: object,
) -> Report:
    """Capture ``builder`` over the config's buckets, replay the workload, check every replay.

    Args:
        builder: a callable with the builder signature, a built-in name or ``module:fn``.
        config: the setup (``CheckConfig``); ``overrides`` replace its fields.
        device: default CUDA when present, else the CPU (eager, Triton interpreter).
        progress: called as ``progress(done, total)`` after each replay.
        runner_factory: makes the runner under test, with ``GraphRunner``'s arguments
            (default ``GraphRunner``): the checker judges any runner by what it was asked.
        on_phase: called with the phase reached (``"capture"``, ``"replay 17"``, ...), for
            a supervisor that must say where a crashed run stopped.
        on_chunk: called with the report so far after each chunk of replays is judged (a
            supervisor keeps it, so a crash later loses nothing already found).
        stop_on_failure: stop after the first chunk in which a property failed (mutation
            runs: one failure decides the verdict); the rest is reported incomplete.
        explain_replays: note each replay's bucket and out-of-contract rows through
            ``on_phase`` and wait for the device after each replay (slow), so a supervisor
            can say which replay a crash came from.
        reader: the decode step's reader (a ``pagegraph.consumers.reader.Reader``, an
            attention call with ``paged_decode_attention``'s signature, or ``module:name``
            naming either), for a config with a consumer; default: pagegraph's attention of
            the consumer's format.

    A config with a ``[consumer]`` (``cfg.consumer``) runs the decode step end to end
    (``pagegraph.check.checker.check_decode_step``: the builder and the attention in one
    graph, judged on the attention's output) and returns its ``Report``, with the step's
    section; ``on_chunk`` then gets the report after each replay. The config's preset
    outputs that the builder's kind does not have are dropped, as ``pagegraph check
    --builder`` drops them (they describe the scenario's own builder).

    Returns a ``Report``; a misbehaving builder or runner is reported, not raised. Ctrl-C
    raises ``CheckInterrupted`` carrying the report of what was checked so far.
    """
    cfg = (config or CheckConfig()).replace(**overrides)
    plan, fn = plan_check(builder, cfg, reader=reader)
    return run_plan(
        plan, fn, device=device, progress=progress, runner_factory=runner_factory,
        on_phase=on_phase, on_chunk=on_chunk, stop_on_failure=stop_on_failure,
        explain_replays=explain_replays, reader=reader,
    )  # fmt: skip


def run_plan(
    plan: CheckPlan,
    builder: Callable[..., object],
    *,
    device: str | torch.device | None = None,
    progress: Callable[[int, int], None] | None = None,
    runner_factory: Callable[..., GraphRunner] | None = None,
    on_phase: Callable[[str], None] | None = None,
    on_chunk: Callable[[Report], None] | None = None,
    stop_on_failure: bool = False,
    explain_replays: bool = False,
    reader: Reader | Callable[..., object] | str | None = None,
) -> Report:
    """Run a planned check (``plan_check``: validated, nothing validated again here) of
    ``builder`` (resolved from ``plan.builder``): its pipeline's judges (``plan.pipeline``),
    with ``check_replay_safety``'s options. A child process runs its parent's plan this way.
    A config with ``kv_groups`` runs once a group, merged
    (``pagegraph.check.pipeline.kv_groups``)."""
    options: _Options = dict(device=device, runner_factory=runner_factory, on_phase=on_phase,
                             stop_on_failure=stop_on_failure,
                             explain_replays=explain_replays)  # fmt: skip
    if plan.config.kv_groups:
        runs = GroupRuns(plan, builder, progress, on_chunk)
        for group_plan, group_builder, group_progress, group_chunk in runs:
            runs.add(_run_one(group_plan, group_builder, group_progress, group_chunk, reader,
                              **options))  # fmt: skip
        return runs.merged()
    return _run_one(plan, builder, progress, on_chunk, reader, **options)


def _run_one(plan: CheckPlan, builder: Callable[..., object],
             progress: Callable[[int, int], None] | None,
             on_chunk: Callable[[Report], None] | None,
             reader: Reader | Callable[..., object] | str | None, *,
             device: str | torch.device | None,
             runner_factory: Callable[..., GraphRunner] | None,
             on_phase: Callable[[str], None] | None, stop_on_failure: bool,
             explain_replays: bool) -> Report:  # fmt: skip
    """``run_plan`` for a plan of one KV-cache group (every plan without ``kv_groups``)."""
    if plan.pipeline == "step":
        reader = resolve_reader(reader if reader is not None else plan.reader)

        if runner_factory is not None or explain_replays:
            raise ValueError(
                "runner_factory and explain_replays do not apply to a decode-step check "
                "(a config with a consumer)"
            )
        return run_decode_step(
            builder, plan, device=device, progress=progress, on_phase=on_phase,
            on_report=on_chunk, stop_on_failure=stop_on_failure, consumer=reader,
        )  # fmt: skip
    if reader is not None:
        raise ValueError("a reader needs a config with a consumer (a decode-step scenario)")
    hooks = CheckHooks(progress, on_phase, on_chunk, stop_on_failure, explain_replays)
    bench = TableBench(start_run(builder, plan, device, runner_factory or GraphRunner, hooks))
    return run_pipeline(bench, hooks)


def check_decode_step(
    builder: Callable[..., object] | str,
    cfg: CheckConfig,
    *,
    device: str | torch.device | None = None,
    progress: Callable[[int, int], None] | None = None,
    consumer: Callable[..., object] | Reader | None = None,
    on_phase: Callable[[str], None] | None = None,
    on_report: Callable[[Report], None] | None = None,
    stop_on_failure: bool = False,
    emulate: bool | None = None,
) -> Report:
    """Capture ``builder`` + the consumer over the config's buckets, replay the workload and
    judge the attention's output (docs/ARCHITECTURE.md, "The decode step end to end").

    Args:
        builder: a page-table or decode-metadata builder (callable, built-in name or
            ``module:fn``).
        cfg: the setup; ``cfg.consumer`` ("paged" or "csr") picks the format (default
            "paged"), ``cfg.steps`` the replays.
        device: default CUDA when present, else the CPU (eager, shapes shrunk).
        progress: called as ``progress(done, total)`` after each replay.
        consumer: the attention call (``paged_decode_attention``'s or
            ``csr_decode_attention``'s signature; default: pagegraph's kernel of the format),
            or a ``pagegraph.consumers.reader.Reader`` with host launch arguments.
        on_phase: called with the phase reached: ``"capture"``, ``"replay K"``, ``"timing"``.
        on_report: called with the report after setup and after each replay (a partial
            report to keep).
        stop_on_failure: stop after the first replay in which a property failed, the rest
            left incomplete and the timing skipped (mutation testing).
        emulate: without CUDA, replay emulated graphs or, with ``False``, run the step
            eagerly at every replay (``StepGraphs``); default ``cfg.emulate``.

    Returns a ``Report`` with its ``step`` section; a builder or consumer that raises is
    reported, not raised. A stop asked for by a signal (``pagegraph.check.signals``) ends the
    replays early, the report marked incomplete.
    """
    plan, fn = plan_check(builder, cfg.replace(consumer=cfg.consumer or "paged"))
    return run_decode_step(
        fn, plan, device=device, progress=progress, consumer=consumer, on_phase=on_phase,
        on_report=on_report, stop_on_failure=stop_on_failure, emulate=emulate,
    )  # fmt: skip


def run_decode_step(
    fn: Callable[..., object],
    plan: CheckPlan,
    *,
    device: str | torch.device | None = None,
    progress: Callable[[int, int], None] | None = None,
    consumer: Callable[..., object] | Reader | None = None,
    on_phase: Callable[[str], None] | None = None,
    on_report: Callable[[Report], None] | None = None,
    stop_on_failure: bool = False,
    emulate: bool | None = None,
) -> Report:
    """The decode-step check of a planned check (``pagegraph.check.plan``: validated, a
    consumer in its config) of the resolved builder ``fn``; ``check_decode_step``'s options."""
    hooks = CheckHooks(progress, on_phase, on_report, stop_on_failure)
    return run_pipeline(StepBench(fn, plan, device, consumer, hooks, emulate), hooks)
