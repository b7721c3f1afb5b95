"""Invariant: build_decode_metadata writes exactly what reference_decode_metadata writes (the
lengths, both prefix sums, the page and SWA tables, the error counts) and nothing else.

Every output is a view inside a larger canary-filled buffer; after a call each whole buffer,
canary included, must equal what the reference leaves in an identical buffer, so a write
outside an output, past a row's live pages or past ``bs`` fails the comparison. On a CPU the
kernel runs under the Triton interpreter (and is also compiled for sm_90 in every variant the
contract allows); GPU cases repeat at real sizes, on the eager fast launch path and inside a
CUDA graph replayed with changed lengths.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import subprocess
import sys
import zlib

import pytest
import torch

from pagegraph.kernels import decode_metadata as metadata
from pagegraph.kernels.contract import cdiv
from pagegraph.kernels.decode_contract import fast_decode_checks
from pagegraph.kernels.decode_metadata import (
    DECODE_ERROR_KINDS,
    MAX_DRAFT_TOKENS,
    build_decode_metadata,
    prepare_decode_metadata,
)
from pagegraph.kernels.page_table import MAX_BATCH, BuffersChanged
from pagegraph.kernels.reference import reference_decode_metadata, unfused_decode_metadata

from helpers import CANARY, MARGIN, assert_equal_tables, framed, random_inputs

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
INT32_MAX = 2**31 - 1
DTYPES = {"int32": torch.int32, "int64": torch.int64}


def _framed_vector(n: int, dtype, device) -> tuple[torch.Tensor, torch.Tensor]:
    """A canary-filled ``[1, n + 2*MARGIN]`` buffer and the ``[n]`` view inside it."""
    big = torch.full((1, n + 2 * MARGIN), CANARY, dtype=dtype, device=device)
    return big, big[0, MARGIN : MARGIN + n]


class Outputs:
    """Canary-framed output buffers of one call: ``kwargs`` holds the views to pass, and
    ``frames`` the whole buffers to compare (the ``errors`` view starts at zero)."""

    def __init__(
        self,
        bs: int,
        width: int,
        *,
        cu_k_dtype=torch.int32,
        swa: bool = False,
        cu_q: bool = True,
        errors: bool = True,
        device=DEVICE,
    ):
        self.frames: dict[str, torch.Tensor] = {}
        self.kwargs: dict[str, torch.Tensor] = {}
        vectors = [("cache_seqlens", bs, torch.int32), ("cu_seqlens_k", bs + 1, cu_k_dtype)]
        if cu_q:
            vectors.append(("cu_seqlens_q", bs + 1, torch.int32))
        if errors:
            vectors.append(("errors", len(DECODE_ERROR_KINDS), torch.int32))
        for name, n, dtype in vectors:
            self.frames[name], self.kwargs[name] = _framed_vector(n, dtype, device)
        if errors:
            self.kwargs["errors"].zero_()
        tables = ["page_table", "swa_page_table"] if swa else ["page_table"]
        for name in tables:
            self.frames[name], self.kwargs[name] = framed(bs, width, device)

    def assert_equal(self, other: Outputs, what: str = "") -> None:
        assert self.frames.keys() == other.frames.keys()
        for name, big in self.frames.items():
            assert_equal_tables(big, other.frames[name], f"{name} (with canary frame) {what}")

    def snapshot(self) -> dict[str, torch.Tensor]:
        return {name: big.clone() for name, big in self.frames.items()}

    def unchanged_since(self, snap: dict[str, torch.Tensor]) -> bool:
        return all(torch.equal(big, snap[name]) for name, big in self.frames.items())


def make_inputs(
    seed,
    *,
    bs,
    width,
    page_size,
    lengths,
    swa=False,
    dtypes=("int32",) * 4,
    rows=None,
    num_slots=1 << 20,
    device=DEVICE,
):
    """Random ``req_to_token`` (rows ``width * page_size`` long), request rows, and the given
    lengths (cycled, shuffled). ``dtypes``: req_to_token, req_pool_indices, seq_lens and
    full_to_swa."""
    gen = torch.Generator().manual_seed(seed)
    r2t, rpi, sl, f2s = random_inputs(
        gen,
        bs=bs,
        rows=bs + 3 if rows is None else rows,
        ctx=width * page_size,
        page_size=page_size,
        lengths=lengths,
        swa=swa,
        r2t_dtype=DTYPES[dtypes[0]],
        idx_dtype=DTYPES[dtypes[1]],
        f2s_dtype=DTYPES[dtypes[3]],
        num_slots=num_slots,
        device=device,
    )
    return r2t, rpi, sl.to(DTYPES[dtypes[2]]), f2s


def run_against_reference(
    r2t,
    rpi,
    sl,
    width,
    page_size,
    f2s=None,
    *,
    draft=0,
    cu_k_dtype=torch.int32,
    cu_q=True,
    errors=True,
) -> Outputs:
    """Kernel and reference into identical framed buffers; every buffer compared exactly."""
    bs = sl.shape[0]
    swa = f2s is not None
    kw = {"cu_k_dtype": cu_k_dtype, "swa": swa, "cu_q": cu_q, "errors": errors}
    got, want = (
        Outputs(bs, width, device=r2t.device, **kw),
        Outputs(bs, width, device=r2t.device, **kw),
    )
    extra = {"full_to_swa": f2s} if swa else {}
    build_decode_metadata(r2t, rpi, sl, page_size, draft_tokens=draft, **got.kwargs, **extra)
    reference_decode_metadata(r2t, rpi, sl, page_size, draft_tokens=draft, **want.kwargs, **extra)
    got.assert_equal(want, f"(bs={bs}, page_size={page_size}, draft={draft})")
    return got


def lengths_for(page_size: int, width: int, draft: int) -> list[int]:
    """Negative, empty, page edges, the exact capacity with and without the draft tokens,
    and overlong rows (``cache_seqlens`` over capacity)."""
    cap = width * page_size
    return [
        -3,
        0,
        1,
        page_size,
        page_size + 1,
        max(cap - draft, 0),
        cap - draft + 1,
        cap,
        cap + 3 * page_size,
        cap // 2 + 1,
    ]


def counts(out: Outputs) -> dict[str, int]:
    return dict(zip(DECODE_ERROR_KINDS, out.kwargs["errors"].tolist()))


# -- the oracle itself -------------------------------------------------------------------------


def test_reference_known_values():
    """reference_decode_metadata on a hand-computed example."""
    r2t = torch.tensor([[0, 0, 0, 0, 0, 0], [8, 9, 10, 11, 4, 5], [12, 13, 2, 3, 6, 7]])
    rpi = torch.tensor([2, 1, 1])
    sl = torch.tensor([2, 3, -4])
    out = Outputs(3, 4, swa=True, device="cpu")
    f2s = torch.arange(15, dtype=torch.int64) * 2
    reference_decode_metadata(r2t, rpi, sl, 2, draft_tokens=1, full_to_swa=f2s, **out.kwargs)
    k = out.kwargs
    c = CANARY
    assert k["cache_seqlens"].tolist() == [3, 4, 1]
    assert k["cu_seqlens_k"].tolist() == [0, 3, 7, 8]
    assert k["cu_seqlens_q"].tolist() == [0, 1, 2, 3]
    assert k["page_table"].tolist() == [[6, 1, c, c], [4, 5, c, c], [4, c, c, c]]
    assert k["swa_page_table"].tolist() == [[12, 2, c, c], [8, 10, c, c], [8, c, c, c]]
    assert counts(out) == dict.fromkeys(DECODE_ERROR_KINDS, 0) | {"negative_seq_len": 1}
    # cu_seqlens_q steps by the draft count (by one row without draft tokens, as above).
    out = Outputs(3, 4, device="cpu")
    reference_decode_metadata(r2t, rpi, sl, 2, draft_tokens=4, **out.kwargs)
    assert out.kwargs["cu_seqlens_q"].tolist() == [0, 4, 8, 12]


# -- the kernel against the oracle -------------------------------------------------------------

PAGE_SIZES = [1, 3, 16, 64]
# (page size, SWA, dtypes of req_to_token / req_pool_indices / seq_lens / full_to_swa,
# cu_seqlens_k dtype, draft tokens). Not the full product: every page size meets SWA on and
# off and both index dtypes, and draft counts 0..8 and both cu_seqlens_k dtypes are spread over
# the cases, each case seeded by its own parameters.
MATRIX = [
    (
        ps,
        swa,
        (d, d, "int64" if i % 2 else d, "int32" if i % 3 else "int64"),
        "int64" if i % 3 == 0 else "int32",
        (2 * i + 1) % 9,
    )
    for i, (ps, swa, d) in enumerate(itertools.product(PAGE_SIZES, [False, True], DTYPES))
]


def matrix_id(case) -> str:
    ps, swa, dtypes, cu_k, draft = case
    r2t, idx, sl, f2s = dtypes
    return (
        f"ps{ps}-{'swa_' + f2s if swa else 'full'}-r2t_{r2t}-idx_{idx}-sl_{sl}-cuk_{cu_k}"
        f"-draft{draft}"
    )


@pytest.mark.parametrize("case", MATRIX, ids=matrix_id)
def test_matrix(case):
    ps, swa, dtypes, cu_k, draft = case
    width = 40 if CUDA else 5
    for bs in (1, 7):
        seed = zlib.crc32(repr((case, bs)).encode())
        r2t, rpi, sl, f2s = make_inputs(
            seed,
            bs=bs,
            width=width,
            page_size=ps,
            lengths=lengths_for(ps, width, draft),
            swa=swa,
            dtypes=dtypes,
        )
        run_against_reference(r2t, rpi, sl, width, ps, f2s, draft=draft, cu_k_dtype=DTYPES[cu_k])


def test_every_draft_count_and_no_optional_outputs():
    """Draft counts 0..8 on one configuration, with cu_seqlens_q and errors left out (their
    code compiled out, the aliased pointers never touched)."""
    for draft in range(9):
        for cu_q, errors in ((False, False), (True, False), (False, True)):
            if (cu_q or errors) and draft not in (0, 5):
                continue
            r2t, rpi, sl, _ = make_inputs(
                100 + draft, bs=5, width=4, page_size=3, lengths=lengths_for(3, 4, draft)
            )
            run_against_reference(r2t, rpi, sl, 4, 3, draft=draft, cu_q=cu_q, errors=errors)


@pytest.mark.parametrize(
    "bs, cu_k",
    [(1100, torch.int32), (300, torch.int64)],
    ids=["bs1100-cuk_int32", "bs300-cuk_int64"],
)
def test_batch_past_one_scan_tile(bs, cu_k):
    """More rows than SCAN_BLOCK: the running carry crosses tiles (a one-page table keeps the
    interpreter fast; the scan does not depend on the width)."""
    assert bs > metadata.SCAN_BLOCK
    width, ps = 1, 16
    r2t, rpi, sl, _ = make_inputs(
        bs, bs=bs, width=width, page_size=ps, lengths=[5, 0, 16, 17, 100_000, -2, 9]
    )
    out = run_against_reference(r2t, rpi, sl, width, ps, draft=2, cu_k_dtype=cu_k)
    assert int(out.kwargs["cu_seqlens_k"][-1]) > 100_000 * (bs // 7)


@pytest.mark.parametrize("bs", [127, 128, 129, 256, 257])
def test_scan_tile_edges_at_the_shipped_scan_block(bs):
    """A batch ending just before, on and just after one and two tiles of the shipped
    SCAN_BLOCK."""
    assert metadata.SCAN_BLOCK == 128
    r2t, rpi, sl, _ = make_inputs(bs, bs=bs, width=1, page_size=16, lengths=[5, 0, 16, 17, -2])
    run_against_reference(r2t, rpi, sl, 1, 16, draft=2, cu_k_dtype=torch.int32)


@pytest.mark.parametrize("bs", [1, 15, 16, 17, 47, 48])
def test_scan_tile_edges_with_a_small_scan_block(monkeypatch, bs):
    """Tile boundaries of the scan (a batch ending on, just before and just after one), with
    SCAN_BLOCK shrunk to 16 so that they stay cheap under the interpreter."""
    monkeypatch.setattr(metadata, "SCAN_BLOCK", 16)
    r2t, rpi, sl, _ = make_inputs(
        200 + bs, bs=bs, width=3, page_size=4, lengths=[1, 12, 13, -1, 0, 1000]
    )
    run_against_reference(r2t, rpi, sl, 3, 4, draft=3, cu_k_dtype=torch.int64)
    run_against_reference(r2t, rpi, sl, 3, 4, draft=0)


def test_64_bit_in_row_offsets(monkeypatch):
    """The 64-bit in-row path (``ROW_I32`` off, which only rows of about 2^30 tokens take) on
    small tables, forced by the host's choice."""
    monkeypatch.setattr(metadata, "row_fits_int32", lambda max_pages, page_size: False)
    monkeypatch.setattr(metadata, "_geometries", {})  # forget what earlier calls worked out
    for ps, swa, cu_k in ((3, True, torch.int32), (16, False, torch.int64)):
        r2t, rpi, sl, f2s = make_inputs(
            30 + ps, bs=5, width=4, page_size=ps, lengths=lengths_for(ps, 4, 2), swa=swa
        )
        run_against_reference(r2t, rpi, sl, 4, ps, f2s, draft=2, cu_k_dtype=cu_k)


def test_negative_huge_and_overlong_lengths_write_inside_their_row():
    """Negative lengths count as 0 and write nothing; overlong ones (draft tokens included)
    write their row's capacity and no further; a length past 2^31 - 1 (int64 seq_lens)
    saturates cache_seqlens."""
    ps, width = 8, 4
    r2t, rpi, _, f2s = make_inputs(12, bs=7, width=width, page_size=ps, lengths=[1], swa=True)
    sl = torch.tensor(
        [-5, 2**40, 0, width * ps - 2, width * ps + 1, -(2**31), 2**63 - 1],
        dtype=torch.int64,
        device=DEVICE,
    )
    out = run_against_reference(r2t, rpi, sl, width, ps, f2s, draft=2, cu_k_dtype=torch.int64)
    cache = out.kwargs["cache_seqlens"].tolist()
    assert cache == [2, INT32_MAX, 2, width * ps, width * ps + 3, 2, INT32_MAX]
    assert int(out.kwargs["cu_seqlens_k"][-1]) == sum(cache)
    pt = out.kwargs["page_table"]
    assert (pt[0, 1:] == CANARY).all() and (pt[0, 0] != CANARY)  # 2 tokens: one page
    assert (pt[1] != CANARY).all() and (pt[3] != CANARY).all()  # full rows, and no further
    assert counts(out) == {
        "seq_len_over_capacity": 3,
        "negative_seq_len": 2,
        "req_pool_index_out_of_range": 0,
        "full_to_swa_index_out_of_range": 0,
        "cu_seqlens_k_overflow": 0,
    }


@pytest.mark.parametrize("cu_k", [torch.int32, torch.int64], ids=["cuk_int32", "cuk_int64"])
def test_cu_seqlens_k_overflow_saturates_and_is_counted(cu_k):
    """Lengths near 2^30: the running sum passes 2^31 - 1 at the third row. An int32
    cu_seqlens_k holds 2^31 - 1 from there on and counts each such entry; an int64 one holds
    the exact sums."""
    ps, width = 16, 2
    r2t, rpi, _, _ = make_inputs(14, bs=6, width=width, page_size=ps, lengths=[1])
    lens = [2**30, 2**30 - 1, 2**30, 5, -1, 2**31 - 1]
    sl = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
    out = run_against_reference(r2t, rpi, sl, width, ps, draft=1, cu_k_dtype=cu_k)
    cache = [min(max(n, 0) + 1, INT32_MAX) for n in lens]
    sums = list(itertools.accumulate(cache, initial=0))
    got = out.kwargs["cu_seqlens_k"].tolist()
    assert sums[2] == 2**31 + 1  # the first entry past int32
    if cu_k == torch.int32:
        assert got == [0, 2**30 + 1] + [INT32_MAX] * 5
        assert counts(out)["cu_seqlens_k_overflow"] == 5
    else:
        assert got == sums
        assert counts(out)["cu_seqlens_k_overflow"] == 0
    assert counts(out)["seq_len_over_capacity"] == 4  # every row but the 5- and 0-token ones


@pytest.mark.parametrize("swa", [False, True], ids=["full", "swa"])
def test_error_counters_exactly(swa):
    """Each counter counts exactly its own out-of-contract values (clamped, never out of
    bounds), and counters accumulate over calls."""
    ps, width, rows = 4, 6, 5
    r2t, _, _, f2s = make_inputs(
        13, bs=1, width=width, page_size=ps, lengths=[1], swa=swa, rows=rows, num_slots=100
    )
    if swa:
        f2s = f2s[:50].contiguous()  # slots 50..99 of req_to_token fall outside it
    cap = width * ps
    rpi = torch.tensor([0, 9, -1, 2, 3, 4], device=DEVICE)
    # Row 0 is over capacity by itself, row 4 only with its draft token; row 3 is negative.
    sl = torch.tensor([cap + 1, 3, 5, -7, cap, cap - 1], device=DEVICE)
    out = run_against_reference(r2t, rpi, sl, width, ps, f2s, draft=1)
    got = counts(out)
    expect_swa = 0
    if swa:
        for req, n in zip(rpi.clamp(0, rows - 1).tolist(), (cap, 4, 6, 1, cap, cap)):
            expect_swa += int((r2t[req, : cdiv(n, ps) * ps : ps] >= 50).sum())
        assert expect_swa > 0
    assert got == {
        "seq_len_over_capacity": 2,
        "negative_seq_len": 1,
        "req_pool_index_out_of_range": 2,
        "full_to_swa_index_out_of_range": expect_swa,
        "cu_seqlens_k_overflow": 0,
    }
    errors = out.kwargs["errors"]
    kw = {k: v for k, v in out.kwargs.items() if k != "errors"}
    extra = {"full_to_swa": f2s} if swa else {}
    build_decode_metadata(r2t, rpi, sl, ps, draft_tokens=1, errors=errors, **kw, **extra)
    assert errors.tolist() == [2 * v for v in got.values()]
    assert (out.frames["errors"][0, :MARGIN] == CANARY).all()
    assert (out.frames["errors"][0, -MARGIN:] == CANARY).all()


def test_stale_tail_is_left_as_it_was():
    """Entries past each row's live pages keep what a previous (longer) step wrote."""
    ps, width = 4, 6
    r2t, rpi, _, _ = make_inputs(15, bs=4, width=width, page_size=ps, lengths=[1])
    long = torch.full((4,), width * ps, dtype=torch.int32, device=DEVICE)
    out = Outputs(4, width)
    build_decode_metadata(r2t, rpi, long, ps, **out.kwargs)
    before = out.kwargs["page_table"].clone()
    short = torch.tensor([1, 5, 0, 9], dtype=torch.int32, device=DEVICE)
    build_decode_metadata(r2t, rpi, short, ps, draft_tokens=2, **out.kwargs)
    pages = [cdiv(n + 2, ps) for n in short.tolist()]
    pt = out.kwargs["page_table"]
    for i, n in enumerate(pages):
        assert torch.equal(pt[i, n:], before[i, n:]), f"row {i}: stale tail rewritten"
        assert torch.equal(pt[i, :n], before[i, :n])  # same requests: same pages
    assert out.kwargs["cache_seqlens"].tolist() == [3, 7, 2, 11]


def test_empty_batch_and_zero_width():
    """bs == 0 still writes cu_seqlens_k[0] = cu_seqlens_q[0] = 0 and nothing else; a zero-
    width table gets no entry, while the lengths and sums are still written."""
    r2t = torch.arange(24, dtype=torch.int32, device=DEVICE).reshape(3, 8)
    empty = torch.zeros(0, dtype=torch.int32, device=DEVICE)
    out = Outputs(0, 4)
    build_decode_metadata(r2t, empty, empty, 2, draft_tokens=3, **out.kwargs)
    assert out.kwargs["cu_seqlens_k"].tolist() == [0]
    assert out.kwargs["cu_seqlens_q"].tolist() == [0]
    want = Outputs(0, 4)
    want.kwargs["cu_seqlens_k"].zero_()
    want.kwargs["cu_seqlens_q"].zero_()
    out.assert_equal(want)
    rpi = torch.tensor([0, 2], dtype=torch.int32, device=DEVICE)
    sl = torch.tensor([3, 0], dtype=torch.int32, device=DEVICE)
    run_against_reference(r2t, rpi, sl, 0, 2, draft=1)


# -- host checks -------------------------------------------------------------------------------


def _mistakes(bs: int):
    """(argument overrides, exception, text the message must contain) for one mistake each."""
    d = DEVICE
    i32 = torch.int32
    wide = torch.zeros(bs, 2, dtype=i32, device=d)
    return [
        ({"cache_seqlens": torch.zeros(bs, dtype=torch.int64, device=d)}, TypeError,
         "cache_seqlens must be int32"),
        ({"cache_seqlens": torch.zeros(bs + 1, dtype=i32, device=d)}, ValueError,
         "cache_seqlens must have shape"),
        ({"cache_seqlens": wide[:, 0]}, ValueError, "cache_seqlens must be contiguous"),
        ({"cache_seqlens": [0] * bs}, TypeError, "cache_seqlens must be a torch.Tensor"),
        ({"cache_seqlens": torch.zeros(bs, dtype=i32, device="meta")}, ValueError,
         "cache_seqlens is on meta"),
        ({"cu_seqlens_k": torch.zeros(bs + 1, dtype=torch.float32, device=d)}, TypeError,
         "cu_seqlens_k must be int32 or int64"),
        ({"cu_seqlens_k": torch.zeros(bs, dtype=i32, device=d)}, ValueError,
         "cu_seqlens_k must have shape"),
        ({"cu_seqlens_k": torch.zeros(bs + 1, 2, dtype=torch.int64, device=d)[:, 1]}, ValueError,
         "cu_seqlens_k must be contiguous"),
        ({"cu_seqlens_k": None}, TypeError, "cu_seqlens_k must be a torch.Tensor"),
        ({"cu_seqlens_q": torch.zeros(bs + 1, dtype=torch.int64, device=d)}, TypeError,
         "cu_seqlens_q must be int32"),
        ({"cu_seqlens_q": torch.zeros(bs + 2, dtype=i32, device=d)}, ValueError,
         "cu_seqlens_q must have shape"),
        ({"draft_tokens": -1}, ValueError, "draft_tokens must be in"),
        ({"draft_tokens": MAX_DRAFT_TOKENS + 1}, ValueError, "draft_tokens must be in"),
        ({"draft_tokens": 1.0}, TypeError, "draft_tokens must be an int"),
        ({"draft_tokens": True}, TypeError, "draft_tokens must be an int"),
        ({"draft_tokens": torch.tensor(2)}, TypeError, "draft_tokens must be an int"),
        ({"errors": torch.zeros(4, dtype=i32, device=d)}, ValueError,
         "errors must hold at least 5"),
        ({"errors": torch.zeros(5, dtype=torch.int64, device=d)}, TypeError,
         "errors must be int32"),
        ({"page_table": torch.zeros(bs, 4, dtype=torch.int64, device=d)}, TypeError,
         "page_table must be int32"),
        ({"seq_lens": torch.zeros(bs + 1, dtype=i32, device=d)}, ValueError, "seq_lens"),
        ({"req_pool_indices": torch.zeros(bs, dtype=torch.float32, device=d)}, TypeError,
         "req_pool_indices must be int32 or int64"),
        ({"swa_page_table": torch.zeros(bs, 4, dtype=i32, device=d)}, ValueError,
         "swa_page_table was given without full_to_swa"),
        ({"page_size": 0}, ValueError, "page_size must be >= 1"),
    ]  # fmt: skip


@pytest.mark.parametrize("entry", range(len(_mistakes(3))))
def test_metadata_mistake_raises_naming_the_argument_before_writing(entry):
    bs = 3
    overrides, exc, text = _mistakes(bs)[entry]
    r2t, rpi, sl, _ = make_inputs(16, bs=bs, width=4, page_size=2, lengths=[1, 5, 8])
    out = Outputs(bs, 4)
    args = {"req_to_token": r2t, "req_pool_indices": rpi, "seq_lens": sl, "page_size": 2}
    kwargs = {**args, "draft_tokens": 1, **out.kwargs, **overrides}
    snap = out.snapshot()
    for fn in (build_decode_metadata, prepare_decode_metadata, reference_decode_metadata):
        with pytest.raises(exc, match=re.escape(text)):
            fn(**kwargs)
        assert out.unchanged_since(snap), f"{fn.__name__} wrote before raising"
    with pytest.raises(exc, match=re.escape(text)):
        unfused_decode_metadata(**kwargs)
    assert out.unchanged_since(snap), "unfused_decode_metadata wrote before raising"


def test_fast_checks_refuse_every_output_mistake():
    """The eager fast path's checks (used when every tensor is on one CUDA device) accept the
    in-contract outputs and refuse each mistake above, so that the full checks name it. On a
    CPU they run here on CPU tensors, as device -1."""
    bs = 3
    out = Outputs(bs, 4)
    k = out.kwargs
    dev = k["page_table"].get_device()
    good = (k["cache_seqlens"], k["cu_seqlens_k"], k["cu_seqlens_q"], 1, k["errors"])
    assert fast_decode_checks(dev, bs, *good)
    assert fast_decode_checks(dev, bs, good[0], good[1], None, 0, None)
    names = ("cache_seqlens", "cu_seqlens_k", "cu_seqlens_q", "draft_tokens", "errors")
    seen = 0
    for overrides, _, _ in _mistakes(bs):
        (name, value), *_ = overrides.items()
        if name not in names or getattr(value, "device", None) == torch.device("meta"):
            continue
        if name == "errors" and value.dtype != torch.int32:
            continue  # the errors tensor's dtype and layout are cuda_call_metadata's to check
        args = list(good)
        args[names.index(name)] = value
        assert not fast_decode_checks(dev, bs, *args), name
        seen += 1
    assert seen == 16
    assert not fast_decode_checks(dev, MAX_BATCH + 1, *good)


def test_batch_over_max_batch_is_refused():
    bs = MAX_BATCH + 1
    r2t = torch.zeros((1, 1), dtype=torch.int32, device=DEVICE)
    idx = torch.zeros(bs, dtype=torch.int32, device=DEVICE)
    out = Outputs(bs, 1, cu_q=False, errors=False)
    with pytest.raises(ValueError, match=f"exceeds {MAX_BATCH} rows"):
        build_decode_metadata(r2t, idx, idx, 1, **out.kwargs)


# -- prepared path and unfused chain -----------------------------------------------------------


@pytest.mark.parametrize("swa", [False, True], ids=["full", "swa"])
def test_prepared_matches_plain_call_on_every_prefix(swa):
    bs, ps, width, draft = 9, 4, 5, 2
    r2t, rpi, sl, f2s = make_inputs(
        17 + swa, bs=bs, width=width, page_size=ps, lengths=lengths_for(ps, width, draft), swa=swa
    )
    extra = {"full_to_swa": f2s} if swa else {}
    prepared_out = Outputs(bs, width, swa=swa)
    meta = prepare_decode_metadata(
        r2t, rpi, sl, ps, draft_tokens=draft, **prepared_out.kwargs, **extra
    )
    assert meta.rows == bs and meta.draft_tokens == draft
    for rows in (bs, 4, 1, 0, bs):  # a second full call takes the cached launch on a GPU
        fresh = Outputs(bs, width, swa=swa)
        for name, big in prepared_out.frames.items():
            big.copy_(fresh.frames[name])  # in place: the prepared addresses stay
        plain = Outputs(rows, width, swa=swa)
        meta(rows)
        build_decode_metadata(
            r2t, rpi[:rows], sl[:rows], ps, draft_tokens=draft, **plain.kwargs, **extra
        )
        k, p = prepared_out.kwargs, plain.kwargs
        for name in ("cache_seqlens", "cu_seqlens_k", "cu_seqlens_q", "page_table", "errors"):
            n = {"cu_seqlens_k": rows + 1, "cu_seqlens_q": rows + 1, "errors": 5}.get(name, rows)
            assert torch.equal(k[name][:n], p[name]), f"{name}, bs={rows}"
            assert (k[name][n:] == CANARY).all(), f"{name} written past bs={rows}"
        if swa:
            assert torch.equal(k["swa_page_table"][:rows], p["swa_page_table"])
            assert (k["swa_page_table"][rows:] == CANARY).all()


def test_prepared_refuses_bad_batch_and_moved_buffers():
    r2t, rpi, sl, _ = make_inputs(18, bs=6, width=4, page_size=4, lengths=[3, 9])
    out = Outputs(6, 4)
    meta = prepare_decode_metadata(r2t, rpi, sl, 4, **out.kwargs)
    snap = out.snapshot()
    for bad in (7, -1, 2.0):
        with pytest.raises(ValueError, match="bs must be an int in 0..6"):
            meta(bad)
    out.kwargs["cu_seqlens_k"].set_(out.kwargs["cu_seqlens_k"].clone())  # new storage
    with pytest.raises(BuffersChanged, match="cu_seqlens_k moved since prepare_decode_metadata"):
        meta()
    assert out.unchanged_since(snap), "a refused call wrote"


@pytest.mark.parametrize("swa", [False, True], ids=["full", "swa"])
@pytest.mark.parametrize("cu_k", [torch.int32, torch.int64], ids=["cuk_int32", "cuk_int64"])
def test_unfused_chain_matches_on_in_contract_inputs(swa, cu_k):
    """In contract (lengths within the row's capacity with the draft tokens, request rows and
    slots in range), the engine's unfused chain and the fused kernel agree exactly."""
    bs, ps, width, draft = 7, 16, 4, 3
    cap = width * ps - draft
    r2t, rpi, sl, f2s = make_inputs(
        19 + 2 * swa + (cu_k == torch.int64),
        bs=bs,
        width=width,
        page_size=ps,
        lengths=[0, 1, ps, ps + 1, cap, cap // 2],
        swa=swa,
    )
    extra = {"full_to_swa": f2s} if swa else {}
    fused, unfused = (Outputs(bs, width, cu_k_dtype=cu_k, swa=swa) for _ in range(2))
    build_decode_metadata(r2t, rpi, sl, ps, draft_tokens=draft, **fused.kwargs, **extra)
    unfused_decode_metadata(r2t, rpi, sl, ps, draft_tokens=draft, **unfused.kwargs, **extra)
    fused.assert_equal(unfused, "(unfused chain)")
    assert counts(fused) == dict.fromkeys(DECODE_ERROR_KINDS, 0)


# -- sm_90 compilation of every variant --------------------------------------------------------

# The kernel's variants: its constexpr flags, the dtypes of its pointers, and the int class of
# the arguments that can pass 2^31 (req_to_token's row stride, full_to_swa's length). The full
# product is 2304 compilations; every pair of values of any two factors is covered instead.
FACTORS = {
    "r2t": ("i32", "i64"),
    "idx": ("i32", "i64"),
    "seq": ("i32", "i64"),
    "f2s": (None, "i32", "i64"),  # None: no SWA
    "errors": (False, True),
    "cu_q": (False, True),
    "cu_k": ("i32", "i64"),
    "row_i32": (True, False),
    "big_ints": (False, True),
    "page_size": (1, 3, 64),
}


def pairwise_variants() -> list[dict]:
    """A deterministic greedy covering array: every value pair of every two factors appears in
    at least one variant."""
    names = list(FACTORS)
    uncovered = {
        (a, va, b, vb)
        for a, b in itertools.combinations(names, 2)
        for va in FACTORS[a]
        for vb in FACTORS[b]
    }
    candidates = [dict(zip(names, values)) for values in itertools.product(*FACTORS.values())]
    chosen = []
    while uncovered:
        best = max(
            candidates,
            key=lambda v: sum(
                (a, v[a], b, v[b]) in uncovered for a, b in itertools.combinations(names, 2)
            ),
        )
        chosen.append(best)
        uncovered -= {(a, best[a], b, best[b]) for a, b in itertools.combinations(names, 2)}
    return chosen


VARIANTS = pairwise_variants()


def variant_id(v: dict) -> str:
    return "-".join(f"{k}_{v[k]}" for k in FACTORS)


def compile_variant(v: dict) -> dict:
    """Compile one specialisation for sm_90; return facts about the output."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from pagegraph.kernels.page_table import BLOCK_PAGES, NUM_WARPS, ROWS_PER_PROGRAM, UNROLL

    big = "i64" if v["big_ints"] else "i32"
    sig = {
        "req_to_token_ptr": "*" + v["r2t"],
        "req_pool_indices_ptr": "*" + v["idx"],
        "seq_lens_ptr": "*" + v["seq"],
        "cache_seqlens_ptr": "*i32",
        "cu_seqlens_k_ptr": "*" + v["cu_k"],
        "cu_seqlens_q_ptr": "*i32",
        "page_table_ptr": "*i32",
        "swa_page_table_ptr": "*i32",
        "full_to_swa_ptr": "*" + (v["f2s"] or "i32"),
        "errors_ptr": "*i32",
        "r2t_stride": big,
        "r2t_rows": "i32",
        "pt_stride": "i32",
        "swa_stride": "i32",
        "capacity": "i32",
        # Without SWA the launcher passes 1, which Triton specialises as a constant.
        "f2s_len": big if v["f2s"] else "constexpr",
        "bs": "i32",
        "draft_tokens": "i32",
    }
    flags = {
        "PAGE_SIZE": v["page_size"],
        "HAS_SWA": v["f2s"] is not None,
        "HAS_ERRORS": v["errors"],
        "HAS_CU_Q": v["cu_q"],
        "CU_K_I32": v["cu_k"] == "i32",
        "ROW_I32": v["row_i32"],
        "BLOCK": BLOCK_PAGES,
        "UNROLL": UNROLL,
        "ROWS": ROWS_PER_PROGRAM,
        "SCAN_BLOCK": metadata.SCAN_BLOCK,
    }
    sig.update(dict.fromkeys(flags, "constexpr"))
    names = list(sig)
    constexprs = {(names.index(k),): value for k, value in flags.items()}
    if v["f2s"] is None:
        constexprs[(names.index("f2s_len"),)] = 1
    src = ASTSource(fn=metadata._decode_metadata_kernel, signature=sig, constexprs=constexprs)
    out = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": NUM_WARPS})
    ptx = out.asm["ptx"]
    return {
        "cubin_bytes": len(out.asm["cubin"]),
        "sm90": ".target sm_90" in ptx,
        "atomics": re.search(r"^\s*(@%p\d+\s+)?(atom|red)\.", ptx, re.M) is not None,
    }


def compile_all() -> dict:
    results = {}
    for v in VARIANTS:
        try:
            results[variant_id(v)] = compile_variant(v)
        except Exception as exc:  # reported per variant by the test
            results[variant_id(v)] = {"error": f"{type(exc).__name__}: {exc}"}
    return results


@pytest.fixture(scope="module")
def compiled():
    from pagegraph.kernels.contract import interpreter_active

    if not interpreter_active():
        return compile_all()
    # Triton's library functions are defined in interpreter form once TRITON_INTERPRET=1 is
    # set: compile in a child process with it unset.
    env = dict(os.environ, TRITON_INTERPRET="0")
    proc = subprocess.run(
        [sys.executable, __file__], env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_variants_cover_every_pair():
    names = list(FACTORS)
    for a, b in itertools.combinations(names, 2):
        for va, vb in itertools.product(FACTORS[a], FACTORS[b]):
            assert any(v[a] == va and v[b] == vb for v in VARIANTS), (a, va, b, vb)


# The fixture compiles every variant at once: one worker of a parallel run does it for all.
@pytest.mark.heavy
@pytest.mark.xdist_group("metadata-sm90-compile")
@pytest.mark.parametrize("variant", VARIANTS, ids=variant_id)
def test_compiles_for_sm90(compiled, variant):
    result = compiled[variant_id(variant)]
    assert "error" not in result, result.get("error")
    assert result["sm90"] and result["cubin_bytes"] > 0
    # The error counters are compiled out unless requested: no atomics without them.
    assert result["atomics"] == variant["errors"]


# -- GPU: real sizes, the eager fast path, CUDA graphs -----------------------------------------

gpu = pytest.mark.gpu


@gpu
@pytest.mark.parametrize("bs", [64, 256, 3000])
@pytest.mark.parametrize("page_size", [16, 64])
@pytest.mark.parametrize("swa", [False, True], ids=["full", "swa"])
def test_gpu_real_sizes(bs, page_size, swa):
    ctx = 32768 if bs <= 256 else 4096
    width = ctx // page_size
    gen = torch.Generator().manual_seed(bs + page_size)
    lengths = [int(x) for x in torch.randint(1, ctx + 1, (16,), generator=gen)]
    lengths += lengths_for(page_size, width, 4)
    r2t, rpi, sl, f2s = make_inputs(
        bs * 7 + page_size,
        bs=bs,
        width=width,
        page_size=page_size,
        lengths=lengths,
        swa=swa,
        dtypes=("int32", "int64", "int32", "int64"),
        device="cuda",
    )
    for draft, cu_k in ((0, torch.int32), (4, torch.int64)):
        run_against_reference(r2t, rpi, sl, width, page_size, f2s, draft=draft, cu_k_dtype=cu_k)


@gpu
def test_gpu_max_batch_matches_the_unfused_chain():
    bs, ps, width = MAX_BATCH, 16, 4
    r2t, rpi, sl, _ = make_inputs(
        21, bs=bs, width=width, page_size=ps, lengths=[0, 1, 17, 60, 33], device="cuda"
    )
    for cu_k in (torch.int32, torch.int64):
        fused, unfused = (Outputs(bs, width, cu_k_dtype=cu_k) for _ in range(2))
        build_decode_metadata(r2t, rpi, sl, ps, draft_tokens=3, **fused.kwargs)
        unfused_decode_metadata(r2t, rpi, sl, ps, draft_tokens=3, **unfused.kwargs)
        fused.assert_equal(unfused, f"(MAX_BATCH, {cu_k})")


@gpu
def test_gpu_rows_past_2_31_tokens():
    """A req_to_token row longer than 2^31 tokens: the second row starts past 2^31 entries, the
    in-row offsets are 64-bit, and a saturated cache_seqlens (2^31 - 1) bounds the pages, not
    the longer row."""
    ps = 64
    cols = 2**31 + ps
    r2t = torch.empty((2, cols), dtype=torch.int32, device="cuda")
    r2t.random_(0, 2**31 - 1, generator=torch.Generator(device="cuda").manual_seed(26))
    width = cdiv(cols, ps)
    rpi = torch.tensor([1, 0, 1], device="cuda")
    sl = torch.tensor([2**40, 5 * ps + 1, cols - 3], device="cuda")
    out = run_against_reference(r2t, rpi, sl, width, ps, draft=4, cu_k_dtype=torch.int64)
    assert out.kwargs["cache_seqlens"].tolist() == [INT32_MAX, 5 * ps + 5, INT32_MAX]
    assert (out.kwargs["page_table"][0, cdiv(INT32_MAX, ps) :] == CANARY).all()
    del r2t, out
    torch.cuda.empty_cache()


@gpu
def test_gpu_eager_fast_path_matches_and_compiles_once(monkeypatch):
    """After the first call of a launch key, calls go straight into the compiled launcher
    (Triton's JIT path is not entered) for every batch size and draft count, compile nothing
    new, and still match the reference."""
    bs_max, ps, width = 256, 64, 128
    r2t, rpi, sl, f2s = make_inputs(
        22,
        bs=bs_max,
        width=width,
        page_size=ps,
        lengths=[1, width * ps, 333, 4000],
        swa=True,
        device="cuda",
    )
    run_against_reference(r2t, rpi, sl, width, ps, f2s, draft=1)  # compiles, caches the entry
    before = metadata.compiled_variants()
    keys = len(metadata.launch_cache)
    jit_calls = []
    real_jit = metadata._jit_launch
    monkeypatch.setattr(
        metadata, "_jit_launch", lambda *a, **k: jit_calls.append(a) or real_jit(*a, **k)
    )
    for bs, draft in ((256, 1), (1, 0), (2, 7), (17, 3), (100, 1), (255, 8), (256, 0)):
        run_against_reference(r2t, rpi[:bs], sl[:bs], width, ps, f2s, draft=draft)
    assert jit_calls == [], "a call after the first went through Triton's JIT path"
    assert metadata.compiled_variants() == before
    assert len(metadata.launch_cache) == keys


@gpu
def test_gpu_no_sync_under_sync_debug_error():
    r2t, rpi, sl, f2s = make_inputs(
        23, bs=32, width=256, page_size=16, lengths=[1, 4000, 77], swa=True, device="cuda"
    )
    out = Outputs(32, 256, swa=True)
    kw = dict(draft_tokens=2, full_to_swa=f2s, **out.kwargs)
    build_decode_metadata(r2t, rpi, sl, 16, **kw)  # compiles
    meta = prepare_decode_metadata(r2t, rpi, sl, 16, **kw)
    meta()
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(3):
            build_decode_metadata(r2t, rpi, sl, 16, **kw)
            meta()
            meta(5)
    finally:
        torch.cuda.set_sync_debug_mode(previous)


@gpu
@pytest.mark.parametrize("prepared", [False, True], ids=["plain", "prepared"])
def test_gpu_cuda_graph_replay_with_changed_lengths(prepared):
    """Captured once, replayed with new lengths and request rows copied into the static
    inputs: after every replay the outputs (stale tails and accumulated error counts
    included) equal the reference run on the same sequence of inputs."""
    bs, ps, width, draft = 96, 16, 256, 3
    ctx = width * ps
    r2t, rpi, sl, f2s = make_inputs(
        24, bs=bs, width=width, page_size=ps, lengths=[1, ctx, 500], swa=True, device="cuda"
    )
    got = Outputs(bs, width, swa=True)
    want = Outputs(bs, width, swa=True)
    kw = dict(draft_tokens=draft, full_to_swa=f2s)
    meta = prepare_decode_metadata(r2t, rpi, sl, ps, **kw, **got.kwargs) if prepared else None

    def step():
        if prepared:
            meta()
        else:
            build_decode_metadata(r2t, rpi, sl, ps, **kw, **got.kwargs)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):  # the first compiles, the second takes the cached entry
            step()
            reference_decode_metadata(r2t, rpi, sl, ps, **kw, **want.kwargs)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    gen = torch.Generator().manual_seed(25)
    for replay in range(6):
        new_lens = torch.randint(-2, ctx + 8, (bs,), generator=gen)
        new_lens[replay] = ctx  # a full row, then (with the draft) an overlong one
        sl.copy_(new_lens.to(sl.dtype))
        rpi.copy_(torch.randint(0, r2t.shape[0], (bs,), generator=gen).to(rpi.dtype))
        graph.replay()
        torch.cuda.synchronize()
        reference_decode_metadata(r2t, rpi, sl, ps, **kw, **want.kwargs)
        got.assert_equal(want, f"(replay {replay})")
    del graph
    torch.cuda.synchronize()
    torch.cuda.empty_cache()


if __name__ == "__main__":
    print(json.dumps(compile_all()))
