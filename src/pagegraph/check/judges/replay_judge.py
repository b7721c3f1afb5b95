"""Judges the replay loop plugs in beside the verifier's table comparison (``ReplayJudge``),
and the read-back they share (``RecordedComparisons``).

After each replay it wants, a judge queues its comparison on the device into one record row
(no sync); once a chunk, its records are read back and folded into its property. Two judges
exist: ``pagegraph.check.judges.graph_safety.EagerTwin`` ("graph-safe": the replay against an eager
call on the same inputs) and ``pagegraph.check.judges.eager_reads.GraphReads`` ("correct": what the
graph read of an eagerly built kind's tables against what the builder left there).
"""

from __future__ import annotations

from typing import Protocol

import torch

from ..reports.report import Failure, PropertyResult
from .verify import ModelStep

__all__ = ["RecordedComparisons", "ReplayJudge"]


class ReplayJudge(Protocol):
    """A judge of replays: ``wanted`` says whether it compares replay ``mstep``,
    ``compare`` queues that comparison into record ``slot`` (no sync), ``judge`` reads the
    chunk's records back into its property (the report's property named ``property_name``)."""

    property_name: str

    def wanted(self, mstep: ModelStep) -> bool: ...

    def compare(self, slot: int, mstep: ModelStep) -> None: ...

    def judge(self, prop: PropertyResult) -> None: ...


class RecordedComparisons:
    """A judge's device records, one ``[4]`` int64 row a compared replay (entries that
    differ, the first one's flat index, the two values there; a scratch row for replays not
    compared), and their read-back: every compared replay with a difference fails the
    property, the first one with its ``Failure`` (``describe``)."""

    def __init__(self, chunk: int, device: torch.device) -> None:
        self.records = torch.zeros((chunk + 1, 4), dtype=torch.int64, device=device)
        self.compared: dict[int, ModelStep] = {}

    def record(self, slot: int, mstep: ModelStep, got: torch.Tensor,
               expected: torch.Tensor) -> None:  # fmt: skip
        """Queue on the device (no sync) how the 1-D int64 ``got`` and ``expected`` differ,
        into record ``slot``, for replay ``mstep``."""
        diff = got != expected
        first = diff.to(torch.uint8).argmax().view(1)
        self.records[slot] = torch.cat(
            [diff.sum().view(1), first, got.gather(0, first), expected.gather(0, first)]
        )
        self.compared[slot] = mstep

    def judge(self, prop: PropertyResult) -> None:
        """Fold the compared replays' records into ``prop`` (a read-back: once a chunk)."""
        if not self.compared:
            return
        records = self.records.cpu().numpy()
        for slot, mstep in sorted(self.compared.items()):
            count, flat, got, expected = (int(x) for x in records[slot])
            if count:
                first = prop.first_failure is None
                prop.fail(self.describe(mstep, count, flat, got, expected) if first else None)
        self.compared.clear()

    def describe(self, mstep: ModelStep, count: int, flat: int, got: int,
                 expected: int) -> Failure:  # fmt: skip
        """The first difference of replay ``mstep`` as a ``Failure``: ``count`` entries
        differ, the first at ``flat``, where the replay gave ``got`` and ``expected`` was
        due."""
        raise NotImplementedError
