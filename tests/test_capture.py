"""Invariant: ``capture_buckets`` never lets Python's cyclic collector run inside a CUDA
capture. A dead cycle that holds a CUDA graph is collected before the captures begin, the
collector stays off while they run and is back on afterwards, however the body ended:
destroying a graph while a stream captures invalidates the capture."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

from pagegraph.graph.capture import capture_buckets, no_collection


class _Cycle:
    """An object in a reference cycle with itself: only the cyclic collector frees it."""

    def __init__(self, held: object = None) -> None:
        self.me = self
        self.held = held


def _dead_cycle(held: object = None) -> weakref.ref:
    return weakref.ref(_Cycle(held))


def test_a_dead_cycle_is_collected_before_the_body_and_none_during_it():
    was_on = gc.isenabled()
    gone = _dead_cycle()
    seen = {}
    with no_collection():
        seen["at entry"] = gone() is None
        seen["collector on"] = gc.isenabled()
        during = _dead_cycle()
        for _ in range(20_000):  # many allocations: enough to trigger a collection when on
            [object()]
        seen["collected during"] = during() is None
    assert seen == {"at entry": True, "collector on": False, "collected during": False}
    assert gc.isenabled() == was_on
    gc.collect()
    assert during() is None


def test_the_collector_comes_back_after_a_body_that_raised_and_stays_off_if_it_was():
    with pytest.raises(ValueError), no_collection():
        raise ValueError("the body raised")
    assert gc.isenabled()
    gc.disable()
    try:
        with no_collection():
            pass
        assert not gc.isenabled(), "a collector the caller turned off stays off"
    finally:
        gc.enable()


def test_an_emulated_or_eager_capture_runs_the_body_once_a_bucket():
    calls: list[tuple[str, int]] = []
    for mode in ("emulated", "eager"):
        graphs, pool = capture_buckets(
            [4, 2],
            warm_up=lambda bs: calls.append(("warm-up", bs)),
            body=lambda bs: calls.append(("body", bs)),
            mode=mode,
            device=torch.device("cpu"),
        )
        assert sorted(graphs) == ([2, 4] if mode == "emulated" else []) and pool is None
    assert calls == [("warm-up", 4), ("warm-up", 2), ("body", 4), ("body", 2)] + [
        ("warm-up", 4),
        ("warm-up", 2),
    ]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="a real stream capture needs CUDA")
def test_gpu_a_dead_cycle_holding_a_graph_does_not_break_the_next_capture():
    """A captured graph left in a dead cycle (as an exception's traceback leaves one), then
    a capture whose body allocates enough to trigger the collector: the capture holds, and
    the old graph was freed before it began."""
    x = torch.zeros(1024, device="cuda")
    old = torch.cuda.CUDAGraph()
    with torch.cuda.graph(old):
        x.add_(1)
    gone = _dead_cycle(old)
    del old

    def body(bs: int) -> None:
        for _ in range(20_000):
            [object()]
        x[:bs].mul_(2)

    graphs, _ = capture_buckets(
        [8, 4], warm_up=body, body=body, mode="cuda", device=torch.device("cuda")
    )
    assert gone() is None
    x.fill_(1)
    graphs[8].replay()
    torch.cuda.synchronize()
    assert x[:8].tolist() == [2.0] * 8 and x[8:].eq(1).all()
