"""Invariant: GraphRunner.replay() stages any batch into the captured static buffers without a
sync, pads by its policy, and refuses to run on buffers that moved since capture.

CPU cases run the eager path (no graph) under the Triton interpreter; GPU cases capture real
graphs over SGLang buckets and replay them out of order.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pagegraph import GraphRunner, KVPool, NotCaptured, StaticBufferMoved
from pagegraph.kernels.contract import POISON, cdiv
from pagegraph.kernels.table_reference import expected_tables
from pagegraph.workload.decode import DecodeWorkload

from helpers import assert_equal_tables

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"


def make(max_bs=12, ctx=200, ps=16, swa=False, seed=0, **kw):
    pool = KVPool(
        max_reqs=max_bs + 1, max_context_len=ctx, page_size=ps, swa=swa, device=DEVICE, seed=seed
    )
    runner = GraphRunner(
        pool.req_to_token,
        max_bs=max_bs,
        max_context_len=ctx,
        page_size=ps,
        full_to_swa=pool.full_to_swa,
        **kw,
    )
    return pool, runner


def check_replay(runner, pool, rpi, sl, bucket, stale_rpi):
    """The tables must hold what the *asked* batch gives (never what the runner staged):
    rows ``:n`` from ``(rpi, sl)``, rows ``n:bucket`` padded by the runner's policy (stale
    request indices taken from ``stale_rpi``, the static buffer before the replay), poison
    past the bucket."""
    n = len(sl)
    policy = runner.padding
    want_rpi = torch.as_tensor(stale_rpi[:bucket]).to(torch.int64).clone()
    want_rpi[:n] = torch.as_tensor(list(rpi))
    if policy.req_pool_index is not None:
        want_rpi[n:bucket] = policy.req_pool_index
    want_sl = torch.full((bucket,), policy.seq_len, dtype=torch.int64)
    want_sl[:n] = torch.as_tensor(list(sl))
    want, want_swa = expected_tables(
        pool.req_to_token,
        want_rpi.to(DEVICE),
        want_sl.to(DEVICE),
        runner.max_num_pages,
        runner.page_size,
        pool.full_to_swa,
    )
    assert runner.last_bucket == bucket
    assert_equal_tables(runner.page_table[:bucket], want, "page_table")
    assert_equal_tables(
        runner.page_table[bucket:],
        torch.full_like(runner.page_table[bucket:], POISON),
        "rows past bucket",
    )
    if want_swa is not None:
        assert_equal_tables(runner.swa_page_table[:bucket], want_swa, "swa_page_table")


@pytest.mark.parametrize("kind", ["list", "cpu-tensor", "device-tensor", "int64-device"])
@pytest.mark.parametrize("padding", ["sglang", "vllm", "dummy-row"])
def test_staging_and_padding(kind, padding):
    pool, runner = make(padding=padding, buckets=[4, 8, 12], swa=True)
    runner.capture()
    rows = [pool.alloc(n) for n in (5, 190, 17, 33, 64)]
    pool.flush()
    rpi, sl = pool.batch(rows)
    stale = runner.req_pool_indices.clone()
    if kind == "cpu-tensor":
        rpi, sl = torch.tensor(rpi), torch.tensor(sl)
    elif kind.endswith("device") or kind == "device-tensor":
        dt = torch.int64 if kind == "int64-device" else torch.int32
        rpi, sl = (
            torch.tensor(rpi, dtype=dt, device=DEVICE),
            torch.tensor(sl, dtype=dt, device=DEVICE),
        )
    runner.page_table.fill_(POISON)
    runner.swa_page_table.fill_(POISON)
    asked = pool.batch(rows)
    pt, swa = runner.replay(rpi, sl)
    assert pt.shape == (5, runner.max_num_pages) and swa.shape == pt.shape
    assert pt.data_ptr() == runner.page_table.data_ptr(), "a view of the static buffer"
    assert runner.last_bucket == 8
    assert runner.seq_lens[:5].tolist() == pool.batch(rows)[1]
    policy = runner.padding
    assert (runner.seq_lens[5:8] == policy.seq_len).all()
    if policy.req_pool_index is None:
        assert torch.equal(runner.req_pool_indices[5:8], stale[5:8]), "stale indices stay"
    else:
        assert (runner.req_pool_indices[5:8] == policy.req_pool_index).all()
    check_replay(runner, pool, *asked, 8, stale.cpu())


def _reading_runner(with_reader: bool, emulate):
    """A runner whose reader copies rows ``:bs`` of the table into ``read`` (poison
    elsewhere): what a consumer in the same graph saw."""
    box: dict[str, torch.Tensor] = {}

    def reader(bs: int) -> None:
        box["read"][:bs].copy_(box["table"][:bs])

    pool, runner = make(buckets=[4, 8, 12], emulate=emulate)
    if with_reader:
        runner.attach_reader(reader)
    box["table"] = runner.page_table
    box["read"] = torch.full_like(runner.page_table, POISON)
    return pool, runner, box["read"]


@pytest.mark.parametrize("emulate", [None, False])
def test_a_reader_sees_each_replays_tables_after_the_builder(emulate):
    """The reader is captured (or run eagerly) after the builder in the bucket's body: at every
    replay it reads the rows this replay built, exactly, and nothing past the bucket."""
    pool, runner, read = _reading_runner(True, emulate)
    runner.capture()
    rows = [pool.alloc(n) for n in (7, 150, 33, 64, 90, 12, 5, 41, 199)]
    pool.flush()
    for pick in ([0, 1, 2], [3, 4, 5, 6, 7, 8], [8, 1], [2, 3, 4, 5, 6]):
        rpi, sl = pool.batch([rows[i] for i in pick])
        stale = runner.req_pool_indices.cpu().clone()
        read.fill_(POISON)
        runner.page_table.fill_(POISON)
        runner.replay(rpi, sl)
        bucket = runner.buckets.bucket_for(len(pick))
        check_replay(runner, pool, rpi, sl, bucket, stale)
        assert_equal_tables(read[:bucket], runner.page_table[:bucket], "what the reader read")
        assert (read[bucket:] == POISON).all(), "the reader read rows past the bucket"
    runner.close()


def test_without_a_reader_nothing_reads_the_tables():
    """The planted twin: the same runner without its reader leaves ``read`` untouched, so the
    comparison above is one that fails."""
    pool, runner, read = _reading_runner(False, None)
    runner.capture()
    row = pool.alloc(30)
    pool.flush()
    runner.replay([row], [30])
    assert (read == POISON).all()
    assert not torch.equal(read[:4], runner.page_table[:4])
    runner.close()


def test_a_reader_is_refused_after_capture():
    _, runner, _ = _reading_runner(False, None)
    runner.capture()
    try:
        with pytest.raises(RuntimeError, match="after capture"):
            runner.attach_reader(lambda bs: None)
    finally:
        runner.close()  # the graphs go now, not when a collection finds the traceback's cycle


def test_a_kind_built_before_the_graph_has_its_reader_in_the_graph():
    """vLLM's gather runs eagerly before the launch; the graph holds the reader alone, which
    reads at each replay the table the gather just wrote (padded rows cleared to block 0)."""
    from pagegraph.kernels.block_table import gather_block_tables
    from pagegraph.workload.engine_block_tables import EngineBlockTables

    engine = EngineBlockTables(13, 13, 16, device=DEVICE)
    pool, eager = make(builder=gather_block_tables, engine=engine, buckets=[4, 12], padding="vllm")
    read = torch.full_like(eager.page_table, POISON)
    eager.attach_reader(lambda bs: read[:bs].copy_(eager.page_table[:bs]))
    eager.capture()
    try:
        for lens in ([30, 150, 7], [199, 16], [64, 90, 12, 5, 41, 3, 100]):
            rows = [pool.alloc(n) for n in lens]
            pool.flush()
            engine.update(rows, lens, pool.req_to_token)
            eager.replay(rows, lens)
            bucket = eager.last_bucket
            assert torch.equal(read[:bucket], eager.page_table[:bucket])
            assert (read[len(lens) : bucket] == 0).all()  # padded rows: the null block
            for i, (row, n) in enumerate(zip(rows, lens)):
                pages = cdiv(n, 16)
                want = pool.req_to_token[row, : pages * 16 : 16] // 16
                assert torch.equal(read[i, :pages].long(), want.long())
            for row in rows:
                pool.free(row)
    finally:
        eager.close()


def test_swa_view_is_none_without_full_to_swa():
    pool, runner = make()
    runner.capture()
    row = pool.alloc(20)
    pool.flush()
    pt, swa = runner.replay([row], [20])
    assert swa is None and pt.shape[0] == 1


def test_replay_before_capture_raises():
    _, runner = make()
    with pytest.raises(NotCaptured, match="capture"):
        runner.replay([1], [3])


def test_batch_over_max_bs_raises_before_touching_buffers():
    _, runner = make(max_bs=4, buckets=[2, 4])
    runner.capture()
    before = (runner.seq_lens.clone(), runner.req_pool_indices.clone(), runner.page_table.clone())
    with pytest.raises(ValueError, match=r"5 requests exceeds max_bs=4"):
        runner.replay([1] * 5, [3] * 5)
    with pytest.raises(ValueError, match="entries"):
        runner.replay([1, 2], [3])
    after = (runner.seq_lens, runner.req_pool_indices, runner.page_table)
    assert all(torch.equal(a, b) for a, b in zip(before, after))


@pytest.mark.parametrize("kind", ["list", "numpy", "device"])
def test_write_inputs_writes_a_batch_for_bodies_outside_the_graphs(kind):
    """``write_inputs`` copies a batch into rows ``:n`` now (the rows after it kept), which
    the builder alone then reads; given none, the capture's inputs in every row. A batch of
    unequal counts, of more rows than max_bs or of one argument only is refused, nothing
    written."""
    pool, runner = make(max_bs=4, buckets=[2, 4])
    rows = [pool.alloc(n) for n in (17, 40)]
    pool.flush()
    as_kind = {"list": list, "numpy": np.array, "device": lambda v: torch.tensor(v, device=DEVICE)}
    runner.req_pool_indices.fill_(7)
    runner.seq_lens.fill_(9)
    runner.write_inputs(as_kind[kind](rows), as_kind[kind]([17, 40]))
    assert runner.req_pool_indices.tolist() == [*rows, 7, 7]
    assert runner.seq_lens.tolist() == [17, 40, 9, 9]
    runner.page_table.fill_(POISON)
    runner.build(2)
    rpi, sl = runner.req_pool_indices[:2], runner.seq_lens[:2]
    want, _ = expected_tables(pool.req_to_token, rpi, sl, runner.max_num_pages, 16)
    assert_equal_tables(runner.page_table[:2], want, "page_table")
    for bad in (([1], [3, 4]), ([1] * 5, [3] * 5), ([1], None), ([], [])):
        with pytest.raises(ValueError, match="batch"):
            runner.write_inputs(*bad)
    assert runner.seq_lens.tolist() == [17, 40, 9, 9]
    runner.write_inputs()
    assert runner.req_pool_indices.tolist() == [0] * 4 and runner.seq_lens.tolist() == [1] * 4


def one_request(kind: str):
    """A batch of one request as host lists or as device tensors (with graphs, the runner's
    short path for the engine's usual call)."""
    if kind == "list":
        return [1], [3]
    return torch.tensor([1], device=DEVICE), torch.tensor([3], device=DEVICE)


@pytest.mark.parametrize("kind", ["list", "device"])
@pytest.mark.parametrize("what", ["page_table", "seq_lens", "req_pool_indices", "swa_page_table"])
def test_replaced_static_buffer_is_detected(what, kind):
    pool, runner = make(swa=True)
    runner.capture()
    setattr(runner, what, getattr(runner, what).clone())
    with pytest.raises(StaticBufferMoved, match=what):
        runner.replay(*one_request(kind))


@pytest.mark.parametrize("kind", ["list", "device"])
def test_req_to_token_reallocated_in_place_is_detected(kind):
    pool, runner = make()
    runner.capture()
    pool.req_to_token.set_(torch.zeros_like(pool.req_to_token))  # same object, new storage
    with pytest.raises(StaticBufferMoved, match="req_to_token"):
        runner.replay(*one_request(kind))


@pytest.mark.parametrize("kind", ["list", "device"])
@pytest.mark.parametrize("how", ["resize_", "as_strided_"])
def test_static_buffer_reshaped_in_place_is_detected(how, kind):
    """Same tensor, same address, other shape or strides: the graphs still write the extent
    they were captured with, so the replay must refuse."""
    pool, runner = make()
    runner.capture()
    pt = runner.page_table
    ptr = pt.data_ptr()
    if how == "resize_":
        pt.resize_(pt.shape[0] - 1, pt.shape[1])  # smaller: keeps its storage
    else:
        pt.as_strided_((pt.shape[0] // 2, pt.shape[1]), (2 * pt.stride(0), 1))
    assert runner.page_table.data_ptr() == ptr
    with pytest.raises(StaticBufferMoved, match="page_table"):
        runner.replay(*one_request(kind))


def test_invalid_runner_arguments():
    pool = KVPool(max_reqs=4, max_context_len=64, page_size=8, device=DEVICE)
    with pytest.raises(ValueError, match="fewer than max_context_len"):
        GraphRunner(pool.req_to_token, max_bs=2, max_context_len=65, page_size=8)
    with pytest.raises(ValueError, match="page_size"):
        GraphRunner(pool.req_to_token, max_bs=2, max_context_len=64, page_size=0)
    with pytest.raises(ValueError, match="above max_bs"):
        GraphRunner(pool.req_to_token, max_bs=2, max_context_len=64, page_size=8, buckets=[4])
    with pytest.raises(ValueError, match="unknown padding"):
        GraphRunner(pool.req_to_token, max_bs=2, max_context_len=64, page_size=8, padding="x")
    with pytest.raises(ValueError, match="unknown builder"):
        GraphRunner(pool.req_to_token, max_bs=2, max_context_len=64, page_size=8, builder="x")


def test_eager_workload_replays_are_exact():
    pool, runner = make(max_bs=9, ctx=160, ps=8, swa=True, buckets="pow2")
    runner.capture()
    work = DecodeWorkload(
        pool,
        max_bs=9,
        steps=25,
        seed=3,
        draft_tokens=2,
        swa_window=32,
        swa_churn=0.5,
        finish_rate=0.1,
    )
    for step in work:
        runner.page_table.fill_(POISON)
        runner.swa_page_table.fill_(POISON)
        stale = runner.req_pool_indices.cpu().clone()
        runner.replay(step.req_pool_indices, step.seq_lens)
        bucket = runner.buckets.sizes[[b >= step.bs for b in runner.buckets.sizes].index(True)]
        check_replay(runner, pool, step.req_pool_indices, step.seq_lens, bucket, stale)


def test_error_counters_through_the_runner():
    pool, runner = make(max_bs=4, buckets=[4], errors=True)
    runner.capture()
    runner.reset_errors()
    runner.replay([1, 99, 2], [500, 3, -1])  # overlong, bad row, negative
    errs = runner.read_errors()
    assert errs["seq_len_over_capacity"] == 1
    assert errs["req_pool_index_out_of_range"] == 1
    assert errs["negative_seq_len"] == 1


# -- GPU: real graphs --------------------------------------------------------------------------

gpu = pytest.mark.gpu


@gpu
@pytest.mark.parametrize("builder", ["build_page_table", "static_width_gather"])
def test_gpu_shared_pool_random_bucket_order(builder):
    """Graphs share one memory pool; replays in random bucket order must stay exact (the
    static-width gather allocates intermediates inside that pool)."""
    pool, runner = make(max_bs=64, ctx=8192, ps=16, swa=True, buckets="sglang", builder=builder)
    runner.capture()
    assert len(runner.graphs) == len(runner.buckets)
    rows = [
        pool.alloc(int(n))
        for n in torch.randint(1, 8000, (64,), generator=torch.Generator().manual_seed(1))
    ]
    pool.flush()
    gen = torch.Generator().manual_seed(2)
    for _ in range(60):
        n = int(torch.randint(1, 65, (1,), generator=gen))
        pick = torch.randperm(64, generator=gen)[:n].tolist()
        runner.page_table.fill_(POISON)
        runner.swa_page_table.fill_(POISON)
        rpi, sl = pool.batch([rows[i] for i in pick])
        stale = runner.req_pool_indices.cpu().clone()
        runner.replay(rpi, sl)
        bucket = runner.buckets.bucket_for(n)
        if builder == "build_page_table":
            check_replay(runner, pool, rpi, sl, bucket, stale)
        else:  # the static-width gather rewrites the tails: compare the live entries only
            want, want_swa = expected_tables(
                pool.req_to_token,
                torch.tensor(rpi, device="cuda"),
                torch.tensor(sl, device="cuda"),
                runner.max_num_pages,
                16,
                pool.full_to_swa,
            )
            live = want != POISON
            assert torch.equal(runner.page_table[:n][live], want[live])
            assert torch.equal(runner.swa_page_table[:n][live], want_swa[live])
    runner.close()


@gpu
def test_gpu_replay_is_sync_free_and_allocation_free():
    pool, runner = make(max_bs=32, ctx=4096, ps=16, buckets="sglang")
    runner.capture()
    rows = [pool.alloc(n) for n in range(100, 3300, 100)]
    pool.flush()
    rpi, sl = pool.batch(rows)
    dev_rpi = torch.tensor(rpi, device="cuda")
    dev_sl = torch.tensor(sl, device="cuda")
    runner.replay(rpi, sl)
    torch.cuda.synchronize()
    allocs = torch.cuda.memory_stats()["allocation.all.allocated"]
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for i in range(50):
            if i % 2:
                runner.replay(dev_rpi[: 1 + i % 32], dev_sl[: 1 + i % 32])
            else:
                runner.replay(rpi[: 1 + i % 32], sl[: 1 + i % 32])
    finally:
        torch.cuda.set_sync_debug_mode(previous)
    torch.cuda.synchronize()
    assert torch.cuda.memory_stats()["allocation.all.allocated"] == allocs
    runner.page_table.fill_(POISON)
    stale = runner.req_pool_indices.cpu().clone()
    runner.replay(rpi, sl)
    check_replay(runner, pool, rpi, sl, runner.buckets.bucket_for(len(rpi)), stale)
    runner.close()


@gpu
def test_gpu_replays_far_ahead_of_the_device_are_each_staged(monkeypatch):
    """More replays in flight than the mailbox has slots (the device held back by a sleep
    kernel), from device tensors and host lists: every replay builds its own batch, and the
    host waits for the device only when it is a whole ring of posts ahead."""
    from pagegraph.graph.staging import SLOTS, Mailbox

    waits = []
    wait = Mailbox._wait
    monkeypatch.setattr(Mailbox, "_wait", lambda self, k: (waits.append(k), wait(self, k)))
    pool, runner = make(max_bs=32, ctx=4096, ps=16, buckets="sglang")
    runner.capture()
    gen = torch.Generator().manual_seed(7)
    rows = [pool.alloc(int(n)) for n in torch.randint(1, 4000, (32,), generator=gen)]
    pool.flush()
    asked = []
    for _ in range(3 * SLOTS):
        n = int(torch.randint(1, 33, (1,), generator=gen))
        pick = torch.randperm(32, generator=gen)[:n].tolist()
        rpi, sl = pool.batch([rows[j] for j in pick])
        dev = (torch.tensor(rpi, device="cuda"), torch.tensor(sl, device="cuda"))
        asked.append((rpi, sl, dev))
    torch.cuda.synchronize()
    outputs, stale = [], []
    torch.cuda._sleep(200_000_000)  # hold the device back while the host posts
    for i, (rpi, sl, dev) in enumerate(asked):
        stale.append(runner.req_pool_indices.clone())  # enqueued: the buffer before replay i
        runner.page_table.fill_(POISON)
        if i % 2:
            runner.replay(*dev)
        else:
            runner.replay(list(rpi), list(sl))
        outputs.append(runner.page_table.clone())
    torch.cuda.synchronize()
    assert waits, "the host never got a ring of posts ahead"
    for i, ((rpi, sl, _), got, before) in enumerate(zip(asked, outputs, stale)):
        bucket = runner.buckets.bucket_for(len(sl))
        want_rpi = before[:bucket].cpu().to(torch.int64)
        want_rpi[: len(rpi)] = torch.tensor(rpi)
        want_sl = torch.ones(bucket, dtype=torch.int64)
        want_sl[: len(sl)] = torch.tensor(sl)
        want, _ = expected_tables(
            pool.req_to_token, want_rpi.cuda(), want_sl.cuda(), runner.max_num_pages, 16
        )
        assert torch.equal(got[:bucket], want), f"replay {i}"
    runner.close()


def _interrupt_bed(runner_cls):
    """A captured one-bucket runner of ``runner_cls`` and three requests, for the tests of a
    replay interrupted around its launch (the first request is the interrupted batch)."""
    pool = KVPool(max_reqs=9, max_context_len=512, page_size=16, device=DEVICE, seed=0)
    runner = runner_cls(pool.req_to_token, max_bs=8, max_context_len=512, page_size=16, buckets=[8])
    runner.capture()
    rows = [pool.alloc(n) for n in (40, 300, 17)]
    pool.flush()
    return pool, runner, rows


def _next_replay_stages_its_own_batch(runner, pool, rows):
    """After the interrupted replay, the next one (``rows[1:]``) stages its own batch, not
    the interrupted one: its inputs and tables exact."""
    rpi, sl = pool.batch(rows[1:])
    runner.page_table.fill_(POISON)
    stale = runner.req_pool_indices.cpu().clone()
    runner.replay(rpi, sl)
    assert runner.seq_lens[:2].tolist() == list(sl)
    check_replay(runner, pool, rpi, sl, 8, stale)
    runner.close()


@gpu
def test_gpu_a_post_whose_launch_never_came_is_withdrawn():
    """Staging posted the batch, then raised before the launch: the post is taken back, and
    the next replay stages its own batch, not the one left behind."""

    pool, runner, rows = _interrupt_bed(GraphRunner)
    mailbox = runner._mailbox
    for name in ("post", "try_post_tensors"):  # the general path and the short one
        real = getattr(mailbox, name)

        def post_then_interrupt(*args, real=real):
            real(*args)
            raise KeyboardInterrupt

        setattr(mailbox, name, post_then_interrupt)
        batch = ([rows[0]], [40])
        if name == "try_post_tensors":
            batch = tuple(torch.tensor(v, device="cuda") for v in batch)
        with pytest.raises(KeyboardInterrupt):
            runner.replay(*batch)
        delattr(mailbox, name)
        assert mailbox.posted == 0, f"{name}: the post was not taken back"
    _next_replay_stages_its_own_batch(runner, pool, rows)


@gpu
def test_gpu_an_interrupt_after_the_launch_keeps_the_post(monkeypatch):
    """Ctrl-C lands as the replay range closes, after the graph was launched: the graph
    consumes its post, so the post must stay (withdrawing it would leave the device one post
    ahead, and the next replay would stage nothing)."""
    import pagegraph.graph.runner as runner_mod

    pool, runner, rows = _interrupt_bed(GraphRunner)
    real_pop = runner_mod.pop

    def pop_then_interrupt():
        name = real_pop()
        if name.startswith("replay/"):
            raise KeyboardInterrupt
        return name

    monkeypatch.setattr(runner_mod, "pop", pop_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        runner.replay([rows[0]], [40])
    monkeypatch.setattr(runner_mod, "pop", real_pop)
    assert runner._mailbox.posted == 1
    torch.cuda.synchronize()
    assert runner._mailbox.consumed.item() == 1  # the launched graph took it
    _next_replay_stages_its_own_batch(runner, pool, rows)


@gpu
def test_gpu_a_graph_replayed_directly_rebuilds_the_last_batch():
    """``runner.graphs[b].replay()`` (no post for it) stages nothing: it rebuilds from the
    static inputs as they are, and the next ``runner.replay()`` stages its own batch."""
    pool, runner = make(max_bs=16, ctx=2048, ps=16, buckets=[4, 8, 16])
    runner.capture()
    rows = [pool.alloc(n) for n in (30, 700, 1500, 64, 2000)]
    pool.flush()
    first, second = pool.batch(rows[:3]), pool.batch(rows[2:])
    runner.replay(*first)
    staged = (runner.req_pool_indices.clone(), runner.seq_lens.clone())
    runner.page_table.fill_(POISON)
    runner.graphs[4].replay()
    assert torch.equal(runner.req_pool_indices, staged[0])
    assert torch.equal(runner.seq_lens, staged[1])
    stale = runner.req_pool_indices.cpu().clone()
    check_replay(runner, pool, *first, 4, stale)
    runner.page_table.fill_(POISON)
    runner.replay(*second)
    check_replay(runner, pool, *second, 4, stale)
    runner.close()


@gpu
def test_gpu_device_tensors_of_other_dtypes_are_refused_before_any_launch():
    pool, runner = make(max_bs=8, ctx=512, ps=16, buckets=[8])
    runner.capture()
    before = runner.seq_lens.clone()
    with pytest.raises(TypeError, match="int32 or int64"):
        runner.replay(
            torch.zeros(2, dtype=torch.int64, device="cuda"),
            torch.ones(2, dtype=torch.float32, device="cuda"),
        )
    assert torch.equal(runner.seq_lens, before)
    runner.replay([1, 2], [3, 4])  # posts and launches are still in step
    assert runner.seq_lens[:2].tolist() == [3, 4]
    runner.close()


@gpu
def test_gpu_device_tensors_take_the_short_path_and_fall_back_exactly(monkeypatch):
    """Two 1-D int32/int64 device tensors (strided too) take ``replay()``'s short path (never
    ``_replay``) and are posted by address in one write (never field by field, through
    ``Mailbox.post_each``), with exact tables. Tensors of one shape that cannot be posted so
    (a host tensor next to a device one) take the short path to ``Mailbox.post_each``, which
    converts them; an empty,
    oversized or mismatched batch goes the general way, to the general path's errors."""
    from pagegraph.graph.staging import Mailbox

    pool, runner = make(max_bs=16, ctx=2048, ps=16, buckets=[4, 8, 16])
    runner.capture()
    rows = [pool.alloc(n) for n in (30, 700, 1500, 64, 2000, 5)]
    pool.flush()
    rpi, sl = pool.batch(rows)
    general_posts, general_replays = [], []
    real_post, real_replay = Mailbox.post_each, GraphRunner._replay
    monkeypatch.setattr(Mailbox, "post_each", lambda *a: (general_posts.append(1), real_post(*a)))
    monkeypatch.setattr(
        GraphRunner, "_replay", lambda *a: (general_replays.append(1), real_replay(*a))[1]
    )
    wide = torch.full((2 * len(rpi),), -9, dtype=torch.int32, device="cuda")
    wide[::2] = torch.tensor(rpi, dtype=torch.int32)
    batches = {
        "int32": (
            torch.tensor(rpi, dtype=torch.int32, device="cuda"),
            torch.tensor(sl, dtype=torch.int32, device="cuda"),
        ),
        "int64": (torch.tensor(rpi, device="cuda"), torch.tensor(sl, device="cuda")),
        "strided": (wide[::2], torch.tensor(sl, device="cuda")),
        "host-and-device": (torch.tensor(rpi), torch.tensor(sl, device="cuda")),
    }
    for kind, batch in batches.items():
        runner.page_table.fill_(POISON)
        stale = runner.req_pool_indices.cpu().clone()
        general_posts.clear()
        pt, _ = runner.replay(*batch)
        assert not general_replays, f"{kind}: the general path was taken"
        assert bool(general_posts) == (kind == "host-and-device"), kind
        assert pt.shape[0] == len(sl)
        check_replay(runner, pool, rpi, sl, 8, stale)
    empty = torch.zeros(0, dtype=torch.int32, device="cuda")
    over = torch.ones(17, dtype=torch.int32, device="cuda")
    for batch, error in [
        ((empty, empty), "at least 1"),
        ((over, over), "exceeds max_bs=16"),
        ((over[:2], over[:3]), "entries"),
    ]:
        general_replays.clear()
        with pytest.raises(ValueError, match=error):
            runner.replay(*batch)
        assert general_replays, f"{error}: the short path took a batch it cannot"
    assert runner._mailbox.posted == len(batches)
    runner.close()
