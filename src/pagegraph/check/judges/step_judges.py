"""The decode step's judges of the attention's output, one a property (``STEP_JUDGES``): each
observes a step (``StepSeen``: its run, batch and replays) and judges it at once, under the
check's one judge protocol (``pagegraph.check.judges.protocol.Judge``); a judge added here is
a property the step reports (``pagegraph.check.reports.step_report.STEP_PROPERTIES``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from ...consumers.attention_reference import attend, live_kv, tolerances
from ...graph.step_graphs import GUARD_PAGE
from ...kernels.contract import bit_view
from ..reports.report import BucketStats, Report
from .cache_write_judge import CACHE_WRITE
from .padded_rows import READS, WRITES, PaddedRun
from .protocol import Judge, JudgedAtOnce

__all__ = [
    "STEP_JUDGES",
    "CacheWriteExact",
    "NullBlockUntouched",
    "PaddedReadsInPool",
    "StepBatch",
    "StepReplays",
    "StepRun",
    "StepSeen",
    "changed_rows",
]


@dataclass
class StepBatch:
    """A step's batch and the host model's view of it."""

    index: int
    bucket: int
    #: each real row's request slot and length (``int``)
    rpi: list[int]
    lens: list[int]
    #: each real row's ``(page ids up to its length, length)``
    rows: list[tuple[list[int], int]]
    #: every page a running request holds, int32 ``[live]`` on the host
    live: torch.Tensor

    def where(self, i: int) -> str:
        """Real row ``i`` with its replay, bucket and inputs, for a failure's text."""
        return (
            f"replay {self.index} (bucket {self.bucket}): row {i} (req_pool_index "
            f"{self.rpi[i]}, seq_len {self.lens[i]}, {len(self.rpi)} real rows)"
        )


@dataclass
class StepReplays:
    """What one step's replays gave: the real rows' outputs ``[n, heads, head_dim]`` of
    replay A (stale tails name other live pages, padded queries NaN/Inf), B (other stale ids,
    new values past each length) and C (finite padded queries; None when ``n`` fills the
    bucket), and whether the sentinel page stayed intact through all of them; ``pad_c``: the
    padded rows' outputs ``[bucket - n, heads, head_dim]`` of replay C (None without it), and
    which of page 0 and the guard page before it changed
    (``pagegraph.check.judges.padded_rows``)."""

    out_a: torch.Tensor
    out_b: torch.Tensor
    out_c: torch.Tensor | None
    sentinel_intact: bool
    pad_c: torch.Tensor | None = None
    reserved_changed: Sequence[str] = ()
    #: replay D's real rows (a planned reader's unwritten workspace entries given other
    #: values, B's inputs otherwise: ``pagegraph.check.judges.step_plan``); None without it
    out_plan: torch.Tensor | None = None
    #: replay D0's real rows (the workspace entries no plan has written given other values);
    #: None without such entries
    out_fresh: torch.Tensor | None = None
    #: the K and V the step must leave (``pagegraph.check.judges.cache_write_judge.CacheModel``),
    #: what the reference reads; None: the graphs' own caches
    model_kv: tuple[torch.Tensor, torch.Tensor] | None = None
    #: the first difference of the replayed cache from the model, described; None: none
    cache_failure: str | None = None
    #: the reader's own eager call on B's inputs, real rows (``reader_judges.eager_rows``)
    out_eager: torch.Tensor | None = None
    #: replay E's real rows (the NaN page outside every row: ``reader_judges.canary_replay``);
    #: None where it did not run
    out_canary: torch.Tensor | None = None
    #: replay E's padded rows, where they are judged (``null_block = "finite"``); else None
    pad_canary: torch.Tensor | None = None


class StepRun(PaddedRun, Protocol):
    """The decode step's run as its judges read it (``pagegraph.check.pipeline.step_bed``'s): its
    ``cfg``, ``graphs``, ``props`` (``PaddedRun``) and ``report``."""

    @property
    def report(self) -> Report: ...


@dataclass
class StepSeen:
    """What one step showed its judges (``pagegraph.check.judges.protocol.Judge``): the step's
    run (its ``cfg``, ``graphs``, ``props`` and ``report``), its batch and its replays."""

    run: StepRun
    batch: StepBatch
    replays: StepReplays


def changed_rows(a: torch.Tensor, b: torch.Tensor) -> list[int]:
    """Rows whose bits differ (NaN included: a NaN row that stays NaN is unchanged)."""
    diff = (bit_view(a) != bit_view(b)).flatten(1).any(1)
    return np.flatnonzero(diff.cpu().numpy()).tolist()


class OutputCorrect(JudgedAtOnce):
    """Replay A's real rows finite and within the reference's tolerance of dense fp32
    attention over the host model's pages, up to each row's length."""

    property_name = "output correct through the consumer"

    def observe(self, seen: StepSeen) -> None:
        run, batch, replays = seen.run, seen.batch, seen.replays
        out, g = replays.out_a, run.graphs
        q = g.q[: len(batch.rpi)]
        k_cache, v_cache = replays.model_kv or (g.k_cache, g.v_cache)
        kv = live_kv(k_cache, v_cache, batch.rows, run.cfg.page_size)
        ref = attend(q, kv)
        atol, rtol = tolerances(q, kv)
        err = (out.float() - ref.float()).abs().flatten(1)
        allowed = atol.to(out.device)[:, None] + rtol * ref.float().abs().flatten(1)
        finite = torch.isfinite(out.float()).flatten(1).all(1)
        bad_rows = (~finite | (err > allowed).any(1)).cpu()
        step = run.report.step
        assert step is not None, "a decode-step report has its step section"
        step.rows_checked += len(batch.rpi)
        wrong = np.flatnonzero(bad_rows.numpy()).tolist()
        stats = run.report.buckets.setdefault(batch.bucket, BucketStats(batch.bucket))
        stats.mismatches += len(wrong)
        if not wrong:
            return
        i = wrong[0]
        what = (
            "non-finite output"
            if not bool(finite[i])
            else f"max |out - ref| {float(err[i].max()):.4g} > allowed "
            f"{float(allowed[i][err[i].argmax()]):.4g} (atol {float(atol[i]):.3g}, "
            f"rtol {rtol:.3g})"
        )
        run.props[self.property_name].fail(
            f"{batch.where(i)}: {what}; {len(wrong)} wrong row(s) in this replay"
        )


class ReadsWithinLength(JudgedAtOnce):
    """Replays A and B bit-identical on every real row: only entries past each length (the
    stale tail's ids, the last page's slots past the length) changed between them."""

    property_name = "consumer reads only within cache_seqlens"

    def observe(self, seen: StepSeen) -> None:
        run, batch, replays = seen.run, seen.batch, seen.replays
        changed = changed_rows(replays.out_a, replays.out_b)
        if changed:
            run.props[self.property_name].fail(
                f"{batch.where(changed[0])}: the output changed when only entries past the "
                "length changed (the table's stale tail, the last page's slots past the "
                f"length); {len(changed)} row(s) changed"
            )


class PaddedRowsContained(JudgedAtOnce):
    """With padded rows (replay C ran), real rows finite under NaN/Inf padded queries (B) and
    bit-identical once those turn finite (C)."""

    property_name = "padded rows contained"

    def observe(self, seen: StepSeen) -> None:
        run, batch, replays = seen.run, seen.batch, seen.replays
        if replays.out_c is None:
            return
        nan_pads = replays.out_b
        finite = torch.isfinite(nan_pads.float()).flatten(1).all(1).cpu().numpy()
        bad = set(np.flatnonzero(~finite).tolist()) | set(changed_rows(nan_pads, replays.out_c))
        if bad:
            i = min(bad)
            what = "is non-finite" if not finite[i] else "changed"
            run.props[self.property_name].fail(
                f"{batch.where(i)} {what} with NaN/Inf queries in padded rows "
                f"{len(batch.rpi)}..{batch.bucket - 1}; {len(bad)} real row(s) affected"
            )


class SentinelUntouched(JudgedAtOnce):
    """The KV page past every allocated one unchanged through the step's replays."""

    property_name = "sentinel page untouched"

    def observe(self, seen: StepSeen) -> None:
        run, batch, replays = seen.run, seen.batch, seen.replays
        if not replays.sentinel_intact:
            run.props[self.property_name].fail(
                f"replay {batch.index} (bucket {batch.bucket}): page {run.graphs.sentinel} of "
                "the KV cache, which no request holds, changed"
            )


class ReadsOnlyCurrentPlan(JudgedAtOnce):
    """A planned reader's real rows bit-identical between replay B and replay D, whose only
    change is the workspace entries the step's plan did not write (given other values)."""

    property_name = "reader reads only what the current plan wrote"

    def observe(self, seen: StepSeen) -> None:
        run, batch, replays = seen.run, seen.batch, seen.replays
        if replays.out_plan is None:
            return
        changed = changed_rows(replays.out_b, replays.out_plan)
        if changed:
            space = run.graphs.plan_space
            left = space.left_by() if space is not None else None
            stale = f" (stale: left by {left})" if left else ""
            run.props[self.property_name].fail(
                f"{batch.where(changed[0])}: the output changed when only the workspace "
                f"entries the current plan did not write changed (an earlier plan's values{stale}, "
                f"then others); {len(changed)} row(s) changed"
            )


class ReadsOnlyPlannedWorkspace(JudgedAtOnce):
    """A planned reader's real rows bit-identical between replay B and replay D0, whose only
    change is the workspace entries no plan has written since allocation (given other
    values): an engine's workspace holds whatever its allocation left there."""

    property_name = "reader reads only workspace a plan wrote"

    def observe(self, seen: StepSeen) -> None:
        run, batch, replays = seen.run, seen.batch, seen.replays
        if replays.out_fresh is None:
            return
        changed = changed_rows(replays.out_b, replays.out_fresh)
        if changed:
            run.props[self.property_name].fail(
                f"{batch.where(changed[0])}: the output changed when only the workspace "
                "entries no plan has written since allocation changed (an engine's allocation "
                f"leaves anything there); {len(changed)} row(s) changed"
            )


class CacheWriteExact(JudgedAtOnce):
    """Every real row's new K/V at the slot the host model gives it and no other pool slot
    changed, padded rows' writes discarded by the scenario's ``pad_slot``
    (``pagegraph.check.judges.cache_write_judge``)."""

    property_name = CACHE_WRITE

    def observe(self, seen: StepSeen) -> None:
        failure = seen.replays.cache_failure
        if failure is not None:
            seen.run.props[self.property_name].fail(f"replay {seen.batch.index}: {failure}")


#: Table entries of a padded row shown in a failure.
SHOWN_ENTRIES = 4


class PaddedReadsInPool(JudgedAtOnce):
    """With ``null_block = "finite"``, every padded row of replay C finite."""

    property_name = READS

    def observe(self, seen: StepSeen) -> None:
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

    def observe(self, seen: StepSeen) -> None:
        run, batch, replays = seen.run, seen.batch, seen.replays
        if replays.reserved_changed:
            run.props[self.property_name].fail(
                f"replay {batch.index} (bucket {batch.bucket}, {len(batch.rpi)} real rows): "
                f"{' and '.join(replays.reserved_changed)} of the KV cache, which no request "
                "holds, changed"
            )


def _padded_row(run: StepRun, batch: StepBatch, row: int) -> str:
    """Padded row ``row`` with its replay, bucket, staged inputs and first table entries."""
    g = run.graphs
    entries = g.page_table[row, :SHOWN_ENTRIES].tolist()
    return (
        f"replay {batch.index} (bucket {batch.bucket}): padded row {row} (seq_len "
        f"{int(g.seq_lens[row])}, req_pool_index {int(g.req_pool_indices[row])}, "
        f"{run.cfg.padding} padding, table entries {entries}...)"
    )


#: The step's judges, in the order they judge a step (each its property of STEP_PROPERTIES).
STEP_JUDGES: tuple[Judge[StepSeen], ...] = (
    CacheWriteExact(),
    OutputCorrect(),
    ReadsWithinLength(),
    PaddedRowsContained(),
    PaddedReadsInPool(),
    NullBlockUntouched(),
    SentinelUntouched(),
    ReadsOnlyCurrentPlan(),
    ReadsOnlyPlannedWorkspace(),
)
