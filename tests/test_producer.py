"""Invariant: a ``ProducedWorkload`` is the workload ``DecodeWorkload`` generates, step for
step, whether its streams run here or in child processes: the same batches and, after every
step's writes, the same device tables; with several streams, each stream's steps and tables
are those of its own ``DecodeWorkload``, segment after segment. A child's exception reaches the
parent at the step where it was raised, a child that dies is reported, and closing stops the
children; a checker's verdict does not depend on where its workload ran."""

from __future__ import annotations

import itertools
import os
import signal
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from pagegraph import build_page_table, check_replay_safety
from pagegraph.check.config import CheckConfig
from pagegraph.check.reports.report import Report
from pagegraph.kinds import PAGE_TABLE
from pagegraph.workload import producer
from pagegraph.workload.decode import DecodeWorkload, Injection
from pagegraph.workload.pool import KVPool, PoolExhausted
from pagegraph.workload.producer import (
    BATCH_STEPS,
    ProducedWorkload,
    ProducerDied,
    stream_kwargs,
    stream_steps,
)

# Starts child processes: scheduled first in a parallel run (see conftest.py).
pytestmark = pytest.mark.heavy

CASES = {
    "plain": (
        dict(max_reqs=12, max_context_len=96, page_size=8, seed=3),
        dict(max_bs=10, steps=60, seed=5, finish_rate=0.1, near_capacity=0.2),
    ),
    "swa-injections-int64": (
        dict(
            max_reqs=9,
            max_context_len=64,
            page_size=4,
            swa=True,
            seed=7,
            dtype=torch.int64,
            full_to_swa_dtype=torch.int32,
            row_order="high-first",
        ),
        dict(
            max_bs=8,
            steps=50,
            seed=2,
            swa_window=16,
            swa_churn=0.3,
            inject=Injection(overlong=0.3, negative=0.2, zero=0.2, bad_index=0.2),
        ),
    ),
    "spec-committed-page1": (
        dict(max_reqs=6, max_context_len=40, page_size=1, seed=11, extra_cols=3, storage_offset=5),
        dict(max_bs=5, steps=40, seed=9, draft_tokens=3, committed_lengths=True),
    ),
}


def tables(pool: KVPool) -> list[torch.Tensor]:
    out = [pool.req_to_token.clone()]
    if pool.full_to_swa is not None:
        out.append(pool.full_to_swa.clone())
    return out


def produced_batch(step) -> tuple[list[int], list[int]]:
    """A ``ProducedWorkload`` step's batch as lists, after checking it comes as two ``[bs]``
    int64 arrays."""
    for values in (step.req_pool_indices, step.seq_lens):
        assert isinstance(values, np.ndarray) and values.dtype == np.int64 and values.ndim == 1
    assert len(step.req_pool_indices) == len(step.seq_lens)
    return step.req_pool_indices.tolist(), step.seq_lens.tolist()


# Every case here; the richest one (SWA, injections, int64) in a child process too: a child
# costs an interpreter start and a torch import.
@pytest.mark.parametrize(
    "case, processes",
    [(case, False) for case in CASES] + [("swa-injections-int64", True)],
    ids=[f"{case}-here" for case in CASES] + ["swa-injections-int64-child"],
)
def test_same_steps_and_tables_as_decode_workload(case, processes):
    pool_kwargs, workload_kwargs = CASES[case]
    here = KVPool(**pool_kwargs)
    there = KVPool(**pool_kwargs)
    expected = DecodeWorkload(here, **workload_kwargs, lookahead=16)
    produced = ProducedWorkload(there, pool_kwargs, workload_kwargs, processes=processes)
    n = 0
    for want, got in zip(expected, produced, strict=True):
        assert (got.index, *produced_batch(got)) == (
            want.index,
            want.req_pool_indices,
            want.seq_lens,
        ), f"step {n}"
        for a, b in zip(tables(here), tables(there)):
            assert torch.equal(a, b), f"tables differ after step {n}"
        n += 1
    assert n == workload_kwargs["steps"]


def timed_wait_started(produced: ProducedWorkload, monkeypatch) -> float:
    """``produced.wait_started()`` on a fake clock that moves one second each time a child's
    message is received, and only then: the seconds it returns are the children it waited
    for (a wait that returns early, or times only a part of the waits, says fewer)."""
    clock = [0.0]
    with monkeypatch.context() as m:
        m.setattr(producer, "time", SimpleNamespace(perf_counter=lambda: clock[0]))
        for child in produced._sources:
            if hasattr(child, "wait_first"):

                def receive(*args, _real=child._receive, **kwargs):
                    item = _real(*args, **kwargs)
                    clock[0] += 1.0
                    return item

                m.setattr(child, "_receive", receive)
        return produced.wait_started()


@pytest.mark.parametrize(
    "streams, steps, processes",
    [(3, 100, False), (3, 100, True), (2, 7, False), (4, 40, False)],
    ids=["3x100-here", "3x100-child", "2x7-here", "4x40-here"],
)
def test_streams_take_turns_each_with_its_own_tables(streams, steps, processes, monkeypatch):
    """Segments of 16 steps: stream k's steps and tables are those of its own DecodeWorkload
    (seeds shifted), and a run shorter than one segment is stream 0 alone."""
    pool_kwargs, workload_kwargs = CASES["swa-injections-int64"]
    workload_kwargs = dict(workload_kwargs, steps=steps)
    segment = BATCH_STEPS
    counts = stream_steps(steps, streams, segment)
    assert sum(counts) == steps
    refs = []
    for k, n in enumerate(counts):
        pk, wk = stream_kwargs(pool_kwargs, workload_kwargs, k, n)
        pool = KVPool(**pk)
        refs.append((pool, iter(DecodeWorkload(pool, **wk)) if n else None))
    live = KVPool(**pool_kwargs)
    produced = ProducedWorkload(
        live, pool_kwargs, workload_kwargs, streams=streams, processes=processes, segment=segment
    )
    assert produced.streams == sum(1 for n in counts if n)
    # As a checker does after its capture: the first step, then every child's start-up waited
    # for (its first batch received and kept, handed out at its stream's first turn).
    steps_iter = iter(produced)
    first = next(steps_iter)
    children = [s for s in produced._sources if hasattr(s, "wait_first")]
    assert len(children) == (produced.streams if processes else 0)
    # The time waited spans the start-up of every child not heard from yet (streams 1 on;
    # stream 0 sent the first step), and nothing without children.
    assert timed_wait_started(produced, monkeypatch) == (len(children) - 1 if processes else 0)
    assert all(s._received for s in children)
    assert all(s._first is not None for s in children[1:])  # kept for their first turn
    for index, got in enumerate(itertools.chain([first], steps_iter)):
        k = (index // segment) % produced.streams
        pool, steps_k = refs[k]
        want = next(steps_k)
        assert got.index == index
        assert produced_batch(got) == (want.req_pool_indices, want.seq_lens)
        for a, b in zip(tables(pool), tables(live)):
            assert torch.equal(a, b), f"stream {k}: tables differ after step {index}"
    assert index == steps - 1
    # Every batch after the first was received (or made) and timed: 100 steps are 7 batches.
    assert (produced.receive_s > 0) == (steps > BATCH_STEPS)
    for _, rest in refs:  # every stream's steps were used, no more
        assert rest is None or next(rest, None) is None


def test_stream_step_counts():
    assert stream_steps(1000, 1, 256) == [1000]
    assert stream_steps(1000, 3, 256) == [256 + 232, 256, 256]
    assert stream_steps(100, 4, 256) == [100, 0, 0, 0]
    assert stream_steps(2048, 4, 256) == [512] * 4


def test_the_childs_exception_is_raised_at_its_step():
    # Too few pages: the pool runs out at some step, in both processes alike.
    pool_kwargs = dict(max_reqs=8, max_context_len=64, page_size=8, num_pages=20, seed=1)
    workload_kwargs = dict(max_bs=8, steps=200, seed=4, finish_rate=0.0)
    reached = []
    with pytest.raises(PoolExhausted) as want:
        for step in DecodeWorkload(KVPool(**pool_kwargs), **workload_kwargs):
            reached.append(step.index)
    got_steps = []
    produced = ProducedWorkload(KVPool(**pool_kwargs), pool_kwargs, workload_kwargs, processes=True)
    with pytest.raises(PoolExhausted) as got:
        for step in produced:
            got_steps.append(step.index)
    assert got_steps == reached
    assert str(got.value) == str(want.value)
    assert not any(p.is_alive() for p in produced._processes)


def test_a_child_that_dies_is_reported():
    pool_kwargs, workload_kwargs = CASES["plain"]
    produced = ProducedWorkload(
        KVPool(**pool_kwargs), pool_kwargs, dict(workload_kwargs, steps=10**7), processes=True
    )
    steps = iter(produced)
    next(steps)
    os.kill(produced._processes[0].pid, signal.SIGKILL)
    with pytest.raises(ProducerDied, match="exited with code -9"):
        for _ in steps:
            pass


def test_stopping_early_stops_the_child(monkeypatch):
    pool_kwargs, workload_kwargs = CASES["plain"]
    produced = ProducedWorkload(
        KVPool(**pool_kwargs),
        pool_kwargs,
        dict(workload_kwargs, steps=10**7),
        processes=True,
        streams=2,
    )
    assert len(produced._processes) == 2
    # A stop asked for while waiting for the children's start-up is honoured at the first
    # look (before any wait for a child's message), and leaves the workload as it was.
    asked = []
    with pytest.raises(KeyboardInterrupt):
        produced.wait_started(should_stop=lambda: asked.append(1) or True)
    assert asked == [1]
    for step in produced:
        if step.index == 3:
            # Stream 1's first batch, the one start-up left to wait for, kept for its turn.
            assert timed_wait_started(produced, monkeypatch) == 1
            assert all(s._received for s in produced._sources)
            break
    produced.close()
    assert not any(p.is_alive() for p in produced._processes)
    produced.close()  # idempotent
    with pytest.raises(RuntimeError, match="once"):
        iter(produced).__next__()


def test_bad_arguments_raise_before_a_process_starts():
    pool_kwargs, workload_kwargs = CASES["plain"]
    with pytest.raises(ValueError, match="draft_tokens"):
        ProducedWorkload(KVPool(**pool_kwargs), pool_kwargs, dict(workload_kwargs, draft_tokens=-1))
    with pytest.raises(ValueError, match="device"):
        ProducedWorkload(KVPool(**pool_kwargs), dict(pool_kwargs, device="cpu"), workload_kwargs)
    used = KVPool(**pool_kwargs)
    used.alloc(5)
    with pytest.raises(ValueError, match="new"):
        ProducedWorkload(used, pool_kwargs, workload_kwargs)
    for bad in ({"streams": 0}, {"streams": 65}, {"segment": 24}, {"segment": 0}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            ProducedWorkload(KVPool(**pool_kwargs), pool_kwargs, workload_kwargs, **bad)


# -- the checker with its workload in a child process ----------------------------------------


def _wrong_first_column(req_to_token, req_pool_indices, seq_lens, page_table, page_size, **kw):
    build_page_table(req_to_token, req_pool_indices, seq_lens, page_table, page_size, **kw)
    page_table[:, :1].add_(1)


def _summary(report) -> tuple:
    return (
        report.verdict,
        report.replays,
        report.out_of_contract_replays,
        report.errors,
        [(p.name, p.status, str(p.first_failure)) for p in report.properties],
        sorted(
            (
                b.bucket,
                b.replays,
                b.out_of_contract,
                b.mismatches,
                b.oob_writes,
                b.escaped_writes,
                b.syncs,
            )
            for b in report.buckets.values()
        ),
    )


@pytest.mark.cpu_heavy  # 5-10 s under the interpreter: make test-heavy (CI runs it)
@pytest.mark.parametrize("streams", [1, 2])
@pytest.mark.parametrize(
    "builder", ["build_page_table", _wrong_first_column], ids=["kernel", "wrong"]
)
def test_a_verdict_does_not_depend_on_where_the_workload_ran(builder, streams, monkeypatch):
    monkeypatch.setattr(producer, "SEGMENT_STEPS", BATCH_STEPS)  # 36 steps: 3 segments
    cfg = CheckConfig(
        max_bs=8,
        max_context_len=128,
        page_size=8,
        steps=36,
        swa=True,
        swa_window=32,
        swa_churn=0.5,
        buckets="pow2",
        overlong=0.4,
        negative=0.2,
        bad_index=0.2,
        zero_len=0.2,
        errors=True,
        detectors="none",
        workload_streams=streams,
    )
    inline = check_replay_safety(builder, cfg.replace(workload_process="off"))
    produced = check_replay_safety(builder, cfg.replace(workload_process="on"))
    assert not inline.workload_in_process and produced.workload_in_process
    # Both report the time spent getting the workload's batches, within the workload phase.
    for report in (inline, produced):
        assert 0 < report.phase_us["workload receive"] <= report.phase_us["workload"]
    assert _summary(produced) == _summary(inline)
    assert "child process" in produced.format()
    assert Report.from_dict(produced.to_dict()).workload_in_process
    # The children's start-up is waited for after capture, outside the steady state, and said.
    assert inline.workload_start_ms == 0 and "start-up waited" not in inline.format()
    assert f"start-up waited {produced.workload_start_ms:.0f}" in produced.format()
    again = Report.from_dict(produced.to_dict())
    assert again.workload_start_ms == produced.workload_start_ms


def test_auto_keeps_short_and_eager_runs_in_one_process():
    cfg = CheckConfig(max_bs=4, max_context_len=64, page_size=8, steps=3, detectors="none")
    assert not check_replay_safety("build_page_table", cfg).workload_in_process


@pytest.mark.skipif(torch.cuda.is_available(), reason="sizes host memory (no CUDA here)")
def test_memory_check_counts_the_parked_tables_of_the_streams_used(monkeypatch):
    from pagegraph.check import memory_fit
    from pagegraph.check.pipeline.buffers import table_bytes

    cfg = CheckConfig(max_bs=256, max_context_len=131072, page_size=64, steps=10_000)
    r2t = (cfg.max_bs + 2) * cfg.max_context_len * 4  # 135 MB
    # Free memory for one stream's tables, the checker's working set and the rest, not for
    # four parked copies on top.
    free = r2t * 4 + table_bytes(cfg, PAGE_TABLE)
    monkeypatch.setattr(
        memory_fit.os,
        "sysconf",
        lambda name: 4096 if name == "SC_PAGE_SIZE" else free // 4096,
    )
    assert memory_fit.memory_problem(cfg, PAGE_TABLE) is None
    problem = memory_fit.memory_problem(cfg.replace(workload_streams=4), PAGE_TABLE)
    assert problem and "parked stream tables" in problem
    # A run of one segment uses stream 0 alone: nothing is parked.
    assert memory_fit.memory_problem(cfg.replace(workload_streams=4, steps=200), PAGE_TABLE) is None
