"""Fuzzing: random shapes, page sizes, dtypes, hostile values, padding policies and workloads.

Invariant: whatever the input, the kernel leaves exactly what the reference leaves (canary
frame included), and a random graph setup passes every replay-safety property it can check.
The kernel examples, in four parts: 1,000 under the interpreter (CI), 300 on a GPU in
``make test``, and 20,000 with ``HYPOTHESIS_PROFILE=gpu`` (``make fuzz``).
"""

from __future__ import annotations

import os

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pagegraph import ERROR_KINDS, build_page_table, check_replay_safety, reference_page_table
from pagegraph.check.config import CheckConfig
from pagegraph.kernels.contract import cdiv

from helpers import CPU_PASSES, assert_equal_tables, assert_passed, framed

# Seconds of examples a test: scheduled first in a parallel run (see conftest.py).
pytestmark = pytest.mark.heavy

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
GPU_PROFILE = os.environ.get("HYPOTHESIS_PROFILE") == "gpu"
# Under the interpreter (CI) 1,000 kernel examples; the compiled kernel on a GPU gets 300 in
# `make test` (each example costs a launch and a host read there) and 20,000 in `make fuzz`.
KERNEL_EXAMPLES = 20_000 if GPU_PROFILE else (300 if DEVICE == "cuda" else 1_000)
WORKLOAD_EXAMPLES = 300 if GPU_PROFILE else 40
INDEX = st.sampled_from([torch.int32, torch.int64])
#: What every random workload must pass (not skip), on a GPU or the CPU (the cpu detector,
#: emulated graphs).
WORKLOAD_PASSES = (
    *CPU_PASSES,
    "sync-free builder call",
    "sync-free replay path",
    "no allocation in builder",
    "no allocation in replay",
)


# In four parts (SWA x error counters): each part compiles its own kernel specialisations, so
# a parallel run (make test on a GPU) compiles them in four workers at once.
@pytest.mark.cpu_heavy
@pytest.mark.parametrize(
    "swa, with_errors",
    [(False, False), (False, True), (True, False), (True, True)],
    ids=["full", "full-errors", "swa", "swa-errors"],
)
@settings(max_examples=KERNEL_EXAMPLES // 4, deadline=None)
@given(
    bs=st.integers(1, 16),
    width=st.integers(1, 8),
    page_size=st.sampled_from([1, 2, 3, 7, 16, 64, 1024]),
    cols_delta=st.integers(-2, 12),
    r2t_dtype=INDEX,
    idx_dtype=INDEX,
    f2s_dtype=INDEX,
    hostile=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)
def test_fuzz_kernel(
    swa,
    with_errors,
    bs,
    width,
    page_size,
    cols_delta,
    r2t_dtype,
    idx_dtype,
    f2s_dtype,
    hostile,
    seed,
):
    gen = torch.Generator().manual_seed(seed)
    cols = max(1, width * page_size + cols_delta)
    rows = int(torch.randint(1, bs + 3, (1,), generator=gen))
    slots = 4096
    r2t = torch.randint(0, slots, (rows, cols), generator=gen).to(DEVICE, r2t_dtype)
    cap = cdiv(cols, page_size) * page_size
    if hostile:  # out-of-range rows, negative and overlong lengths
        rpi = torch.randint(-3, rows + 3, (bs,), generator=gen)
        sl = torch.randint(-2 * page_size, cap + 4 * page_size, (bs,), generator=gen)
    else:
        rpi = torch.randint(0, rows, (bs,), generator=gen)
        sl = torch.randint(0, cap + 1, (bs,), generator=gen)
    rpi, sl = rpi.to(DEVICE, idx_dtype), sl.to(DEVICE, idx_dtype)
    f2s = None
    if swa:  # a short full_to_swa makes some slots fall outside it: clamped
        n = slots + 1 if not hostile else int(torch.randint(1, slots, (1,), generator=gen))
        f2s = torch.randint(0, 1 << 20, (n,), generator=gen).to(DEVICE, f2s_dtype)
    big, pt = framed(bs, width, DEVICE)
    big_ref, pt_ref = framed(bs, width, DEVICE)
    kw, kw_ref = {}, {}
    if swa:
        sbig, spt = framed(bs, width, DEVICE)
        sbig_ref, spt_ref = framed(bs, width, DEVICE)
        kw = {"swa_page_table": spt, "full_to_swa": f2s}
        kw_ref = {"swa_page_table": spt_ref, "full_to_swa": f2s}
    errors = torch.zeros(len(ERROR_KINDS), dtype=torch.int32, device=DEVICE)
    build_page_table(r2t, rpi, sl, pt, page_size, errors=errors if with_errors else None, **kw)
    reference_page_table(r2t, rpi, sl, pt_ref, page_size, **kw_ref)
    assert_equal_tables(big, big_ref, "page_table")
    if swa:
        assert_equal_tables(sbig, sbig_ref, "swa_page_table")
    if with_errors:
        got = dict(zip(ERROR_KINDS, errors.tolist()))
        cap_pages = min(width, cdiv(cols, page_size))
        assert got["seq_len_over_capacity"] == int((sl > cap_pages * page_size).sum())
        assert got["negative_seq_len"] == int((sl < 0).sum())
        assert got["req_pool_index_out_of_range"] == int(((rpi < 0) | (rpi >= rows)).sum())
    else:
        assert not errors.any()


@pytest.mark.cpu_heavy
@settings(max_examples=WORKLOAD_EXAMPLES, deadline=None)
@given(
    max_bs=st.integers(1, 12),
    page_size=st.sampled_from([1, 3, 16, 64]),
    pages=st.integers(1, 12),
    buckets=st.sampled_from(["sglang", "sglang-spec", "vllm", "pow2"]),
    padding=st.sampled_from(["sglang", "vllm", "dummy-row"]),
    swa=st.booleans(),
    draft=st.sampled_from([0, 2, 8]),
    index_dtype=st.sampled_from(["int32", "int64"]),
    seed=st.integers(0, 2**31 - 1),
)
def test_fuzz_workloads(max_bs, page_size, pages, buckets, padding, swa, draft, index_dtype, seed):
    ctx = pages * page_size + (seed % page_size if page_size > 1 else 0)
    cfg = CheckConfig(
        max_bs=max_bs,
        max_context_len=max(ctx, draft + 2),
        page_size=page_size,
        buckets=buckets,
        padding=padding,
        swa=swa,
        steps=6,
        seed=seed,
        draft_tokens=draft,
        swa_window=(page_size * 2) if swa else None,
        swa_churn=0.5 if swa else 0.0,
        index_dtype=index_dtype,
        finish_rate=0.2,
        near_capacity=0.3,
    )
    report = check_replay_safety("build_page_table", cfg)
    # Passed, not skipped: ``report.safe`` alone also accepts a property that turned into a
    # skip. The error counters are off; graph safety and row containment are judged where
    # the workload has replays for them (longer than at capture; out of the contract).
    assert_passed(report, *WORKLOAD_PASSES)
    graph_safe = "graph-safe (captured short, replayed long)"
    if report.long_replays:
        assert_passed(report, graph_safe)
    else:  # nothing to compare: skipped, and for that reason only
        prop = report.property(graph_safe)
        assert (prop.status, prop.detail) == (
            "skip",
            "no in-contract replay longer than at capture",
        ), report.format()
    if report.out_of_contract_replays:
        assert_passed(report, "row containment")
    assert report.safe, report.format()
