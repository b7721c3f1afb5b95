"""The tables pipeline's replays: ``replay_one`` (between ``start_replays`` and
``end_replays``), each through five steps over one ``ReplayState``: generate the batch, stage
the checker's model of it, replay the runner (syncs and allocations watched), verify on the
device with no sync, and judge the records a chunk at a time. The pipeline drives the loop
(``pagegraph.check.pipeline.phases.drive_replays``).
"""

from __future__ import annotations

import contextlib
import gc
import time
from collections.abc import Iterator

import numpy as np
import torch

from ...detect.probes import AllocationCounter
from ...detect.ranges import phase
from ...workload.decode import Step
from ..judges.replay_judge import RecordedComparisons
from ..judges.replay_summary import summarise_replays
from ..judges.table_judges import HostJudge, TableVerification, describe_exception
from ..judges.table_replays import ALLOCATION_PROBES, ReplayMeasure, TableSeen
from ..judges.verify import ModelStep
from ..reports.report import PropertyResult
from ..signals import CheckInterrupted, stop_requested
from .engine_state import update_engine_state
from .phases import LoopEnd, ReplayFailed
from .state import IN_FLIGHT, ReplayState

#: a replay's arguments to the runner: the batch's request indices and lengths, as host lists
#: (or arrays) or as ``[n]`` device views of the model's inputs
_ReplayArgs = tuple[list[int] | np.ndarray | torch.Tensor, list[int] | np.ndarray | torch.Tensor]


def start_replays(state: ReplayState) -> None:
    """Before the first replay: the sync recorder started, paused (``end_replays`` stops it)."""
    from ...detect import sync

    detectors = state.run.detectors
    state.sync_recording = sync.record_device_syncs(detectors) if detectors else None
    recording = state.sync_recording
    state.judges = [
        HostJudge(state),
        *(_Comparing(state, comparison) for comparison in state.comparisons),
        TableVerification(state),
    ]
    state.recorder = recording.__enter__() if recording is not None else None
    if state.recorder is not None:
        # Watched while staging and replaying only: the property judges those ranges, and a
        # detector on the workload's and the verification's driver calls only costs time.
        state.recorder.pause()


def stop_recording(state: ReplayState) -> None:
    """The sync recorder stopped (safe to call twice)."""
    recording, state.sync_recording = state.sync_recording, None
    if recording is not None:
        recording.__exit__(None, None, None)


def end_replays(state: ReplayState, end: LoopEnd) -> None:
    """After the loop (``end``: why it ended early, if it did): the replays still pending
    judged, the report's replay properties, rates and host times filled; ``CheckInterrupted``
    when a signal stopped the loop."""
    stop_recording(state)
    state.stopped, state.interrupted = end.stopped, end.interrupted
    _judge_last_chunk(state)
    _record_rates(state)
    after = None
    if state.graphs and state.stopped is None:
        gc.collect()  # what only the cyclic collector frees is not a leak
        after = torch.cuda.memory_allocated(state.run.device)
    summarise_replays(state, after)
    if state.interrupted is not None:
        raise CheckInterrupted(state.report, state.interrupted)


def _wait_for_workload(state: ReplayState) -> None:
    if state.cfg.steps > 1:
        # Every workload child's start-up is over before the steady state begins (its first
        # turn would otherwise stall the replays in the middle of the measurement).
        workload = state.run.workload
        assert workload is not None, "the workload starts at set-up"
        waited_s = workload.wait_started(should_stop=lambda: stop_requested() is not None)
        state.report.workload_start_ms = waited_s * 1e3


def replay_one(state: ReplayState, i: int) -> bool:
    """Replay ``i`` through all five steps; True when it completed a chunk, now judged.
    ``ReplayFailed`` when the replay or the chunk's read-back raised."""
    if i == 0:
        _wait_for_workload(state)
        if stop_requested() is not None:  # asked while waiting: no replay runs
            raise KeyboardInterrupt()
    if i == 1:
        state.times.t_start, state.times.steady_from = time.perf_counter(), 1
    _measure_by_chunk_once_trusted(state, i)
    _generate(state, i)
    t_step = time.perf_counter()
    mstep, args = _stage(state, i)
    if state.run.hooks.explain:
        rows = state.model.describe_rows(mstep)
        state.run.hooks.note(f"replay {i} (bucket {mstep.bucket})" + (f", {rows}" if rows else ""))
    measured = _replay(state, i, mstep, args)
    _verify(state, i, mstep, measured)
    state.times.checker_us.append((time.perf_counter() - t_step) * 1e6 - measured.dt_us)
    if len(state.pending) < state.chunk:
        return False
    try:
        _judge_chunk(state)
    except Exception as exc:  # noqa: BLE001 - e.g. a CUDA context a builder broke
        state.pending.clear()
        raise ReplayFailed(f"reading the records after replay {i} raised {exc!r}") from exc
    return True


def _measure_by_chunk_once_trusted(state: ReplayState, i: int) -> None:
    """After ``ALLOCATION_PROBES`` replays, measure allocations a chunk at a time if the
    workload step between replays allocated nothing (see ``AllocationTally``)."""
    tally = state.allocations
    if state.graphs and tally.per_replay and i == ALLOCATION_PROBES and not tally.workload:
        tally.per_replay = False
        tally.base = tally.read()


def _generate(state: ReplayState, i: int) -> None:
    """Step 1: the workload's batch for replay ``i`` into ``state.step``."""
    t_step = time.perf_counter()
    if i == 0:
        return  # the first batch, already taken for the eager call
    tally = state.allocations
    a0 = tally.read() if tally.per_replay else 0
    with phase("workload"):
        steps = state.run.steps
        assert steps is not None, "the workload's steps start at set-up"
        state.step = next(steps)
        update_engine_state(state.run, state.step)
    if tally.per_replay:
        tally.workload += tally.read() - a0
    state.times.workload_us.append((time.perf_counter() - t_step) * 1e6)


def _stage(state: ReplayState, i: int) -> tuple[ModelStep, _ReplayArgs]:
    """Step 2: the model's expected inputs of replay ``i``, uploaded for the verifier, and the
    runner's arguments (host lists, or ``[n]`` device views of the model's inputs)."""
    step: Step = state.step
    mstep = state.model.stage(i, step.req_pool_indices, step.seq_lens, state.run.engine_overrun)
    state.verifier.upload(state.model, len(state.pending))
    if state.graphs and len(state.in_flight) >= IN_FLIGHT:
        # IN_FLIGHT replays at most: the staging rings never wait (outside the replay path,
        # so this wait is not one of the replay's syncs).
        with phase("verify"):
            state.in_flight.pop(0).synchronize()
    staging = state.cfg.staging
    if staging == "device" or (staging == "mixed" and i % 2 == 1):
        return mstep, _device_batch(state, mstep.n)
    return mstep, (step.req_pool_indices, step.seq_lens)


def _device_batch(state: ReplayState, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``[n]`` views of the verifier's device copy of the model's request indices and
    lengths, made once per batch size (a slice costs a microsecond)."""
    args = state.device_batches.get(n)
    if args is None:
        model_dev, M = state.verifier.model, state.cfg.max_bs
        args = state.device_batches[n] = (model_dev[:n], model_dev[M : M + n])
    return args


def _replay(state: ReplayState, i: int, mstep: ModelStep, args: _ReplayArgs) -> ReplayMeasure:
    """Step 3: ``runner.replay(*args)``, measured; ``ReplayFailed`` when it raised."""
    rec = state.recorder
    before = len(rec.events) if rec is not None else 0
    counter = None if state.graphs else AllocationCounter()
    probe = state.run.probe
    assert probe is not None, "the probe is made at set-up"
    calls_before = len(probe.calls)
    mirror = state.run.engine_vectors
    if mirror is not None:  # the poison into an engine's own buffers, outside the measures
        mirror.push()
    tally = state.allocations
    a0 = tally.read() if tally.per_replay else 0
    t = time.perf_counter()
    if rec is not None:
        rec.resume()
    try:
        if counter is not None:
            with counter:
                state.runner.replay(*args)
        else:
            state.runner.replay(*args)
        if state.run.hooks.explain and state.graphs:
            torch.cuda.synchronize(state.run.device)  # the error surfaces at its replay
    except Exception as exc:  # noqa: BLE001 - reported, then the run stops
        raised = describe_exception(exc, state.run.builder)
        why = f"replay {i} (bucket {mstep.bucket}) raised {raised}"
        injected = state.model.describe_rows(mstep)
        if injected:
            why += f"; the replay's out-of-contract rows: {injected}"
        raise ReplayFailed(why) from exc
    finally:
        if rec is not None:
            rec.pause()
    dt = (time.perf_counter() - t) * 1e6
    allocations = tally.read() - a0 if tally.per_replay else 0
    if mirror is not None:  # what the replay left there, for every judge
        mirror.pull()
    builder_calls = probe.calls[calls_before:]
    del probe.calls[calls_before:]  # eager replays: measured here, not kept
    if state.graphs and not tally.per_replay:  # a chunk's tally is the runner's alone
        tally.base += sum(c.allocations for c in builder_calls)
    return ReplayMeasure(dt, allocations, counter, before, builder_calls)


def _verify(state: ReplayState, i: int, mstep: ModelStep, measured: ReplayMeasure) -> None:
    """Step 4: hand the replay to every judge (``start_replays`` lists them): the host
    judgments, the comparisons, then the verifier's snapshot and comparison queued on the
    device (an event marks it in flight)."""
    seen = TableSeen(i, len(state.pending), mstep, measured)
    for judge in state.judges:
        judge.observe(seen)
    if state.graphs:
        event = state.events[i % len(state.events)]
        event.record()
        state.in_flight.append(event)
    state.pending.append(mstep)


class _Comparing:
    """A comparison (``RecordedComparisons``) as a judge of the tables' replays: each replay it
    wants compared in the ``verify`` range, its work the check's own (an eager twin's call,
    its allocations taken out of the chunk's tally), its records read back when settled."""

    def __init__(self, state: ReplayState, comparison: RecordedComparisons) -> None:
        self.state, self.comparison = state, comparison

    def observe(self, seen: TableSeen) -> None:
        if self.comparison.wanted(seen.mstep):
            with phase("verify"), _untallied(self.state):
                self.comparison.compare(seen.slot, seen.mstep)

    def settle(self, props: dict[str, PropertyResult]) -> None:
        self.comparison.judge(props[self.comparison.property_name])


@contextlib.contextmanager
def _untallied(state: ReplayState) -> Iterator[None]:
    """Allocations made in the block are taken out of the chunk's tally (measured a chunk at
    a time, the tally is the runner's alone)."""
    tally = state.allocations
    counted = state.graphs and not tally.per_replay
    a0 = tally.read() if counted else 0
    yield
    if counted:
        tally.base += tally.read() - a0


def _judge_chunk(state: ReplayState) -> None:
    """Step 5: read back the pending replays' records and judge them."""
    if not state.pending:
        return
    # The last to observe reads back first: the verification, whose snapshot ends a replay's
    # judging, then the comparisons, then the chunk's allocations (after every read-back).
    for judge in reversed(state.judges):
        judge.settle(state.props)
    state.pending.clear()


def _judge_last_chunk(state: ReplayState) -> None:
    """The replays still pending when the loop ended, judged; the caller told."""
    if not state.pending:
        return
    try:
        _judge_chunk(state)
        if state.run.hooks.on_chunk is not None:
            state.run.hooks.on_chunk(state.report)
    except Exception as exc:  # noqa: BLE001 - e.g. a CUDA context a builder broke
        state.stopped = state.stopped or f"reading the records raised {exc!r}"
        state.props["replays completed"].fail(state.stopped)
        state.pending.clear()


def _record_rates(state: ReplayState) -> None:
    """The steady-state rate and the mean host time per replay of each phase."""
    report, times = state.report, state.times
    if times.t_start is not None and report.replays > times.steady_from:
        elapsed = time.perf_counter() - times.t_start
        report.replays_per_s = (report.replays - times.steady_from) / elapsed
    replay_us = [u for b in report.buckets.values() for u in b.replay_us]
    phases = (("workload", times.workload_us), ("replay", replay_us), ("checker", times.checker_us))
    for name, xs in phases:
        if xs:
            report.phase_us[name] = round(float(np.mean(xs)), 1)
    receive_s = getattr(state.run.workload, "receive_s", None)
    if times.workload_us and receive_s is not None:
        # The part of the workload phase spent getting the steps' batches (ProducedWorkload)
        report.phase_us["workload receive"] = round(receive_s / len(times.workload_us) * 1e6, 1)
