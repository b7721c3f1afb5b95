"""The tables pipeline's bed (``TableBed``, run by ``pagegraph.check.pipeline.phases``): the
builder's eager calls, its capture into the runner under test, and the replays of
``replay_loop``, every replay's outputs compared exactly with the checker's model.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence

import numpy as np
import torch

from ...detect.probes import BuilderProbe, CompileCounter, measure_eager_call
from ...detect.ranges import phase
from ...graph.builder_names import builder_name
from ...graph.runner import GraphRunner
from ...kinds.builders import builder_capabilities
from ...runtime.device import pick_device
from ...workload.decode import Step
from ...workload.pool import KVPool
from ...workload.producer import ProducedWorkload
from ..config import INDEX_DTYPES, PRODUCER_MIN_STEPS, PROPERTIES, CheckConfig
from ..judges.aliasing import judge_aliasing
from ..judges.table_judges import (
    describe_exception,
    judge_builder_calls,
    judge_eager_call,
    judge_eager_call_raised,
    record_how_judged,
    sync_capture_cause,
)
from ..planned import CheckPlan
from ..reports.report import PropertyResult, Report
from ..run_end import TABLE_BED_PROPERTIES
from .buffers import EngineVectors, allocate_check_buffers, engine_buffers
from .engine_state import make_engine_state, update_engine_state
from .phases import LoopEnd, fail_capture, record_capture
from .replay_loop import end_replays, replay_one, start_replays, stop_recording
from .state import CheckHooks, CheckRun, ReplayState
from .workload_setup import pool_kwargs, workload_kwargs

__all__ = ["TableBed", "resolve_detectors", "start_run"]


class TableBed:
    """The tables pipeline (``pagegraph.check.pipeline.phases.Bed``): the builder's outputs after
    every replay compared exactly with the checker's model, by the phases below."""

    def __init__(self, run: CheckRun) -> None:
        self.run = run
        self.report = run.report
        self.props = run.props
        self.steps = run.cfg.steps
        self._first: Step | None = None
        self._state: ReplayState | None = None

    def set_up(self) -> None:
        _allocate(self.run)
        self._first = _start_workload_and_runner(self.run)
        if self.run.runner is not None:
            # Before anything runs: outputs that share memory make every later value suspect.
            judge_aliasing(self.run.props["outputs unaliased"], self.run.runner, self.run.kind)

    def capture(self) -> bool:
        assert self._first is not None, "set_up takes the first batch"
        if self.run.runner_error is not None:
            what = f"the runner factory raised {self.run.runner_error}"
            fail_capture(self.report, self.props, what, TABLE_BED_PROPERTIES)
            return False
        return _probe_eager_call(self.run, self._first) and _capture(self.run)

    def start_replays(self) -> None:
        assert self._first is not None, "set_up takes the first batch"
        self._state = ReplayState.after_capture(self.run, self._first)
        start_replays(self._state)

    def replay_one(self, i: int) -> bool:
        assert self._state is not None, "start_replays makes the replays' state"
        return replay_one(self._state, i)

    def end_replays(self, end: LoopEnd) -> None:
        assert self._state is not None, "start_replays makes the replays' state"
        end_replays(self._state, end)

    def after_replays(self) -> None:
        pass

    def release(self) -> None:
        if self._state is not None:
            stop_recording(self._state)
        _release(self.run)

    def finish(self) -> None:
        _judge_capabilities(self.run)  # also in the report an interruption carries
        record_how_judged(self.run.report)


# -- the phases, in order ------------------------------------------------------------------------


def start_run(
    fn: Callable[..., object],
    plan: CheckPlan,
    device: str | torch.device | None,
    runner_factory: Callable[..., GraphRunner],
    hooks: CheckHooks,
) -> CheckRun:
    """The device and the detectors for a planned check; an empty report with every
    property passing until judged."""
    cfg, kind = plan.config, plan.kind_spec
    dev = pick_device(device)
    report = Report(builder_name(fn), cfg, str(dev), "cuda" if dev.type == "cuda" else "none")
    detectors, no_detector_reason = resolve_detectors(cfg.detectors, dev)
    report.detectors = detectors
    props = {name: PropertyResult(name) for name in PROPERTIES}
    report.properties = list(props.values())
    run = CheckRun(
        cfg, fn, kind, dev, report, props, detectors, no_detector_reason, hooks, runner_factory
    )
    run.errors = plan.errors  # decided by plan_check
    return run


def _allocate(run: CheckRun) -> None:
    """The pool, the checker's buffers, and the builder's probe (counting compilations from
    here on, until ``_release``)."""
    run.pool = KVPool(**pool_kwargs(run.cfg), device=run.device)
    run.engine = make_engine_state(run.kind, run.cfg, run.pool, run.device)
    run.engine_rng = np.random.default_rng(run.cfg.seed + 11)
    run.buffers = allocate_check_buffers(run.cfg, run.kind, run.device)
    run.compiles = CompileCounter()
    capabilities = dataclasses.asdict(builder_capabilities(run.builder))
    run.probe = BuilderProbe(
        run.builder, run.device, run.compiles, capabilities, run.kind.call_rows
    )


def _start_workload_and_runner(run: CheckRun) -> Step:
    """Start the workload (before the capture, so child processes generate steps meanwhile),
    make the runner under test, and return the workload's first batch."""
    cfg, pool = run.cfg, run.pool
    assert pool is not None, "after _allocate"
    run.report.workload_in_process = _workload_in_process(cfg, run.device)
    run.workload = ProducedWorkload(
        pool,
        pool_kwargs(cfg),
        workload_kwargs(cfg, run.kind.tables_include_draft, run.len_limit),
        streams=cfg.workload_streams,
        processes=run.report.workload_in_process,
    )
    _make_runner(run)
    run.steps = iter(run.workload)
    first = next(run.steps)
    update_engine_state(run, first, may_break=False)  # the eager probe's batch is in contract
    return first


def _make_runner(run: CheckRun) -> None:
    """The runner under test, from the runner factory with ``GraphRunner``'s arguments: the
    checker's output buffers but those the factory allocates itself (``engine_buffers``),
    which are mirrored into the checker's around each replay (``EngineVectors``). A factory
    that raises (an engine buffer too small for the padded batch, say) leaves no runner and
    ``run.runner_error`` saying why: "capture" fails with it, the check goes on to its
    report."""
    cfg, pool, probe, buffers = run.cfg, run.pool, run.probe, run.buffers
    assert pool is not None and probe is not None and buffers is not None, "after _allocate"
    try:
        engine_own = engine_buffers(run.runner_factory)
        run.runner = run.runner_factory(
            pool.req_to_token,
            max_bs=cfg.max_bs,
            max_context_len=cfg.max_context_len,
            page_size=cfg.page_size,
            buckets=cfg.buckets,
            padding=cfg.padding,
            builder=probe,
            full_to_swa=pool.full_to_swa,
            errors=run.errors,
            index_dtype=INDEX_DTYPES[cfg.index_dtype],
            table_width=cfg.width,
            engine=run.engine,
            **buffers.runner_kwargs(cfg, engine_own),
            **({} if cfg.emulate else {"emulate": False}),  # a custom factory may not take it
        )
    except Exception as exc:  # noqa: BLE001 - a misbehaving runner is reported, not raised
        run.runner_error = describe_exception(exc, run.runner_factory)
        return
    run.engine_vectors = EngineVectors.of(getattr(run.runner, "vectors", {}), buffers)


def _probe_eager_call(run: CheckRun, first: Step) -> bool:
    """The builder's own eager calls: a short one first, as an engine's warm-up is (lengths
    of one token, the capture's), then the measured one on the first real batch: no sync
    (safety), allocations (advice). False (the rest not reached) when the builder raised."""
    from ...detect.sync import DetectorUnavailable

    buffers, pool, probe = run.buffers, run.pool, run.probe
    assert buffers is not None and pool is not None and probe is not None, "after _allocate"
    warm_up, call = buffers.eager_calls(
        run.builder, run.cfg, pool, first, run.device, engine=run.engine
    )
    try:
        measured = measure_eager_call(warm_up, call, first.bs, run.device, run.detectors)
    except DetectorUnavailable:
        raise
    except Exception as exc:  # noqa: BLE001 - a builder that raises is reported, not fatal
        run.report.stopped = judge_eager_call_raised(run.props, exc, run.builder)
        return False
    probe.eager_call = measured  # its syncs explain a capture that fails on them
    judge_eager_call(run.props, measured, run.detectors, run.no_detector_reason, run.cfg.strict)
    return True


def _capture(run: CheckRun) -> bool:
    """Warm up and capture every bucket, judging the builder's calls; False (the rest
    marked not reached) when the capture raised."""
    props, report = run.props, run.report
    run.hooks.note("capture")
    probe, compiles, runner = run.probe, run.compiles, run.runner
    assert probe is not None and compiles is not None and runner is not None, "after set-up"
    probe.calls.clear()
    t0 = time.perf_counter()
    try:
        with phase("capture"):
            runner.capture()
        if run.graphs:
            torch.cuda.synchronize(run.device)
    except Exception as exc:  # noqa: BLE001 - a builder that raises is reported
        where = probe.current_phase
        # A sync the eager call found just before is what broke the capture: say so.
        what = sync_capture_cause(exc, probe.eager_call, run.builder)
        what = what or f"{where} raised {describe_exception(exc, run.builder)}"
        judge_builder_calls(probe, compiles, props, run.cfg.strict)
        fail_capture(report, props, what, TABLE_BED_PROPERTIES)
        return False
    record_capture(
        report, props["capture"], len(runner.buckets), runner.graphs, run.graphs, run.emulated, t0
    )
    judge_builder_calls(probe, compiles, props, run.cfg.strict)
    # Eager replays run the builder: keep measuring it. Graph replays, emulated ones
    # included, never call it.
    probe.measure = run.kind.where == "eager" or not (run.graphs or run.emulated)
    if run.hooks.on_chunk is not None:  # a supervisor keeps what the capture found
        run.hooks.on_chunk(report)
    return True


def _judge_capabilities(run: CheckRun) -> None:
    """A scenario with error counters and a builder without ``errors=``: the counters are
    pagegraph's own extension, so they are skipped, with the reason (a failure only when
    ``strict`` promotes that advice)."""
    prop = run.props["error counters"]
    if not run.cfg.errors or run.errors or prop.status == "incomplete":
        return
    why = (
        "the builder takes no errors= (pagegraph's own extension, which most builders lack): "
        "its out-of-contract counts are not checked"
    )
    if "error-counters" in run.cfg.strict:
        prop.fail(why)
        prop.detail = why
    else:
        prop.skip(why)


def _release(run: CheckRun) -> None:
    if run.compiles is not None:
        run.compiles.stop()
    if run.workload is not None:
        run.workload.close()
    if run.runner is not None:
        try:
            run.runner.close()
        except Exception:  # noqa: BLE001 - a dead CUDA context: nothing left to release
            pass


# -- set-up functions --------------------------------------------------------------------------


def resolve_detectors(
    spec: str | Sequence[str] | None, device: torch.device | None = None
) -> tuple[tuple[str, ...], str | None]:
    """The detectors to run on ``device`` and, when none runs, why (for the skipped
    properties). ``auto``: torch and cupti for a CUDA device, the cpu detector for a CPU one
    (``pagegraph.detect.sync_record.auto_detectors``)."""
    from ...detect.sync import (
        DetectorUnavailable,
        auto_detectors,
        available_detectors,
        parse_detectors,
    )

    choice = parse_detectors(spec)
    status = available_detectors()
    if choice == "auto":
        names = auto_detectors(device.type if device is not None else None)
        wanted = tuple(name for name in names if status.get(name) is None)
        if wanted:
            return wanted, None
        why = "; ".join(f"{n}: {status.get(n)}" for n in names)
        return (), f"no sync detector can run here ({why})"
    assert not isinstance(choice, str), "parse_detectors: 'auto' or a tuple of names"
    if not choice:
        return (), "detectors off (detectors = none)"
    missing = {name: status.get(name) for name in choice if status.get(name) is not None}
    if missing:
        raise DetectorUnavailable(
            "requested detector(s) cannot run: "
            + "; ".join(f"{name}: {reason}" for name, reason in missing.items())
        )
    return choice, None


def _workload_in_process(cfg: CheckConfig, dev: torch.device) -> bool:
    """Whether the run's workload goes to a child process (``CheckConfig.workload_process``)."""
    if cfg.workload_process == "auto":
        return dev.type == "cuda" and cfg.steps >= PRODUCER_MIN_STEPS
    return cfg.workload_process == "on"
