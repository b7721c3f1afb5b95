"""Recording a region: the registry of detectors, ``record_device_syncs`` and
``no_device_sync``."""

from __future__ import annotations

import contextlib
import fnmatch
import os
import traceback
from collections.abc import Iterable, Iterator

from . import sync_hub
from .detector_spec import DETECTORS, GPU_DETECTORS, parse_detectors
from .sync_cpu import CpuHub
from .sync_cupti import CuptiHub
from .sync_events import DetectorUnavailable, DeviceSyncError, SyncEvent, format_sync_report
from .sync_hub import Hub, SyncRecorder
from .sync_stacks import STACK_FRAMES, TORCH_DIR
from .sync_torch import TorchHub, is_torch_sync_error

__all__ = [
    "HUBS",
    "auto_detectors",
    "available_detectors",
    "no_device_sync",
    "record_device_syncs",
]

#: Detector name -> its hub, in the order they are started; tests swap in fakes.
HUBS: dict[str, Hub] = {"torch": TorchHub(), "cupti": CuptiHub(), "cpu": CpuHub()}
assert tuple(HUBS) == DETECTORS

#: Why ``"auto"`` leaves the cpu detector out where CUDA is present.
CPU_NOT_AUTO = "auto runs the cpu detector only without CUDA (here torch and cupti watch the GPU)"


def auto_detectors(device_type: str | None = None) -> tuple[str, ...]:
    """The detectors ``"auto"`` tries, in order: the GPU ones (torch, cupti) for a CUDA
    device, the cpu detector for a CPU one. ``device_type``: the region's device (``"cuda"``,
    ``"cpu"``); default CUDA when it is available. Names that are not in :data:`HUBS` (tests
    swap in fakes) are left out, and fakes are all tried."""
    if device_type is None:
        device_type = "cuda" if sync_hub.cuda_available() else "cpu"
    wanted = GPU_DETECTORS if device_type == "cuda" else ("cpu",)
    if set(HUBS) <= set(DETECTORS):
        return tuple(n for n in HUBS if n in wanted)
    return tuple(HUBS)


def available_detectors() -> dict[str, str | None]:
    """Detector name -> ``None`` if it can run now, else the reason it cannot."""
    return {name: hub.unavailable_reason() for name, hub in HUBS.items()}


def refuse_unavailable(names: tuple[str, ...]) -> None:
    """``DetectorUnavailable`` naming each of ``names`` that cannot run here (the cheap
    checks: package, device), before anything runs."""
    _refuse_unavailable(names)


def _refuse_unavailable(names: tuple[str, ...]) -> None:
    # Cheap checks only (package, device): a subscription that is taken surfaces when the
    # detector starts, which saves a trial subscribe on every call.
    reasons = {n: r for n in names if (r := HUBS[n].unavailable_reason(probe=False)) is not None}
    if reasons:
        raise DetectorUnavailable(
            "requested detector(s) cannot run: "
            + "; ".join(f"{n}: {r}" for n, r in reasons.items())
        )


def _start(recorder: SyncRecorder, names: tuple[str, ...], auto: bool) -> None:
    """Start each detector for ``recorder``; with ``auto``, skip (and note why) those that
    cannot run. What was started is in ``recorder._hubs`` even when this raises."""
    for name in names:
        hub = HUBS[name]
        if auto:
            reason = hub.unavailable_reason(probe=False)
            if reason is not None:
                recorder.unavailable[name] = reason
                continue
        try:
            hub.acquire(recorder)
        except DetectorUnavailable as e:
            if not auto:
                raise
            recorder.unavailable[name] = str(e)
            continue
        recorder._hubs[name] = hub


@contextlib.contextmanager
def record_device_syncs(
    detectors: str | Iterable[str] | None = "auto",
) -> Iterator[SyncRecorder]:
    """Record every synchronizing call made while the body runs; never raises on syncs.

    ``detectors``: ``"auto"`` (where CUDA is present, the torch and cupti detectors that can
    run; without CUDA, the cpu detector: :func:`auto_detectors`; check ``.detectors`` for
    which ran, ``.unavailable`` for why the others did not), or any spelling
    :func:`~pagegraph.detect.detector_spec.parse_detectors` takes (``"torch"``, ``"cpu"``,
    ``"torch,cupti"``, ``("cupti",)``, ``"none"``). A named detector that cannot run raises
    :class:`DetectorUnavailable` before the body runs.
    """
    choice = parse_detectors(detectors, known=HUBS)
    auto = choice == "auto"
    names = auto_detectors() if isinstance(choice, str) else choice  # a str is "auto"
    recorder = SyncRecorder(names)
    if auto:
        for name in HUBS:
            if name not in names:
                reason = HUBS[name].unavailable_reason(probe=False)
                recorder.unavailable[name] = reason or CPU_NOT_AUTO
    else:
        _refuse_unavailable(names)
    try:
        _start(recorder, names, auto)
        recorder.detectors = tuple(recorder._hubs)
        yield recorder
    finally:
        for hub in reversed(recorder._hubs.values()):
            hub.release(recorder)


def _event_from_torch_error(exc: BaseException) -> SyncEvent:
    tb = traceback.extract_tb(exc.__traceback__)
    where = f"{os.path.basename(tb[-1].filename)}:{tb[-1].lineno}" if tb else "?"
    for entry in reversed(tb):  # innermost frame outside torch names the call
        if not entry.filename.startswith(TORCH_DIR) and entry.line:
            where = entry.line.strip()
            break
    stack = "".join(traceback.format_list(tb[-STACK_FRAMES:])) if tb else None
    return SyncEvent(
        "torch", f"sync_debug error: {where}", getattr(exc, "pagegraph_range", None), stack
    )


@contextlib.contextmanager
def no_device_sync(
    detectors: str | Iterable[str] | None = GPU_DETECTORS, *, allow: Iterable[str] = ()
) -> Iterator[SyncRecorder]:
    """Assert that the body makes no synchronizing call; yields the recorder.

    On normal exit, raises :class:`DeviceSyncError` listing every offending call (so the body
    runs to its end and all of them are reported, not just the first). ``allow``: glob
    patterns of call names that are tolerated (``"cuMemFree*"``). If the body raises, its
    exception propagates unchanged (a note lists the syncs seen, on Python 3.11+), except
    torch's sync-debug ``RuntimeError``, which becomes a :class:`DeviceSyncError`.

    ``detectors``: default the torch and cupti detectors (each must run); ``"cpu"`` for the
    cpu detector; ``"auto"`` uses what :func:`record_device_syncs` would, but raises
    :class:`DetectorUnavailable` when nothing can: an assertion that checked nothing must not pass.
    """
    patterns = tuple(allow)

    def offending(events: list[SyncEvent]) -> list[SyncEvent]:
        return [e for e in events if not any(fnmatch.fnmatchcase(e.name, p) for p in patterns)]

    with record_device_syncs(detectors) as recorder:
        if not recorder.detectors:
            why = "; ".join(f"{n}: {r}" for n, r in recorder.unavailable.items()) or "none given"
            raise DetectorUnavailable(f"no_device_sync: no detector available ({why})")
        try:
            yield recorder
        except Exception as e:
            if is_torch_sync_error(e):
                events = offending(recorder.events) + [_event_from_torch_error(e)]
                raise DeviceSyncError(events, recorder.detectors) from e
            seen = offending(recorder.events)
            if seen and hasattr(e, "add_note"):
                e.add_note(format_sync_report(seen, recorder.detectors, title="while raising"))
            raise
    events = offending(recorder.events)
    if events:
        raise DeviceSyncError(events, recorder.detectors)
