"""What the tables' judges read of the replay loop, as typed values this package owns: what
one replay showed (``TableSeen``, with what the host measured of it, ``ReplayMeasure``), the
allocator's tally (``AllocationTally``) and the static buffers' addresses at capture
(``WatchedBuffers``), and the loop's state as the judges read it (``TableReplays``, which
``pagegraph.check.pipeline.state.ReplayState`` provides). The pipeline fills them and calls
the judges; the judges never import the pipeline.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch

from ...detect.probes import AllocationCounter, BuilderCall, cuda_allocations
from ...detect.sync_events import SyncEvent
from ...detect.sync_hub import SyncRecorder
from ...graph.runner import GraphRunner
from ..config import CheckConfig
from ..reports.report import PropertyResult, Report
from .graph_safety import EagerTwin
from .verify import BatchModel, ModelStep, TableVerifier

__all__ = [
    "ALLOCATION_PROBES",
    "AllocationTally",
    "ReplayMeasure",
    "ReplayRun",
    "TableReplays",
    "TableSeen",
    "WatchedBuffers",
]

#: Replays whose allocations are measured one by one before the checker trusts chunks.
ALLOCATION_PROBES = 8


@dataclass
class AllocationTally:
    """Allocator events while staging and replaying, on CUDA.

    Allocator statistics cost tens of microseconds to read: the first ``ALLOCATION_PROBES``
    replays are measured one by one (the workload step apart from the replay); if the
    checker's own work between replays allocated nothing there, later replays are measured a
    chunk at a time (any allocation in a chunk is then the runner's), else every replay stays
    measured on its own."""

    device: torch.device
    #: measured replay by replay (else a chunk at a time)
    per_replay: bool
    #: the reading at the start of the current chunk (chunk at a time)
    base: int = 0
    #: allocations during staging + replay so far
    total: int = 0
    #: allocations by the workload step between replays, while measured replay by replay
    workload: int = 0

    def read(self) -> int:
        """The caching allocator's allocation count on the device now (0 without CUDA)."""
        return cuda_allocations(self.device)


@dataclass
class WatchedBuffers:
    """The checker's own record of every static buffer's address after capture. Checked
    after every replay: each buffer there at capture still at its address, and none of those
    absent at capture (None) now set."""

    #: (attribute of the runner, its data_ptr at capture)
    live: list[tuple[str, int]]
    absent: list[str]

    @classmethod
    def of(cls, runner: GraphRunner) -> WatchedBuffers:
        """The record of ``runner``'s static buffers as they are now (after capture)."""
        # Every buffer a graph reads or writes (the runner's, the kind's derived inputs, the
        # engine state's): a runner's own list, as its address check keeps it.
        watched = dict(runner.static_buffers())
        return cls(
            [(k, t.data_ptr()) for k, t in watched.items() if t is not None],
            [k for k, t in watched.items() if t is None],
        )


@dataclass
class ReplayMeasure:
    """What the replay step measured of one replay (staging included)."""

    #: host time of ``runner.replay``, in us
    dt_us: float
    #: allocator events, when measured replay by replay (else 0)
    allocations: int
    #: the torch operators' allocations, on an eager run (else None)
    counter: AllocationCounter | None
    #: the sync recorder's event count before the replay
    syncs_before: int
    #: the builder's own calls during an eager replay (their allocations are advice)
    builder_calls: list[BuilderCall] = field(default_factory=list)


@dataclass
class TableSeen:
    """What one replay of the tables' check showed its judges: its index, its record slot in
    the chunk, the checker's model of it and what the replay measured on the host."""

    index: int
    slot: int
    mstep: ModelStep
    measured: ReplayMeasure


class ReplayRun(Protocol):
    """What the judges read of the check around the replays
    (``pagegraph.check.pipeline.state.CheckRun``)."""

    @property
    def emulated(self) -> bool: ...
    @property
    def detectors(self) -> tuple[str, ...]: ...
    @property
    def no_detector_reason(self) -> str | None: ...
    def no_graph_reason(self) -> str: ...


class TableReplays(Protocol):
    """The replay loop's state as the tables' judges read it
    (``pagegraph.check.pipeline.state.ReplayState``): the report and its properties, the
    checker's model and verifier, the replays whose records are not read yet (``pending``),
    and the tallies kept between two replays (``replay_syncs``: the syncs seen in a stage/*
    or replay/* range so far, which the judges extend)."""

    @property
    def run(self) -> ReplayRun: ...
    @property
    def cfg(self) -> CheckConfig: ...
    @property
    def props(self) -> dict[str, PropertyResult]: ...
    @property
    def report(self) -> Report: ...
    @property
    def runner(self) -> GraphRunner: ...
    @property
    def graphs(self) -> bool: ...
    @property
    def model(self) -> BatchModel: ...
    @property
    def verifier(self) -> TableVerifier: ...
    @property
    def watched(self) -> WatchedBuffers: ...
    @property
    def allocations(self) -> AllocationTally: ...
    @property
    def memory_before(self) -> int | None: ...
    @property
    def pending(self) -> list[ModelStep]: ...
    @property
    def replay_syncs(self) -> list[SyncEvent]: ...
    @property
    def recorder(self) -> SyncRecorder | None: ...
    @property
    def stopped(self) -> str | None: ...
    @property
    def twin(self) -> EagerTwin | None: ...
