"""Padded rows under the engine's convention, judged on the reader's side of the decode step.

docs/ARCHITECTURE.md ("Inside the checker") has the details.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

import numpy as np
import torch

from ...graph.step_graphs import GUARD_NAME, GUARD_PAGE, StepGraphs
from ..config import CheckConfig
from ..reports.report import PropertyResult
from .protocol import JudgedAtOnce

__all__ = ["NullBlockUntouched", "PaddedBatch", "PaddedReadsInPool", "PaddedReplays", "PaddedSeen",
           "PaddedRun", "READS", "ReplayedRun", "WRITES", "describe", "judge_capture",
           "nan_page", "note_convention"]  # fmt: skip

#: The properties this module judges (``pagegraph.check.reports.step_report.STEP_PROPERTIES``).
READS = "padded rows read inside the KV pool"
WRITES = "null block and guard page untouched"
#: Table entries of a padded row shown in a failure.
SHOWN_ENTRIES = 4


class PaddedRun(Protocol):
    """The decode step's run as this module reads it (``pagegraph.check.pipeline.step_bench``'s,
    ``pagegraph.check.judges.step_judges.StepRun``): its config, graphs and properties."""

    @property
    def cfg(self) -> CheckConfig: ...
    @property
    def graphs(self) -> StepGraphs: ...
    @property
    def props(self) -> Mapping[str, PropertyResult]: ...


class ReplayedRun(PaddedRun, Protocol):
    """The run once its replays are done: ``padded_replays``, those with padded rows."""

    @property
    def padded_replays(self) -> int: ...


class PaddedBatch(Protocol):
    """A step's batch as this module reads it (``pagegraph.check.judges.step_judges.StepBatch``)."""

    @property
    def index(self) -> int: ...
    @property
    def bucket(self) -> int: ...
    @property
    def rpi(self) -> Sequence[int]: ...


class PaddedReplays(Protocol):
    """What a step's replays gave, as this module reads it
    (``pagegraph.check.judges.step_judges.StepReplays``)."""

    @property
    def pad_c(self) -> torch.Tensor | None: ...
    @property
    def reserved_changed(self) -> Sequence[str]: ...


class PaddedSeen(Protocol):
    """What a step's replays showed, as this module's judges observe it
    (``pagegraph.check.judges.step_judges.StepSeen``)."""

    @property
    def run(self) -> PaddedRun: ...
    @property
    def batch(self) -> PaddedBatch: ...
    @property
    def replays(self) -> PaddedReplays: ...


def nan_page(null_block: str) -> int:
    """The page id whose K and V are NaN and which no row may read: page 0 where the null
    block holds NaN, else the guard page (-1)."""
    return 0 if null_block == "nan" else GUARD_PAGE


def note_convention(props: Mapping[str, PropertyResult], null_block: str) -> None:
    """Mark "padded rows read inside the KV pool" skipped, with why, where the null block
    holds NaN (before the run)."""
    if null_block == "nan":
        props[READS].skip(
            "null_block = 'nan': page 0 holds NaN, so padded rows' own outputs are not judged "
            "(set [consumer] null_block = 'finite' for a convention whose padded rows may read "
            "the null block)"
        )


def judge_capture(run: PaddedRun) -> None:
    """The guard page after capture (``run``: the decode step's run); page 0's values from
    here on are the ones the replays keep."""
    g = run.graphs
    if GUARD_NAME in g.reserved_changed():
        run.props[WRITES].fail(f"{GUARD_NAME} of the KV cache changed during capture")
    g.snapshot_reserved()


class PaddedReadsInPool(JudgedAtOnce):
    """With ``null_block = "finite"``, every padded row of replay C finite."""

    property_name = READS

    def observe(self, seen: PaddedSeen) -> None:
        run, batch, replays = seen.run, seen.batch, seen.replays
        pads = replays.pad_c
        if run.graphs.null_block == "nan" or pads is None or not len(pads):
            return
        finite = torch.isfinite(pads.float()).flatten(1).all(1).cpu().numpy()
        bad = np.flatnonzero(~finite).tolist()
        if bad:
            where = _padded_row(run, batch, len(batch.rpi) + bad[0])
            run.props[self.property_name].fail(
                f"{where} has a non-finite output with finite queries: it read outside the KV "
                f"pool (the guard page {GUARD_PAGE} or the NaN sentinel); {len(bad)} padded "
                "row(s) non-finite"
            )


class NullBlockUntouched(JudgedAtOnce):
    """The guard page before page 0, and page 0 where the null block holds data, unchanged
    through the step's replays."""

    property_name = WRITES

    def observe(self, seen: PaddedSeen) -> None:
        run, batch, replays = seen.run, seen.batch, seen.replays
        if replays.reserved_changed:
            run.props[self.property_name].fail(
                f"replay {batch.index} (bucket {batch.bucket}, {len(batch.rpi)} real rows): "
                f"{' and '.join(replays.reserved_changed)} of the KV cache, which no request "
                "holds, changed"
            )


def _padded_row(run: PaddedRun, batch: PaddedBatch, row: int) -> str:
    """Padded row ``row`` with its replay, bucket, staged inputs and first table entries."""
    g = run.graphs
    entries = g.page_table[row, :SHOWN_ENTRIES].tolist()
    return (
        f"replay {batch.index} (bucket {batch.bucket}): padded row {row} (seq_len "
        f"{int(g.seq_lens[row])}, req_pool_index {int(g.req_pool_indices[row])}, "
        f"{run.cfg.padding} padding, table entries {entries}...)"
    )


def describe(run: ReplayedRun) -> None:
    """What each property covered, once the replays are done (a pass), or why it had
    nothing to judge (a skip)."""
    reads, writes = run.props[READS], run.props[WRITES]
    if writes.status == "pass":
        writes.detail = (
            "the guard page before page 0 (NaN, no request holds it) unchanged after capture and "
            "every replay; "
            + (
                "page 0 not judged (null_block = 'nan': padding's own page)"
                if run.graphs.null_block == "nan"
                else "page 0 (the null block, data) unchanged after every replay"
            )
        )
    if reads.status != "pass":
        return
    if not run.padded_replays:
        reads.skip("no replay had padded rows")
        return
    reads.detail = (
        f"{run.padded_replays} replays with padded rows ({run.cfg.padding} padding, null block "
        "page 0 finite, NaN in the guard page before it and in the sentinel): every padded "
        "row's output finite with finite queries"
    )
