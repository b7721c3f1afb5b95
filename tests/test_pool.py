"""Invariant: the pool model's device tables always match its host bookkeeping: every token's
slot lies in one of its request's pages, pages are never shared, SWA slots of live pages map
into distinct SWA pages, and freed or evicted slots map to 0."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from pagegraph.kernels.contract import interpreter_active
from pagegraph.workload import pool as pool_mod
from pagegraph.workload.decode import DecodeWorkload, Injection
from pagegraph.workload.pool import KVPool, PoolExhausted


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


@pytest.mark.parametrize(
    "layout",
    [
        {"extra_cols": 7, "storage_offset": 13},
        {"dtype": torch.int64, "full_to_swa_dtype": torch.int32},
    ],
    ids=["r2t-view", "dtypes"],
)
def test_layouts_keep_the_pool_consistent(layout):
    pool = KVPool(max_reqs=9, max_context_len=80, page_size=8, swa=True, seed=4, **layout)
    if "storage_offset" in layout:
        assert pool.req_to_token.storage_offset() == 13
        assert pool.req_to_token.shape == (10, 87)
    work = DecodeWorkload(pool, max_bs=8, steps=30, seed=2, swa_window=24, swa_churn=0.5)
    for _ in work:
        check_pool(pool)
    assert pool.req_to_token.dtype == layout.get("dtype", torch.int32)
    assert pool.full_to_swa.dtype == layout.get("full_to_swa_dtype", torch.int64)


def test_grow_matches_one_extend_per_row():
    a = KVPool(max_reqs=6, max_context_len=64, page_size=4, seed=3)
    b = KVPool(max_reqs=6, max_context_len=64, page_size=4, seed=3)
    rows_a = [a.alloc(n) for n in (3, 4, 9, 1)]
    rows_b = [b.alloc(n) for n in (3, 4, 9, 1)]
    a.grow(np.asarray(rows_a), np.asarray([1, 5, 0, 8]))
    for row, k in zip(rows_b, (1, 5, 0, 8)):
        b.extend(row, k)
    a.flush()
    b.flush()
    assert torch.equal(a.req_to_token, b.req_to_token)
    assert [a.requests[r].length for r in rows_a] == [4, 9, 9, 9]
    check_pool(a)


def test_injected_values_leave_the_pool_and_its_evolution_unchanged():
    def run(inject):
        pool = KVPool(max_reqs=13, max_context_len=96, page_size=8, seed=1)
        work = DecodeWorkload(pool, max_bs=12, steps=40, seed=9, inject=inject)
        steps = [(s.req_pool_indices, s.seq_lens) for s in work]
        return steps, pool.req_to_token.clone()

    plain, r2t_plain = run(None)
    hostile, r2t_hostile = run(Injection(overlong=0.5, negative=0.3, zero=0.3, bad_index=0.3))
    assert torch.equal(r2t_plain, r2t_hostile), "injections must not change the pool"
    changed = [(p, h) for p, h in zip(plain, hostile) if p != h]
    assert changed, "some batch must carry injected values"
    seen = {"overlong": False, "negative": False, "zero": False, "bad_index": False}
    for (p_rpi, p_sl), (h_rpi, h_sl) in zip(plain, hostile):
        assert len(p_sl) == len(h_sl)
        for a, b in zip(p_sl, h_sl):
            assert a == b or b > 96 or b <= 0
            seen["overlong"] |= b > 96
            seen["negative"] |= b < 0
            seen["zero"] |= b == 0 and a != 0
        for a, b in zip(p_rpi, h_rpi):
            assert a == b or not 0 <= b < 14
            seen["bad_index"] |= a != b
    assert all(seen.values()), seen


def test_committed_lengths_leave_out_the_draft_tokens():
    pool = KVPool(max_reqs=5, max_context_len=200, page_size=8, seed=1)
    work = DecodeWorkload(pool, max_bs=4, steps=5, seed=1, draft_tokens=3, committed_lengths=True)
    for step in work:
        for row, n in zip(step.req_pool_indices, step.seq_lens):
            assert n == max(pool.requests[row].length - 3, 0)


@pytest.mark.parametrize("chunk", [1 << 21, 64], ids=["one-stage", "small-scratch"])
@pytest.mark.parametrize("swa", [False, True])
def test_lookahead_shows_each_step_the_tables_of_that_step(monkeypatch, chunk, swa):
    """Steps generated ahead, their writes staged together and applied one step at a time,
    give at every yielded step the very tables a flush per step gives. With a small scratch
    some stages hold a few steps, and some steps do not fit one stage (written in parts)."""
    import pagegraph.workload.pool as pool_module

    monkeypatch.setattr(pool_module, "FLUSH_CHUNK", chunk)

    def run(lookahead):
        pool = KVPool(max_reqs=13, max_context_len=160, page_size=4, swa=swa, seed=3)
        work = DecodeWorkload(
            pool,
            max_bs=12,
            steps=45,
            seed=7,
            swa_window=32 if swa else None,
            swa_churn=0.4,
            finish_rate=0.15,
            lookahead=lookahead,
        )
        seen = []
        for step in work:
            tables = [pool.req_to_token.clone()]
            if swa:
                tables.append(pool.full_to_swa.clone())
            seen.append((step.req_pool_indices, step.seq_lens, tables))
        return seen, pool

    plain, _ = run(0)
    for lookahead in (1, 5, 16):
        ahead, pool = run(lookahead)
        if chunk == 64:
            assert pool._r2t_writer.capacity == 16
        assert len(ahead) == len(plain)
        for i, (a, p) in enumerate(zip(ahead, plain)):
            assert a[:2] == p[:2], f"lookahead {lookahead}, step {i}: batch differs"
            for t_a, t_p in zip(a[2], p[2]):
                assert torch.equal(t_a, t_p), f"lookahead {lookahead}, step {i}: tables differ"


def test_write_ahead_applies_in_order_and_refuses_an_empty_queue():
    from pagegraph.workload.write_ahead import WriteAhead

    pool = KVPool(max_reqs=3, max_context_len=32, page_size=4, seed=1)
    ahead = WriteAhead()
    row = pool.alloc(9)
    ahead.add(pool.take_writes())
    pool.free(row)
    again = pool.alloc(3)  # the same row, shorter: its first page written again
    assert again == row
    ahead.add(pool.take_writes())
    assert (pool.req_to_token == 0).all(), "take_writes applies nothing"
    ahead.next()
    first = pool.req_to_token[row, :9].clone()
    assert (first != 0).all()
    ahead.next()
    assert torch.equal(pool.req_to_token[row, 3:9], first[3:9]), "the stale tail stays"
    assert not torch.equal(pool.req_to_token[row, :3], first[:3])
    check_pool(pool)
    with pytest.raises(IndexError, match="no queued writes"):
        ahead.next()


def test_free_many_and_last_lengths():
    pool = KVPool(max_reqs=4, max_context_len=64, page_size=8, seed=2)
    rows = [pool.alloc(n) for n in (5, 17, 40)]
    assert pool.last_lengths(rows).tolist() == [-1, -1, -1]
    free_before = pool.free_pages
    pool.free_many(rows[:2])
    assert pool.free_pages == free_before + 1 + 3
    assert pool.last_lengths(rows).tolist() == [5, 17, -1]
    assert sorted(pool.requests) == [rows[2]]
    with pytest.raises(KeyError, match="not running"):
        pool.free(rows[0])
    with pytest.raises(KeyError, match="not running"):
        pool.extend(rows[0], 1)
    pool.flush()
    check_pool(pool)


def test_a_step_writes_each_swa_page_once():
    """A step touches many SWA pages twice (unmapped by a finish, mapped again by an arrival;
    mapped by an arrival, evicted behind its window): each is written once, in its final
    state, and the tables stay consistent."""
    pool = KVPool(max_reqs=24, max_context_len=512, page_size=8, swa=True, seed=2)
    work = DecodeWorkload(
        pool, max_bs=20, steps=80, seed=5, finish_rate=0.2, swa_window=64, swa_churn=0.5
    )
    touched = written = 0
    for i in range(work.steps):
        work._advance(i)
        touched += sum(len(p) for p in pool._swa_touched)
        writes = pool.take_writes()
        for writer, runs in writes:
            if writer is pool._swa_writer:
                written += len(runs)
                assert len(np.unique(runs[:, 0])) == len(runs), f"step {i}: a page written twice"
            writer.write(runs)
        check_pool(pool)
    assert written < touched  # the workload did touch pages twice


def test_runs_staged_from_tensors_in_place_write_what_arrays_write(monkeypatch):
    """``_PageWriter.stage`` takes parts as numpy arrays (through its staging slot) or as CPU
    tensors (copied in place, adjacent ones at once, as a workload child's ring is): any mix
    writes the same table, and adjacent tensor parts go up in one copy."""
    rng = np.random.default_rng(4)
    page, rows, cols = 4, 6, 32
    runs = []
    for _ in range(40):  # whole pages and partial ones, anywhere in the table
        row, col = int(rng.integers(rows)), int(rng.integers(cols // page)) * page
        lo = int(rng.integers(page))
        hi = int(rng.integers(lo + 1, page + 1))
        runs.append([row * cols + col, int(rng.integers(1, 1000)), 1, lo, hi])
    runs = np.array(runs, dtype=np.int64)
    # Later runs may rewrite an entry of an earlier one: keep one run a page, so that no entry
    # is written twice (a scatter has no defined winner).
    _, first = np.unique(runs[:, 0], return_index=True)
    runs = runs[np.sort(first)]
    k = len(runs)
    whole = torch.from_numpy(runs.copy())  # the tensor parts are views of one buffer
    mixes = {
        "arrays": [runs[: k // 3], runs[k // 3 : k // 2], runs[k // 2 :]],
        "adjacent tensors": [whole[: k // 3], whole[k // 3 : k // 2], whole[k // 2 :]],
        "mixed": [whole[: k // 3], runs[k // 3 : k // 2], whole[k // 2 : -2], whole[-2:]],
        "gapped tensors": [whole[: k // 3], whole[k // 2 :]],
    }
    uploads = []
    original = pool_mod._PageWriter._upload

    def counting(self, lo, hi, first, pinned):
        if hi > lo:
            uploads.append("tensor" if first is not None else "slot")
        return original(self, lo, hi, first, pinned)

    monkeypatch.setattr(pool_mod._PageWriter, "_upload", counting)
    tables = {}
    for name, parts in mixes.items():
        table = torch.full((rows, cols), -7, dtype=torch.int32)
        writer = pool_mod._PageWriter(table, page)
        uploads.clear()
        writer.stage(parts)
        n = sum(len(p) for p in parts)
        writer.apply(0, n)
        tables[name] = (table, list(uploads))
    want = torch.full((rows, cols), -7, dtype=torch.int32)
    for base, value, step, lo, hi in runs.tolist():
        for j in range(lo, hi):
            want.view(-1)[base + j] = value + j * step
    for name in ("arrays", "adjacent tensors", "mixed"):
        assert torch.equal(tables[name][0], want), name
    assert tables["arrays"][1] == ["slot"]
    assert tables["adjacent tensors"][1] == ["tensor"]  # three adjacent parts, one copy
    assert tables["mixed"][1] == ["tensor", "slot", "tensor"]
    gapped = want.clone()
    for base, _, _, lo, hi in runs[k // 3 : k // 2].tolist():  # the runs left out
        gapped.view(-1)[base + lo : base + hi] = -7
    assert torch.equal(tables["gapped tensors"][0], gapped)
    assert tables["gapped tensors"][1] == ["tensor", "tensor"]
    with pytest.raises(ValueError, match="contiguous int64"):
        pool_mod._PageWriter(want, page).stage([whole[:, :5:2]])


def _random_runs(rng, numel: int, page: int, k: int) -> np.ndarray:
    """``k`` runs at distinct pages of a ``numel``-entry table (no entry written twice: a
    scatter has no defined winner): whole and partial lanes, steps 0 (an unmapped SWA page), 1
    (token slots) and others, the table's last page last (a GPU writes it through the compiled
    launcher, the first launch being Triton's own)."""
    last = numel // page - 1  # the table's last page is always the last run
    pages = np.concatenate([rng.choice(last, size=k - 1, replace=False), [last]])
    lo = rng.integers(0, page, size=k)
    hi = np.minimum(lo + rng.integers(1, page + 1, size=k), page)
    step = rng.choice([0, 1, 1, 1, 7], size=k)
    value = rng.integers(1, 1 << 20, size=k)
    return np.stack([pages * page, value, step, lo, hi], axis=1).astype(np.int64)


# The kernel on CPU tensors runs under the Triton interpreter only (set where there is no CUDA).
_KERNEL_DEVICES = [
    pytest.param(
        "cpu",
        marks=pytest.mark.skipif(
            not interpreter_active(), reason="CPU tensors need the interpreter"
        ),
    ),
    pytest.param(
        "cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
    ),
]


@pytest.mark.parametrize("device", _KERNEL_DEVICES)
@pytest.mark.parametrize("page,dtype", [(1, torch.int32), (3, torch.int64), (16, torch.int32)])
def test_the_write_kernel_writes_what_the_operators_write(device, page, dtype):
    """``_PageWriter(kernel=True)`` (the Triton kernel; on a CPU under the interpreter) and the
    operator chain write the same entries, step by step, and nothing else: the table is a
    slice of a larger buffer whose other entries stay as they were."""
    rng = np.random.default_rng(page)
    rows, cols, canary = 5, 6 * page, 37
    numel = rows * cols
    runs = _random_runs(rng, numel, page, 20)
    steps = [(0, 7), (7, 8), (8, 20)]  # applied in this order, like a WriteAhead
    got = {}
    for kernel in (True, False):
        dev = device if kernel else "cpu"
        buf = torch.full((numel + 2 * canary,), -5, dtype=dtype, device=dev)
        table = buf[canary : canary + numel].view(rows, cols)
        writer = pool_mod._PageWriter(table, page, kernel=kernel)
        assert (writer._kernel is not None) == kernel
        writer.stage([runs[:10], runs[10:]])
        snapshots = []
        for lo, hi in steps:
            writer.apply(lo, hi)
            snapshots.append(buf.cpu().clone())
        got[kernel] = snapshots
    want = torch.full((numel + 2 * canary,), -5, dtype=dtype)
    for (lo, hi), kernel_buf, operator_buf in zip(steps, got[True], got[False]):
        for base, value, step, a, b in runs[lo:hi].tolist():
            for j in range(a, b):
                want[canary + base + j] = value + j * step
        assert torch.equal(operator_buf, want)
        assert torch.equal(kernel_buf, want)


@pytest.mark.parametrize("device", _KERNEL_DEVICES)
def test_the_write_kernel_writes_nothing_outside_its_table(device):
    """Runs that reach outside the table (before it, past its end, lanes past the page) write
    only their entries inside it: the kernel guards every store."""
    from pagegraph.workload.page_writes import RunWriter

    page, numel, canary = 3, 24, 8  # a page size under its power of two: lane 3 exists
    buf = torch.full((numel + 2 * canary,), -5, dtype=torch.int64, device=device)
    table = buf[canary : canary + numel]
    runs = torch.tensor(
        [[-3, 100, 1, 0, 3],  # the page before the table
         [numel - 2, 200, 1, 0, 3],  # straddles the end: two entries inside
         [6, 300, 1, 1, 9],  # hi past the page: lanes 1, 2 only
         [12, 400, 1, 2, 2]],  # empty
        dtype=torch.int64,
        device=device,
    ).view(-1)  # fmt: skip
    writer = RunWriter(runs, table, page)
    writer(0, 1)  # on a GPU: Triton's own launch, which compiles
    writer(1, 3)  # then the compiled launcher
    want = torch.full((numel + 2 * canary,), -5, dtype=torch.int64)
    want[canary + numel - 2 : canary + numel] = torch.tensor([200, 201])
    want[canary + 7 : canary + 9] = torch.tensor([301, 302])
    assert torch.equal(buf.cpu(), want)
    with pytest.raises(ValueError, match="outside"):
        RunWriter(runs, table, page)(2, 3)
    with pytest.raises(ValueError, match="int32 or int64"):
        RunWriter(runs, table.to(torch.float32), page)
    with pytest.raises(ValueError, match="contiguous 1-D int64"):
        RunWriter(runs.view(4, 5), table, page)
    with pytest.raises(ValueError, match="page_size must be in"):
        RunWriter(runs, table, (1 << 20) + 1)


def test_random_runs_never_write_an_entry_twice():
    for page in (1, 3, 16):
        runs = _random_runs(np.random.default_rng(page), 5 * 6 * page, page, 20)
        assert len(np.unique(runs[:, 0])) == len(runs)
        assert runs[-1, 0] == (5 * 6 - 1) * page


def test_the_host_model_on_meta_loads_no_symbolic_shapes_machinery():
    """The producer's host model (a ``KVPool`` on ``meta``) is made at every check's start: a
    factory operator on ``meta`` that goes through torch's Python references imports sympy
    there, seconds of a first verdict where Python has no bytecode cache."""
    code = (
        "import sys, torch\n"
        "before = 'sympy' in sys.modules\n"
        "from pagegraph.workload.pool import KVPool\n"
        "for swa in (False, True):\n"
        "    KVPool(max_reqs=4, max_context_len=256, page_size=16, swa=swa, device='meta')\n"
        "print(before, 'sympy' in sys.modules)\n"
    )
    src = str(Path(__file__).resolve().parent.parent / "src")
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": src},
    )
    assert done.returncode == 0, done.stderr
    before, after = done.stdout.split()
    assert after == "False" or before == "True", done.stdout
