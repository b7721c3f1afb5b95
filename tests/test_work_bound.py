"""Invariant: the kernel's work follows each row's length, never the static width.

The kernel's ``work_counter`` hook (compiled out by default) counts every pass of the page
loop that the programs of a row group make. These tests compare that count, exactly, with
what the design promises: the programs of a group visit the blocks of the group's longest
row and no more, so a short row in a very wide table costs the same as in a narrow one. A
kernel that walked the whole width (or the batch's longest row) fails here on a CPU, where
timing could never show it.
"""

from __future__ import annotations

import pytest
import torch

from pagegraph import build_page_table
from pagegraph.kernels.contract import cdiv
from pagegraph.kernels.page_table import (
    BLOCK_PAGES,
    ROWS_PER_PROGRAM,
    UNROLL,
    programs_per_row,
    row_groups,
)

from helpers import random_inputs

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def expected_passes(lengths: list[int], width: int, page_size: int) -> list[int]:
    """Loop passes per row group, from the design: program ``j`` of ``C`` visits blocks
    ``j, j + C*UNROLL, ...`` below the group's longest row (clamped to the width)."""
    bs = len(lengths)
    parts = programs_per_row(bs, width)
    out = []
    for g in range(row_groups(bs)):
        group = lengths[g * ROWS_PER_PROGRAM : (g + 1) * ROWS_PER_PROGRAM]
        pages = max(min(cdiv(max(n, 0), page_size), width) for n in group)
        blocks = cdiv(pages, BLOCK_PAGES)
        out.append(sum(cdiv(max(blocks - j, 0), parts * UNROLL) for j in range(parts)))
    return out


def measured_passes(lengths: list[int], width: int, page_size: int, seed: int) -> list[int]:
    bs = len(lengths)
    gen = torch.Generator().manual_seed(seed)
    r2t, rpi, sl, _ = random_inputs(
        gen,
        bs=bs,
        rows=bs + 2,
        ctx=width * page_size,
        page_size=page_size,
        lengths=[1],
        swa=False,
        device=DEVICE,
    )
    sl = torch.tensor(lengths, dtype=torch.int32, device=DEVICE)
    pt = torch.zeros((bs, width), dtype=torch.int32, device=DEVICE)
    work = torch.zeros(row_groups(bs), dtype=torch.int32, device=DEVICE)
    build_page_table(r2t, rpi, sl, pt, page_size, work_counter=work)
    return work.tolist()


@pytest.mark.parametrize(
    "lengths,page_size",
    [
        ([5, 1, 0, 17, 3], 16),  # every row inside one block
        ([40_000, 3, 0, 0, 1, 7_000], 16),  # one long row among short ones
        ([-4, 0, 0, 0], 16),  # nothing live: no pass at all
        ([300, 2_000, 129, 1, 1, 1, 1], 1),  # page size 1: a page a token
    ],
    ids=["short", "one-long", "empty", "ps1"],
)
def test_passes_match_the_design_exactly(lengths, page_size):
    width = 4096
    assert measured_passes(lengths, width, page_size, seed=1) == expected_passes(
        lengths, width, page_size
    )


def test_short_rows_cost_the_same_in_a_table_sixteen_times_wider():
    """The same short lengths in a 256-page and a 4096-page table: the same loop passes,
    although the wide table has 16x the entries a width-bound kernel would visit."""
    lengths = [17, 1, 100, 3, 64, 0, 250]
    narrow = measured_passes(lengths, 256, 16, seed=2)
    wide = measured_passes(lengths, 4096, 16, seed=2)
    assert sum(wide) == sum(narrow) == len([g for g in expected_passes(lengths, 256, 16) if g])
    # A width-bound kernel would make cdiv(4096, BLOCK_PAGES) block visits a row group.
    assert sum(wide) < row_groups(len(lengths)) * cdiv(4096, BLOCK_PAGES) // 4


def test_counter_is_checked_on_the_host():
    r2t = torch.zeros((3, 64), dtype=torch.int32, device=DEVICE)
    rpi = torch.zeros(3, dtype=torch.int32, device=DEVICE)
    pt = torch.zeros((3, 4), dtype=torch.int32, device=DEVICE)
    with pytest.raises(TypeError, match="work_counter must be an int32"):
        build_page_table(r2t, rpi, rpi, pt, 16, work_counter=torch.zeros(2, device=DEVICE))
    with pytest.raises(ValueError, match="work_counter must have shape"):
        build_page_table(
            r2t, rpi, rpi, pt, 16, work_counter=torch.zeros(1, dtype=torch.int32, device=DEVICE)
        )
