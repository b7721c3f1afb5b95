"""Invariant: the pool model's device tables always match its host bookkeeping: every token's
slot lies in one of its request's pages, pages are never shared, SWA slots of live pages map
into distinct SWA pages, and freed or evicted slots map to 0."""

from __future__ import annotations

import pytest
import torch

from pagegraph.pool import KVPool, PoolExhausted
from pagegraph.workload import DecodeWorkload


def check_pool(pool: KVPool) -> None:
    ps = pool.page_size
    seen_pages, seen_swa = set(), set()
    for row, req in pool.requests.items():
        got = pool.req_to_token[row, : req.length].cpu()
        t = torch.arange(req.length)
        pages = torch.tensor(req.pages, dtype=torch.int64)[t // ps]
        assert torch.equal(got.to(torch.int64), pages * ps + t % ps), f"row {row}"
        assert not seen_pages & set(req.pages), "a page is shared by two requests"
        seen_pages |= set(req.pages)
        assert 0 not in req.pages, "page 0 is reserved for padding"
        if pool.swa:
            assert len(req.swa_pages) == len(req.pages)
            assert all(p == 0 for p in req.swa_pages[: req.swa_first]), "evicted pages stay 0"
            for i, page in enumerate(req.pages):
                m = pool.full_to_swa[page * ps : (page + 1) * ps].cpu()
                sp = req.swa_pages[i]
                if sp:
                    assert i >= req.swa_first
                    assert sp not in seen_swa
                    seen_swa.add(sp)
                    assert torch.equal(m, torch.arange(ps) + sp * ps)
                else:
                    assert (m == 0).all(), "evicted SWA slots must map to 0"


def test_alloc_extend_free_and_row_reuse():
    pool = KVPool(max_reqs=4, max_context_len=40, page_size=8, seed=1)
    a = pool.alloc(10)
    b = pool.alloc(17)
    pool.extend(a, 7)
    pool.flush()
    check_pool(pool)
    old_row = pool.req_to_token[b].clone()
    pool.free(b)
    c = pool.alloc(3)
    pool.flush()
    assert c == b, "freed rows are reused first"
    # The reused row keeps its stale tail beyond the new length, as engines leave it.
    assert torch.equal(pool.req_to_token[c, 3:17], old_row[3:17])
    check_pool(pool)
    assert (pool.req_to_token[0] == 0).all(), "row 0 is the dummy request"


def test_exact_capacity_and_overflow():
    pool = KVPool(max_reqs=2, max_context_len=32, page_size=8)
    r = pool.alloc(31)
    pool.extend(r, 1)
    with pytest.raises(ValueError, match="exceed max_context_len"):
        pool.extend(r, 1)
    pool.flush()
    check_pool(pool)


def test_exhaustion_is_reported():
    pool = KVPool(max_reqs=3, max_context_len=64, page_size=8, num_pages=4)
    pool.alloc(24)
    with pytest.raises(PoolExhausted):
        pool.alloc(9)
    pool2 = KVPool(max_reqs=1, max_context_len=8, page_size=8)
    pool2.alloc(1)
    with pytest.raises(PoolExhausted, match="rows"):
        pool2.alloc(1)


def test_swa_eviction_and_remap():
    pool = KVPool(max_reqs=3, max_context_len=64, page_size=4, swa=True, seed=2)
    r = pool.alloc(30)
    pool.flush()
    check_pool(pool)
    evicted = pool.evict_outside_window(r, 8)
    assert evicted == (30 - 8) // 4
    before = pool.full_to_swa.clone()
    pool.remap_swa(r)
    pool.flush()
    check_pool(pool)
    assert not torch.equal(before, pool.full_to_swa), "remap must change the mapping"
    pool.free(r)
    pool.flush()
    assert (pool.full_to_swa == 0).all(), "freed slots map to 0"


@pytest.mark.parametrize("draft", [0, 3, 8])
@pytest.mark.parametrize("swa", [False, True])
def test_workload_keeps_pool_consistent_and_moves_across_buckets(draft, swa):
    pool = KVPool(max_reqs=17, max_context_len=96, page_size=8, swa=swa, seed=draft)
    work = DecodeWorkload(
        pool,
        max_bs=16,
        steps=60,
        seed=5 + draft,
        draft_tokens=draft,
        swa_window=24 if swa else None,
        swa_churn=0.3,
        finish_rate=0.1,
    )
    sizes, reached_cap, shrunk = [], False, False
    last_len: dict[int, int] = {}
    for step in work:
        assert 1 <= step.bs <= 16
        assert len(set(step.req_pool_indices)) == step.bs, "a request row appears twice"
        sizes.append(step.bs)
        for row, length in zip(step.req_pool_indices, step.seq_lens):
            assert pool.requests[row].length == length
            reached_cap |= length == 96
            shrunk |= row in last_len and length < last_len[row]
            last_len[row] = length
        check_pool(pool)
    assert min(sizes) < max(sizes), "batch size must move"
    assert reached_cap, "some request must reach exact capacity"
    assert shrunk, "a reused row must come back shorter"
