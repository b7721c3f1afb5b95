"""Invariant: everything runs on the device of its tensors. A runner on cuda:1 never touches
cuda:0's memory, and one runner per device replays concurrently from two threads, exact and
sync-free. Needs two GPUs; skipped otherwise."""

from __future__ import annotations

import threading

import pytest
import torch

from pagegraph import GraphRunner, KVPool, build_page_table
from pagegraph.kernels.contract import POISON
from pagegraph.kernels.table_reference import expected_tables

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices"),
]


def make_runner(device: str, seed: int, swa: bool = False):
    pool = KVPool(
        max_reqs=65, max_context_len=16384, page_size=16, device=device, seed=seed, swa=swa
    )
    runner = GraphRunner(
        pool.req_to_token,
        max_bs=64,
        max_context_len=16384,
        page_size=16,
        full_to_swa=pool.full_to_swa,
    )
    runner.capture()
    rows = [pool.alloc(int(n)) for n in torch.randint(1, 16000, (64,))]
    pool.flush()
    return pool, runner, rows


def test_kernel_launches_on_its_tensors_device():
    with torch.cuda.device(0):
        r2t = torch.randint(0, 999, (5, 256), dtype=torch.int32, device="cuda:1")
        rpi = torch.tensor([1, 3], device="cuda:1")
        sl = torch.tensor([200, 17], device="cuda:1")
        pt = torch.full((2, 16), POISON, dtype=torch.int32, device="cuda:1")
        build_page_table(r2t, rpi, sl, pt, 16)
        want, _ = expected_tables(r2t, rpi, sl, 16, 16)
        assert torch.equal(pt, want)


def test_runner_on_cuda1_never_touches_cuda0():
    torch.cuda.synchronize(0)
    before = torch.cuda.memory_stats(0).get("allocation.all.allocated", 0)
    with torch.cuda.device(0):
        pool, runner, rows = make_runner("cuda:1", seed=1, swa=True)
        for n in (1, 7, 33, 64):
            rpi, sl = pool.batch(rows[:n])
            runner.page_table.fill_(POISON)
            runner.replay(rpi, sl)
            b = runner.last_bucket
            want, want_swa = expected_tables(
                pool.req_to_token,
                runner.req_pool_indices[:b],
                runner.seq_lens[:b],
                runner.max_num_pages,
                16,
                pool.full_to_swa,
            )
            assert torch.equal(runner.page_table[:b], want)
        assert all(g is not None for g in runner.graphs.values())
        runner.close()
    assert torch.cuda.memory_stats(0).get("allocation.all.allocated", 0) == before


def test_one_runner_per_device_from_two_threads():
    from pagegraph.detect.sync import record_device_syncs

    setups = [make_runner(f"cuda:{d}", seed=d) for d in (0, 1)]
    failures = []

    def drive(idx: int):
        pool, runner, rows = setups[idx]
        gen = torch.Generator().manual_seed(idx)
        try:
            with torch.cuda.device(idx):
                for _ in range(100):
                    n = int(torch.randint(1, 65, (1,), generator=gen))
                    rpi, sl = pool.batch(rows[:n])
                    runner.replay(rpi, sl)
                    b = runner.last_bucket
                    want, _ = expected_tables(
                        pool.req_to_token,
                        runner.req_pool_indices[:b],
                        runner.seq_lens[:b],
                        runner.max_num_pages,
                        16,
                    )
                    live = want != POISON
                    if not torch.equal(runner.page_table[:b][live], want[live]):
                        failures.append((idx, n))
        except Exception as exc:  # surfaced below
            failures.append((idx, repr(exc)))

    # One recorder for both threads (the detectors are process-wide); events carry the range
    # of the thread that made them, and only stage/replay ranges must be clean.
    with record_device_syncs("auto") as rec:
        threads = [threading.Thread(target=drive, args=(i,)) for i in (0, 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert not failures, failures
    assert rec.detectors, "no detector ran"
    syncs = [e for e in rec.events if e.range and e.range.split("/")[0] in ("stage", "replay")]
    assert not syncs, syncs
    for _, runner, _ in setups:
        runner.close()
