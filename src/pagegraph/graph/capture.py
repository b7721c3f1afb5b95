"""Capturing one graph per batch bucket: the one capture path of the runner and of the decode
step's graphs (``pagegraph.graph.step_graphs``).

``capture_buckets`` warms a body up for every bucket, then captures it once per bucket in the
order given (largest first: later, smaller graphs fit in the memory the first one reserved),
all graphs in one memory pool:

* ``"cuda"``: the warm-up on a side stream (a Triton kernel's first launch loads its module,
  which is illegal inside a capture), then ``torch.cuda.CUDAGraph`` captures, with Python's
  cyclic garbage collected first and the collector off until they end (``no_collection``);
* ``"emulated"``: the warm-up, then one ``pagegraph.graph.emulate.EmulatedGraph`` a bucket,
  which records the body's operations and replays them without calling it again;
* ``"eager"``: the warm-up only (replays call the body again).
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeAlias

import torch

from ..detect.ranges import phase
from .emulate import EmulatedGraph

if TYPE_CHECKING:
    from torch.cuda import _POOL_HANDLE

    #: A CUDA graph memory pool: what ``torch.cuda.graph_pool_handle()`` returns (torch has
    #: no public name for its type).
    GraphPool: TypeAlias = _POOL_HANDLE

#: Values of ``capture_buckets``' ``mode``.
CAPTURE_MODES = ("cuda", "emulated", "eager")

#: A bucket's captured graph: a CUDA graph, or (without CUDA) its emulation.
Graph: TypeAlias = torch.cuda.CUDAGraph | EmulatedGraph


@contextlib.contextmanager
def no_collection() -> Iterator[None]:
    """Collect Python's cyclic garbage now, then keep the collector off for the body. A dead
    cycle that holds a CUDA graph (an exception's traceback, an engine's objects) would
    otherwise be collected when allocations inside a capture trigger it: destroying a graph
    is illegal while a stream captures, and it invalidates the capture."""
    gc.collect()
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()


@dataclass
class CaptureStep:
    """Where ``capture_buckets`` is, kept up to date for an out-of-memory message: ``what``
    (``"warm-up"`` or ``"capture"``) of which ``bucket``."""

    what: str
    bucket: int


def capture_buckets(
    sizes: Sequence[int],
    *,
    warm_up: Callable[[int], None],
    body: Callable[[int], None],
    mode: str,
    device: torch.device,
    pool: GraphPool | None = None,
    step: CaptureStep | None = None,
    ranges: bool = True,
) -> tuple[dict[int, Graph], GraphPool | None]:
    """Warm ``warm_up(bs)`` up for each of ``sizes``, then capture ``body(bs)`` into one
    graph per size (see the module docstring); returns ``(graphs by size, pool)`` (the pool
    is ``None`` unless ``mode`` is ``"cuda"`` or one was given).

    ``pool``: the CUDA memory pool to share (default a new one). ``step``: kept up to date
    (``"warm-up"`` or ``"capture"``, and the bucket), for an out-of-memory message.
    ``ranges``: each call inside a ``warmup/bs=N`` or ``capture/bs=N`` NVTX range.
    """
    if mode not in CAPTURE_MODES:
        raise ValueError(f"mode must be one of {CAPTURE_MODES}, got {mode!r}")
    step = step if step is not None else CaptureStep("warm-up", sizes[0])
    graphs: dict[int, Graph] = {}

    def ranged(name: str, bs: int) -> contextlib.AbstractContextManager[object]:
        return phase(name, bs) if ranges else contextlib.nullcontext()

    if mode == "cuda":
        with torch.cuda.device(device):
            current = torch.cuda.current_stream()
            side = torch.cuda.Stream()
            side.wait_stream(current)
            with torch.cuda.stream(side):
                for bs in sizes:
                    step.bucket = bs
                    with ranged("warmup", bs):
                        warm_up(bs)
            current.wait_stream(side)
            torch.cuda.synchronize()
            pool = pool or torch.cuda.graph_pool_handle()
            step.what = "capture"
            with no_collection():
                for bs in sizes:
                    step.bucket = bs
                    graph = torch.cuda.CUDAGraph()
                    with ranged("capture", bs), torch.cuda.graph(graph, pool=pool):
                        body(bs)
                    graphs[bs] = graph
            torch.cuda.synchronize()
        return graphs, pool
    for bs in sizes:
        step.bucket = bs
        with ranged("warmup", bs):
            warm_up(bs)
    if mode == "emulated":
        step.what = "capture"
        for bs in sizes:
            step.bucket = bs
            emulated = graphs[bs] = EmulatedGraph()
            with ranged("capture", bs), emulated.capture():
                body(bs)
    return graphs, pool
