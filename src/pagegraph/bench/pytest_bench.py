"""pytest-benchmark timings of the eager builders and of one ``GraphRunner.replay()``, run by
``benchmarks/test_bench.py`` (``make bench``). Needs a GPU.

Every timed call is also checked exactly against ``expected_tables`` once, so a fast but wrong
builder cannot post a number. What is timed is host wall time of one call with an empty queue
(the GPU synchronised before each, outside the timed region); device times come from
``pagegraph bench``. ``benchmark`` below is pytest-benchmark's fixture.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .configs import get_config
from .inputs import BenchInputs, Check, make_inputs, make_outputs, poison
from .rows import BUILDERS, single_bucket_runner

#: What the pytest entry times: ``time_eager`` on each config and eager builder, ``time_replay``
#: on ``PYTEST_REPLAY_CONFIG``.
PYTEST_CONFIGS = ("decode-small", "decode-large", "long-1m")
PYTEST_EAGER_BUILDERS = ("build_page_table", "static_width_gather")
PYTEST_REPLAY_CONFIG = "decode-large"
#: Timed calls per benchmark, after ``PYTEST_WARMUP_ROUNDS`` untimed ones.
PYTEST_ROUNDS = 200
PYTEST_WARMUP_ROUNDS = 10


class InputCache:
    """Inputs and their exactness check per config name, made on the first ``get``."""

    def __init__(self) -> None:
        self._made: dict[str, tuple[BenchInputs, Check]] = {}

    def get(self, name: str) -> tuple[BenchInputs, Check]:
        if name not in self._made:
            inp = make_inputs(get_config(name), "cuda")
            self._made[name] = (inp, Check(inp))
        return self._made[name]

    def close(self) -> None:
        """Drop the inputs and give their device memory back."""
        self._made.clear()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
            torch.cuda.empty_cache()


def _pedantic(
    benchmark: Any,
    fn: Callable[..., object],
    args: tuple[Any, ...],
    kwargs: dict[str, Any] | None = None,
) -> None:
    benchmark.pedantic(
        fn,
        args=args,
        kwargs=kwargs,
        setup=torch.cuda.synchronize,
        rounds=PYTEST_ROUNDS,
        warmup_rounds=PYTEST_WARMUP_ROUNDS,
    )


def _require_exact(
    check: Check, page_table: torch.Tensor, swa_page_table: torch.Tensor | None, what: str
) -> None:
    mismatch = check.compare(page_table, swa_page_table)
    if mismatch is not None:
        raise AssertionError(f"{what}: {mismatch}")


def time_eager(benchmark: Any, inp: BenchInputs, check: Check, builder: str) -> None:
    """Time one eager call of ``builder`` on ``inp``, then check one call's output exactly
    (``AssertionError`` when it differs)."""
    fn = BUILDERS[builder]
    page_table, swa_page_table, kwargs = make_outputs(inp)
    args = (inp.req_to_token, inp.req_pool_indices, inp.seq_lens, page_table, inp.config.page_size)
    benchmark.extra_info.update(
        config=inp.config.name, builder=builder, gpu=torch.cuda.get_device_name()
    )
    _pedantic(benchmark, fn, args, kwargs)
    poison(page_table, swa_page_table)
    fn(*args, **kwargs)
    torch.cuda.synchronize()
    _require_exact(check, page_table, swa_page_table, f"{builder} on {inp.config.name}")


def time_replay(benchmark: Any, inp: BenchInputs, check: Check) -> None:
    """Time one ``GraphRunner.replay()`` of ``inp``'s batch (one bucket, captured), then
    check one replay's output exactly (``AssertionError`` when it differs)."""
    cfg = inp.config
    runner = single_bucket_runner(inp)
    try:
        runner.capture()
        benchmark.extra_info.update(config=cfg.name, gpu=torch.cuda.get_device_name())
        _pedantic(benchmark, runner.replay, (inp.req_pool_indices, inp.seq_lens))
        poison(runner.page_table, runner.swa_page_table)
        page_table, swa = runner.replay(inp.req_pool_indices, inp.seq_lens)
        torch.cuda.synchronize()
        _require_exact(check, page_table, swa, f"GraphRunner.replay on {cfg.name}")
    finally:
        runner.close()
