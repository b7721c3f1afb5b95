"""Invariant: pagegraph's ``"slot_mapping"`` builder writes exactly what the oracle writes: each
real token's slot, ``PAD_SLOT_ID`` for padded rows' tokens and for the tail up to
``max_num_tokens``, nothing before ``query_start_loc[0]`` nor outside ``slot_mapping``;
broken host guarantees stay inside their row and their buffers; the argument checks name
what is wrong.

The slot mapping is a view inside a canary-filled buffer and starts from random stale slots;
the whole buffer is compared exactly. Inputs are small, seeded and random, of odd sizes, with
rows of 0, 1 and more than a thousand tokens (several passes of a program and of several
programs a row).
"""

from __future__ import annotations

import pytest
import torch

from pagegraph.kernels.slot_mapping import PAD_SLOT_ID, compute_slot_mappings
from pagegraph.kernels.vllm_reference import reference_slot_mapping

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
CANARY = -31337
MARGIN = 5


def framed_slots(n: int, gen) -> tuple[torch.Tensor, torch.Tensor]:
    """A canary int64 buffer and the ``[n]`` view at ``MARGIN`` in it, full of stale slots."""
    big = torch.full((n + 2 * MARGIN,), CANARY, dtype=torch.int64)
    big[MARGIN : MARGIN + n] = torch.randint(0, 1 << 30, (n,), generator=gen)
    big = big.to(DEVICE)
    return big, big[MARGIN : MARGIN + n]


def make_case(
    seed: int,
    rows: int,
    page_size: int,
    width: int,
    *,
    pad_rows: int = 1,
    long_row: int = 0,
    first: int = 0,
    spare: int = 37,
):
    """Seeded inputs: ``rows`` rows of 0 to 9 tokens (one of ``long_row`` tokens when
    given), the last ``pad_rows`` of them padded (-1; two when there are enough rows), each
    real row on its own request slot; positions inside each row's blocks; a slot mapping
    ``spare`` entries longer than the batch, its first ``first`` tokens before ``qsl[0]``."""
    gen = torch.Generator().manual_seed(seed)
    max_reqs = rows + 4
    table = torch.randint(1, 1 << 24, (max_reqs, width + 3), generator=gen, dtype=torch.int32)
    table = table[:, :width]  # a row stride larger than the width
    counts = torch.randint(0, 10, (rows,), generator=gen)
    if long_row:
        counts[rows // 2] = long_row
    qsl = torch.cat([torch.zeros(1, dtype=torch.int64), counts.cumsum(0)]) + first
    idx = torch.randperm(max_reqs, generator=gen)[:rows].to(torch.int32)
    idx[rows - pad_rows :] = -1
    if rows > 4:
        idx[1] = -1
    total = int(qsl[-1])
    positions = torch.randint(0, width * page_size, (total,), generator=gen)
    big, slots = framed_slots(total + spare, gen)
    args = (table.to(DEVICE), idx.to(DEVICE), qsl.to(torch.int32).to(DEVICE))
    return args, positions.to(DEVICE), big, slots


def run_both(builder, args, positions, big, slots, page_size):
    want_big = big.clone()
    want = want_big[MARGIN : MARGIN + slots.shape[0]]
    builder(*args, positions, slots, page_size)
    reference_slot_mapping(*args, positions, want, page_size)
    return big, want_big


def assert_equal_slots(got: torch.Tensor, want: torch.Tensor) -> None:
    if torch.equal(got, want):
        return
    diff = (got != want).nonzero().flatten().tolist()
    first = ", ".join(f"[{i}] got {int(got[i])} want {int(want[i])}" for i in diff[:5])
    raise AssertionError(f"{len(diff)} entries differ; first: {first}")


CASES = [
    # seed, rows, page_size, width, long_row, first
    (1, 3, 16, 5, 0, 0),
    (2, 7, 1, 300, 0, 0),
    (3, 13, 16, 1300, 1500, 0),
    (4, 7, 16, 37, 2600, 3),
    (5, 13, 1, 2100, 1100, 0),
    (6, 1, 16, 9, 0, 2),
]


@pytest.mark.parametrize("seed, rows, page_size, width, long_row, first", CASES)
def test_builder_matches_oracle(seed, rows, page_size, width, long_row, first):
    args, positions, big, slots = make_case(
        seed, rows, page_size, width, long_row=long_row, first=first
    )
    got, want = run_both(compute_slot_mappings, args, positions, big, slots, page_size)
    assert_equal_slots(got, want)
    assert torch.all(got[:MARGIN] == CANARY) and torch.all(got[-MARGIN:] == CANARY)
    qsl = args[2].cpu()
    # The tail and every padded row's tokens are PAD; tokens before qsl[0] are stale.
    assert torch.all(slots[int(qsl[-1]) :] == PAD_SLOT_ID)
    assert torch.all(slots[: int(qsl[0])] != PAD_SLOT_ID)
    for i in (args[1].cpu() < 0).nonzero().flatten().tolist():
        assert torch.all(slots[int(qsl[i]) : int(qsl[i + 1])] == PAD_SLOT_ID)


def test_oracle_by_hand():
    table = torch.tensor([[3, 4, 5], [7, 8, 9]], dtype=torch.int32)
    idx = torch.tensor([1, -1, 0], dtype=torch.int32)
    qsl = torch.tensor([1, 3, 4, 5], dtype=torch.int32)
    positions = torch.tensor([0, 0, 17, 5, 33], dtype=torch.int64)
    slots = torch.full((7,), 99, dtype=torch.int64)
    reference_slot_mapping(table, idx, qsl, positions, slots, 16)
    # Token 0 is before qsl[0]; row 0 (slot 1): positions 0 and 17; row 1 padded; row 2
    # (slot 0): position 33 is block 2 offset 1; the tail from qsl[3] = 5.
    assert slots.tolist() == [99, 7 * 16, 8 * 16 + 1, -1, 5 * 16 + 1, -1, -1]


def test_empty_batch_pads_everything():
    gen = torch.Generator().manual_seed(7)
    table = torch.randint(1, 99, (3, 4), generator=gen, dtype=torch.int32).to(DEVICE)
    big, slots = framed_slots(300, gen)
    idx = torch.empty(0, dtype=torch.int32, device=DEVICE)
    qsl = torch.zeros(1, dtype=torch.int32, device=DEVICE)
    positions = torch.zeros(0, dtype=torch.int64, device=DEVICE)
    compute_slot_mappings(table, idx, qsl, positions, slots, 16)
    assert torch.all(slots == PAD_SLOT_ID)
    assert torch.all(big[:MARGIN] == CANARY) and torch.all(big[-MARGIN:] == CANARY)


def test_hostile_inputs_stay_inside_rows_and_buffers():
    """Positions past their row or negative, a slot past the table, a batch longer than the
    slot mapping and than ``positions``: the builder still matches the oracle's clamps and
    writes nothing outside ``slot_mapping``."""
    page_size, width = 16, 7
    args, positions, big, slots = make_case(31, 7, page_size, width, long_row=40, spare=0)
    table, idx, qsl = args
    positions[0] = width * page_size + 5
    positions[1] = -20
    positions[2] = 2**40
    real = (idx >= 0).nonzero().flatten()
    idx[int(real[0])] = table.shape[0] + 6
    total = int(qsl[-1])
    short = positions[: total - 3]
    smaller = slots[: total - 8]  # qsl[rows] > max_num_tokens
    got, want = run_both(compute_slot_mappings, args, short, big, smaller, page_size)
    assert_equal_slots(got, want)
    # Entries past the shorter view are untouched (a view of the same buffer).
    assert torch.equal(got[MARGIN + total - 8 :], want[MARGIN + total - 8 :])
    assert torch.all(got[MARGIN + total - 8 :] != PAD_SLOT_ID)


def test_planted_row_overrun_is_caught():
    """The exact comparison fires on a builder whose rows run one token past their end (a
    twin of the tests above, which pass with the real builder)."""

    def overrun(block_table, idx_mapping, qsl, positions, slot_mapping, page_size):
        compute_slot_mappings(block_table, idx_mapping, qsl, positions, slot_mapping, page_size)
        end = int(qsl[-1])
        slot_mapping[end] = 0

    args, positions, big, slots = make_case(32, 5, 16, 9)
    got, want = run_both(overrun, args, positions, big, slots, 16)
    with pytest.raises(AssertionError, match="1 entries differ"):
        assert_equal_slots(got, want)


def test_argument_checks_name_the_argument():
    args, positions, _, slots = make_case(33, 3, 16, 5)
    table, idx, qsl = args
    call = compute_slot_mappings
    with pytest.raises(TypeError, match="block_table must be int32"):
        call(table.long(), idx, qsl, positions, slots, 16)
    with pytest.raises(TypeError, match="idx_mapping must be int32"):
        call(table, idx.long(), qsl, positions, slots, 16)
    with pytest.raises(TypeError, match="query_start_loc must be int32"):
        call(table, idx, qsl.long(), positions, slots, 16)
    with pytest.raises(TypeError, match="positions must be int64"):
        call(table, idx, qsl, positions.int(), slots, 16)
    with pytest.raises(TypeError, match="slot_mapping must be int64"):
        call(table, idx, qsl, positions, slots.int(), 16)
    with pytest.raises(ValueError, match="slot_mapping must have inner stride 1"):
        call(table, idx, qsl, positions, slots[::2], 16)
    with pytest.raises(ValueError, match="query_start_loc has 3 entries, rows \\+ 1 = 4"):
        call(table, idx, qsl[:3], positions, slots, 16)
    with pytest.raises(ValueError, match="page_size must be an integer >= 1"):
        call(table, idx, qsl, positions, slots, 0)
    with pytest.raises(ValueError, match="page_size must be an integer >= 1"):
        call(table, idx, qsl, positions, slots, True)
    with pytest.raises(ValueError, match="block_table must have rows and columns"):
        call(table[:, :0], idx, qsl, positions, slots, 16)
    with pytest.raises(ValueError, match="positions must have 1"):
        call(table, idx, qsl, positions[None], slots, 16)


@pytest.mark.parametrize("seed", range(100, 124))
def test_seeded_sweep_matches_oracle(seed):
    """Random sizes, page sizes and padding; positions past their row and slots past the
    table in half the cases."""
    gen = torch.Generator().manual_seed(seed)

    def draw(lo: int, hi: int) -> int:
        return int(torch.randint(lo, hi + 1, (1,), generator=gen))

    page_size = [1, 2, 16, 64, 528][seed % 5]
    width, rows = draw(1, 1500), draw(1, 15)
    args, positions, big, slots = make_case(
        seed,
        rows,
        page_size,
        width,
        pad_rows=draw(0, rows),
        long_row=draw(0, 1) * draw(0, 1400),
        first=draw(0, 3),
        spare=draw(0, 600),
    )
    if seed % 2 and positions.numel():
        at = torch.randint(0, positions.shape[0], (2,), generator=gen)
        positions[at] = torch.tensor([-3, width * page_size + 17], device=positions.device)
        args[1][0] = args[0].shape[0] + 2
    got, want = run_both(compute_slot_mappings, args, positions, big, slots, page_size)
    assert_equal_slots(got, want)
    assert torch.all(got[:MARGIN] == CANARY) and torch.all(got[-MARGIN:] == CANARY)
