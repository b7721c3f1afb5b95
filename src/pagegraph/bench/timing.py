"""How the bench takes its times: device time inside a CUDA graph, host wall time per call.

``device_time_us`` captures ``N`` calls in one graph and takes the median of event-timed
replays over ``N``, a spin kernel keeping the GPU busy while they are queued; ``wall_time_us``
is the median host time of one call, the queue drained now and then outside the timed region.
Also here: ``Settings``, ``bench_environment``, and the helpers every failed measurement uses,
``error`` (a one-line description) and ``recover`` (so one failed row does not poison the next).
"""

from __future__ import annotations

import statistics
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import torch

from ..jobs.environment import environment

_K = TypeVar("_K")

#: Builds per captured graph, and replays of it, for the device time.
GRAPH_BUILDS = 20
GRAPH_REPLAYS = 50
#: Timed calls of an eager build, and of a ``GraphRunner.replay()``.
EAGER_CALLS = 200
REPLAY_CALLS = 200
#: The queue is drained (outside the timed region) every this many timed calls.
SYNC_EVERY = 50


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
    """``pagegraph.jobs.environment.environment()`` plus what the bench reports of the device:
    ``cuda_available``, ``sm_count`` and ``l2_bytes`` (``None`` without CUDA)."""
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


def sync(cuda: bool) -> None:
    """Wait for the device (nothing to wait for without CUDA)."""
    if cuda:
        torch.cuda.synchronize()


def keep_gpu_busy(seconds: float) -> None:
    """Queue a spin kernel so that work queued behind it starts back to back."""
    sleep = getattr(torch.cuda, "_sleep", None)
    if sleep is None:
        return
    try:
        sleep(int(seconds * 2e9))  # ~2 GHz SM clock: an estimate is enough
    except Exception:  # noqa: BLE001 - timing still works, only less tightly
        pass


def capture(
    fn: Callable[[], object], builds: int, reset: Callable[[], None] | None = None
) -> torch.cuda.CUDAGraph:
    """Warm ``fn`` up on a side stream, then capture ``builds`` calls of it in one graph
    (``reset`` runs just before the capture)."""
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    if reset is not None:
        reset()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(builds):
            fn()
    torch.cuda.synchronize()
    return graph


def time_graph(graph: torch.cuda.CUDAGraph, replays: int) -> float:
    """Median milliseconds of one replay, event-timed, replays queued behind a spin."""
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    events = [
        (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
        for _ in range(replays)
    ]
    keep_gpu_busy(replays * 50e-6 + 1e-3)
    for start, end in events:
        start.record()
        graph.replay()
        end.record()
    torch.cuda.synchronize()
    ms: float = statistics.median(start.elapsed_time(end) for start, end in events)
    return ms


def device_time_us(
    fn: Callable[[], object],
    builds: int = GRAPH_BUILDS,
    replays: int = GRAPH_REPLAYS,
    reset: Callable[[], None] | None = None,
) -> tuple[float, torch.cuda.CUDAGraph]:
    """Device microseconds per call of ``fn``: a graph of ``builds`` calls, median of
    ``replays`` replays, divided by ``builds``. Returns the graph too (caller deletes it)."""
    graph = capture(fn, builds, reset)
    ms = time_graph(graph, replays)
    return ms * 1e3 / builds, graph


def wall_times_ns(
    fn: Callable[[], object],
    calls: int,
    warmup: int = 10,
    cuda: bool = True,
    sync_every: int = SYNC_EVERY,
) -> list[int]:
    """Host nanoseconds of each of ``calls`` timed calls of ``fn``, after ``warmup`` untimed
    ones. Every ``sync_every`` calls the queue is drained, outside the timed region."""
    for _ in range(warmup):
        fn()
    sync(cuda)
    times = []
    for i in range(calls):
        if i and i % sync_every == 0:
            sync(cuda)
        t0 = time.perf_counter_ns()
        fn()
        times.append(time.perf_counter_ns() - t0)
    sync(cuda)
    return times


def wall_time_us(
    fn: Callable[[], object],
    calls: int = EAGER_CALLS,
    warmup: int = 10,
    cuda: bool = True,
    sync_every: int = SYNC_EVERY,
) -> float:
    """Median host microseconds of one call (``wall_times_ns``)."""
    return statistics.median(wall_times_ns(fn, calls, warmup, cuda, sync_every)) / 1e3


def interleaved_wall_us(
    fns: dict[_K, Callable[[], object]],
    calls: int,
    *,
    round_calls: int = SYNC_EVERY,
    warmup: int = 20,
    cuda: bool = True,
    per_round: dict[_K, list[float]] | None = None,
) -> dict[_K, float]:
    """Median host microseconds per call of each of ``fns`` (by key), ``calls`` timed calls each,
    taken in alternating rounds of ``round_calls`` calls (``fns`` in order, round after
    round). Each round starts after a drained queue, outside the timed region. With
    ``per_round`` (a dict), ``per_round[key]`` gets each round's median microseconds, in round
    order: the pairs a ratio between two of ``fns`` can be taken over (``paired_ratio``)."""
    for fn in fns.values():  # warm every path up before any timing
        for _ in range(warmup):
            fn()
    sync(cuda)
    times: dict[_K, list[int]] = {name: [] for name in fns}
    rounds = max(1, -(-calls // round_calls))
    for r in range(rounds):
        n = min(round_calls, calls - r * round_calls)
        if n <= 0:
            break
        for name, fn in fns.items():
            ts = wall_times_ns(fn, n, warmup=0, cuda=cuda, sync_every=n + 1)
            times[name] += ts
            if per_round is not None:
                per_round.setdefault(name, []).append(statistics.median(ts) / 1e3)
    return {name: statistics.median(ts) / 1e3 for name, ts in times.items()}


def paired_ratio(a_rounds: list[float] | None, b_rounds: list[float] | None) -> float | None:
    """The median over rounds of ``a / b`` within each round (``interleaved_wall_us``'s
    ``per_round`` lists of two of its functions): a drift of the host's speed from round to
    round moves both sides of a pair, so it cancels, where a ratio of two overall medians
    keeps it. ``None`` without two equally long lists of positive times."""
    if not a_rounds or not b_rounds or len(a_rounds) != len(b_rounds):
        return None
    if min(b_rounds) <= 0:
        return None
    ratio: float = statistics.median(a / b for a, b in zip(a_rounds, b_rounds))
    return ratio


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
