"""pytest-benchmark entry: host wall time of the eager builders and of one
``GraphRunner.replay()``, each checked exactly once (``pagegraph.bench.pytest_bench`` says
what is timed and how).

Run with ``make bench`` (``pytest benchmarks --benchmark-only``); needs a GPU.
"""

from __future__ import annotations

import pytest

from pagegraph import bench

pytestmark = [pytest.mark.bench, pytest.mark.gpu]


@pytest.fixture(scope="module")
def inputs():
    cache = bench.InputCache()
    yield cache.get
    cache.close()


@pytest.mark.parametrize("builder", bench.PYTEST_EAGER_BUILDERS)
@pytest.mark.parametrize("config", bench.PYTEST_CONFIGS)
def test_eager(benchmark, inputs, config, builder):
    bench.time_eager(benchmark, *inputs(config), builder)


def test_replay_decode_large(benchmark, inputs):
    bench.time_replay(benchmark, *inputs(bench.PYTEST_REPLAY_CONFIG))
