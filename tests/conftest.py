"""Test-suite set-up: pagegraph's pytest plugin, and hypothesis profiles.

Running from a source tree (``PYTHONPATH=src``) the plugin's entry point is not installed, so it
is registered here; installed, the entry point has registered it already.
"""

import os

import pytest
from hypothesis import settings

settings.register_profile("ci", deadline=None, derandomize=True)
settings.register_profile("gpu", deadline=None, max_examples=500)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture
def no_leaked_ranges():
    """Fails a test that leaves pagegraph NVTX ranges open (and closes them for the next)."""
    from pagegraph.detect import ranges

    yield
    leaked = ranges.range_stack()
    while ranges.range_stack():
        ranges.pop()
    assert leaked == (), f"test left ranges open: {leaked}"


def pytest_configure(config):
    if not config.pluginmanager.has_plugin("pagegraph.pytest_plugin"):
        import pagegraph.pytest_plugin as plugin

        config.pluginmanager.register(plugin, "pagegraph.pytest_plugin")


def pytest_collection_modifyitems(session, config, items):
    # torch.profiler (Kineto) holds CUPTI's one subscription for the rest of the process once
    # started, which would turn every CUPTI-detector test after it into a skip: run those
    # tests last. Before them, the heavy tests (child processes, compiles, long property runs:
    # 4 to 16 s each on the H200 host, most of the suite's time) come first, so that a parallel
    # run hands them out at its start and does not end waiting for one. The sort is stable:
    # a module's tests keep their order, and its module-scoped fixtures are made once.
    items.sort(
        key=lambda item: (
            item.get_closest_marker("torch_profiler") is not None,
            item.get_closest_marker("heavy") is None,
        )
    )


def pytest_sessionstart(session):
    # Under pytest-xdist with several GPUs, pin each worker to its own device, so "cuda" in a
    # test means that worker's GPU (make test starts at least one worker per visible GPU).
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if worker.startswith("gw"):
        import torch

        if torch.cuda.is_available() and torch.cuda.device_count() > 1:
            torch.cuda.set_device(int(worker[2:]) % torch.cuda.device_count())
