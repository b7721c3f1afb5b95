"""How pagegraph takes its times: device time inside CUDA graphs, host wall time per call.

Device time: a graph of ``N`` back-to-back calls (``capture``) is replayed behind a spin
kernel that keeps the GPU busy while the host queues the replays, each replay between two
CUDA events (``EventClock``), ``WARMUP_REPLAYS`` untimed replays first; the median replay over
``N`` is the time of one call (``per_call_us``). ``time_interleaved`` does so for several
graphs replayed in turns (a drift of the clocks moves each alike), on ``EventClock`` or, for
bodies run eagerly without CUDA, on ``HostClock``; ``device_time_us`` captures and times one
callable. Host time: ``wall_time_us`` is the median host time of one call, the queue drained
now and then outside the timed region; ``interleaved_wall_us`` times several in alternating
rounds, and ``paired_ratio`` takes their ratio round by round.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol, TypeVar

import torch

_K = TypeVar("_K")
_M = TypeVar("_M")

#: Calls per captured graph, and timed replays of it, for a device time.
GRAPH_BUILDS = 20
GRAPH_REPLAYS = 50
#: Untimed replays of a graph before the timed ones (first touch, clock ramp).
WARMUP_REPLAYS = 3
#: Timed calls of a host-timed callable.
EAGER_CALLS = 200
#: The queue is drained (outside the timed region) every this many timed calls.
SYNC_EVERY = 50


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


def per_call_us(replay_ms: Sequence[float], calls: int) -> float:
    """Microseconds per call: the median of ``replay_ms`` (replays of a graph of ``calls``
    back-to-back calls, in ms) over ``calls``."""
    if not replay_ms or calls < 1:
        raise ValueError("per_call_us needs at least one replay time and calls >= 1")
    return statistics.median(replay_ms) * 1e3 / calls


class Clock(Protocol[_M]):
    """What ``time_interleaved`` times with: ``begin`` before the replays, a ``mark`` before
    and after each, ``end`` after them all, then ``elapsed_ms`` between two marks
    (``EventClock``, ``HostClock``)."""

    def begin(self, replays: int) -> None:
        """Before ``replays`` timed replays are queued."""

    def mark(self) -> _M:
        """A point in time, taken where the replays are queued."""

    def end(self) -> None:
        """After the last replay: every mark can be read."""

    def elapsed_ms(self, a: _M, b: _M, /) -> float:
        """Milliseconds from mark ``a`` to mark ``b``."""


class EventClock:
    """Device time on the current stream of ``device`` (default: the current device): CUDA
    events, the replays queued behind a spin kernel so that the host's launch gaps do not
    reach the device's timeline."""

    def __init__(self, device: torch.device | None = None) -> None:
        self.device = device

    def begin(self, replays: int) -> None:
        torch.cuda.synchronize(self.device)
        # Long enough for the host to queue every replay.
        keep_gpu_busy(1e-3 + 50e-6 * replays)

    def mark(self) -> torch.cuda.Event:
        """A CUDA event recorded on the current stream (timed)."""
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def end(self) -> None:
        torch.cuda.synchronize(self.device)

    @staticmethod
    def elapsed_ms(a: torch.cuda.Event, b: torch.cuda.Event) -> float:
        """Device milliseconds between the two events (both completed: after ``end``)."""
        ms: float = a.elapsed_time(b)
        return ms


class HostClock:
    """Host wall time (``time.perf_counter``): ``EventClock``'s interface for eager bodies."""

    def begin(self, replays: int) -> None:
        pass

    def mark(self) -> float:
        return time.perf_counter()

    def end(self) -> None:
        pass

    @staticmethod
    def elapsed_ms(a: float, b: float) -> float:
        return (b - a) * 1e3


def time_interleaved(
    launch: Mapping[_K, Callable[[], object]],
    calls: int,
    repeats: int,
    clock: Clock[_M],
    warmup: int = WARMUP_REPLAYS,
) -> dict[_K, float]:
    """Microseconds per call of each of ``launch`` (by key), each a replay of ``calls``
    back-to-back calls: ``warmup`` untimed replays each, then ``repeats`` rounds that time
    one replay of each in turn (a drift of the clocks moves every part alike), the median
    replay over ``calls`` (``per_call_us``)."""
    if repeats < 1:
        raise ValueError("time_interleaved needs repeats >= 1")
    for fn in launch.values():
        for _ in range(warmup):
            fn()
    clock.begin(repeats * len(launch))
    marks: dict[_K, list[tuple[_M, _M]]] = {name: [] for name in launch}
    for _ in range(repeats):
        for name, fn in launch.items():
            start = clock.mark()
            fn()
            marks[name].append((start, clock.mark()))
    clock.end()
    return {
        name: per_call_us([clock.elapsed_ms(a, b) for a, b in pairs], calls)
        for name, pairs in marks.items()
    }


def device_time_us(
    fn: Callable[[], object],
    builds: int = GRAPH_BUILDS,
    replays: int = GRAPH_REPLAYS,
    reset: Callable[[], None] | None = None,
) -> tuple[float, torch.cuda.CUDAGraph]:
    """Device microseconds per call of ``fn``: a graph of ``builds`` calls (``capture``), the
    median of ``replays`` event-timed replays over ``builds`` (``time_interleaved`` on an
    ``EventClock``). Returns the graph too (the caller deletes it)."""
    graph = capture(fn, builds, reset)
    us = time_interleaved({"graph": graph.replay}, builds, replays, EventClock())["graph"]
    return us, graph


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
