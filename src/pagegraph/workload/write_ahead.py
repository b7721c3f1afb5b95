"""Applying the device-table writes of decode steps generated ahead of their replays
(``WriteAhead``): the writes a ``KVPool`` handed over (``KVPool.take_writes``), uploaded for
several steps at once and applied one step at a time."""

from __future__ import annotations

from .pool import Runs, Writes, _PageWriter


class WriteAhead:
    """Applies the writes of steps generated ahead of their replays: the writes of as many
    steps as fit are uploaded at once (``stage``; on a CPU also expanded), then each step's are
    applied with one launch a table (``apply``), in step order, on the current stream.

    A step is staged only after every step staged before it was applied (the scratch is
    reused), which ``next()`` ensures by staging when it reaches a step that is not staged.
    A step whose writes alone exceed a writer's capacity is written in parts when applied.
    """

    def __init__(self) -> None:
        self._steps: list[Writes] = []  # taken, not yet applied, oldest first
        self._staged: list[list[tuple[_PageWriter, int, int]] | None] = []

    def __len__(self) -> int:
        return len(self._steps)

    def add(self, writes: Writes) -> None:
        """Queue one step's writes (``KVPool.take_writes()``), after the ones queued before."""
        self._steps.append(writes)

    def _stage(self) -> None:
        used: dict[_PageWriter, int] = {}
        parts: dict[_PageWriter, list[Runs]] = {}
        plans: list[list[tuple[_PageWriter, int, int]] | None] = []
        for writes in self._steps:
            need: dict[_PageWriter, int] = {}
            for writer, runs in writes:
                need[writer] = need.get(writer, 0) + len(runs)
            if any(used.get(w, 0) + k > w.capacity for w, k in need.items()):
                break
            plan: list[tuple[_PageWriter, int, int]] = []
            for writer, runs in writes:
                lo = used.get(writer, 0)
                used[writer] = lo + len(runs)
                parts.setdefault(writer, []).append(runs)
                plan.append((writer, lo, lo + len(runs)))
            plans.append(plan)
        for writer, staged in parts.items():
            writer.stage(staged)
        # Steps past the first that did not fit wait for the next stage; a first step too
        # large for any stage is written in parts (plan None).
        self._staged = plans or [None]

    def next(self) -> None:
        """Apply the oldest queued step's writes."""
        if not self._steps:
            raise IndexError("no queued writes")
        if not self._staged:
            self._stage()
        plan = self._staged.pop(0)
        writes = self._steps.pop(0)
        if plan is None:
            for writer, runs in writes:
                writer.write(runs)
        else:
            for writer, lo, hi in plan:
                writer.apply(lo, hi)
