"""pytest-benchmark timings of the eager builders and of one ``GraphRunner.replay()``.

Invariant guarded: every timed call is also checked exactly against ``expected_tables`` once,
so a fast but wrong builder cannot post a number. What is timed is host wall time of one call
with an empty queue (the GPU is synchronised before each round, outside the timed region);
device times per build come from ``pagegraph bench`` (CUDA-graph replays), not from here.

Run with ``make bench`` (``pytest benchmarks --benchmark-only``); needs a GPU.
"""

from __future__ import annotations

import pytest
import torch

from pagegraph import bench

CONFIGS = ("decode-small", "decode-large", "long-1m")
EAGER_BUILDERS = ("build_page_table", "static_width_gather")
ROUNDS = 200

pytestmark = [pytest.mark.bench, pytest.mark.gpu]


@pytest.fixture(scope="module")
def inputs():
    made: dict[str, tuple] = {}

    def get(name: str):
        if name not in made:
            inp = bench.make_inputs(bench.get_config(name), "cuda")
            made[name] = (inp, bench.Check(inp))
        return made[name]

    yield get
    made.clear()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


@pytest.mark.parametrize("builder", EAGER_BUILDERS)
@pytest.mark.parametrize("config", CONFIGS)
def test_eager(benchmark, inputs, config, builder):
    inp, check = inputs(config)
    fn = bench.BUILDERS[builder]
    page_table, swa_page_table, kwargs = bench.make_outputs(inp)
    args = (inp.req_to_token, inp.req_pool_indices, inp.seq_lens, page_table, inp.config.page_size)
    benchmark.extra_info.update(config=config, builder=builder, gpu=torch.cuda.get_device_name())
    benchmark.pedantic(
        fn,
        args=args,
        kwargs=kwargs,
        setup=torch.cuda.synchronize,
        rounds=ROUNDS,
        warmup_rounds=10,
    )
    bench.poison(page_table, swa_page_table)
    fn(*args, **kwargs)
    torch.cuda.synchronize()
    mismatch = check.compare(page_table, swa_page_table)
    assert mismatch is None, f"{builder} on {config}: {mismatch}"


def test_replay_decode_large(benchmark, inputs):
    inp, check = inputs("decode-large")
    cfg = inp.config
    runner = bench.single_bucket_runner(inp)
    try:
        runner.capture()
        benchmark.extra_info.update(config=cfg.name, gpu=torch.cuda.get_device_name())
        benchmark.pedantic(
            runner.replay,
            args=(inp.req_pool_indices, inp.seq_lens),
            setup=torch.cuda.synchronize,
            rounds=ROUNDS,
            warmup_rounds=10,
        )
        bench.poison(runner.page_table, runner.swa_page_table)
        page_table, swa = runner.replay(inp.req_pool_indices, inp.seq_lens)
        torch.cuda.synchronize()
        mismatch = check.compare(page_table, swa)
        assert mismatch is None, f"GraphRunner.replay on decode-large: {mismatch}"
    finally:
        runner.close()
