"""What the graph reads of an eagerly built kind's outputs (``KindSpec.where == "eager"``).

vLLM builds its block tables on the host side of each step, into persistent buffers, and
replays a graph that reads them. The builder's writes are judged like any other kind's
("correct", "bounded writes"); what this adds is the graph's side: after each replay, the
rows of the bucket the graph read (``GraphRunner.read_table``, the graph's copy of the tables,
as an attention kernel would load them) must equal what the builder left in the tables. A
builder that writes through a buffer other than the one captured, or on a stream the graph
does not wait for, shows here; a failure is one of "correct".
"""

from __future__ import annotations

import torch

from ...graph.runner import GraphRunner
from ..reports.report import Failure
from .replay_judge import RecordedComparisons
from .verify import ModelStep


class GraphReads(RecordedComparisons):
    """Per replay, the entries of the bucket's rows where the graph read something else than
    the eager builder wrote (records read back once a chunk): a comparison judging
    "correct"."""

    property_name = "correct"

    def __init__(self, runner: GraphRunner, chunk: int, width: int) -> None:
        # count, first differing flat index (row * width + col), what was read, what was written
        super().__init__(chunk, runner.device)
        self.runner = runner
        self.width = width

    @staticmethod
    def applies(runner: GraphRunner) -> bool:
        return getattr(runner, "read_table", None) is not None

    def wanted(self, mstep: ModelStep) -> bool:
        return True  # every replay: the graph reads the tables each time

    def compare(self, slot: int, mstep: ModelStep) -> None:
        b = mstep.bucket
        assert self.runner.read_table is not None  # applies(): the runner has a read_table
        read = self.runner.read_table[:b].reshape(-1).to(torch.int64)
        written = self.runner.page_table[:b].reshape(-1).to(torch.int64)
        self.record(slot, mstep, read, written)

    def describe(self, mstep: ModelStep, count: int, flat: int, read: int, written: int) -> Failure:
        row, col = divmod(flat, self.width)
        failure = Failure(mstep.index, mstep.bucket, row, col, written, read, "page_table")
        failure.note = (
            f"the graph read {read} where the builder, run before it, left {written} "
            f"({count} entr{'y' if count == 1 else 'ies'} of the bucket)"
        )
        return failure
