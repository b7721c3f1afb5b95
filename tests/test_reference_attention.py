"""Invariant: the decode-attention reference (``pagegraph.consumers.attention_reference``),
which gathers rows in padded, masked chunks, gives what attending each row on its own gives:
padding never reaches a row (even when the padding's page holds NaN), a NaN in a row's own live
tokens does (the reference must not hide bad data), and the tolerances follow the documented
formula.
"""

from __future__ import annotations

import math

import pytest
import torch

from pagegraph.consumers import attention_reference
from pagegraph.consumers.attention_reference import (
    EXP2_ERROR,
    FP32_EPS,
    UNIT_ROUNDOFF,
    attend,
    live_kv,
    tolerances,
)

PAGE_SIZE = 4
HEADS = (8, 2)  # query heads over KV heads
DIM = 16


def pool(gen: torch.Generator, dtype: torch.dtype, num_pages: int = 40):
    """K and V ``[num_pages, PAGE_SIZE, Hkv, DIM]``; page 0 (the padding's page) all NaN."""
    shape = (num_pages, PAGE_SIZE, HEADS[1], DIM)
    k = torch.randn(shape, generator=gen).to(dtype)
    v = torch.randn(shape, generator=gen).to(dtype)
    k[0], v[0] = float("nan"), float("nan")
    return k, v


def rows_of(gen: torch.Generator, lengths: list[int], num_pages: int = 40) -> list:
    out = []
    for n in lengths:
        pages = (torch.randperm(num_pages - 1, generator=gen)[: -(-n // PAGE_SIZE)] + 1).tolist()
        out.append((pages if n else [], n))
    return out


def one_row(q_row, k, v, pages, n) -> torch.Tensor:
    """Dense fp32 attention of one row ``[Hq, D]`` over its ``n`` tokens, token by token."""
    if n == 0:
        return torch.zeros_like(q_row)
    group = HEADS[0] // HEADS[1]
    keys = torch.stack([k[pages[t // PAGE_SIZE], t % PAGE_SIZE] for t in range(n)]).float()
    vals = torch.stack([v[pages[t // PAGE_SIZE], t % PAGE_SIZE] for t in range(n)]).float()
    out = torch.empty(q_row.shape, dtype=torch.float32)
    for h in range(HEADS[0]):
        scores = keys[:, h // group] @ q_row[h].float() / math.sqrt(DIM)
        out[h] = torch.softmax(scores, 0) @ vals[:, h // group]
    return out.to(q_row.dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("gather_tokens", [1, 50, 1 << 16])  # one row a chunk .. one chunk
def test_chunked_rows_match_rows_attended_alone(monkeypatch, dtype, gather_tokens):
    monkeypatch.setattr(attention_reference, "GATHER_TOKENS", gather_tokens)
    gen = torch.Generator().manual_seed(11)
    k, v = pool(gen, dtype)
    rows = rows_of(gen, [0, 1, 3, 4, 5, 37, 0, 16, 22])
    q = torch.randn((len(rows), HEADS[0], DIM), generator=gen).to(dtype)
    got = attend(q, live_kv(k, v, rows, PAGE_SIZE))
    assert torch.isfinite(got).all(), "the NaN padding page reached a row"
    for i, (pages, n) in enumerate(rows):
        want = one_row(q[i], k, v, pages, n)
        # The two sum in different orders: allow one rounding of the output's dtype.
        tol = 2 * UNIT_ROUNDOFF[dtype] + 1e-6
        assert torch.allclose(got[i].float(), want.float(), rtol=tol, atol=tol), f"row {i}"


def test_a_nan_in_a_rows_own_tokens_shows_in_that_row_only():
    gen = torch.Generator().manual_seed(12)
    k, v = pool(gen, torch.bfloat16)
    rows = rows_of(gen, [9, 14, 6])
    pages, _ = rows[1]
    v[pages[1], 2] = float("nan")  # token 6 of row 1: live
    q = torch.randn((3, HEADS[0], DIM), generator=gen).to(torch.bfloat16)
    got = attend(q, live_kv(k, v, rows, PAGE_SIZE))
    finite = torch.isfinite(got).flatten(1).all(1).tolist()
    assert finite == [True, False, True]


def test_tolerances_follow_the_documented_formula(monkeypatch):
    monkeypatch.setattr(attention_reference, "GATHER_TOKENS", 7)  # several chunks
    gen = torch.Generator().manual_seed(13)
    k, v = pool(gen, torch.float16)
    rows = rows_of(gen, [10, 0, 3])
    q = torch.randn((3, HEADS[0], DIM), generator=gen).to(torch.float16)
    atol, rtol = tolerances(q, live_kv(k, v, rows, PAGE_SIZE))
    u = UNIT_ROUNDOFF[torch.float16]
    assert rtol == 2 * u and atol.device.type == "cpu" and float(atol[1]) == 0.0
    for i in (0, 2):
        pages, n = rows[i]
        toks = [(pages[t // PAGE_SIZE], t % PAGE_SIZE) for t in range(n)]
        keys = torch.stack([k[p, s] for p, s in toks]).float()
        vals = torch.stack([v[p, s] for p, s in toks]).float()
        group = HEADS[0] // HEADS[1]
        s_max = max(
            float((q[i, h].float().abs() * keys[:, h // group].abs()).sum(-1).max())
            for h in range(HEADS[0])
        ) / math.sqrt(DIM)
        e_s = DIM * FP32_EPS * s_max + EXP2_ERROR
        want = 2 * float(vals.abs().max()) * (u + 2 * e_s + (n + 16) * FP32_EPS)
        assert float(atol[i]) == pytest.approx(want, rel=1e-5)


def test_no_rows_and_empty_rows_give_zeros_and_a_zero_tolerance():
    gen = torch.Generator().manual_seed(14)
    k, v = pool(gen, torch.bfloat16)
    for rows in ([], [([], 0), ([], 0)]):
        q = torch.randn((len(rows), HEADS[0], DIM), generator=gen).to(torch.bfloat16)
        kv = live_kv(k, v, rows, PAGE_SIZE)
        assert torch.equal(attend(q, kv), torch.zeros_like(q))
        atol, _ = tolerances(q, kv)
        assert atol.shape == (len(rows),) and not atol.any()


def test_rows_and_queries_must_agree():
    gen = torch.Generator().manual_seed(15)
    k, v = pool(gen, torch.bfloat16)
    kv = live_kv(k, v, rows_of(gen, [5, 9]), PAGE_SIZE)
    q = torch.randn((4, HEADS[0], DIM), generator=gen).to(torch.bfloat16)
    for fn in (attend, tolerances):
        with pytest.raises(ValueError, match="q has 4 rows and the live keys and values 2"):
            fn(q, kv)
