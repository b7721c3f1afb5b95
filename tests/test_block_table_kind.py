"""Invariant: pagegraph's ``"block_table"`` builder writes exactly what the oracle writes, and
nothing outside ``out[:num_rows, :width]``; broken host guarantees stay inside their row; the
argument checks name what is wrong; ``EngineBlockTables`` keeps vLLM's append/overwrite
semantics with exact entries after every update.

Outputs are views inside canary-filled buffers (rows above and below, columns past the width,
a row stride larger than the width) and start from random stale values; whole buffers are
compared exactly. Inputs are small, seeded and random, of odd sizes.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pagegraph.kernels.block_table import gather_block_tables
from pagegraph.kernels.vllm_reference import reference_block_table
from pagegraph.kinds import BatchContext
from pagegraph.workload.engine_block_tables import EngineBlockTables

from helpers import CANARY, MARGIN, assert_equal_tables

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def framed_table(rows: int, width: int, extra_cols: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    """A canary buffer and the ``[rows, width]`` int32 view at ``[MARGIN, MARGIN]`` in it, row
    stride ``width + 2 * MARGIN + extra_cols``."""
    big = torch.full(
        (rows + 2 * MARGIN, width + 2 * MARGIN + extra_cols), CANARY, dtype=torch.int32
    )
    big = big.to(DEVICE)
    return big, big[MARGIN : MARGIN + rows, MARGIN : MARGIN + width]


def make_case(
    seed: int,
    num_reqs: int,
    num_rows: int,
    width: int,
    max_bs: int | None = None,
    extra_cols: int = 3,
):
    """Seeded inputs: a per-request table (framed, random ids), counts in ``[0, width]`` with 0
    and ``width`` present, a one-to-one ``idx_mapping`` of ``max_bs`` entries (stale past
    ``num_reqs``), and a framed ``out`` full of random stale ids."""
    gen = torch.Generator().manual_seed(seed)
    max_bs = max_bs or num_rows + 2
    max_reqs = max_bs + 5
    _, table = framed_table(max_reqs, width, extra_cols)
    table.copy_(torch.randint(1, 1 << 24, (max_reqs, width), generator=gen, dtype=torch.int32))
    counts = torch.randint(0, width + 1, (max_reqs,), generator=gen, dtype=torch.int32)
    counts[0], counts[1] = 0, width
    idx = torch.randperm(max_reqs, generator=gen)[:max_bs].to(torch.int32)
    out_big, out = framed_table(max_bs, width, extra_cols)
    out.copy_(torch.randint(1, 1 << 24, (max_bs, width), generator=gen, dtype=torch.int32))
    batch = BatchContext(num_reqs=num_reqs, num_rows=num_rows, max_bs=max_bs)
    return table, counts.to(DEVICE), idx.to(DEVICE), out_big, out, batch


def run_both(builder, table, counts, idx, out_big, out, batch):
    """``out_big`` after ``builder`` and after the oracle, from the same start."""
    want_big = out_big.clone()
    want = want_big[MARGIN : MARGIN + out.shape[0], MARGIN : MARGIN + out.shape[1]]
    builder(table, counts, idx, out, batch=batch)
    reference_block_table(table, counts, idx, want, batch=batch)
    return out_big, want_big


def assert_frame_intact(big: torch.Tensor, rows: int, width: int) -> None:
    inside = torch.zeros_like(big, dtype=torch.bool)
    inside[MARGIN : MARGIN + rows, MARGIN : MARGIN + width] = True
    outside = big[~inside]
    assert torch.all(outside == CANARY), "a write outside the output view"


CASES = [
    # seed, num_reqs, num_rows, width
    (1, 3, 4, 5),
    (2, 7, 8, 300),
    (3, 13, 16, 1300),
    (4, 0, 3, 37),
    (5, 13, 13, 1),
    (6, 7, 7, 2100),
]


@pytest.mark.parametrize("seed, num_reqs, num_rows, width", CASES)
def test_builder_matches_oracle_and_writes_only_its_rows(seed, num_reqs, num_rows, width):
    table, counts, idx, out_big, out, batch = make_case(seed, num_reqs, num_rows, width)
    got, want = run_both(gather_block_tables, table, counts, idx, out_big, out, batch)
    assert_equal_tables(got, want, "out buffer")
    assert_frame_intact(got, out.shape[0], width)
    # Rows past num_rows keep their stale ids; padded rows are all zero; real rows' tails too.
    stale = want[MARGIN + num_rows : MARGIN + out.shape[0], MARGIN : MARGIN + width]
    assert torch.all(stale != 0) and stale.numel() > 0
    assert torch.all(out[num_reqs:num_rows] == 0)


def test_oracle_by_hand():
    """The oracle itself, on a case small enough to write out."""
    table = torch.tensor([[11, 12, 13], [21, 22, 23], [31, 32, 33]], dtype=torch.int32)
    counts = torch.tensor([3, 1, 2], dtype=torch.int32)
    idx = torch.tensor([2, 0, 1, 1], dtype=torch.int32)  # entry 2 on is stale
    out = torch.full((4, 3), 7, dtype=torch.int32)
    reference_block_table(table, counts, idx, out, batch=BatchContext(2, 3, 4))
    assert out.tolist() == [[31, 32, 7], [11, 12, 13], [0, 0, 0], [7, 7, 7]]


@pytest.mark.parametrize("width", [9, 1300])
def test_hostile_counts_and_slots_stay_inside_their_row(width):
    table, counts, idx, out_big, out, batch = make_case(11, 6, 8, width)
    max_reqs = table.shape[0]
    counts[idx[0]] = width + 3
    counts[idx[1]] = -5
    counts[idx[2]] = 2**31 - 1
    idx[3] = max_reqs + 4
    idx[4] = -3
    got, want = run_both(gather_block_tables, table, counts, idx, out_big, out, batch)
    assert_equal_tables(got, want, "out buffer")
    assert_frame_intact(got, out.shape[0], width)
    # The clamps: a count past the width copies the whole row, a negative one nothing.
    assert torch.equal(out[0], table[idx[0]])
    r_last = max_reqs - 1
    n_last = min(max(int(counts[r_last]), 0), width)
    assert torch.equal(out[3, :n_last], table[r_last, :n_last])


def test_planted_writer_outside_its_rows_is_caught():
    """The frame check fires on a builder that writes one padded row too many (a twin of the
    test above, which must pass with the real builder)."""

    def one_row_too_many(block_table, num_blocks, idx_mapping, out, *, batch):
        gather_block_tables(block_table, num_blocks, idx_mapping, out, batch=batch)
        out[batch.num_rows].zero_()

    table, counts, idx, out_big, out, batch = make_case(12, 3, 4, 7)
    got, want = run_both(one_row_too_many, table, counts, idx, out_big, out, batch)
    with pytest.raises(AssertionError):
        assert_equal_tables(got, want, "out buffer")


# -- argument checks ---------------------------------------------------------------------------


def test_argument_checks_name_the_argument():
    table, counts, idx, _, out, batch = make_case(13, 3, 4, 6)
    call = gather_block_tables
    with pytest.raises(TypeError, match="block_table must be int32"):
        call(table.long(), counts, idx, out, batch=batch)
    with pytest.raises(TypeError, match="num_blocks must be int32"):
        call(table, counts.long(), idx, out, batch=batch)
    with pytest.raises(TypeError, match="idx_mapping must be int32"):
        call(table, counts, idx.long(), out, batch=batch)
    with pytest.raises(TypeError, match="out must be a torch.Tensor"):
        call(table, counts, idx, out.tolist(), batch=batch)
    with pytest.raises(TypeError, match="batch must be a BatchContext"):
        call(table, counts, idx, out, batch=(3, 4, 6))
    with pytest.raises(ValueError, match="out must have inner stride 1"):
        call(table, counts, idx, out.t().contiguous().t(), batch=batch)
    with pytest.raises(ValueError, match="out is 5 wide"):
        call(table, counts, idx, out[:, :5], batch=batch)
    with pytest.raises(ValueError, match="out has 3 rows, num_rows = 4"):
        call(table, counts, idx, out[:3], batch=batch)
    with pytest.raises(ValueError, match="num_blocks has"):
        call(table, counts[:-1], idx, out, batch=batch)
    with pytest.raises(ValueError, match="idx_mapping has 2 entries, num_reqs = 3"):
        call(table, counts, idx[:2], out, batch=batch)
    with pytest.raises(ValueError, match="block_table must have 2"):
        call(table[0], counts, idx, out, batch=batch)


def test_batch_context_is_validated():
    assert BatchContext(0, 0, 0).num_rows == 0
    with pytest.raises(ValueError, match="num_reqs <= num_rows <= max_bs"):
        BatchContext(5, 4, 8)
    with pytest.raises(ValueError, match="num_reqs <= num_rows <= max_bs"):
        BatchContext(1, 9, 8)
    with pytest.raises(ValueError):
        BatchContext(-1, 2, 8)
    with pytest.raises(TypeError, match="num_reqs must be an int"):
        BatchContext(torch.tensor(3), 4, 8)
    with pytest.raises(TypeError, match="max_bs must be an int"):
        BatchContext(1, 2, True)
    with pytest.raises(AttributeError):
        BatchContext(1, 2, 3).num_reqs = 2  # frozen


# -- EngineBlockTables -------------------------------------------------------------------------


def pool(gen, max_reqs: int, cols: int, page_size: int) -> torch.Tensor:
    """``req_to_token``: every row owns distinct random pages, slots consecutive in a page."""
    pages_per_row = -(-cols // page_size)
    pages = torch.randperm(max_reqs * pages_per_row + 5, generator=gen)[: max_reqs * pages_per_row]
    starts = (pages + 1).reshape(max_reqs, pages_per_row) * page_size
    slots = starts.repeat_interleave(page_size, 1) + torch.arange(page_size).repeat(pages_per_row)
    return slots[:, :cols].to(torch.int32).contiguous().to(DEVICE)


def assert_entries_exact(tables: EngineBlockTables, r2t: torch.Tensor) -> None:
    ps = tables.page_size
    counts = tables.num_blocks.cpu()
    assert counts.tolist() == tables.host_num_blocks.tolist()
    for r in range(tables.max_reqs):
        n = int(counts[r])
        want = r2t[r, : n * ps : ps].cpu().long() // ps
        assert tables.block_table[r, :n].cpu().long().tolist() == want.tolist(), f"row {r}"


@pytest.mark.parametrize("page_size", [1, 16])
def test_engine_tables_append_and_overwrite(page_size):
    gen = torch.Generator().manual_seed(21)
    max_reqs, width = 9, 13
    tables = EngineBlockTables(max_reqs, width, page_size, DEVICE)
    r2t = pool(gen, max_reqs, width * page_size, page_size)
    tables.update([2, 5, 7], [3 * page_size, 1, 0], r2t)
    assert tables.host_num_blocks[[2, 5, 7]].tolist() == [3, 1, 0]
    assert_entries_exact(tables, r2t)
    # Growth appends: poison the live entries on the device; an append leaves them alone.
    tables.block_table[2, :3] = -1
    tables.update([2, 5], [4 * page_size + 1, 2 * page_size + 1], r2t)
    assert tables.block_table[2, :3].tolist() == [-1, -1, -1]
    assert tables.host_num_blocks[[2, 5]].tolist() == [5, 3]
    tables.block_table[2, :3] = r2t[2, : 3 * page_size : page_size].cpu() // page_size
    assert_entries_exact(tables, r2t)
    # A new, shorter request in slot 2 (vLLM's overwrite): rewritten from 0, tail stale.
    r2t[2] = pool(gen, 1, width * page_size, page_size)[0] + 10_000 * page_size
    tail = tables.block_table[2, 2:5].clone()
    tables.update([2], [2 * page_size], r2t)
    assert tables.host_num_blocks[2] == 2
    assert torch.equal(tables.block_table[2, 2:5], tail)  # stale, as vLLM leaves it
    assert_entries_exact(tables, r2t)
    # Overlong: clamped to the width; a repeated slot takes its last row's length.
    tables.update([7, 4, 4], [(width + 4) * page_size, 99, 2 * page_size], r2t)
    assert tables.host_num_blocks[[7, 4]].tolist() == [width, 2]
    assert_entries_exact(tables, r2t)


def test_engine_tables_reset_and_new_requests():
    gen = torch.Generator().manual_seed(22)
    ps, width = 16, 6
    tables = EngineBlockTables(5, width, ps, DEVICE)
    r2t = pool(gen, 5, width * ps, ps)
    tables.update([1, 3], [40, 70], r2t)
    tables.reset(1)
    assert tables.num_blocks[1] == 0 and tables.host_num_blocks[1] == 0
    # A new request in slot 1 after the reset, longer than the old one: rewritten from 0.
    r2t[1] = pool(gen, 1, width * ps, ps)[0] + 5000 * ps
    tables.update([1], [60], r2t)
    assert_entries_exact(tables, r2t)
    # Without a reset, `new` marks a slot whose request changed (not shorter).
    r2t[3] = pool(gen, 1, width * ps, ps)[0] + 9000 * ps
    tables.update([3], [80], r2t, new=[True])
    assert_entries_exact(tables, r2t)
    # Planted twin: the same change without `new` appends only, and the check sees it.
    r2t[3] = pool(gen, 1, width * ps, ps)[0] + 12000 * ps
    tables.update([3], [90], r2t)
    with pytest.raises(AssertionError, match="row 3"):
        assert_entries_exact(tables, r2t)


def test_engine_tables_injection_and_argument_checks():
    gen = torch.Generator().manual_seed(23)
    tables = EngineBlockTables(4, 5, 2, DEVICE)
    r2t = pool(gen, 4, 10, 2)
    tables.update([0, 2], [5, 9], r2t)
    tables.inject_num_blocks([0, 2], [5 + 3, -1])
    assert tables.num_blocks.tolist() == [8, 0, -1, 0]
    assert tables.host_num_blocks.tolist() == [3, 0, 5, 0]
    tables.restore_num_blocks()
    assert tables.num_blocks.tolist() == [3, 0, 5, 0]
    with pytest.raises(ValueError, match="request slots"):
        tables.update([4], [1], r2t)
    with pytest.raises(ValueError, match="cannot fill"):
        tables.update([0], [1], r2t[:, :8])
    with pytest.raises(ValueError, match="2 request slots, 1 lengths"):
        tables.update([0, 1], [1], r2t)
    with pytest.raises(ValueError, match="outside"):
        tables.reset(4)
    with pytest.raises(ValueError, match="twice the width"):
        tables.inject_num_blocks([3], [2 * 5 + 1])
    with pytest.raises(ValueError, match="request slots"):
        tables.inject_num_blocks([4], [6])
    # A count of up to twice the width reads at most the spare row past the last slot.
    storage = tables.block_table.untyped_storage().nbytes() // 4
    assert storage == (4 + 1) * 5 and tables.block_table.data_ptr() % 16 == 0


def test_engine_tables_feed_the_builder():
    """A few steps of a drifting batch through the engine's tables and the builder: the batch
    table's live entries are the pool's pages, every step."""
    gen = torch.Generator().manual_seed(24)
    rng = np.random.default_rng(24)
    ps, width, max_reqs, max_bs = 16, 11, 12, 8
    tables = EngineBlockTables(max_reqs, width, ps, DEVICE)
    r2t = pool(gen, max_reqs, width * ps, ps)
    lengths = np.zeros(max_reqs, dtype=np.int64)
    out = torch.full((max_bs, width), 5, dtype=torch.int32, device=DEVICE)
    for _ in range(4):
        slots = rng.choice(max_reqs, size=int(rng.integers(1, max_bs + 1)), replace=False)
        lengths[slots] += rng.integers(1, 3 * ps, size=slots.size)
        tables.update(slots, lengths[slots], r2t)
        idx = torch.tensor(slots, dtype=torch.int32, device=DEVICE)
        batch = BatchContext(len(slots), max_bs, max_bs)
        gather_block_tables(tables.block_table, tables.num_blocks, idx, out, batch=batch)
        for i, r in enumerate(slots):
            n = min(-(-int(lengths[r]) // ps), width)
            assert out[i, :n].tolist() == (r2t[r, : n * ps : ps].cpu() // ps).tolist()
        assert torch.all(out[len(slots) :] == 0)


@pytest.mark.parametrize("seed", range(100, 124))
def test_seeded_sweep_matches_oracle(seed):
    """Random sizes (any width, bucket, padding), hostile counts and slots in half the cases."""
    gen = torch.Generator().manual_seed(seed)

    def draw(lo: int, hi: int) -> int:
        return int(torch.randint(lo, hi + 1, (1,), generator=gen))

    width = draw(1, 2500) if seed % 3 else draw(1, 40)
    num_rows = draw(0, 17)
    num_reqs = draw(0, num_rows)
    table, counts, idx, out_big, out, batch = make_case(
        seed, num_reqs, num_rows, width, max_bs=num_rows + draw(0, 3), extra_cols=draw(0, 5)
    )
    if seed % 2:
        hostile = torch.randint(0, counts.shape[0], (3,), generator=gen).to(counts.device)
        counts[hostile] = torch.tensor(
            [-7, width + 1, 2**31 - 1], dtype=torch.int32, device=counts.device
        )
        bad = torch.tensor([-1, 10**6], dtype=torch.int32, device=idx.device)
        idx[: min(2, idx.shape[0])] = bad[: idx.shape[0]]
    got, want = run_both(gather_block_tables, table, counts, idx, out_big, out, batch)
    assert_equal_tables(got, want, "out buffer")
    assert_frame_intact(got, out.shape[0], width)
