"""What one bench run measures with, and how its rows fail.

``make_settings`` gives the run's counts (graph calls and replays for device times, timed calls
for host times; fewer with ``--quick``, three eager calls under the interpreter), and
``bench_environment`` the machine a row records; the times themselves are taken by
``pagegraph.runtime.timing``. Every failed measurement goes through ``error`` (a one-line
description) and ``recover`` (so one failed row does not poison the next).
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..runtime.environment import environment
from ..runtime.timing import EAGER_CALLS, GRAPH_BUILDS, GRAPH_REPLAYS

#: Timed calls of a ``GraphRunner.replay()``.
REPLAY_CALLS = 200


@dataclass
class Settings:
    """What one run measures with: ``cuda`` (False: the interpreter smoke run), graph
    ``builds`` and ``replays`` for device times, timed calls for wall times, the measured
    device-to-device ``bandwidth`` in bytes/s (None: not measured) and the L2 size."""

    cuda: bool
    builds: int
    replays: int
    eager_calls: int
    replay_calls: int
    bandwidth: float | None
    l2_bytes: int


def bench_environment(cuda: bool) -> dict[str, Any]:
    """``pagegraph.runtime.environment.environment()`` plus what the bench reports of the
    device: ``cuda_available``, ``sm_count`` and ``l2_bytes`` (``None`` without CUDA)."""
    env = environment()
    env["cuda_available"] = cuda
    env["sm_count"] = None
    env["l2_bytes"] = None
    if cuda:
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        env["sm_count"] = getattr(props, "multi_processor_count", None)
        env["l2_bytes"] = getattr(props, "L2_cache_size", None)
    return env


def make_settings(cuda: bool, quick: bool, l2_bytes: int) -> Settings:
    """The run's settings: the interpreter's (3 eager calls, nothing on a device), ``quick``
    (fewer replays and calls) or the full counts. ``bandwidth`` is filled in once measured."""
    if not cuda:
        return Settings(False, 0, 0, 3, 0, None, l2_bytes)
    if quick:
        return Settings(True, GRAPH_BUILDS, 20, 50, 50, None, l2_bytes)
    return Settings(True, GRAPH_BUILDS, GRAPH_REPLAYS, EAGER_CALLS, REPLAY_CALLS, None, l2_bytes)


def error(exc: BaseException) -> str:
    """``Type: message at file:line`` of the innermost frame, at most ~500 characters."""
    where = traceback.extract_tb(exc.__traceback__)
    loc = f" at {Path(where[-1].filename).name}:{where[-1].lineno}" if where else ""
    return f"{type(exc).__name__}: {exc}"[:500] + loc


def recover(cuda: bool) -> None:
    """Drain the device and release cached memory after a measurement (or a failed one)."""
    if not cuda:
        return
    try:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    except Exception:  # noqa: BLE001 - a poisoned context: later rows will say so
        pass
