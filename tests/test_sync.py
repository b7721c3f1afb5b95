"""Invariant: a region checked by ``no_device_sync`` passes only if a detector actually ran and
saw no synchronizing call; every planted sync is caught by some detector, the clean ones
(device work, a CUDA-graph replay) are caught by none, and each report names the range the
call was made in. Process-wide settings the detectors change are restored, also on error."""

import os
import subprocess
import sys
import warnings

import pytest
import torch
from torch.cuda import _gpu_trace

import pagegraph
from pagegraph.detect import ranges, sync_cupti, sync_hub, sync_record, sync_torch, trace
from pagegraph.detect.sync import (
    DetectorUnavailable,
    DeviceSyncError,
    SyncEvent,
    available_detectors,
    is_d2h_copy_api,
    is_forbidden_api,
    is_sync_api,
    no_device_sync,
    parse_detectors,
    record_device_syncs,
    summarize,
)
from pagegraph.jobs.sync_table import detector_matrix, format_detector_matrix, planted_syncs

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
cpu_only = pytest.mark.skipif(
    torch.cuda.is_available(), reason="checks behaviour on a machine without CUDA"
)

SYNC_WARNING = "called a synchronizing CUDA operation (Triggered internally at fake.cpp:1.)"


@pytest.fixture(autouse=True)
def _no_leaked_ranges(no_leaked_ranges):
    """Every test here leaves no NVTX range open (``conftest.no_leaked_ranges``)."""


# --------------------------------------------------------------------------- CPU: availability


@cpu_only
def test_available_detectors_reports_reasons_without_cuda():
    avail = available_detectors()
    assert set(avail) == {"torch", "cupti", "cpu"}
    assert avail["cpu"] is None, "the cpu detector runs everywhere"
    for name in ("torch", "cupti"):
        reason = avail[name]
        assert isinstance(reason, str) and reason, f"{name} should be unavailable with a reason"


@cpu_only
@pytest.mark.parametrize("detector", ["torch", "cupti"])
@pytest.mark.parametrize("api", [no_device_sync, record_device_syncs])
def test_explicit_detector_without_cuda_raises_before_the_body(api, detector):
    ran = []
    with pytest.raises(DetectorUnavailable, match=detector):
        with api((detector,)):
            ran.append(True)
    assert not ran


@cpu_only
def test_auto_without_cuda_runs_the_cpu_detector_and_says_why_not_the_others():
    with record_device_syncs("auto") as rec:
        pass
    assert rec.detectors == ("cpu",)
    assert set(rec.unavailable) == {"torch", "cupti"}
    t = torch.arange(4)
    with pytest.raises(DeviceSyncError, match=r"\[cpu\] scalar read"):
        with no_device_sync("auto"):
            t.sum().item()


@cpu_only
def test_auto_with_nothing_available_records_nothing_but_never_passes_silently(monkeypatch):
    monkeypatch.setattr(sync_record.HUBS["cpu"], "unavailable_reason", lambda probe=True: "off")
    with record_device_syncs("auto") as rec:
        pass
    assert rec.detectors == ()
    assert set(rec.unavailable) == {"torch", "cupti", "cpu"}
    ran = []
    with pytest.raises(DetectorUnavailable, match="no detector available"):
        with no_device_sync("auto"):
            ran.append(True)
    assert not ran


def test_unknown_detector_is_rejected():
    with pytest.raises(ValueError, match="unknown detector 'nsight'"):
        with record_device_syncs(("torch", "nsight")):
            pass


@pytest.mark.parametrize(
    "spec, want",
    [
        ("auto", "auto"),
        (" auto ", "auto"),
        ("none", ()),
        ("", ()),
        (None, ()),
        ((), ()),
        ([], ()),
        ("torch", ("torch",)),
        ("cupti", ("cupti",)),
        ("torch,cupti", ("torch", "cupti")),
        (" cupti , torch ", ("cupti", "torch")),
        ("torch,torch", ("torch",)),
        (("torch", "cupti"), ("torch", "cupti")),
        (["cupti"], ("cupti",)),
    ],
)
def test_every_detector_spelling_parses(spec, want):
    assert parse_detectors(spec) == want


@pytest.mark.parametrize("spec", ["strace", "torch,gdb", ("torch", 3), ("auto",), 7])
def test_bad_detector_spellings_name_the_bad_one(spec):
    with pytest.raises(ValueError, match="unknown detector|must be a string or a sequence"):
        parse_detectors(spec)


# --------------------------------------------------------------------------- CPU: CUPTI names


@pytest.mark.parametrize(
    "name, flagged",
    [
        ("cuStreamSynchronize", True),
        ("cuStreamSynchronize_ptsz", True),
        ("cuCtxSynchronize", True),
        ("cuCtxSynchronize_v2", True),
        ("cuEventSynchronize", True),
        ("cuMemcpyDtoHAsync_v2", True),
        ("cuMemcpyDtoHAsync_v2_ptsz", True),
        ("cuMemcpyDtoH_v2", True),
        ("cuMemcpyAtoH_v2", True),
        ("cuMemcpy", True),
        ("cuMemcpy_ptds", True),
        ("cuMemcpyHtoD_v2", True),
        ("cuMemcpyDtoD_v2", True),
        ("cuMemcpy2D_v2", True),
        ("cuMemcpy3D_v2", True),
        ("cuMemcpyPeer", True),
        ("cuMemFree_v2", True),
        ("cuMemFreeHost", True),
        # Host-async unless the target is pinned or managed memory: not flagged by name.
        ("cuMemsetD8_v2", False),
        ("cuMemsetD32_v2", False),
        ("cuMemsetD2D32_v2", False),
        ("cuMemcpyHtoDAsync_v2", False),
        ("cuMemcpyDtoDAsync_v2", False),
        ("cuMemcpyAsync", False),
        ("cuMemcpy2DAsync_v2", False),
        ("cuMemcpyPeerAsync", False),
        ("cuMemFreeAsync", False),
        ("cuMemsetD32Async", False),
        ("cuLaunchKernel", False),
        ("cuLaunchKernelEx", False),
        ("cuGraphLaunch", False),
        ("cuEventQuery", False),
        ("cuStreamQuery", False),
        ("cuEventRecord", False),
        ("cuStreamWaitEvent", False),
        ("cuMemAlloc_v2", False),
        ("cuStreamSynchronizeX", False),
    ],
)
def test_cupti_name_classification(name, flagged):
    assert is_forbidden_api(name) is flagged


@pytest.mark.parametrize(
    "name, waits, reads",
    [
        ("cuStreamSynchronize", True, False),
        ("cuMemcpyDtoH_v2", True, True),
        ("cuMemFree_v2", True, False),
        ("cuMemcpyDtoHAsync_v2", False, True),  # a host read, not a wait
        ("cuMemcpyAtoHAsync_v2", False, True),
        ("cuMemsetD32_v2", False, False),
    ],
)
def test_sync_api_is_the_waits_alone(name, waits, reads):
    assert is_sync_api(name) is waits
    assert is_d2h_copy_api(name) is reads
    assert is_forbidden_api(name) is (waits or reads)


def test_detector_and_trace_analyzer_share_one_sync_list():
    assert trace.is_sync_api is is_sync_api


# --------------------------------------------------------------------------- CPU: reports


def test_device_sync_error_message_lists_every_group():
    stack = '  File "decode.py", line 12, in step\n    n = seq_lens.max().item()\n'
    events = [
        SyncEvent("cupti", "cuStreamSynchronize", "replay/bs=4", stack),
        SyncEvent("cupti", "cuStreamSynchronize", "replay/bs=4", None),
        SyncEvent("cupti", "cuMemcpyDtoHAsync_v2", "replay/bs=4", stack),
        SyncEvent("torch", "sync_debug: n = seq_lens.max().item()", None, stack),
    ]
    err = DeviceSyncError(events, ("torch", "cupti"))
    assert isinstance(err, AssertionError)
    assert err.events == events
    assert err.detectors == ("torch", "cupti")
    msg = str(err)
    assert "4 synchronizing call(s)" in msg
    assert "detectors that ran: torch, cupti" in msg
    assert "[cupti] cuStreamSynchronize x2 in replay/bs=4" in msg
    assert "[cupti] cuMemcpyDtoHAsync_v2 x1 in replay/bs=4" in msg
    assert "[torch] sync_debug: n = seq_lens.max().item() x1 in <no range>" in msg
    assert msg.count("decode.py") == 3  # the first occurrence of each group, once
    assert "first occurrence" in msg


def test_summarize_groups_by_detector_name_and_range():
    events = [
        SyncEvent("cupti", "cuStreamSynchronize", "replay/bs=4"),
        SyncEvent("cupti", "cuStreamSynchronize", "replay/bs=8", "stack8"),
        SyncEvent("cupti", "cuStreamSynchronize", "replay/bs=4", "late"),
        SyncEvent("torch", "stream_synchronize", "replay/bs=4"),
    ]
    groups = summarize(events)
    assert [(g.detector, g.name, g.range, g.count) for g in groups] == [
        ("cupti", "cuStreamSynchronize", "replay/bs=4", 2),
        ("cupti", "cuStreamSynchronize", "replay/bs=8", 1),
        ("torch", "stream_synchronize", "replay/bs=4", 1),
    ]
    assert groups[0].stack == "late"  # the first occurrence that has one
    assert groups[1].stack == "stack8"


# --------------------------------------------------------------------------- CPU: machinery


class FakeHub:
    """A detector under the test's control: ``fire(name)`` plays an offending call."""

    def __init__(self, name="fake", reason=None):
        self.name = name
        self.reason = reason
        self.recorders = []
        self.releases = 0

    def unavailable_reason(self, probe=True):
        return self.reason

    def acquire(self, recorder):
        self.recorders.append(recorder)

    def release(self, recorder):
        self.recorders.remove(recorder)
        self.releases += 1

    def fire(self, name):
        for r in list(self.recorders):
            r._record(self.name, name)


@pytest.fixture
def fake(monkeypatch):
    hub = FakeHub()
    monkeypatch.setitem(sync_record.HUBS, "fake", hub)
    return hub


def test_no_device_sync_raises_with_range_and_stack(fake):
    def step():
        fake.fire("cuStreamSynchronize")

    with pytest.raises(DeviceSyncError) as info:
        with no_device_sync(("fake",)) as rec:
            assert rec.detectors == ("fake",)
            with ranges.phase("replay", bs=4):
                step()
                step()
            fake.fire("cuStreamSynchronize")
    err = info.value
    assert err.detectors == ("fake",)
    assert [(e.name, e.range) for e in err.events] == [
        ("cuStreamSynchronize", "replay/bs=4"),
        ("cuStreamSynchronize", "replay/bs=4"),
        ("cuStreamSynchronize", None),
    ]
    assert "in step" in err.events[0].stack  # the Python frame that made the call
    assert err.events[1].stack is None  # later occurrences skip the stack walk
    assert "x2 in replay/bs=4" in str(err) and "x1 in <no range>" in str(err)
    assert fake.recorders == [] and fake.releases == 1


def test_no_device_sync_passes_when_silent(fake):
    with no_device_sync(("fake",)) as rec:
        pass
    assert rec.events == [] and fake.releases == 1


def test_allow_patterns(fake):
    with no_device_sync(("fake",), allow=("cuMemFree*",)) as rec:
        fake.fire("cuMemFree_v2")
    assert rec.count() == 1  # still recorded, only tolerated
    with pytest.raises(DeviceSyncError) as info:
        with no_device_sync(("fake",), allow=("cuMemFree*",)):
            fake.fire("cuMemFree_v2")
            fake.fire("cuCtxSynchronize")
    assert [e.name for e in info.value.events] == ["cuCtxSynchronize"]


def test_body_exception_is_not_masked(fake):
    with pytest.raises(KeyError) as info:
        with no_device_sync(("fake",)):
            fake.fire("cuStreamSynchronize")
            raise KeyError("from the body")
    assert fake.releases == 1
    notes = getattr(info.value, "__notes__", None)
    if notes is not None:  # Python 3.11+
        assert any("cuStreamSynchronize" in n for n in notes)


def test_torch_sync_debug_error_becomes_device_sync_error(fake):
    with pytest.raises(DeviceSyncError) as info:
        with no_device_sync(("fake",)):
            with ranges.phase("stage", bs=12):
                raise RuntimeError("called a synchronizing CUDA operation")
    (event,) = info.value.events
    assert event.detector == "torch"
    assert event.range == "stage/bs=12"
    assert "raise RuntimeError" in event.name
    assert isinstance(info.value.__cause__, RuntimeError)


def test_auto_skips_unavailable_and_records_why(monkeypatch):
    ok, gone = FakeHub("ok"), FakeHub("gone", reason="not here")
    monkeypatch.setattr(sync_record, "HUBS", {"ok": ok, "gone": gone})
    with record_device_syncs("auto") as rec:
        ok.fire("cuCtxSynchronize")
    assert rec.detectors == ("ok",)
    assert rec.unavailable == {"gone": "not here"}
    assert rec.names() == ["cuCtxSynchronize"]
    with pytest.raises(DetectorUnavailable, match="gone: not here"):
        with record_device_syncs(("ok", "gone")):
            pass
    assert ok.releases == 1  # nothing was started by the refused request
    # Every spelling parse_detectors takes: a comma-separated string, "none".
    with pytest.raises(DetectorUnavailable, match="gone: not here"):
        with record_device_syncs("ok,gone"):
            pass
    with record_device_syncs("none") as rec:
        ok.fire("cuCtxSynchronize")
    assert rec.detectors == () and rec.events == []


def test_a_detector_that_fails_to_start_is_skipped_by_auto(monkeypatch):
    class Taken(FakeHub):
        def acquire(self, recorder):
            raise DetectorUnavailable("cupti: another CUPTI client is attached")

    ok, taken = FakeHub("ok"), Taken("taken")
    monkeypatch.setattr(sync_record, "HUBS", {"ok": ok, "taken": taken})
    with record_device_syncs("auto") as rec:
        pass
    assert rec.detectors == ("ok",)
    assert "another CUPTI client" in rec.unavailable["taken"]
    with pytest.raises(DetectorUnavailable, match="another CUPTI client"):
        with record_device_syncs(("ok", "taken")):
            pass
    assert ok.recorders == []  # the started one was released again


# --------------------------------------------------------------------------- CPU: torch hub


@pytest.fixture
def fake_torch_cuda(monkeypatch):
    """The torch detector on a CPU-only torch: sync-debug mode and CUDA availability faked,
    GPU trace callbacks fired by hand."""
    state = {"mode": 0, "sets": []}
    modes = {"default": 0, "warn": 1, "error": 2}

    def set_mode(mode):
        state["sets"].append(mode)
        state["mode"] = modes.get(mode, mode)

    monkeypatch.setattr(sync_hub, "cuda_available", lambda: True)
    monkeypatch.setattr(sync_torch, "_gpu_trace_active", True)  # never activate it on this CPU
    monkeypatch.setattr(torch.cuda, "get_sync_debug_mode", lambda: state["mode"])
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", set_mode)
    return state


def _our_trace_callbacks():
    registries = (
        _gpu_trace.DeviceSynchronizationCallbacks,
        _gpu_trace.StreamSynchronizationCallbacks,
        _gpu_trace.EventSynchronizationCallbacks,
    )
    return [cb for reg in registries for cb in reg.callback_list if "TorchHub" in repr(cb)]


def test_torch_detector_records_warnings_and_trace_callbacks(fake_torch_cuda):
    assert sync_torch.TorchHub.unavailable_reason() is None
    showwarning_before = warnings.showwarning
    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("default")
        with record_device_syncs(("torch",)) as rec:
            assert fake_torch_cuda["mode"] == 1  # "warn"
            assert len(_our_trace_callbacks()) == 3
            with ranges.phase("replay", bs=4):
                for _ in range(3):  # the same line three times: all three counted
                    warnings.warn(SYNC_WARNING, stacklevel=1)
            warnings.warn("an unrelated warning", stacklevel=1)
            _gpu_trace.DeviceSynchronizationCallbacks.fire_callbacks()
            _gpu_trace.StreamSynchronizationCallbacks.fire_callbacks(1234)
            _gpu_trace.EventSynchronizationCallbacks.fire_callbacks(7)
    assert fake_torch_cuda["mode"] == 0 and fake_torch_cuda["sets"] == ["warn", 0]
    assert _our_trace_callbacks() == []
    assert warnings.showwarning is showwarning_before
    # Unrelated warnings reach whoever handled them before; sync warnings are consumed.
    assert [str(w.message) for w in shown] == ["an unrelated warning"]
    assert rec.detectors == ("torch",)
    sync_name = "sync_debug: warnings.warn(SYNC_WARNING, stacklevel=1)"
    assert rec.names() == [
        sync_name,
        "device_synchronize",
        "stream_synchronize",
        "event_synchronize",
    ]
    assert rec.count(name=sync_name) == 3
    first = rec.events[0]
    assert first.range == "replay/bs=4"
    assert "test_torch_detector_records_warnings_and_trace_callbacks" in first.stack
    assert "pagegraph/detect/" not in first.stack  # detector frames are left out
    assert rec.events[1].stack is None
    assert rec.events[3].range is None


def test_torch_detector_restores_everything_after_an_error(fake_torch_cuda):
    fake_torch_cuda["mode"] = 2  # the caller had "error" on
    showwarning_before = warnings.showwarning
    with pytest.raises(ZeroDivisionError):
        with no_device_sync(("torch",)):
            assert fake_torch_cuda["mode"] == 1
            1 / 0  # noqa: B018
    assert fake_torch_cuda["mode"] == 2
    assert _our_trace_callbacks() == []
    assert warnings.showwarning is showwarning_before


def test_torch_detector_raises_on_sync_warning(fake_torch_cuda):
    with pytest.raises(DeviceSyncError) as info:
        with no_device_sync(("torch",)):
            with ranges.phase("replay", bs=8):
                warnings.warn(SYNC_WARNING, stacklevel=1)
    (event,) = info.value.events
    assert (event.detector, event.range) == ("torch", "replay/bs=8")
    assert "replay/bs=8" in str(info.value)


def test_nested_recorders_share_one_installation(fake_torch_cuda):
    with record_device_syncs(("torch",)) as outer:
        with record_device_syncs(("torch",)) as inner:
            warnings.warn(SYNC_WARNING, stacklevel=1)
        assert fake_torch_cuda["mode"] == 1  # still on for the outer one
        warnings.warn(SYNC_WARNING, stacklevel=1)
    assert fake_torch_cuda["sets"] == ["warn", 0]
    assert inner.count() == 1 and outer.count() == 2


def test_planted_expectations():
    planted = planted_syncs()
    assert {"clean", "clean_graph_replay", "cu_stream_synchronize"} <= set(planted)
    for name in ("clean", "clean_graph_replay"):
        assert planted[name].expected == frozenset()
    for name in (
        "cuda_synchronize",
        "event_synchronize",
        "stream_synchronize",
        "cu_stream_synchronize",
        "item",
        "nonblocking_pageable",
    ):
        assert "cupti" in planted[name].expected
    assert "torch" not in planted["nonblocking_pageable"].expected
    assert "torch" not in planted["cu_stream_synchronize"].expected


def _row(planted, detector, status, names=(), expected=True, reason=None):
    return {
        "planted": planted,
        "detector": detector,
        "status": status,
        "names": list(names),
        "count": len(names),
        "expected": expected,
        "reason": reason,
    }


def test_format_detector_matrix():
    rows = [
        _row("item", "torch", "caught", ["sync_debug: t.sum().item()", "stream_synchronize"]),
        _row("item", "cupti", "n/a", reason="cupti-python is not installed"),
        _row("clean", "torch", "missed", expected=False),
        _row("clean", "cupti", "caught", ["a|b"], expected=False),
    ]
    table = format_detector_matrix(rows).splitlines()
    assert table[0] == "| planted sync | torch | cupti | expected to catch it |"
    assert table[2] == (
        "| `item` | caught (sync_debug: t.sum().item(), stream_synchronize) "
        "| n/a: cupti-python is not installed | torch, cupti |"
    )
    assert table[3] == (
        "| `clean` | missed | caught (a\\|b) **(unexpected)** | none (must stay silent) |"
    )


@cpu_only
def test_detector_matrix_without_cuda_is_all_na():
    rows = detector_matrix("cpu")
    assert rows and all(r["status"] == "n/a" and r["reason"] for r in rows)
    assert len(rows) == len(planted_syncs()) * 2


# --------------------------------------------------------------------------- GPU

PLANTED = planted_syncs()
SYNCING = [n for n, p in PLANTED.items() if p.expected]
CLEAN = [n for n, p in PLANTED.items() if not p.expected]
TORCH_VISIBLE = [n for n, p in PLANTED.items() if "torch" in p.expected]
CUPTI_VISIBLE = [n for n, p in PLANTED.items() if "cupti" in p.expected]


def _prepared(name):
    planted = PLANTED[name]
    reason = planted.unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    return planted.prepare("cuda")


def _require(detector):
    reason = available_detectors()[detector]
    if reason is not None:
        pytest.skip(f"{detector} detector unavailable: {reason}")


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("name", SYNCING)
def test_planted_sync_is_caught_by_some_detector(name):
    action = _prepared(name)
    with record_device_syncs("auto") as rec:
        action()
    assert rec.detectors, rec.unavailable
    assert rec.events, f"{name}: missed by {rec.detectors}"
    assert {e.range for e in rec.events} == {"replay/bs=1"}
    with pytest.raises(DeviceSyncError):
        with no_device_sync("auto"):
            action()


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("name", TORCH_VISIBLE)
def test_torch_detector_catches(name):
    _require("torch")
    action = _prepared(name)
    with record_device_syncs(("torch",)) as rec:
        action()
    assert rec.events, f"torch detector missed {name}"


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("name", CUPTI_VISIBLE)
def test_cupti_detector_catches(name):
    _require("cupti")
    action = _prepared(name)
    with record_device_syncs(("cupti",)) as rec:
        action()
    assert rec.events, f"cupti detector missed {name}"
    assert {e.range for e in rec.events} == {"replay/bs=1"}


@pytest.mark.gpu
@needs_cuda
def test_nested_cupti_recorders_share_the_subscription():
    _require("cupti")
    action = _prepared("item")
    with record_device_syncs(("cupti",)) as outer:
        assert available_detectors()["cupti"] is None  # our own subscription is no conflict
        with record_device_syncs(("cupti",)) as inner:
            action()
        action()
    assert inner.count() > 0
    assert outer.count() == 2 * inner.count()
    # Released at the end: a fresh subscription works again.
    assert available_detectors()["cupti"] is None


_PROFILER_CONFLICT = """
import torch
from torch.profiler import ProfilerActivity, profile
from pagegraph.detect.sync import DetectorUnavailable, available_detectors, record_device_syncs
torch.ones(1, device="cuda").add_(1)
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]):
    torch.ones(1, device="cuda").add_(1)
    print("REASON", available_detectors()["cupti"])
    try:
        with record_device_syncs(("cupti",)):
            pass
    except DetectorUnavailable as e:
        print("UNAVAILABLE", e)
    else:
        print("STARTED")
"""


@pytest.mark.gpu
@needs_cuda
@pytest.mark.heavy
def test_cupti_next_to_torch_profiler_is_reported_not_hidden():
    # In a subprocess: Kineto may keep CUPTI for the rest of its process.
    _require("cupti")
    src = os.path.dirname(os.path.dirname(pagegraph.__file__))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run(
        [sys.executable, "-c", _PROFILER_CONFLICT],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    lines = [
        ln
        for ln in out.stdout.splitlines()
        if ln.split(" ", 1)[0] in ("REASON", "UNAVAILABLE", "STARTED")
    ]
    print("\n" + "\n".join(lines))
    reason = lines[0].split(" ", 1)[1]
    if reason != "None":
        assert "another CUPTI client" in reason
        assert lines[1].startswith("UNAVAILABLE") and "another CUPTI client" in lines[1]
    else:  # this Kineto does not hold a callback subscription while profiling
        assert lines[1] == "STARTED"


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("detector", ["auto", "torch", "cupti"])
@pytest.mark.parametrize("name", CLEAN)
def test_clean_operations_stay_silent(name, detector):
    if detector != "auto":
        _require(detector)
    action = _prepared(name)
    with no_device_sync(detector) as rec:
        for _ in range(5):
            action()
    assert rec.events == []
    torch.cuda.synchronize()


@pytest.mark.gpu
@needs_cuda
def test_range_attribution_of_an_item():
    t = torch.arange(10, device="cuda", dtype=torch.float32)
    t.sum()
    torch.cuda.synchronize()
    with pytest.raises(DeviceSyncError) as info:
        with no_device_sync("auto"):
            with ranges.phase("replay", bs=4):
                t.sum().item()
    assert info.value.events
    assert {e.range for e in info.value.events} == {"replay/bs=4"}
    assert "replay/bs=4" in str(info.value)
    assert "t.sum().item()" in str(info.value)  # the stack of the first occurrence


@pytest.mark.gpu
@needs_cuda
def test_sync_debug_mode_restored_after_an_exception():
    _require("torch")
    torch.cuda.set_sync_debug_mode("default")
    try:
        with pytest.raises(ValueError):
            with no_device_sync(("torch",)):
                assert torch.cuda.get_sync_debug_mode() == 1
                raise ValueError("body failed")
        assert torch.cuda.get_sync_debug_mode() == 0
        torch.cuda.set_sync_debug_mode("error")
        with pytest.raises(ValueError):
            with record_device_syncs(("torch",)):
                raise ValueError("body failed")
        assert torch.cuda.get_sync_debug_mode() == 2
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.gpu
@needs_cuda
def test_detector_matrix_matches_expectations():
    rows = detector_matrix("cuda")
    print("\n" + format_detector_matrix(rows))
    ran = [r for r in rows if r["status"] in ("caught", "missed")]
    assert ran, rows
    errors = [r for r in rows if r["status"] == "error"]
    assert not errors, errors
    wrong = [r for r in ran if (r["status"] == "caught") != r["expected"]]
    assert not wrong, wrong


@pytest.mark.gpu
def test_gpu_a_paused_recorder_sees_nothing_and_a_resumed_one_everything():
    """The checker watches only its stage/replay ranges by pausing the detectors elsewhere:
    a planted .item() while paused is not seen, the same one after resume() is, by every
    detector that runs here."""
    from pagegraph.detect.sync import available_detectors, record_device_syncs

    names = tuple(n for n, why in available_detectors().items() if why is None)
    t = torch.arange(4, device="cuda")
    t.sum().item()  # warm-up outside the recording
    with record_device_syncs(names) as rec:
        if "cupti" in names:
            assert sync_record.HUBS["cupti"].selective, "CUPTI subscribed the whole domain"
        rec.pause()
        t.sum().item()
        assert rec.events == [], rec.events
        rec.resume()
        t.sum().item()
    assert {e.detector for e in rec.events} == set(rec.detectors) == set(names)


def test_cupti_subscribes_the_sync_calls_alone():
    """The CUPTI detector enables one callback id per driver call that can wait, so kernel
    and graph launches cost no callback; the ids come from the release's table, by name."""
    import enum
    import types

    table = enum.IntEnum(
        "driver_api_trace_cbid",
        {
            "cuLaunchKernel": 307,
            "cuGraphLaunch": 514,
            "cuMemcpyHtoDAsync_v2": 278,
            "cuStreamSynchronize": 131,
            "cuMemcpyDtoHAsync_v2": 279,
            "cuCtxSynchronize": 17,
            "cuStreamQuery": 130,
            "cuEventSynchronize": 141,
            "cuMemFree_v2": 246,
        },
    )
    assert sync_cupti.sync_callback_ids(types.SimpleNamespace(driver_api_trace_cbid=table)) == [
        17,
        131,
        141,
        246,
        279,
    ]
    assert sync_cupti.sync_callback_ids(types.SimpleNamespace()) == [], "no table: the whole domain"
