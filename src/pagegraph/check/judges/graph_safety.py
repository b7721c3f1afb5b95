""" "graph-safe (captured short, replayed long)": a replay against an eager call on the same
inputs.

docs/ARCHITECTURE.md ("Inside the checker") has the details.
"""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Protocol

import torch

from ...graph.runner import GraphRunner
from ...kernels.contract import POISON
from ...kinds import KindSpec
from ...kinds.builders import builder_capabilities
from ...workload.pool import KVPool
from ..config import CheckConfig
from ..reports.report import Failure, PropertyResult
from .replay_judge import RecordedComparisons
from .verify import CANARY_ROWS, ModelStep, preset_views

#: Replays that are all compared with an eager call; after them one in ``SAMPLE``.
EVERY_REPLAY = 64
SAMPLE = 8


class OutputBuffers(Protocol):
    """The checker's output buffers as the eager twin reads them
    (``pagegraph.check.pipeline.buffers.CheckBuffers``): ``tables``, every table's
    ``[T, max_bs + 2 * CANARY_ROWS, width + pad]`` int32 allocation, and the ``[max_bs,
    width]`` int32 ``views`` of it the builder fills (row strides ``row_strides``); the kind's
    ``vectors`` in one ``[V, L]`` allocation and their ``vector_views`` by name, or None."""

    @property
    def tables(self) -> torch.Tensor: ...
    @property
    def views(self) -> list[torch.Tensor]: ...
    @property
    def row_strides(self) -> tuple[int, ...]: ...
    @property
    def vectors(self) -> torch.Tensor | None: ...
    @property
    def vector_views(self) -> dict[str, torch.Tensor] | None: ...


class TwinRun(Protocol):
    """A check after capture as its eager twin reads it
    (``pagegraph.check.pipeline.state.CheckRun``,
    whose module imports this one): its pool, runner and buffers, None before set-up, are
    set by then."""

    @property
    def cfg(self) -> CheckConfig: ...
    @property
    def builder(self) -> Callable[..., object]: ...
    @property
    def kind(self) -> KindSpec: ...
    @property
    def device(self) -> torch.device: ...
    @property
    def pool(self) -> KVPool | None: ...
    @property
    def runner(self) -> GraphRunner | None: ...
    @property
    def buffers(self) -> OutputBuffers | None: ...
    @property
    def errors(self) -> bool: ...
    @property
    def engine(self) -> object | None: ...


class EagerTwin(RecordedComparisons):
    """The eager twin of each sampled replay (see the module docstring): a comparison judging
    "graph-safe", whose records hold the replay's value and the eager call's.

    Args:
        run: the check (``pagegraph.check.pipeline.state.CheckRun``) after capture: its builder,
        kind,
            config, pool, runner and output buffers.
        chunk: replays between two read-backs of the records.
        buffers: the twin's own output buffers, allocated as the replays' are
            (``pagegraph.check.pipeline.buffers.allocate_check_buffers``), poisoned.
    """

    property_name = "graph-safe (captured short, replayed long)"

    def __init__(self, run: TwinRun, chunk: int, buffers: OutputBuffers) -> None:
        cfg, dev = run.cfg, run.device
        pool, runner = run.pool, run.runner
        assert pool is not None and runner is not None, "the twin is made after capture"
        self.run = run
        self.buffers = buffers
        # The plan's presets are the kind's own (plan_check).
        self._presets = preset_views(self.buffers.vectors, cfg.preset_outputs, run.kind)
        self._extra: dict[str, object] = {}
        if pool.full_to_swa is not None:
            self._extra = {"swa_page_table": self.buffers.views[1], "full_to_swa": pool.full_to_swa}
        self._takes_batch = builder_capabilities(run.builder).batch
        if run.errors:  # the same specialisation as the replays' (a scratch buffer)
            assert runner.errors is not None  # the runner passes errors= (run.errors)
            self._extra["errors"] = torch.zeros_like(runner.errors)
        self._io = SimpleNamespace(
            req_to_token=pool.req_to_token,
            req_pool_indices=runner.req_pool_indices,
            seq_lens=runner.seq_lens,
            page_table=self.buffers.views[0],
            swa_page_table=None,
            full_to_swa=pool.full_to_swa,
            errors=None,
            page_size=cfg.page_size,
            vectors=self.buffers.vector_views,
            engine=run.engine,
            derived=run.kind.derived_inputs(cfg.max_bs, runner.draft_tokens, dev),
            draft_tokens=cfg.draft_tokens if run.kind.tables_include_draft else 0,
        )
        # Per compared replay: differing entries, the first one's flat index, the replay's
        # value there and the eager call's.
        super().__init__(chunk, dev)
        self.count = 0

    @staticmethod
    def applies(run: TwinRun) -> bool:
        """Whether a replay is more than an eager call here: a graph (real or emulated) was
        captured and the builder runs inside it."""
        graphs = getattr(run.runner, "graphs", None)
        return bool(graphs) and run.kind.where == "graph"

    def warm_up(self) -> None:
        """One eager call into the twin buffers on the inputs the capture left (every length
        1), then the poison again: what a builder allocates or compiles at its first call on
        new buffers is done before the replays' memory and allocation baselines are read."""
        bucket = self.run.cfg.max_bs
        extra = dict(self._extra)
        if "swa_page_table" in extra:
            extra["swa_page_table"] = self.buffers.views[1][:bucket]
        if self._takes_batch:
            extra["batch"] = self.run.kind.batch_context(bucket, bucket, bucket)
        self.run.kind.call(self.run.builder, self._io, bucket, extra)
        self._poison()

    def wanted(self, mstep: ModelStep) -> bool:
        if mstep.out_of_contract:
            return False
        k = self.count
        self.count += 1
        return k < EVERY_REPLAY or k % SAMPLE == 0

    def compare(self, slot: int, mstep: ModelStep) -> None:
        """Call the builder eagerly on what the replay of ``mstep`` staged, into the twin
        buffers, and record how they differ from the replay's outputs in record ``slot``."""
        bucket = mstep.bucket
        extra = dict(self._extra)
        if "swa_page_table" in extra:
            extra["swa_page_table"] = self.buffers.views[1][:bucket]
        if self._takes_batch:
            extra["batch"] = self.run.kind.batch_context(mstep.n, bucket, self.run.cfg.max_bs)
        self.run.kind.call(self.run.builder, self._io, bucket, extra)
        replayed = self.run.buffers
        assert replayed is not None  # set up before capture
        self.record(slot, mstep, self._flat(replayed), self._flat(self.buffers))
        self._poison()

    @staticmethod
    def _flat(buffers: OutputBuffers) -> torch.Tensor:
        parts = [buffers.tables.view(-1).to(torch.int64)]
        if buffers.vectors is not None:
            parts.append(buffers.vectors.view(-1).to(torch.int64))
        return torch.cat(parts)

    def _poison(self) -> None:
        self.buffers.tables.fill_(POISON)
        if self.buffers.vectors is not None:
            self.buffers.vectors.fill_(POISON)
            for entry in self._presets:
                entry.fill_(0)

    def describe(
        self, mstep: ModelStep, count: int, flat: int, replayed: int, eager: int
    ) -> Failure:
        """Where the first difference is, as a ``Failure`` of the table or vector it is in."""
        tables = self.buffers.tables
        T, rows, width = tables.shape
        names = ("page_table", "swa_page_table")
        if flat < tables.numel():  # laid out as the verifier reads it: each table by its stride
            t, rest = divmod(flat, rows * width)
            row, col = divmod(rest, self.buffers.row_strides[t])
            where, row = names[t], row - CANARY_ROWS
        else:
            vectors = self.buffers.vectors
            assert vectors is not None  # past the tables: the kind's vectors
            v, col = divmod(flat - tables.numel(), vectors.shape[1])
            where, row, col = self.run.kind.vector_names[v], col - 1, 0
        failure = Failure(
            mstep.index,
            mstep.bucket,
            row,
            col,
            eager,
            replayed,
            where,
            self.run.cfg.max_bs,
            self.run.cfg.width,
            vector=where not in names,
        )
        failure.note = (
            f"{count} entr{'y' if count == 1 else 'ies'} of the replay differ from an eager "
            f"call of the builder on the same inputs (expected: the eager call's value)"
        )
        if not failure.vector and 0 <= row < len(mstep.asked_sl):
            failure.seq_len = int(mstep.asked_sl[row])
            failure.req_pool_index = int(mstep.asked_rpi[row])
        if failure.vector:
            failure.untouched = self.run.kind.vector(where).untouched
        failure.poison = POISON
        return failure


def never_compared(prop: PropertyResult, why: str) -> None:
    """The property when no replay can be compared with an eager call: a skip, never a pass."""
    if prop.status == "pass":
        prop.skip(why)


__all__ = ["EVERY_REPLAY", "SAMPLE", "EagerTwin", "OutputBuffers", "never_compared"]
