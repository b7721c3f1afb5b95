"""Invariant: build_page_table writes exactly the reference's live entries and nothing else.

Every output is a view into a larger canary-filled buffer; after a call the whole buffer,
canary included, must equal what the reference leaves in an identical buffer. On a CPU the
kernel runs under the Triton interpreter; GPU cases repeat the matrix at real sizes.
"""

from __future__ import annotations

import zlib

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pagegraph import ERROR_KINDS, build_page_table, reference_page_table
from pagegraph.kernels.contract import cdiv

from helpers import assert_equal_tables, edge_lengths, framed, random_inputs

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
PAGE_SIZES = [1, 3, 16, 32, 64, 128, 256]
BATCH_SIZES = [1, 7, 17, 64, 256]


def run_against_reference(r2t, rpi, sl, width, page_size, f2s=None, errors=None):
    """Run kernel and reference into identical framed buffers; compare everything."""
    bs = sl.shape[0]
    device = r2t.device
    big, pt = framed(bs, width, device)
    big_ref, pt_ref = framed(bs, width, device)
    kw, kw_ref = {}, {}
    if f2s is not None:
        sbig, spt = framed(bs, width, device)
        sbig_ref, spt_ref = framed(bs, width, device)
        kw = {"swa_page_table": spt, "full_to_swa": f2s}
        kw_ref = {"swa_page_table": spt_ref, "full_to_swa": f2s}
    build_page_table(r2t, rpi, sl, pt, page_size, errors=errors, **kw)
    reference_page_table(r2t, rpi, sl, pt_ref, page_size, **kw_ref)
    assert_equal_tables(big, big_ref, "page_table (with canary frame)")
    if f2s is not None:
        assert_equal_tables(sbig, sbig_ref, "swa_page_table (with canary frame)")
    return big


def test_reference_known_values():
    """The oracle itself, on a hand-computed example."""
    r2t = torch.tensor([[0, 0, 0, 0, 0, 0], [8, 9, 10, 11, 4, 5], [12, 13, 2, 3, 6, 7]])
    rpi = torch.tensor([2, 1, 1])
    sl = torch.tensor([3, 6, 0])
    pt = torch.full((3, 4), -1, dtype=torch.int32)
    f2s = torch.arange(15, dtype=torch.int64) * 2
    swa = torch.full((3, 4), -1, dtype=torch.int32)
    reference_page_table(r2t, rpi, sl, pt, 2, swa_page_table=swa, full_to_swa=f2s)
    assert torch.equal(pt, torch.tensor([[6, 1, -1, -1], [4, 5, 2, -1], [-1, -1, -1, -1]]))
    assert torch.equal(swa, torch.tensor([[12, 2, -1, -1], [8, 10, 4, -1], [-1, -1, -1, -1]]))


@pytest.mark.parametrize("page_size", PAGE_SIZES)
@pytest.mark.parametrize("bs", BATCH_SIZES)
@pytest.mark.parametrize("swa", [False, True], ids=["full", "swa"])
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64], ids=["i32", "i64"])
def test_matrix(page_size, bs, swa, dtype):
    seed = zlib.crc32(repr((page_size, bs, swa, dtype)).encode())
    gen = torch.Generator().manual_seed(seed)
    width = 5 if CUDA is False else 40
    ctx = width * page_size
    lengths = edge_lengths(page_size, ctx)
    r2t, rpi, sl, f2s = random_inputs(
        gen,
        bs=bs,
        rows=bs + 3,
        ctx=ctx,
        page_size=page_size,
        lengths=lengths,
        swa=swa,
        r2t_dtype=dtype,
        idx_dtype=dtype,
        f2s_dtype=dtype,
        device=DEVICE,
    )
    run_against_reference(r2t, rpi, sl, width, page_size, f2s)


def test_table_wider_than_req_to_token():
    """A page table wider than req_to_token's rows must not read past those rows."""
    gen = torch.Generator().manual_seed(11)
    r2t, rpi, sl, _ = random_inputs(
        gen, bs=5, rows=6, ctx=50, page_size=16, lengths=[1000, 49, 17], swa=False, device=DEVICE
    )
    run_against_reference(r2t, rpi, sl, 9, 16)  # 9 pages wide, the rows supply cdiv(50,16)=4


def test_negative_and_huge_lengths_write_inside_their_row():
    gen = torch.Generator().manual_seed(12)
    r2t, rpi, sl, f2s = random_inputs(
        gen, bs=6, rows=7, ctx=64, page_size=8, lengths=[1], swa=True, device=DEVICE
    )
    sl = torch.tensor([-5, 2**31 - 1, 0, 64, 65, -(2**31)], dtype=torch.int32, device=DEVICE)
    big = run_against_reference(r2t, rpi, sl, 8, 8, f2s)
    assert (big[2 + 0, 2:10] < 0).all(), "negative seq_len wrote its row"


@pytest.mark.parametrize("swa", [False, True])
def test_error_counters(swa):
    """Out-of-contract values are clamped (no out-of-bounds access) and counted."""
    gen = torch.Generator().manual_seed(13)
    ps, width, rows = 4, 6, 5
    r2t, _, _, f2s = random_inputs(
        gen,
        bs=1,
        rows=rows,
        ctx=width * ps,
        page_size=ps,
        lengths=[1],
        swa=swa,
        num_slots=100,
        device=DEVICE,
    )
    if swa:
        f2s = f2s[:50].contiguous()  # slots 50..99 of req_to_token fall outside it
    rpi = torch.tensor([0, 9, -1, 2, 3], device=DEVICE)
    sl = torch.tensor([width * ps + 1, 3, 5, -7, width * ps], device=DEVICE)
    errors = torch.zeros(len(ERROR_KINDS), dtype=torch.int32, device=DEVICE)
    run_against_reference(r2t, rpi, sl, width, ps, f2s, errors=errors)
    counts = dict(zip(ERROR_KINDS, errors.tolist()))
    assert counts["seq_len_over_capacity"] == 1
    assert counts["negative_seq_len"] == 1
    assert counts["req_pool_index_out_of_range"] == 2
    if swa:
        # Count live page starts of the clamped rows that index past full_to_swa.
        expect = 0
        for req, length in zip(rpi.clamp(0, rows - 1).tolist(), sl.tolist()):
            n = min(max(cdiv(length, ps), 0), width)
            expect += int((r2t[req, : n * ps : ps] >= 50).sum())
        assert expect > 0
        assert counts["full_to_swa_index_out_of_range"] == expect
    else:
        assert counts["full_to_swa_index_out_of_range"] == 0
    # Counters accumulate: a second call doubles them.
    build_page_table(
        r2t, rpi, sl, torch.zeros((5, width), dtype=torch.int32, device=DEVICE), ps, errors=errors
    )
    assert errors[0].item() == 2


@settings(max_examples=40, deadline=None)
@given(
    bs=st.integers(1, 24),
    page_size=st.sampled_from([1, 2, 3, 5, 16, 64]),
    width=st.integers(1, 12),
    extra_cols=st.integers(-3, 20),
    swa=st.booleans(),
    seed=st.integers(0, 2**31 - 1),
    data=st.data(),
)
def test_property_random_shapes(bs, page_size, width, extra_cols, swa, seed, data):
    ctx = max(1, width * page_size + extra_cols)
    cap = cdiv(ctx, page_size) * page_size
    lengths = data.draw(st.lists(st.integers(-2, cap + 3 * page_size), min_size=bs, max_size=bs))
    gen = torch.Generator().manual_seed(seed)
    r2t, rpi, _, f2s = random_inputs(
        gen,
        bs=bs,
        rows=bs + 2,
        ctx=ctx,
        page_size=page_size,
        lengths=[1],
        swa=swa,
        num_slots=4096,
        device=DEVICE,
    )
    sl = torch.tensor(lengths, dtype=torch.int32, device=DEVICE)
    run_against_reference(r2t, rpi, sl, width, page_size, f2s)


def test_empty_batch_and_zero_width_write_nothing():
    r2t = torch.ones((3, 8), dtype=torch.int32, device=DEVICE)
    empty = torch.zeros(0, dtype=torch.int32, device=DEVICE)
    big, pt = framed(0, 4, DEVICE)
    before = big.clone()
    build_page_table(r2t, empty, empty, pt, 2)
    assert torch.equal(big, before)
    big, pt = framed(2, 0, DEVICE)
    before = big.clone()
    two = torch.ones(2, dtype=torch.int32, device=DEVICE)
    build_page_table(r2t, two, two, pt, 2)
    assert torch.equal(big, before)


# -- GPU: real sizes ---------------------------------------------------------------------------

gpu = pytest.mark.gpu


@gpu
@pytest.mark.parametrize("page_size", [1, 16, 64, 256])
@pytest.mark.parametrize("ctx", [2048, 32768, 131072])
@pytest.mark.parametrize("swa", [False, True], ids=["full", "swa"])
def test_gpu_real_sizes(page_size, ctx, swa):
    bs = 64 if ctx == 131072 else 256
    gen = torch.Generator().manual_seed(ctx + page_size)
    width = cdiv(ctx, page_size)
    lengths = [int(x) for x in torch.randint(1, ctx + 1, (16,), generator=gen)]
    lengths += edge_lengths(page_size, width * page_size)
    r2t, rpi, sl, f2s = random_inputs(
        gen,
        bs=bs,
        rows=bs + 1,
        ctx=ctx,
        page_size=page_size,
        lengths=lengths,
        swa=swa,
        device="cuda",
    )
    run_against_reference(r2t, rpi, sl, width, page_size, f2s)


@gpu
def test_gpu_pool_offsets_past_2_31():
    """req_pool_index * stride > 2^31 and slot values past 2^31 (int64 req_to_token)."""
    rows, ctx, ps = 18, 1 << 27, 256  # 2.4e9 entries: row 17 starts at 2.28e9
    r2t = torch.empty((rows, ctx), dtype=torch.int32, device="cuda")
    gen = torch.Generator(device="cuda").manual_seed(5)
    for r in (16, 17):
        r2t[r].random_(0, 2**31 - 1, generator=gen)
    rpi = torch.tensor([17, 16, 17], dtype=torch.int64, device="cuda")
    sl = torch.tensor([ctx, 3 * ps + 1, ctx // 3], dtype=torch.int64, device="cuda")
    width = ctx // ps
    run_against_reference(r2t, rpi, sl, width, ps)
    del r2t
    big_slots = torch.randint(2**31, 2**33, (4, 64 * ps), device="cuda", dtype=torch.int64)
    run_against_reference(
        big_slots,
        torch.tensor([3, 0], device="cuda"),
        torch.tensor([64 * ps, 5], device="cuda"),
        64,
        ps,
    )


@gpu
def test_gpu_no_sync_under_sync_debug_error():
    gen = torch.Generator().manual_seed(7)
    r2t, rpi, sl, f2s = random_inputs(
        gen,
        bs=32,
        rows=33,
        ctx=4096,
        page_size=16,
        lengths=[1, 4000, 77],
        swa=True,
        device="cuda",
    )
    pt = torch.empty((32, 256), dtype=torch.int32, device="cuda")
    swa = torch.empty_like(pt)
    errors = torch.zeros(len(ERROR_KINDS), dtype=torch.int32, device="cuda")
    build_page_table(r2t, rpi, sl, pt, 16, swa_page_table=swa, full_to_swa=f2s)  # compile
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(3):
            build_page_table(r2t, rpi, sl, pt, 16, swa_page_table=swa, full_to_swa=f2s)
            build_page_table(
                r2t, rpi, sl, pt, 16, swa_page_table=swa, full_to_swa=f2s, errors=errors
            )
    finally:
        torch.cuda.set_sync_debug_mode(previous)


@gpu
def test_gpu_one_compile_across_batch_sizes():
    """The batch size is the grid: new batch sizes (and the cached fast launch path) must not
    compile new variants, and the fast path must give the same result as the first call."""
    from pagegraph.kernels.page_table import compiled_variants

    gen = torch.Generator().manual_seed(8)
    r2t, rpi, sl, _ = random_inputs(
        gen,
        bs=256,
        rows=257,
        ctx=8192,
        page_size=64,
        lengths=[1, 8192, 333],
        swa=False,
        device="cuda",
    )
    pt = torch.empty((256, 128), dtype=torch.int32, device="cuda")
    # Warm both buffer kinds up: an aligned table and a canary-framed view (its odd row
    # stride and offset are other specialisations, compiled once each).
    build_page_table(r2t, rpi, sl, pt, 64)
    run_against_reference(r2t, rpi, sl, 128, 64)
    before = compiled_variants()
    for bs in (1, 2, 3, 17, 64, 100, 255, 256):
        run_against_reference(r2t, rpi[:bs], sl[:bs], 128, 64)
        build_page_table(r2t, rpi[:bs], sl[:bs], pt[:bs], 64)
    assert compiled_variants() == before


@pytest.mark.gpu
@pytest.mark.parametrize("swa", [False, True], ids=["full", "swa"])
def test_gpu_eager_call_allocates_nothing_and_syncs_for_no_detector(swa):
    """The eager builder (and a prepared one): no allocator event and no sync seen by any
    detector that runs here (torch's sync-debug mode is blind to Triton's launcher and to
    driver calls; CUPTI sees those), after the first, compiling call."""
    from pagegraph import prepare_build
    from pagegraph.detect.sync import GPU_DETECTORS, available_detectors, no_device_sync

    available = available_detectors()
    detectors = tuple(name for name in GPU_DETECTORS if available[name] is None)
    assert "torch" in detectors
    gen = torch.Generator().manual_seed(31)
    r2t, rpi, sl, f2s = random_inputs(
        gen,
        bs=64,
        rows=70,
        ctx=8192,
        page_size=16,
        lengths=[1, 4000, 8192, 9000],
        swa=swa,
        device="cuda",
    )
    pt = torch.zeros((64, 512), dtype=torch.int32, device="cuda")
    kw = {"swa_page_table": torch.zeros_like(pt), "full_to_swa": f2s} if swa else {}
    errors = torch.zeros(len(ERROR_KINDS), dtype=torch.int32, device="cuda")
    build_page_table(r2t, rpi, sl, pt, 16, errors=errors, **kw)
    prepared = prepare_build(r2t, rpi, sl, pt, 16, errors=errors, **kw)
    prepared()
    torch.cuda.synchronize()
    before = torch.cuda.memory_stats()["allocation.all.allocated"]
    with no_device_sync(detectors) as rec:
        for _ in range(5):
            build_page_table(r2t, rpi, sl, pt, 16, errors=errors, **kw)
            prepared()
            prepared(bs=17)
    assert rec.detectors == detectors
    torch.cuda.synchronize()
    assert torch.cuda.memory_stats()["allocation.all.allocated"] == before
