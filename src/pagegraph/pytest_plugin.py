"""pytest plugin (entry point ``pytest11``): a ``gpu`` marker, a runner fixture and
``assert_replay_safe`` for checking any page-table builder from another project's tests::

    from pagegraph.pytest_plugin import assert_replay_safe

    def test_my_builder_is_graph_safe():
        assert_replay_safe("my_pkg.kernels:build_block_table", max_bs=64,
                           max_context_len=32768, page_size=16, steps=200)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import pytest
import torch

if TYPE_CHECKING:
    from .check.config import CheckConfig
    from .check.reports.report import Report
    from .graph.runner import GraphRunner
    from .kinds.seams import Builder


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpu: needs a CUDA device (skipped cleanly without one)")


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("gpu") is not None and not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")


class ReplayUnsafe(AssertionError):
    """``assert_replay_safe`` failed; ``report`` is the checker's ``Report``."""

    def __init__(self, report: Report) -> None:
        super().__init__(f"builder is not replay-safe:\n{report.format()}")
        self.report = report

    def __str__(self) -> str:  # pytest prints this, once
        message: str = self.args[0]
        return message


def assert_replay_safe(
    builder: str | Builder,
    config: CheckConfig | None = None,
    *,
    isolate: bool = False,
    **shape: Any,
) -> Report:
    """Run ``pagegraph.check_replay_safety`` and raise ``AssertionError`` (a ``ReplayUnsafe``
    carrying the report as ``.report``) unless the verdict is SAFE, as
    ``torch.testing.assert_close`` does, so ``pytest.raises(AssertionError)`` works.
    ``shape`` overrides fields of ``CheckConfig`` (max_bs, max_context_len, page_size,
    buckets, padding, swa, steps, ...). ``isolate=True`` runs the check in a child process
    (``pagegraph.supervise.isolate``): a builder that crashes its process or its CUDA context is
    then reported UNSAFE instead of taking the test session down; the builder must be a name
    or an importable ``module:function``. Returns the report."""
    __tracebackhide__ = True  # a failure shows the report, not this function's source
    from .check.checker import check_replay_safety
    from .check.config import CheckConfig

    if isolate:
        from .supervise.isolate import Job, builder_spec, run_isolated

        cfg = (config or CheckConfig()).replace(**shape)
        (report,) = run_isolated([Job(builder_spec(builder), cfg)])
    else:
        report = check_replay_safety(builder, config, **shape)
    if not report.safe:
        raise ReplayUnsafe(report)
    return report


@pytest.fixture
def graph_runner() -> Iterator[Callable[..., GraphRunner]]:
    """A factory: ``graph_runner(builder=..., max_bs=..., max_context_len=..., page_size=...,
    swa=False, buckets=..., padding=..., seed=0)`` returns a captured ``GraphRunner`` over a
    fresh ``KVPool`` (``runner.pool_model``). Every runner made, captured or not, has its
    graphs released at teardown, also when the test failed or the capture raised."""
    from .graph.runner import GraphRunner
    from .runtime.device import pick_device
    from .workload.pool import KVPool

    made: list[GraphRunner] = []

    def make(
        *,
        max_bs: int,
        max_context_len: int,
        page_size: int,
        swa: bool = False,
        seed: int = 0,
        **kwargs: Any,
    ) -> GraphRunner:
        device = pick_device(None)
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
        vars(runner)["pool_model"] = pool  # the test's handle on the pool
        made.append(runner)  # before capture: a capture that raises is released too
        runner.capture()
        return runner

    try:
        yield make
    finally:
        errors: list[Exception] = []
        for runner in made:
            try:
                runner.close()
            except Exception as exc:  # noqa: BLE001 - release the others first
                errors.append(exc)
        made.clear()
        if torch.cuda.is_available():
            try:
                torch.cuda.synchronize()
                torch.cuda.empty_cache()
            except Exception as exc:  # noqa: BLE001
                errors.append(exc)
        if errors:
            raise errors[0]
