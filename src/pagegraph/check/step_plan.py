"""A planned reader's workspace in the decode step: what each plan wrote, and a replay with
everything else changed.

A planned reader (``pagegraph.consumers.reader.Reader`` with ``plan``) writes a schedule into
a workspace on the host before each step, and its captured ``attend`` reads it, as
FlashInfer's ``plan()`` / ``run()`` do. The workspace is allocated once, so a plan for a small
batch leaves most of it as an earlier, larger plan wrote it. ``PlanWorkspace`` finds which
entries each plan writes and lets the step check that the run reads no other:

* ``plan(host)``: the workspace is filled with a poison and the reader's plan runs; the entries
  that no longer hold the poison are what it wrote. It runs twice, with two poisons, so an
  entry written with a value equal to one poison is caught by the other. The unwritten entries
  then get back what earlier plans left there (a realistic stale workspace), and the step's
  replays run on that.
* ``refill_unwritten(gen)``: before one more replay (``replay_refilled``, after replay B, on
  the same inputs) the unwritten entries get other plausible values: values drawn from those
  the plan wrote in the same column of the same tensor (the last axis of a 2-D or larger
  tensor is its columns; a vector is one column) and the stale ones, each different from the
  entry's stale value where two values are at hand. A run that reads only what the current
  plan wrote gives bit-identical real rows (judged by
  ``step_judges.ReadsOnlyCurrentPlan``); ``restore`` then puts the stale values back.

A reader with a workspace but no plan (scratch) gets the workspace and nothing is checked.
The plan's cost is host time outside the graph: the step's replays do not see it.
"""

from __future__ import annotations

import torch

from ..consumers.reader import HostBatch, Reader
from .verify import POISON

__all__ = ["PlanWorkspace", "plan_detail", "replay_refilled"]


def _poisons(dtype: torch.dtype) -> tuple:
    """Two different fill values of ``dtype``, unlikely as a plan's output."""
    if dtype == torch.bool:
        return True, False
    if dtype.is_floating_point:
        big = torch.finfo(dtype).max
        return -big, big / 2
    if dtype.is_complex:
        raise TypeError("a plan's workspace of complex tensors is not supported")
    info = torch.iinfo(dtype)
    if info.min <= POISON and ~POISON <= info.max:
        return POISON, ~POISON
    return info.min, info.max


class PlanWorkspace:
    """A reader's workspace (``tensors``: name -> tensor, allocated once) and the entries the
    last plan wrote (``written``: name -> bool tensor of the same shape)."""

    def __init__(self, reader: Reader, max_bs: int, width: int, page_size: int, device):
        self.reader = reader
        tensors = reader.workspace(max_bs, width, page_size, device)
        if not isinstance(tensors, dict) or not all(
            isinstance(t, torch.Tensor) for t in tensors.values()
        ):
            raise TypeError(f"reader {reader.name}: workspace() must return a dict of tensors")
        self.tensors: dict[str, torch.Tensor] = tensors
        self._addresses = {k: t.data_ptr() for k, t in tensors.items()}
        self.written: dict[str, torch.Tensor] = {}
        #: plans run, entries they left unwritten (summed), replays with those refilled
        self.plans = self.unwritten = self.refills = 0

    @classmethod
    def for_reader(cls, reader: Reader, max_bs: int, width: int, page_size: int, device):
        """The reader's workspace, or ``None`` for a reader without one."""
        if reader.workspace is None:
            return None
        return cls(reader, max_bs, width, page_size, device)

    @property
    def size(self) -> int:
        """Entries in the workspace."""
        return sum(t.numel() for t in self.tensors.values())

    def plan(self, host: HostBatch) -> None:
        """Run the reader's plan on ``host`` (nothing without one): find what it writes, and
        leave the other entries as earlier plans left them (module docstring)."""
        if not self.reader.planned:
            return
        before = {k: t.clone() for k, t in self.tensors.items()}
        first = self._poisoned(host, 0)
        second = self._poisoned(host, 1)
        for k, t in self.tensors.items():
            (value, in_first), in_second = first[k], second[k][1]
            # A plan with state may write an entry in one call only: keep what it wrote.
            t.copy_(torch.where(in_second, t, torch.where(in_first, value, before[k])))
            self.written[k] = in_first | in_second
        self.plans += 1
        self.unwritten += sum(int((~w).sum()) for w in self.written.values())

    def _poisoned(self, host: HostBatch, which: int) -> dict:
        """``name -> (values after the plan, entries it changed)``, the workspace filled with
        poison ``which`` first."""
        fills = {}
        for k, t in self.tensors.items():
            fills[k] = torch.full_like(t, _poisons(t.dtype)[which])
            t.copy_(fills[k])
        self.reader.plan(host, self.tensors)
        moved = [k for k, t in self.tensors.items() if t.data_ptr() != self._addresses.get(k)]
        if moved or set(self.tensors) != set(self._addresses):
            raise ValueError(
                f"reader {self.reader.name}: plan() replaced workspace tensors "
                f"{moved or sorted(set(self.tensors) ^ set(self._addresses))} (a graph reads "
                "the tensors it captured: write them in place)"
            )
        return {k: (t.clone(), t.ne(fills[k])) for k, t in self.tensors.items()}

    def refill_unwritten(self, gen: torch.Generator) -> dict[str, torch.Tensor]:
        """Give each entry the last plan left unwritten another plausible value (module
        docstring); returns the stale values to ``restore`` (empty: every entry written)."""
        saved = {}
        for k, t in self.tensors.items():
            written = self.written.get(k)
            if written is None or bool(written.all()):
                continue
            saved[k] = t.clone()
            t.copy_(_other_values(t, written, gen))
        return saved

    def restore(self, saved: dict[str, torch.Tensor]) -> None:
        for k, values in saved.items():
            self.tensors[k].copy_(values)


def _other_values(t: torch.Tensor, written: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """``t`` with every unwritten entry given another value of its column (host work)."""
    cur, w = t.detach().cpu(), written.cpu()
    cols = cur.shape[-1] if cur.dim() >= 2 else 1
    new, w = cur.clone().reshape(-1, cols), w.reshape(-1, cols)
    for c in range(cols):
        column, stale = new[:, c], ~w[:, c]
        if not bool(stale.any()):
            continue
        old = column[stale]
        pool = _candidates(column[~stale], old)
        pick = torch.randint(len(pool), (len(old),), generator=gen)
        values = pool[pick]
        # Where the draw equals the stale value, the next candidate (pool values differ).
        values = torch.where(values == old, pool[(pick + 1) % len(pool)], values)
        column[stale] = values
    return new.reshape(t.shape).to(t.device)


def _candidates(written: torch.Tensor, stale: torch.Tensor) -> torch.Tensor:
    """Distinct values to draw from: those the plan wrote and the stale ones; one more when
    they are all alike (a bool's other value, an int plus one, a float doubled plus one)."""
    pool = torch.unique(torch.cat([written, stale]))
    if len(pool) >= 2:
        return pool
    if pool.dtype == torch.bool:
        return torch.tensor([False, True])
    return torch.cat([pool, pool * 2 + 1 if pool.dtype.is_floating_point else pool + 1])


def replay_refilled(run, batch) -> torch.Tensor | None:
    """Replay D of a step (``run``: the decode step's run, after replay B): the planned
    reader's unwritten workspace entries refilled, the graph replayed on the same inputs, the
    stale entries restored. Returns the real rows' output, or ``None`` without a planned
    reader or when the plan wrote every entry."""
    g = run.graphs
    space = g.plan_space
    if space is None or not space.reader.planned:
        return None
    saved = space.refill_unwritten(run.gen)
    if not saved:
        return None
    try:
        g.replay(batch.bucket)
        out = g.out[: len(batch.rpi)].clone()
    finally:
        space.restore(saved)
    space.refills += 1
    return out


def plan_detail(run) -> str:
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
