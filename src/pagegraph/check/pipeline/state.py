"""The state one check shares between its phases: ``CheckRun`` (set-up to report, what
``check_replay_safety``'s phases pass along) and ``ReplayState`` (the replay loop's, built
from a run after capture: the checker's model and verifier, and the tallies it keeps between
two replays)."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np
import torch

from ...detect.probes import BuilderProbe, CompileCounter
from ...detect.ranges import phase
from ...detect.sync_events import SyncEvent
from ...detect.sync_hub import SyncRecorder
from ...graph.buckets import Buckets, resolve_padding
from ...graph.runner import GraphRunner
from ...kernels.contract import cdiv
from ...kinds import KindSpec
from ...workload.decode import Step
from ...workload.pool import KVPool
from ...workload.producer import ProducedWorkload
from ..config import CheckConfig
from ..judges.eager_reads import GraphReads
from ..judges.graph_safety import EagerTwin
from ..judges.protocol import Judge
from ..judges.replay_judge import RecordedComparisons
from ..judges.table_replays import AllocationTally, TableSeen, WatchedBuffers
from ..judges.verify import BatchModel, ModelStep, TableVerifier
from ..reports.report import PropertyResult, Report
from .buffers import CheckBuffers, EngineVectors, allocate_check_buffers, engine_capacity
from .engine_state import EngineState

#: Replays the host may be ahead of the device (checked, then waited for before the next
#: replay). Three, not two: the verification of a whole batch (``TableVerifier``) runs on
#: the device after every ``batch`` replays, a burst longer than one replay's host work, and
#: with two in flight the host waited for it. The verifier's upload ring must hold one more
#: entry than this (``verify.UPLOAD_RING``).
IN_FLIGHT = 3


@dataclass
class CheckHooks:
    """The caller's callbacks and options (see ``check_replay_safety``)."""

    progress: Callable[[int, int], None] | None = None
    on_phase: Callable[[str], None] | None = None
    on_chunk: Callable[[Report], None] | None = None
    stop_on_failure: bool = False
    #: note each replay's bucket and out-of-contract rows, and wait for the device after
    #: each replay, so a crash is pinned to the replay that caused it (slow: a re-run's)
    explain: bool = False

    def note(self, phase: str) -> None:
        """Tell the caller the phase reached (``"capture"``, ``"replay 17"``, ...)."""
        if self.on_phase is not None:
            self.on_phase(phase)


@dataclass
class CheckRun:
    """One check, from set-up to its report. The set-up phase fills the parts below
    ``runner_factory``; every phase judges into ``props`` (the report's own results)."""

    cfg: CheckConfig
    #: the builder under test, resolved
    builder: Callable[..., object]
    #: the builder's kind
    kind: KindSpec
    device: torch.device
    report: Report
    props: dict[str, PropertyResult]
    #: the sync detectors that run, and why none does when there are none
    detectors: tuple[str, ...]
    no_detector_reason: str | None
    hooks: CheckHooks
    runner_factory: Callable[..., GraphRunner]
    pool: KVPool | None = None
    buffers: CheckBuffers | None = None
    compiles: CompileCounter | None = None
    probe: BuilderProbe | None = None
    workload: ProducedWorkload | None = None
    runner: GraphRunner | None = None
    #: the workload's batches, the first already taken by the eager call
    steps: Iterator[Step] | None = None
    #: whether the runner passes ``errors=`` (the config asks and the builder takes it)
    errors: bool = False
    #: the engine state the kind reads between steps (``KindSpec.engine_state``), or None
    engine: EngineState | None = None
    #: ``[bs]`` bool, the rows of the current batch whose engine state a hostile injection
    #: broke (``pagegraph.check.pipeline.engine_state``), or None; drawn from ``engine_rng``
    engine_overrun: np.ndarray | None = None
    engine_rng: np.random.Generator | None = None
    #: the runner's output vectors that are an engine's own buffers, mirrored into the
    #: checker's views around each replay (``pipeline.buffers.EngineVectors``), or None
    engine_vectors: EngineVectors | None = None
    #: why the runner factory could not make the runner (its exception, described), or None
    runner_error: str | None = None

    @property
    def graphs(self) -> bool:
        """Whether the runner captures CUDA graphs (on CUDA) or replays eagerly."""
        return self.device.type == "cuda"

    def no_graph_reason(self) -> str:
        """Why no replay here is more than an eager call of the builder."""
        if self.kind.where == "eager":
            return f"a {self.kind.name} builder runs eagerly, before the graph, not inside it"
        return "nothing was captured: the replays are eager calls of the builder"

    @property
    def emulated(self) -> bool:
        """Whether the runner replays emulated graphs on the CPU (``GraphRunner.emulated``):
        then replays, as with CUDA graphs, never call the builder."""
        return bool(getattr(self.runner, "emulated", False))

    @property
    def len_limit(self) -> int:
        """The longest in-contract row: past it a length is out of the contract."""
        return max(self.cfg.max_context_len, self.cfg.width * self.cfg.page_size)


@dataclass
class ReplayTimes:
    """Host time of the replays: the steady state's start, and per-replay phases in us."""

    #: perf_counter at the steady state's start (the second replay), or None
    t_start: float | None = None
    #: replays before the steady state
    steady_from: int = 0
    workload_us: list[float] = field(default_factory=list)
    checker_us: list[float] = field(default_factory=list)


@dataclass
class ReplayState:
    """Everything the replay loop's steps share (``pagegraph.check.pipeline.replay_loop``)."""

    run: CheckRun
    #: the checker's model of the static inputs each replay must see
    model: BatchModel
    #: exact device verification of every replay's tables, vectors, inputs and counters
    verifier: TableVerifier
    #: replays between two read-backs of the verifier's records
    chunk: int
    watched: WatchedBuffers
    allocations: AllocationTally
    #: ``torch.cuda.memory_allocated`` before the replays (CUDA), else None
    memory_before: int | None
    #: the workload batch of the current replay
    step: Step
    times: ReplayTimes = field(default_factory=ReplayTimes)
    #: model steps replayed whose records are not read yet
    pending: list[ModelStep] = field(default_factory=list)
    #: syncs seen in a stage/* or replay/* range so far
    replay_syncs: list[SyncEvent] = field(default_factory=list)
    #: events recorded after replays the host has not waited for (CUDA)
    in_flight: list[torch.cuda.Event] = field(default_factory=list)
    #: events reused in turn (one more than can be in flight): none is created per replay
    events: list[torch.cuda.Event] = field(default_factory=list)
    #: batch size -> device views of the model's staged inputs, made once per size
    device_batches: dict[int, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)
    #: the running sync recorder (paused outside staging and replay), or None
    recorder: SyncRecorder | None = None
    #: the context that runs the recorder (``record_device_syncs``), exited after the loop
    sync_recording: contextlib.AbstractContextManager[SyncRecorder] | None = None
    #: why the loop stopped before its last replay, or None
    stopped: str | None = None
    #: the signal that interrupted the loop, or None
    interrupted: int | None = None
    #: the eager call each sampled replay is compared with ("graph-safe"), or None where a
    #: replay is no more than an eager call
    twin: EagerTwin | None = None
    #: what the graph read of an eagerly built kind's tables, or None for a kind built in it
    reads: GraphReads | None = None

    #: every judge of the replays, in the order each observes a replay (``replay_loop``)
    judges: list[Judge[TableSeen]] = field(default_factory=list)

    @property
    def comparisons(self) -> list[RecordedComparisons]:
        """The judges that compare a replay with something else (``twin``, ``reads``)."""
        return [j for j in (self.twin, self.reads) if j is not None]

    @property
    def cfg(self) -> CheckConfig:
        return self.run.cfg

    @property
    def props(self) -> dict[str, PropertyResult]:
        return self.run.props

    @property
    def report(self) -> Report:
        return self.run.report

    @property
    def runner(self) -> GraphRunner:
        runner = self.run.runner
        assert runner is not None, "the replays run after set-up"
        return runner

    @property
    def graphs(self) -> bool:
        return self.run.graphs

    @classmethod
    def after_capture(cls, run: CheckRun, first: Step) -> ReplayState:
        """The loop's state once ``run``'s runner has captured, the tables poisoned."""
        graphs, dev = run.graphs, run.device
        runner = run.runner
        assert runner is not None, "the replays start after capture"
        model = _batch_model(run)
        chunk = min(run.cfg.chunk, run.cfg.steps)
        verifier = _table_verifier(run, chunk)
        verifier.poison()
        state = cls(
            run=run,
            model=model,
            verifier=verifier,
            chunk=chunk,
            watched=WatchedBuffers.of(runner),
            allocations=AllocationTally(dev, per_replay=graphs),
            memory_before=None,
            step=first,
            events=[torch.cuda.Event() for _ in range(IN_FLIGHT + 1)] if graphs else [],
        )
        if EagerTwin.applies(run):
            twin_buffers = allocate_check_buffers(run.cfg, run.kind, dev)
            state.twin = EagerTwin(run, chunk, twin_buffers)
            with phase("verify"):
                state.twin.warm_up()
        if GraphReads.applies(runner):
            state.reads = GraphReads(runner, chunk, run.cfg.width)
        if graphs:
            state.allocations.base = state.allocations.read()
            gc.collect()  # dead cycles freed now, not during the replays, where they hide a leak
            state.memory_before = torch.cuda.memory_allocated(dev)
        return state


def _batch_model(run: CheckRun) -> BatchModel:
    """The model of the static inputs, starting from what the runner holds after capture."""
    cfg, runner, pool = run.cfg, run.runner, run.pool
    assert runner is not None and pool is not None, "the model starts after capture"
    policy = resolve_padding(cfg.padding)
    draft_tokens = cfg.draft_tokens if run.kind.tables_include_draft else 0
    capture_lens = runner.seq_lens[: cfg.max_bs].to(torch.int64).cpu().numpy()
    return BatchModel(
        sizes=Buckets(cfg.buckets, cfg.max_bs).sizes,
        max_bs=cfg.max_bs,
        pad_seq_len=policy.seq_len,
        pad_req_pool_index=policy.req_pool_index,
        initial_req_pool_indices=runner.req_pool_indices[: cfg.max_bs].cpu().numpy(),
        len_limit=run.len_limit,
        r2t_rows=pool.req_to_token.shape[0],
        capture_pages=cdiv(int(max(capture_lens.max(), 0)) + draft_tokens, cfg.page_size),
        page_size=cfg.page_size,
        draft_tokens=draft_tokens,
    )


def _table_verifier(run: CheckRun, chunk: int) -> TableVerifier:
    cfg, runner, pool, buffers = run.cfg, run.runner, run.pool, run.buffers
    assert runner is not None and pool is not None and buffers is not None, "after capture"
    return TableVerifier(
        tables=buffers.tables,
        width=cfg.width,
        req_to_token=pool.req_to_token,
        full_to_swa=pool.full_to_swa,
        page_size=cfg.page_size,
        staged=(runner.req_pool_indices, runner.seq_lens),
        errors=runner.errors,
        chunk=chunk,
        use_graph=run.graphs,
        vectors=buffers.vectors,
        draft_tokens=cfg.draft_tokens if run.kind.tables_include_draft else 0,
        preset_outputs=cfg.preset_outputs,  # the kind's only (plan_check)
        error_kinds=len(run.kind.error_kinds),
        kind=run.kind,
        row_strides=buffers.row_strides,
        csr_capacity=engine_capacity(cfg, run.kind),
    )
