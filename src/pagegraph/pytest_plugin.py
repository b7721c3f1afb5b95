"""pytest plugin (entry point ``pytest11``): a ``gpu`` marker, a runner fixture and
``assert_replay_safe`` for checking any page-table builder from another project's tests.

Example::

    from pagegraph.pytest_plugin import assert_replay_safe

    @pytest.mark.gpu
    def test_my_builder_is_graph_safe():
        assert_replay_safe("my_pkg.kernels:build_block_table", max_bs=64,
                           max_context_len=32768, page_size=16, steps=200)
"""

from __future__ import annotations

import pytest
import torch


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA device (skipped cleanly without one)")


def pytest_runtest_setup(item):
    if item.get_closest_marker("gpu") is not None and not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")


def assert_replay_safe(builder, config=None, **shape):
    """Run ``pagegraph.check_replay_safety`` and fail with its report unless every property
    holds. ``shape`` overrides fields of ``CheckConfig`` (max_bs, max_context_len, page_size,
    buckets, padding, swa, steps, ...). Returns the report."""
    from .checker import check_replay_safety

    report = check_replay_safety(builder, config, **shape)
    if not report.safe:
        pytest.fail(f"builder is not replay-safe:\n{report.format()}", pytrace=False)
    return report


@pytest.fixture
def graph_runner():
    """A factory: ``graph_runner(builder=..., max_bs=..., max_context_len=..., page_size=...,
    swa=False, buckets=..., padding=..., seed=0)`` returns a captured ``GraphRunner`` over a
    fresh ``KVPool`` (``runner.pool_model``); graphs are released at teardown."""
    from .pool import KVPool
    from .runner import GraphRunner

    made = []

    def make(*, max_bs, max_context_len, page_size, swa=False, seed=0, **kwargs):
        device = "cuda" if torch.cuda.is_available() else "cpu"
        pool = KVPool(
            max_reqs=max_bs + 1,
            max_context_len=max_context_len,
            page_size=page_size,
            swa=swa,
            device=device,
            seed=seed,
        )
        runner = GraphRunner(
            pool.req_to_token,
            max_bs=max_bs,
            max_context_len=max_context_len,
            page_size=page_size,
            full_to_swa=pool.full_to_swa,
            **kwargs,
        )
        runner.pool_model = pool
        runner.capture()
        made.append(runner)
        return runner

    yield make
    for runner in made:
        runner.close()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
