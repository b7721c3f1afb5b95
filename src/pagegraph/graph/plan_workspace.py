"""A planned reader's workspace (``PlanWorkspace``): allocated once, planned on the host before
each step, with the entries each plan wrote known, so the step can change every other entry
and see whether the captured run reads it (``pagegraph.check.judges.step_plan``).

Each workspace tensor is handed to the reader as a view at the head of a longer allocation
whose trailing entries (the canary, ``canary_entries``) hold a poison: a plan or a run that
writes past a tensor's end (a run-time split count past what the capture sized the tensor
for) changes them, ``check_canaries`` notes it (``overruns``: the tensor, when, how far past
the end) and puts the poison back (``pagegraph.check.judges.reader_judges``, "reader stays
inside its workspace").
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch

from ..consumers.reader import HostBatch, Reader
from ..kernels.contract import POISON, bit_view

__all__ = ["CANARY_MIN_ENTRIES", "Overrun", "PlanWorkspace", "canary_entries"]

#: The least entries of a workspace tensor's canary; a tensor larger than that gets as many
#: as it has (a write up to twice a tensor's size lands in its canary).
CANARY_MIN_ENTRIES = 4096

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


def _accepted(reader: Reader, heads: dict[str, int]) -> dict[str, int]:
    """The keywords of ``heads`` the reader's ``workspace()`` takes (by name, or ``**``)."""
    try:
        params = inspect.signature(reader.workspace).parameters  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return {}
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return dict(heads)
    return {k: v for k, v in heads.items() if k in params}


def canary_entries(numel: int) -> int:
    """Entries of the canary after a workspace tensor of ``numel`` entries."""
    return max(numel, CANARY_MIN_ENTRIES)


@dataclass(frozen=True)
class Overrun:
    """A write past a workspace tensor's end: ``tensor``'s canary changed ``during`` a call
    (``"capture"``, ``"the plan"``, ``"graph replay 2 of the step"``, ...), the furthest
    changed entry ``past`` entries after the tensor's end (1: the entry right after it), of a
    canary of ``canary`` entries (``past == canary``: it may have written further still)."""

    tensor: str
    during: str
    past: int
    canary: int
    element_size: int
    first: int

    def describe(self) -> str:
        reach = "at least " if self.past >= self.canary else ""
        return (
            f"workspace tensor {self.tensor!r} written past its end during {self.during}: "
            f"{reach}{self.past} entries ({reach}{self.past * self.element_size} bytes) past "
            f"its last entry, the first changed {self.first} past it (canary of "
            f"{self.canary} entries)"
        )


def _with_canary(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``t`` copied to the head of an allocation with a canary after it: ``(view, canary,
    the canary's values)``. A tensor that is not contiguous is kept as it is (no canary)."""
    if not t.is_contiguous() or t.dtype.is_complex:
        empty = t.new_empty(0)
        return t, empty, empty
    n = t.numel()
    flat = torch.empty(n + canary_entries(n), dtype=t.dtype, device=t.device)
    view = flat[:n].view(t.shape)
    view.copy_(t)
    canary = flat[n:]
    canary.fill_(_poisons(t.dtype)[1])
    return view, canary, canary.clone()


class PlanWorkspace:
    """A reader's workspace (``tensors``: name -> tensor, allocated once, each with a canary
    after it: the module docstring) and the entries the last plan wrote (``written``: name ->
    bool tensor of the same shape)."""

    def __init__(
        self,
        reader: Reader,
        max_bs: int,
        width: int,
        page_size: int,
        device: torch.device,
        **heads: int,
    ) -> None:
        self.reader = reader
        if reader.workspace is None:
            raise TypeError(f"reader {reader.name}: no workspace() to allocate")
        tensors = reader.workspace(max_bs, width, page_size, device, **_accepted(reader, heads))
        if not isinstance(tensors, dict) or not all(
            isinstance(t, torch.Tensor) for t in tensors.values()
        ):
            raise TypeError(f"reader {reader.name}: workspace() must return a dict of tensors")
        self.tensors: dict[str, torch.Tensor] = {}
        #: name -> (the canary after the tensor, the values it must keep)
        self._canaries: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        for name, t in tensors.items():
            view, canary, values = _with_canary(t)
            self.tensors[name] = view
            if canary.numel():
                self._canaries[name] = (canary, values)
        #: writes past a tensor's end seen by ``check_canaries`` and not yet taken
        self.overruns: list[Overrun] = []
        #: canary checks made, and graph replays since the last plan (their labels)
        self.checks = self._replays = 0
        self._addresses = {k: t.data_ptr() for k, t in self.tensors.items()}
        self.written: dict[str, torch.Tensor] = {}
        #: plans run, entries they left unwritten (summed), replays with those refilled
        self.plans = self.unwritten = self.refills = 0
        #: replays with the entries no plan has written refilled
        self.fresh_refills = 0
        #: each plan's label (``plan``'s ``label``), and by tensor the index of the plan that
        #: last wrote each entry (-1: none since allocation)
        self.labels: list[str] = []
        self.last_plan = {
            k: torch.full(t.shape, -1, dtype=torch.int32, device=t.device)
            for k, t in self.tensors.items()
        }

    @classmethod
    def for_reader(
        cls,
        reader: Reader,
        max_bs: int,
        width: int,
        page_size: int,
        device: torch.device,
        **heads: int,
    ) -> PlanWorkspace | None:
        """The reader's workspace, or ``None`` for a reader without one. ``heads``
        (``num_q_heads``, ``head_dim``) go to a ``workspace()`` that takes them."""
        if reader.workspace is None:
            return None
        return cls(reader, max_bs, width, page_size, device, **heads)

    @property
    def canary_size(self) -> int:
        """Canary entries after the workspace's tensors, all told."""
        return sum(c.numel() for c, _ in self._canaries.values())

    def check_canaries(self, during: str) -> list[Overrun]:
        """Read the canaries back after ``during`` (a read-back: on CUDA it waits for the
        stream); each changed one is noted in ``overruns`` and given its poison back.
        ``during`` ``"replay"`` is labelled with its place among the step's graph replays."""
        if during == "replay":
            self._replays += 1
            during = f"graph replay {self._replays} of the step"
        self.checks += 1
        found = []
        for name, (canary, values) in self._canaries.items():
            changed = bit_view(canary) != bit_view(values)
            if not bool(changed.any()):
                continue
            where = torch.nonzero(changed).flatten()
            found.append(
                Overrun(
                    name,
                    during,
                    int(where[-1]) + 1,
                    canary.numel(),
                    canary.element_size(),
                    int(where[0]) + 1,
                )
            )
            canary.copy_(values)
        self.overruns += found
        return found

    def take_overruns(self) -> list[Overrun]:
        """The overruns noted since the last call."""
        found, self.overruns = self.overruns, []
        return found

    @property
    def size(self) -> int:
        """Entries in the workspace."""
        return sum(t.numel() for t in self.tensors.values())

    def plan(self, host: HostBatch, label: str | None = None) -> None:
        """Run the reader's plan on ``host`` (nothing without one): find what it writes, and
        leave the other entries as earlier plans left them (module docstring). ``label``
        names the plan where a later one reads what it left (``left_by``)."""
        self._replays = 0
        if not self.reader.planned:
            return
        plan_id = len(self.labels)
        self.labels.append(label or f"the plan for bucket {host.bucket}")
        before = {k: t.clone() for k, t in self.tensors.items()}
        first = self._poisoned(host, 0)
        second = self._poisoned(host, 1)
        for k, t in self.tensors.items():
            (value, in_first), in_second = first[k], second[k][1]
            # A plan with state may write an entry in one call only: keep what it wrote.
            t.copy_(torch.where(in_second, t, torch.where(in_first, value, before[k])))
            self.written[k] = in_first | in_second
            self.last_plan[k].masked_fill_(self.written[k], plan_id)
        self.plans += 1
        self.unwritten += sum(int((~w).sum()) for w in self.written.values())
        self.check_canaries("the plan")

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

    def left_by(self) -> str | None:
        """The latest earlier plan whose values the last plan left in place (the label of the
        most recent plan that wrote an entry the last one did not), or None."""
        latest = -1
        for k, written in self.written.items():
            stale = self.last_plan[k][~written]
            if stale.numel():
                latest = max(latest, int(stale.max()))
        return self.labels[latest] if latest >= 0 else None

    def refill_unwritten(self, gen: torch.Generator, stale: bool = True) -> dict[str, torch.Tensor]:
        """Give the entries the last plan left unwritten another plausible value (module
        docstring): with ``stale`` those an earlier plan wrote, else those no plan has written
        since allocation. Returns their values to ``restore`` (empty: no such entry)."""
        saved: dict[str, torch.Tensor] = {}
        for k, t in self.tensors.items():
            written = self.written.get(k)
            if written is None:
                continue
            by_earlier = self.last_plan[k] >= 0
            refill = ~written & (by_earlier if stale else ~by_earlier)
            if not bool(refill.any()):
                continue
            saved[k] = t.clone()
            t.copy_(_other_values(t, ~refill, gen))
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
