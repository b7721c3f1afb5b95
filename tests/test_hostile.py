"""Invariant: a metadata mistake is a TypeError/ValueError naming the argument, raised before
anything is written; hostile values are clamped on the device, never trusted."""

from __future__ import annotations

import pytest
import torch

from pagegraph import GraphRunner, KVPool, build_page_table
from pagegraph.graph.runner import BufferAllocationError, NotCaptured

CUDA = torch.cuda.is_available()
DEV = "cuda" if CUDA else "cpu"


def good_args(swa=True):
    gen = torch.Generator().manual_seed(21)
    r2t = torch.randint(0, 500, (5, 64), generator=gen, dtype=torch.int32).to(DEV)
    rpi = torch.tensor([1, 2, 3], device=DEV)
    sl = torch.tensor([10, 64, 3], device=DEV)
    pt = torch.full((3, 8), -9, dtype=torch.int32, device=DEV)
    kw = {}
    if swa:
        kw = {
            "swa_page_table": torch.full_like(pt, -9),
            "full_to_swa": torch.arange(501, device=DEV),
        }
    return [r2t, rpi, sl, pt, 8], kw


def _set(args, kw, name, value):
    names = ["req_to_token", "req_pool_indices", "seq_lens", "page_table", "page_size"]
    if name in names:
        args[names.index(name)] = value
    elif value is None:
        kw.pop(name, None)
    else:
        kw[name] = value


MISTAKES = [
    # (argument, bad value factory, exception, text)
    ("req_to_token", lambda a, k: a[0].float(), TypeError, "req_to_token must be int32"),
    ("req_to_token", lambda a, k: a[0][0], ValueError, "req_to_token must have 2"),
    ("req_to_token", lambda a, k: a[0].t(), ValueError, "req_to_token must have inner stride"),
    ("req_to_token", lambda a, k: [[1]], TypeError, "req_to_token must be a torch.Tensor"),
    ("req_pool_indices", lambda a, k: a[1].to(torch.int16), TypeError, "req_pool_indices"),
    ("req_pool_indices", lambda a, k: a[1][:2], ValueError, "req_pool_indices must have shape"),
    ("seq_lens", lambda a, k: a[2].float(), TypeError, "seq_lens must be int32 or int64"),
    ("seq_lens", lambda a, k: a[2][None], ValueError, "seq_lens must have 1"),
    (
        "seq_lens",
        lambda a, k: torch.arange(8, device=DEV)[::2][:3],
        ValueError,
        "seq_lens must have inner stride",
    ),
    ("page_table", lambda a, k: a[3].long(), TypeError, "page_table must be int32"),
    ("page_table", lambda a, k: a[3].t(), ValueError, "page_table must have inner stride"),
    ("page_size", lambda a, k: 0, ValueError, "page_size must be >= 1"),
    ("page_size", lambda a, k: 8.0, TypeError, "page_size must be an int"),
    ("page_size", lambda a, k: True, TypeError, "page_size must be an int"),
    ("swa_page_table", lambda a, k: None, ValueError, "full_to_swa was given without"),
    ("full_to_swa", lambda a, k: None, ValueError, "swa_page_table was given without"),
    ("swa_page_table", lambda a, k: k["swa_page_table"][:, :4], ValueError, "swa_page_table shape"),
    ("full_to_swa", lambda a, k: k["full_to_swa"].float(), TypeError, "full_to_swa must be"),
    ("full_to_swa", lambda a, k: k["full_to_swa"][:0], ValueError, "full_to_swa is empty"),
    (
        "errors",
        lambda a, k: torch.zeros(2, dtype=torch.int32, device=DEV),
        ValueError,
        "errors must hold at least 4",
    ),
    ("errors", lambda a, k: torch.zeros(4, device=DEV), TypeError, "errors must be int32"),
    (
        "seq_lens",
        lambda a, k: a[2].cpu() if CUDA else a[2].to("meta"),
        ValueError,
        "all tensors must be on one device",
    ),
]


@pytest.mark.parametrize(
    "arg,make_bad,exc,text", MISTAKES, ids=[f"{m[0]}-{i}" for i, m in enumerate(MISTAKES)]
)
def test_metadata_mistakes_raise_before_writing(arg, make_bad, exc, text):
    args, kw = good_args()
    outputs = [args[3].clone(), kw["swa_page_table"].clone()]
    _set(args, kw, arg, make_bad(args, kw))
    with pytest.raises(exc, match=text):
        build_page_table(*args, **kw)
    assert torch.equal(args[3], outputs[0]) or arg == "page_table"
    assert (
        "swa_page_table" not in kw
        or torch.equal(kw["swa_page_table"], outputs[1])
        or (arg == "swa_page_table")
    )


#: More mistakes the fast metadata path must hand to the full checks (they raise there too).
MORE_MISTAKES = [
    ("req_pool_indices", lambda a, k: a[1][:1].expand(3), ValueError, "inner stride"),
    ("req_to_token", lambda a, k: a[0][:0], ValueError, "req_to_token has no rows"),
    ("errors", lambda a, k: torch.zeros(2, 4, dtype=torch.int32, device=DEV), ValueError, "errors"),
    ("full_to_swa", lambda a, k: k["full_to_swa"][None], ValueError, "full_to_swa must have 1"),
    ("swa_page_table", lambda a, k: k["swa_page_table"].long(), TypeError, "swa_page_table"),
    ("page_size", lambda a, k: -3, ValueError, "page_size must be >= 1"),
]


@pytest.mark.parametrize(
    "arg,make_bad,exc,text",
    MISTAKES + MORE_MISTAKES,
    ids=[f"{m[0]}-{i}" for i, m in enumerate(MISTAKES + MORE_MISTAKES)],
)
def test_fast_metadata_path_never_accepts_a_mistake(arg, make_bad, exc, text):
    """The one-pass check that eager calls take must hand every mistake to the full checks,
    which must then raise it (on a CPU the fast path declines every call, and the full
    checks must still raise)."""
    from pagegraph.kernels.contract import check_builder_args, cuda_call_metadata

    args, kw = good_args()
    kw["errors"] = torch.zeros(4, dtype=torch.int32, device=DEV)
    _set(args, kw, arg, make_bad(args, kw))
    positional = [*args, kw.get("swa_page_table"), kw.get("full_to_swa"), kw.get("errors")]
    assert cuda_call_metadata(*positional) is None
    with pytest.raises(exc, match=text):
        check_builder_args(*positional, cpu_ok=False)


@pytest.mark.gpu
@pytest.mark.parametrize("swa", [False, True])
@pytest.mark.parametrize("layout", ["plain", "row_slice", "size_one_dims"])
def test_gpu_fast_metadata_path_reads_what_the_tensors_say(swa, layout):
    from pagegraph.kernels.contract import cuda_call_metadata

    args, kw = good_args(swa=swa)
    r2t, rpi, sl, pt, ps = args
    if layout == "row_slice":  # views into wider static buffers, as a graph bucket has
        r2t = torch.zeros(9, 100, dtype=torch.int64, device=DEV)[2:7, :64]
        pt = torch.zeros(6, 20, dtype=torch.int32, device=DEV)[:3, :8]
        if swa:
            kw["swa_page_table"] = torch.zeros(3, 30, dtype=torch.int32, device=DEV)[:, :8]
    elif layout == "size_one_dims":  # a size-1 extent may report any stride
        r2t = torch.zeros(5, 8, dtype=torch.int32, device=DEV)[:, ::8]
        rpi = torch.ones(4, dtype=torch.int64, device=DEV)[::4]
        sl = torch.full((4,), 5, dtype=torch.int32, device=DEV)[::4]
        pt = torch.zeros(2, 12, dtype=torch.int32, device=DEV)[:1, ::12]
        if swa:
            kw["swa_page_table"] = torch.zeros(1, 7, dtype=torch.int32, device=DEV)[:, ::7]
    errors = torch.zeros(6, dtype=torch.int32, device=DEV)
    swa_pt, f2s = kw.get("swa_page_table"), kw.get("full_to_swa")
    meta = cuda_call_metadata(r2t, rpi, sl, pt, ps, swa_pt, f2s, errors)
    expected = (
        pt.get_device(),
        pt.shape[0],
        pt.shape[1],
        r2t.shape[0],
        r2t.shape[1],
        r2t.stride(0),
        pt.stride(0),
        swa_pt.stride(0) if swa else None,
        f2s.shape[0] if swa else None,
    )
    assert meta == expected


def test_batch_past_the_grid_limit_raises_before_writing():
    from pagegraph.kernels.page_table import MAX_BATCH

    bs = MAX_BATCH + 1
    r2t = torch.arange(1, 65, dtype=torch.int32, device=DEV)[None, :]
    rpi = torch.zeros(bs, dtype=torch.int32, device=DEV)
    sl = torch.full((bs,), 10, dtype=torch.int32, device=DEV)
    pt = torch.full((bs, 4), -9, dtype=torch.int32, device=DEV)
    with pytest.raises(ValueError, match=f"batch size {bs} exceeds {MAX_BATCH}"):
        build_page_table(r2t, rpi, sl, pt, 16)
    assert bool((pt == -9).all())


def test_cpu_tensors_need_the_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    args, kw = good_args(swa=False)
    args = [a.cpu() if isinstance(a, torch.Tensor) else a for a in args]
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
        build_page_table(*args)


@pytest.mark.gpu
def test_gpu_tensors_on_cpu_and_gpu_mixed():
    args, kw = good_args()
    args[0] = args[0].cpu()
    with pytest.raises(ValueError, match="req_to_token is on cpu"):
        build_page_table(*args, **kw)


def test_runner_rejects_narrow_or_foreign_output_buffers():
    pool = KVPool(max_reqs=5, max_context_len=100, page_size=16, device=DEV)
    narrow = torch.zeros((4, 6), dtype=torch.int32, device=DEV)  # needs cdiv(100, 16) = 7
    with pytest.raises(ValueError, match="max_num_pages=7"):
        GraphRunner(
            pool.req_to_token, max_bs=4, max_context_len=100, page_size=16, page_table=narrow
        )
    wide = torch.full((6, 9), -1, dtype=torch.int32, device=DEV)
    runner = GraphRunner(
        pool.req_to_token, max_bs=4, max_context_len=100, page_size=16, page_table=wide, buckets=[4]
    )
    runner.capture()
    row = pool.alloc(100)
    pool.flush()
    runner.replay([row], [100])
    assert (wide[4:] == -1).all() and (wide[:, 7:] == -1).all(), "wrote outside max_bs x width"
    assert (wide[0, :7] >= 0).all()


def test_replay_before_capture_and_over_max_bs():
    pool = KVPool(max_reqs=5, max_context_len=64, page_size=16, device=DEV)
    runner = GraphRunner(pool.req_to_token, max_bs=4, max_context_len=64, page_size=16)
    with pytest.raises(NotCaptured):
        runner.replay([1], [1])
    runner.capture()
    with pytest.raises(ValueError, match="exceeds max_bs=4"):
        runner.replay([1] * 5, [1] * 5)


def test_static_buffers_that_do_not_fit_name_their_sizes():
    # A zero-stride view stands in for a huge req_to_token without allocating it.
    r2t = torch.zeros((2, 1), dtype=torch.int32, device=DEV).expand(2, 1 << 40)
    with pytest.raises(BufferAllocationError, match=r"max_bs=4096, max_num_pages=68719476736"):
        GraphRunner(r2t, max_bs=4096, max_context_len=1 << 40, page_size=16)


@pytest.mark.gpu
def test_gpu_two_runners_replay_concurrently_on_two_streams():
    """Two runners, each on its own stream, replaying back to back with no host read in
    between, so their replays really overlap on the device; each replay's tables (both, for
    the SWA runner) are snapshotted on its own stream and compared with the asked batches
    only at the end."""
    from pagegraph.kernels.contract import POISON
    from pagegraph.kernels.table_reference import expected_tables

    runners = []
    for seed in (1, 2):
        pool = KVPool(
            max_reqs=33, max_context_len=8192, page_size=16, device="cuda", seed=seed, swa=seed == 2
        )
        runner = GraphRunner(
            pool.req_to_token,
            max_bs=32,
            max_context_len=8192,
            page_size=16,
            full_to_swa=pool.full_to_swa,
        )
        runner.capture()
        gen = torch.Generator().manual_seed(seed)
        rows = [pool.alloc(int(n)) for n in torch.randint(1, 8000, (32,), generator=gen)]
        pool.flush()
        runners.append((pool, runner, rows, torch.cuda.Stream()))
    torch.cuda.synchronize()
    replays = 40
    snaps = [
        torch.empty((replays, 2, 32, runner.max_num_pages), dtype=torch.int32, device="cuda")
        for _, runner, _, _ in runners
    ]
    asked = [[], []]
    gen = torch.Generator().manual_seed(3)
    for i in range(replays):
        for k, (pool, runner, rows, stream) in enumerate(runners):
            n = int(torch.randint(1, 33, (1,), generator=gen))
            rpi, sl = pool.batch(rows[:n])
            asked[k].append((rpi, sl))
            with torch.cuda.stream(stream):
                runner.page_table.fill_(POISON)
                if runner.swa_page_table is not None:
                    runner.swa_page_table.fill_(POISON)
                runner.replay(rpi, sl)
                snaps[k][i, 0].copy_(runner.page_table)
                if runner.swa_page_table is not None:
                    snaps[k][i, 1].copy_(runner.swa_page_table)
    torch.cuda.synchronize()
    for k, (pool, runner, _, _) in enumerate(runners):
        for i, (rpi, sl) in enumerate(asked[k]):
            n = len(sl)
            want, want_swa = expected_tables(
                pool.req_to_token,
                torch.tensor(rpi, device="cuda"),
                torch.tensor(sl, device="cuda"),
                runner.max_num_pages,
                16,
                pool.full_to_swa,
            )
            assert torch.equal(snaps[k][i, 0, :n], want), (k, i)
            if want_swa is not None:
                assert torch.equal(snaps[k][i, 1, :n], want_swa), (k, i)
        runner.close()


def test_out_of_memory_during_capture_names_the_bucket_and_sizes():
    from pagegraph import check_replay_safety
    from pagegraph.graph.runner import CaptureOutOfMemory

    calls = [0]

    def oom_builder(req_to_token, req_pool_indices, seq_lens, page_table, page_size, **kw):
        # Runs out of memory at bucket 4's warm-up: not in the checker's two eager calls,
        # which come before the capture (and stop the check there when they raise).
        calls[0] += 1
        if page_table.shape[0] == 4 and (calls[0] > 2 or capturing_runner[0]):
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        build_page_table(req_to_token, req_pool_indices, seq_lens, page_table, page_size, **kw)

    capturing_runner = [True]
    pool = KVPool(max_reqs=9, max_context_len=64, page_size=16, device=DEV)
    runner = GraphRunner(
        pool.req_to_token,
        max_bs=8,
        max_context_len=64,
        page_size=16,
        buckets=[2, 4, 8],
        builder=oom_builder,
    )
    with pytest.raises(CaptureOutOfMemory, match=r"bucket 4: 1 page table\(s\) of \[4, 4\]"):
        runner.capture()
    capturing_runner[0] = False
    calls[0] = 0
    report = check_replay_safety(
        oom_builder, max_bs=8, max_context_len=64, page_size=16, buckets=[2, 4, 8], steps=3
    )
    assert report.property("capture").passed is False
    assert "out of memory during" in report.property("capture").detail
    assert "bucket 4" in report.property("capture").detail
