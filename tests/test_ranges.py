"""Invariant: a pagegraph range is closed on the thread that opened it, innermost first, even
when its body raises, and ``current_range()`` names the innermost open one: that name is what
the sync detectors report and what Nsight shows, so the two must agree."""

import threading

import pytest
import torch

from pagegraph.detect import ranges


@pytest.fixture(autouse=True)
def _empty_stack():
    assert ranges.range_stack() == (), "a previous test leaked an open range"
    yield
    ranges.set_record_function(False)
    leaked = ranges.range_stack()
    while ranges.range_stack():
        ranges.pop()
    assert leaked == (), f"test left ranges open: {leaked}"


class FakeDomain:
    """Stands in for an NVTX domain with a tool attached: records what is pushed."""

    def __init__(self):
        self.created = []
        self.pushed = []
        self.popped = 0

    def get_event_attributes(self, message=None, color=None):
        self.created.append((message, color))
        return (message, color)

    def push_range(self, attributes):
        self.pushed.append(attributes)

    def pop_range(self):
        self.popped += 1


@pytest.fixture
def fake_domain(monkeypatch):
    domain = FakeDomain()
    monkeypatch.setattr(ranges, "_domain", domain)
    monkeypatch.setattr(ranges, "_attributes", {})
    return domain


def test_names_and_nesting():
    assert ranges.current_range() is None
    with ranges.phase("capture", bs=16) as outer:
        assert outer == "capture/bs=16"
        with ranges.phase("replay", bs=8) as inner:
            assert inner == "replay/bs=8"
            assert ranges.current_range() == "replay/bs=8"
            assert ranges.range_stack() == ("capture/bs=16", "replay/bs=8")
        assert ranges.current_range() == "capture/bs=16"
        with ranges.phase("verify"):
            assert ranges.current_range() == "verify"
    assert ranges.current_range() is None
    assert ranges.range_stack() == ()


def test_bs_zero_is_kept_in_the_name():
    assert ranges.range_name("replay", 0) == "replay/bs=0"
    assert ranges.range_name("replay") == "replay"


def test_push_pop():
    assert ranges.push("stage", bs=4) == "stage/bs=4"
    assert ranges.push("verify") == "verify"
    assert ranges.range_stack() == ("stage/bs=4", "verify")
    assert ranges.pop() == "verify"
    assert ranges.pop() == "stage/bs=4"
    with pytest.raises(RuntimeError, match="without a matching push"):
        ranges.pop()


def test_exception_pops_the_range_and_tags_it():
    with pytest.raises(ValueError) as info:
        with ranges.phase("replay", bs=2):
            with ranges.phase("verify"):
                raise ValueError("boom")
    assert ranges.range_stack() == ()
    # The innermost range it escaped from, not the outer one it also left.
    assert info.value.pagegraph_range == "verify"


def test_ranges_are_thread_local():
    barrier = threading.Barrier(2)
    seen = {}
    errors = []

    def worker(name, bs):
        try:
            with ranges.phase(name, bs=bs):
                barrier.wait(timeout=10)  # both threads hold their range at once
                seen[name] = (ranges.current_range(), ranges.range_stack())
                barrier.wait(timeout=10)
            seen[name + ":after"] = ranges.current_range()
        except Exception as e:  # surfaced below: a failed thread must fail the test
            errors.append(e)

    with ranges.phase("bench"):
        threads = [
            threading.Thread(target=worker, args=("replay", 8)),
            threading.Thread(target=worker, args=("warmup", 3)),
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
        assert ranges.range_stack() == ("bench",)
    assert not errors, errors
    assert seen["replay"] == ("replay/bs=8", ("replay/bs=8",))
    assert seen["warmup"] == ("warmup/bs=3", ("warmup/bs=3",))
    assert seen["replay:after"] is None and seen["warmup:after"] is None


def test_nvtx_attributes_built_once_per_name_with_phase_colours(fake_domain):
    for _ in range(3):
        with ranges.phase("replay", bs=8):
            with ranges.phase("custom-thing"):
                pass
    with ranges.phase("replay", bs=16):
        pass
    assert fake_domain.created == [
        ("replay/bs=8", ranges.PHASE_COLORS["replay"]),
        ("custom-thing", ranges.DEFAULT_COLOR),
        ("replay/bs=16", ranges.PHASE_COLORS["replay"]),
    ]
    assert len(fake_domain.pushed) == 7
    assert fake_domain.popped == 7


def test_every_phase_has_its_own_colour():
    assert set(ranges.PHASE_COLORS) == set(ranges.PHASES)
    colours = list(ranges.PHASE_COLORS.values()) + [ranges.DEFAULT_COLOR]
    assert len(set(colours)) == len(colours)


def test_without_nvtx_the_stack_is_still_kept(monkeypatch):
    # What ranges does when `import nvtx` failed: no domain, but names still tracked.
    monkeypatch.setattr(ranges, "_domain", None)
    monkeypatch.setattr(ranges, "_attributes", {})
    with ranges.phase("replay", bs=1):
        assert ranges.current_range() == "replay/bs=1"
    assert ranges.range_stack() == ()


@pytest.mark.torch_profiler
def test_record_function_mode_on_cpu():
    ranges.set_record_function(True)
    assert ranges.record_function_enabled()
    activities = [torch.profiler.ProfilerActivity.CPU]
    with torch.profiler.profile(activities=activities) as prof:
        with ranges.phase("replay", bs=3):
            torch.ones(4).add_(1)
        ranges.push("stage")
        torch.ones(4).mul_(2)
        ranges.pop()
    names = {e.name for e in prof.events()}
    assert "replay/bs=3" in names
    assert "stage" in names


@pytest.mark.torch_profiler
def test_record_function_off_by_default():
    assert not ranges.record_function_enabled()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        with ranges.phase("replay", bs=5):
            torch.ones(4).add_(1)
    assert "replay/bs=5" not in {e.name for e in prof.events()}


def test_measure_range_cost():
    cost = ranges.measure_range_cost(20_000)
    assert isinstance(cost, float) and cost > 0
    print(f"\npagegraph range push+pop: {cost * 1e9:.0f} ns")
    ranges.set_record_function(True)
    cost_rf = ranges.measure_range_cost(2_000)
    print(f"pagegraph range push+pop with record_function: {cost_rf * 1e9:.0f} ns")
    assert cost_rf > 0
    with pytest.raises(ValueError):
        ranges.measure_range_cost(0)
