"""Invariant: check_replay_safety passes a correct builder on every property it can check, and
catches each way a builder can be unsafe (wrong entries, writes outside the live region,
frozen widths, syncs) without crashing on it."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pagegraph import build_page_table, check_replay_safety, reference_page_table
from pagegraph.checker import POISON, CheckConfig, expected_tables
from pagegraph.pytest_plugin import assert_replay_safe

from helpers import assert_equal_tables

CUDA = torch.cuda.is_available()
SMALL = CheckConfig(
    max_bs=10,
    max_context_len=256,
    page_size=16,
    steps=12,
    swa=True,
    swa_window=64,
    swa_churn=0.5,
    buckets="pow2",
    draft_tokens=3,
)


def off_by_one_builder(req_to_token, req_pool_indices, seq_lens, page_table, page_size, **kw):
    """Writes one page too many per row: past the live region (and past the row at capacity
    would be caught too)."""
    build_page_table(
        req_to_token, req_pool_indices, seq_lens + page_size, page_table, page_size, **kw
    )


def wrong_value_builder(req_to_token, req_pool_indices, seq_lens, page_table, page_size, **kw):
    build_page_table(req_to_token, req_pool_indices, seq_lens, page_table, page_size, **kw)
    page_table[:, :1].add_(1)


def raising_builder(*args, **kwargs):
    raise RuntimeError("boom")


@settings(max_examples=30, deadline=None)
@given(
    bs=st.integers(1, 12),
    ps=st.sampled_from([1, 3, 16]),
    width=st.integers(1, 9),
    seed=st.integers(0, 2**31 - 1),
    swa=st.booleans(),
)
def test_expected_tables_equals_the_oracle(bs, ps, width, seed, swa):
    gen = torch.Generator().manual_seed(seed)
    ctx = width * ps + int(torch.randint(-ps + 1, ps, (1,), generator=gen)) if ps > 1 else width
    r2t = torch.randint(0, 999, (bs + 2, max(ctx, 1)), generator=gen, dtype=torch.int32)
    rpi = torch.randint(0, bs + 2, (bs,), generator=gen)
    sl = torch.randint(-2, width * ps + 3 * ps, (bs,), generator=gen)
    f2s = torch.randint(0, 500, (700,), generator=gen) if swa else None
    want, want_swa = expected_tables(r2t, rpi, sl, width, ps, f2s)
    ref = torch.full((bs, width), POISON, dtype=torch.int32)
    ref_swa = torch.full_like(ref, POISON)
    kw = {"swa_page_table": ref_swa, "full_to_swa": f2s} if swa else {}
    reference_page_table(r2t, rpi, sl, ref, ps, **kw)
    assert_equal_tables(want, ref)
    if swa:
        assert_equal_tables(want_swa, ref_swa)


def test_kernel_passes_everything_checkable_here():
    report = check_replay_safety("build_page_table", SMALL)
    assert report.safe, report.format()
    assert report.replays == SMALL.steps
    for name in (
        "correct",
        "bounded writes",
        "graph-safe (captured short, replayed long)",
        "static buffers unmoved",
        "capture",
    ):
        assert report.property(name).passed is True, report.format()
    if not CUDA:
        # GPU-only checks are listed as skipped, never as passed.
        assert set(report.skipped) >= {
            "no allocation in replay",
            "sync-free replay path",
            "no compilation after warm-up",
        }
        assert "skipped, need a GPU" in report.format()


@pytest.mark.parametrize("padding", ["sglang", "vllm", "dummy-row"])
def test_padding_policies_pass(padding):
    report = check_replay_safety("build_page_table", SMALL, padding=padding, steps=6)
    assert report.safe, report.format()


def test_off_by_one_is_caught_as_out_of_bounds():
    report = check_replay_safety(off_by_one_builder, SMALL)
    assert not report.safe
    bounded = report.property("bounded writes")
    assert bounded.passed is False and bounded.first_failure is not None
    assert bounded.first_failure.got != POISON and bounded.first_failure.expected == POISON
    assert report.property("correct").passed is True


def test_wrong_values_are_caught_with_the_first_failure():
    report = check_replay_safety(wrong_value_builder, SMALL)
    correct = report.property("correct")
    assert correct.passed is False
    f = correct.first_failure
    assert f.replay == 0 and f.col == 0 and f.got == f.expected + 1
    assert "expected" in report.format() and "UNSAFE" in report.format()


def test_raising_builder_is_reported_not_fatal():
    report = check_replay_safety(raising_builder, SMALL)
    assert not report.safe
    assert "boom" in report.property("capture").detail


def test_static_width_gather_is_correct_but_rewrites_the_tail():
    report = check_replay_safety("static_width_gather", SMALL)
    assert report.property("correct").passed is True
    assert report.property("bounded writes").passed is False


def test_report_serialises():
    report = check_replay_safety("build_page_table", SMALL, steps=3)
    d = report.to_dict()
    assert d["safe"] is True and d["replays"] == 3
    assert {p["name"] for p in d["properties"]} >= {"correct", "bounded writes"}
    assert all(b["replays"] > 0 for b in d["buckets"])


# -- GPU: conformance at real sizes ------------------------------------------------------------

gpu = pytest.mark.gpu
BIG = [
    # 4 x 520 = 2080 checked replays of build_page_table in the GPU suite
    CheckConfig(
        max_bs=256, max_context_len=131072, page_size=64, steps=520, seed=1, initial_len=(1, 32768)
    ),
    CheckConfig(
        max_bs=256, max_context_len=131072, page_size=16, steps=520, seed=2, initial_len=(1, 32768)
    ),
    CheckConfig(
        max_bs=256,
        max_context_len=131072,
        page_size=64,
        steps=520,
        seed=3,
        swa=True,
        swa_window=8192,
        swa_churn=0.3,
        initial_len=(1, 32768),
    ),
    CheckConfig(
        max_bs=256,
        max_context_len=131072,
        page_size=16,
        steps=520,
        seed=4,
        swa=True,
        swa_window=4096,
        swa_churn=0.3,
        draft_tokens=4,
        initial_len=(1, 32768),
        padding="vllm",
    ),
]


@gpu
@pytest.mark.parametrize("config", BIG, ids=["ps64", "ps16", "ps64-swa", "ps16-swa-spec"])
def test_gpu_kernel_passes_every_property(config):
    report = check_replay_safety("build_page_table", config)
    assert report.safe, report.format()
    assert not report.skipped, report.format()
    assert report.replays == config.steps
    assert len(report.buckets) > 10, "the workload must cross many buckets"


@gpu
def test_gpu_static_width_gather_is_correct_and_sync_free():
    report = check_replay_safety("static_width_gather", BIG[0], steps=100)
    for name in (
        "correct",
        "sync-free builder call",
        "sync-free replay path",
        "no allocation in replay",
        "graph-safe (captured short, replayed long)",
    ):
        assert report.property(name).passed is True, report.format()


@gpu
def test_gpu_host_max_gather_is_reported_unsafe():
    report = check_replay_safety("host_max_gather", BIG[0], steps=60)
    assert not report.safe
    assert report.property("sync-free builder call").passed is False, report.format()
    assert report.property("graph-safe (captured short, replayed long)").passed is False
    assert report.property("correct").passed is False


@gpu
def test_gpu_assert_replay_safe_on_a_user_builder():
    """The plugin's helper on a user-written builder given as module:function."""
    report = assert_replay_safe(
        "pagegraph.kernel:build_page_table",
        max_bs=48,
        max_context_len=16384,
        page_size=32,
        steps=50,
    )
    assert report.replays == 50
    with pytest.raises(pytest.fail.Exception, match="not replay-safe"):
        assert_replay_safe(
            off_by_one_builder, max_bs=8, max_context_len=1024, page_size=16, steps=5
        )


@gpu
def test_gpu_graph_runner_fixture(graph_runner):
    runner = graph_runner(max_bs=16, max_context_len=2048, page_size=16, swa=True)
    pool = runner.pool_model
    row = pool.alloc(1500)
    pool.flush()
    pt, swa = runner.replay([row], [1500])
    want, want_swa = expected_tables(
        pool.req_to_token,
        runner.req_pool_indices[:1],
        runner.seq_lens[:1],
        runner.max_num_pages,
        16,
        pool.full_to_swa,
    )
    n = -(-1500 // 16)
    assert torch.equal(pt[:, :n], want[:, :n]) and torch.equal(swa[:, :n], want_swa[:, :n])
