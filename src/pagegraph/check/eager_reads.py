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

from .report import Failure
from .verify import ModelStep


class GraphReads:
    """Per replay, the entries of the bucket's rows where the graph read something else than
    the eager builder wrote (records read back once a chunk): a ``ReplayJudge`` of
    "correct"."""

    property_name = "correct"

    def __init__(self, runner, chunk: int, width: int):
        self.runner = runner
        self.width = width
        # count, first differing flat index (row * width + col), what was read, what was written
        self.records = torch.zeros((chunk + 1, 4), dtype=torch.int64, device=runner.device)
        self.compared: dict[int, ModelStep] = {}

    @staticmethod
    def applies(runner) -> bool:
        return getattr(runner, "read_table", None) is not None

    def wanted(self, mstep: ModelStep) -> bool:
        return True  # every replay: the graph reads the tables each time

    def compare(self, slot: int, mstep: ModelStep) -> None:
        b = mstep.bucket
        read = self.runner.read_table[:b].reshape(-1).to(torch.int64)
        written = self.runner.page_table[:b].reshape(-1).to(torch.int64)
        diff = read != written
        first = diff.to(torch.uint8).argmax().view(1)
        self.records[slot] = torch.cat(
            [diff.sum().view(1), first, read.gather(0, first), written.gather(0, first)]
        )
        self.compared[slot] = mstep

    def judge(self, prop) -> None:
        if not self.compared:
            return
        records = self.records.cpu().numpy()
        for slot, mstep in sorted(self.compared.items()):
            count, flat, read, written = (int(x) for x in records[slot])
            if not count:
                continue
            if prop.first_failure is not None:
                prop.fail()
                continue
            row, col = divmod(flat, self.width)
            failure = Failure(mstep.index, mstep.bucket, row, col, written, read, "page_table")
            failure.note = (
                f"the graph read {read} where the builder, run before it, left {written} "
                f"({count} entr{'y' if count == 1 else 'ies'} of the bucket)"
            )
            prop.fail(failure)
        self.compared.clear()
