"""A planned reader's workspace (``PlanWorkspace``): allocated once, planned on the host before
each step, with the entries each plan wrote known, so the step can change every other entry
and see whether the captured run reads it (``pagegraph.check.judges.step_plan``).
"""

from __future__ import annotations

import torch

from ..consumers.reader import HostBatch, Reader
from ..kernels.contract import POISON

__all__ = ["PlanWorkspace"]

#: A fill value of a workspace tensor's dtype.
_Fill = bool | int | float


def _poisons(dtype: torch.dtype) -> tuple[_Fill, _Fill]:
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

    def __init__(
        self, reader: Reader, max_bs: int, width: int, page_size: int, device: torch.device
    ) -> None:
        self.reader = reader
        if reader.workspace is None:
            raise TypeError(f"reader {reader.name}: no workspace() to allocate")
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
    def for_reader(
        cls, reader: Reader, max_bs: int, width: int, page_size: int, device: torch.device
    ) -> PlanWorkspace | None:
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

    def _poisoned(
        self, host: HostBatch, which: int
    ) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """``name -> (values after the plan, entries it changed)``, the workspace filled with
        poison ``which`` first."""
        assert self.reader.plan is not None  # called by plan() for a planned reader
        fills: dict[str, torch.Tensor] = {}
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
        saved: dict[str, torch.Tensor] = {}
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
    pool: torch.Tensor = torch.unique(torch.cat([written, stale]))
    if len(pool) >= 2:
        return pool
    if pool.dtype == torch.bool:
        return torch.tensor([False, True])
    return torch.cat([pool, pool * 2 + 1 if pool.dtype.is_floating_point else pool + 1])
