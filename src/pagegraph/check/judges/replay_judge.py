"""The device records that the judges comparing a replay with something else share
(``RecordedComparisons``): after each
replay it wants, such a judge queues its comparison into one record row (no sync); once a
chunk its records are read back into its property. Two exist:
``pagegraph.check.judges.graph_safety.EagerTwin`` ("graph-safe": the replay against an eager
call on the same inputs) and ``pagegraph.check.judges.eager_reads.GraphReads`` ("correct": what
the graph read of an eagerly built kind's tables against what the builder left there).
"""

from __future__ import annotations

import torch

from ..reports.report import Failure, PropertyResult
from .verify import ModelStep

__all__ = ["RecordedComparisons"]


class RecordedComparisons:
    """A judge's device records, one ``[4]`` int64 row a compared replay (entries that
    differ, the first one's flat index, the two values there; a scratch row for replays not
    compared), and their read-back: every compared replay with a difference fails the
    property, the first one with its ``Failure`` (``describe``). The replay loop makes it a
    ``Judge`` of the tables' replays: observing compares what it ``wanted``, settling reads
    back (``judge``)."""

    #: the report's property this judge fails
    property_name: str

    def __init__(self, chunk: int, device: torch.device) -> None:
        self.records = torch.zeros((chunk + 1, 4), dtype=torch.int64, device=device)
        self.compared: dict[int, ModelStep] = {}

    def record(
        self, slot: int, mstep: ModelStep, got: torch.Tensor, expected: torch.Tensor
    ) -> None:
        """Queue on the device (no sync) how the 1-D int64 ``got`` and ``expected`` differ,
        into record ``slot``, for replay ``mstep``."""
        diff = got != expected
        first = diff.to(torch.uint8).argmax().view(1)
        self.records[slot] = torch.cat(
            [diff.sum().view(1), first, got.gather(0, first), expected.gather(0, first)]
        )
        self.compared[slot] = mstep

    def wanted(self, mstep: ModelStep) -> bool:
        """Whether replay ``mstep`` is compared (every one, unless a judge says otherwise)."""
        return True

    def compare(self, slot: int, mstep: ModelStep) -> None:
        """Queue the comparison of replay ``mstep`` into record ``slot`` (``record``)."""
        raise NotImplementedError

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

    def describe(self, mstep: ModelStep, count: int, flat: int, got: int, expected: int) -> Failure:
        """The first difference of replay ``mstep`` as a ``Failure``: ``count`` entries
        differ, the first at ``flat``, where the replay gave ``got`` and ``expected`` was
        due."""
        raise NotImplementedError
