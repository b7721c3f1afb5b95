"""The entry points of a replay-safety check: ``check_replay_safety(builder, config)`` (any
builder, any scenario), ``check_decode_step`` (a scenario's decode step end to end) and
``run_plan`` (a planned check, as a child process runs its parent's). Each plans the check
once (``plan``) and hands it to the pipeline (``pipeline.phases.run_pipeline``) with its
bed: ``pipeline.table_bed.TableBed`` (the builder's outputs compared exactly with the
checker's model) or ``pipeline.step_bed.StepBed`` (the attention's output); a scenario
with ``kv_groups`` runs once a group (``pipeline.group_checks``). Only passed properties count.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch

from ..consumers.formats import DEFAULT_FORMAT
from ..consumers.reader import Reader
from ..graph.runner import GraphRunner
from .config import CheckConfig
from .pipeline.group_checks import GroupRuns
from .pipeline.phases import run_pipeline
from .pipeline.state import CheckHooks
from .pipeline.step_bed import StepBed
from .pipeline.table_bed import TableBed, start_run
from .plan import CheckPlan, plan_check, resolve_reader
from .reports.report import Report

__all__ = ["check_decode_step", "check_replay_safety", "run_plan"]


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
            Output vectors it allocates itself, as an engine does, it declares with
            ``pagegraph.kernels.declarations.declare_runner_factory(factory,
            engine_buffers=(...))`` (names of its kind's vectors): the checker passes none
            of its own under those names and judges the engine's. A
            factory that raises fails "capture" with the exception.
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

    A config with a ``[consumer]`` runs the decode step end to end (``check_decode_step``),
    ``on_chunk`` then called after each replay. The builder is planned as one put on the
    scenario: the preset outputs its kind lacks are dropped (``pagegraph.check.plan``).

    Returns a ``Report``; a misbehaving builder or runner is reported, not raised. Ctrl-C
    raises ``CheckInterrupted`` carrying the report of what was checked so far.
    """
    cfg = (config or CheckConfig()).replace(**overrides)
    plan, fn = plan_check(builder, cfg, reader=reader)
    return run_plan(
        plan,
        fn,
        device=device,
        progress=progress,
        runner_factory=runner_factory,
        on_phase=on_phase,
        on_chunk=on_chunk,
        stop_on_failure=stop_on_failure,
        explain_replays=explain_replays,
        reader=reader,
    )


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
    (``pagegraph.check.pipeline.group_checks``)."""
    hooks = CheckHooks(progress, on_phase, on_chunk, stop_on_failure, explain_replays)
    if plan.config.kv_groups:
        runs = GroupRuns(plan, builder, progress, on_chunk)
        for group_plan, group_builder, group_progress, group_chunk in runs:
            group_hooks = dataclasses.replace(hooks, progress=group_progress, on_chunk=group_chunk)
            runs.add(
                _run_one(group_plan, group_builder, group_hooks, reader, device, runner_factory)
            )
        return runs.merged()
    return _run_one(plan, builder, hooks, reader, device, runner_factory)


def _run_one(
    plan: CheckPlan,
    builder: Callable[..., object],
    hooks: CheckHooks,
    reader: Reader | Callable[..., object] | str | None,
    device: str | torch.device | None,
    runner_factory: Callable[..., GraphRunner] | None,
) -> Report:
    """``run_plan`` for a plan of one KV-cache group (every plan without ``kv_groups``)."""
    if plan.pipeline == "step":
        if runner_factory is not None or hooks.explain:
            raise ValueError(
                "runner_factory and explain_replays do not apply to a decode-step check "
                "(a config with a consumer)"
            )
        reader = resolve_reader(reader if reader is not None else plan.reader)
        return run_pipeline(StepBed(builder, plan, device, reader, hooks, None), hooks)
    if reader is not None:
        raise ValueError("a reader needs a config with a consumer (a decode-step scenario)")
    bed = TableBed(start_run(builder, plan, device, runner_factory or GraphRunner, hooks))
    return run_pipeline(bed, hooks)


def check_decode_step(
    builder: Callable[..., object] | str,
    cfg: CheckConfig,
    *,
    device: str | torch.device | None = None,
    progress: Callable[[int, int], None] | None = None,
    consumer: Callable[..., object] | Reader | str | None = None,
    on_phase: Callable[[str], None] | None = None,
    on_report: Callable[[Report], None] | None = None,
    stop_on_failure: bool = False,
    emulate: bool | None = None,
) -> Report:
    """Capture ``builder`` + the consumer over the config's buckets, replay the workload and
    judge the attention's output (docs/ARCHITECTURE.md, "The decode step end to end").

    Args:
        builder, device, progress, stop_on_failure: as ``check_replay_safety``'s (without
            CUDA the shapes are shrunk; a stop on failure skips the timing too).
        cfg: the setup; ``cfg.consumer`` (a name in ``pagegraph.consumers.formats.FORMATS``,
            default ``DEFAULT_FORMAT``) picks the reader format.
        consumer: the attention call (the signature of the format's kernel; default
            pagegraph's of the format), a ``Reader``, or a reader's name
            (``resolve_reader``: "sglang:triton_decode", ``module:name``); default: the
            config's ``reader``, else pagegraph's attention of the format.
        on_phase, on_report: ``check_replay_safety``'s ``on_phase`` (``"timing"`` too) and
            ``on_chunk`` (the report after setup and after each replay).
        emulate: without CUDA, replay emulated graphs or (``False``) run the step eagerly at
            every replay; default ``cfg.emulate``.

    Returns a ``Report`` with its ``step`` section; a builder or consumer that raises is
    reported, not raised; a stop asked for by a signal raises ``CheckInterrupted``.
    """
    named = consumer if isinstance(consumer, str) else None
    plan, fn = plan_check(
        builder, cfg.replace(consumer=cfg.consumer or DEFAULT_FORMAT), reader=named
    )
    reader = consumer if consumer is not None and not isinstance(consumer, str) else None
    if reader is None:
        reader = resolve_reader(plan.reader)  # the name given, or the scenario's reader
    hooks = CheckHooks(progress, on_phase, on_report, stop_on_failure)
    return run_pipeline(StepBed(fn, plan, device, reader, hooks, emulate), hooks)
