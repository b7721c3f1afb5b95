"""A planned reader's workspace in the decode step: what each plan wrote, and a replay with
everything else changed.

docs/ARCHITECTURE.md ("Inside the checker") has the details.
"""

from __future__ import annotations

from typing import Protocol

import torch

from ...graph.step_graphs import StepGraphs
from .step_judges import StepBatch

__all__ = ["PlannedRun", "RefilledRun", "fresh_detail", "plan_detail", "replay_refilled"]


class PlannedRun(Protocol):
    """The decode step's run as its plan's summary reads it
    (``pagegraph.check.pipeline.step_bed``'s):
    its graphs, with the reader's workspace."""

    @property
    def graphs(self) -> StepGraphs: ...


class RefilledRun(PlannedRun, Protocol):
    """The run as replay D reads it: its graphs and the generator of the step's values."""

    @property
    def gen(self) -> torch.Generator: ...


def replay_refilled(run: RefilledRun, batch: StepBatch, stale: bool = True) -> torch.Tensor | None:
    """Replay D of a step (``run``: the decode step's run, after replay B): the planned
    reader's workspace entries the step's plan did not write refilled (with ``stale`` those
    an earlier plan wrote; else those no plan has written), the graph replayed on the same
    inputs, the entries restored. Returns the real rows' output, or ``None`` without a
    planned reader or when there is no such entry."""
    g = run.graphs
    space = g.plan_space
    if space is None or not space.reader.planned:
        return None
    saved = space.refill_unwritten(run.gen, stale)
    if not saved:
        return None
    try:
        g.replay()
        out = g.out[: len(batch.rpi)].clone()
    finally:
        space.restore(saved)
    if stale:
        space.refills += 1
    else:
        space.fresh_refills += 1
    return out


def fresh_detail(run: PlannedRun) -> str:
    """What "reader reads only workspace a plan wrote" covered in ``run``."""
    space = run.graphs.plan_space
    if space is None or not space.reader.planned:
        return "the reader has no plan(): nothing to check (passes trivially)"
    return (
        f"{space.fresh_refills} replays re-run with the workspace entries no plan had written "
        "since allocation holding other values: real rows bit-identical"
    )


def plan_detail(run: PlannedRun) -> str:
    """What "reader reads only what the current plan wrote" covered in ``run``."""
    space = run.graphs.plan_space
    if space is None or not space.reader.planned:
        return "the reader has no plan(): nothing to check (passes trivially)"
    mean = space.unwritten / max(space.plans, 1)
    return (
        f"{space.plans} plans on {space.size} workspace entries ({mean:.0f} left unwritten a "
        f"plan on average); {space.refills} replays re-run with those entries holding other "
        "values: real rows bit-identical"
    )
