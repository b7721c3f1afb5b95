"""Sync detectors: prove that a region of host code never waits on the device.

The builder contract says a page-table build does no host synchronization and no host read
of a device value. Capturing it in a CUDA graph proves that only for the captured region;
the host code around ``replay()`` (staging inputs, bucket selection, verification hooks) can
still sync, and one D2H copy plus sync per decode step costs a serving engine on every
iteration. Three detectors look at a region, two of them on a GPU from two sides:

``"torch"`` (:mod:`.sync_torch`)
    ``torch.cuda.set_sync_debug_mode("warn")`` for ``.item()``, ``bool(t)``, ``nonzero``,
    blocking ``copy_``/``.cpu()``/``.to()`` and ``Stream.synchronize()``, plus torch's GPU
    trace callbacks for ``torch.cuda.synchronize()``, ``Event.synchronize()`` and
    ``Stream.synchronize()``, which the debug mode does not see. Blind to anything outside
    torch (Triton's launcher, other libraries, direct driver calls) and to ``non_blocking``
    D2H copies into pageable memory, which block inside the driver.
``"cupti"`` (:mod:`.sync_cupti`)
    a CUPTI callback subscriber on the driver API (``cupti-python``): sees every
    synchronizing driver call whoever makes it (:mod:`.sync_calls` lists them, for the
    trace analyzer too). CUPTI allows one subscriber per process, so it cannot run while
    nsys, ncu or torch.profiler is attached.
``"cpu"`` (:mod:`.sync_cpu`)
    runs everywhere: torch's Python dispatch and function modes flag the operators that
    would make the host wait on CUDA (scalar reads, copies to the host, outputs whose shape
    depends on the data, explicit ``synchronize()`` calls) on device-side tensors, with
    their file:line. It emulates the torch detector's view on a CPU; ``"auto"`` runs it only
    without CUDA.

Every offending call is recorded as a :class:`SyncEvent` with the innermost
:mod:`pagegraph.detect.ranges` range open on the calling thread, so an in-process report and
an Nsight timeline name the same phase (``replay/bs=8``).

:func:`record_device_syncs` only records; :func:`no_device_sync` raises
:class:`DeviceSyncError` when anything was recorded. Requesting a detector that cannot run
raises :class:`DetectorUnavailable` before the body runs: a check that silently checked
nothing would read as a pass. :func:`parse_detectors` reads every spelling of a detector
choice.

Process-wide side effects, while a detector is active: the sync debug mode and the
``warnings`` filters/``showwarning`` (restored on exit), the CUPTI subscription (released on
exit). The first use of the torch detector also activates torch's GPU trace, which cannot be
turned off again: afterwards torch calls into Python on every CUDA event, stream and
caching-allocator operation. Benchmarks should run in a process that has not used it.
Nested recorders share one installation (one hook, one subscription) and each sees the calls
made while it is active.

This module gathers the public names of the modules that implement it.
"""

from __future__ import annotations

from .detector_spec import DETECTORS, GPU_DETECTORS, parse_detectors
from .sync_calls import (
    SYNC_API_NAMES,
    api_base_name,
    is_d2h_copy_api,
    is_forbidden_api,
    is_sync_api,
)
from .sync_cpu import mark_host
from .sync_events import (
    DetectorUnavailable,
    DeviceSyncError,
    SyncEvent,
    SyncGroup,
    format_sync_report,
    summarize,
)
from .sync_hub import SyncRecorder
from .sync_record import auto_detectors, available_detectors, no_device_sync, record_device_syncs

__all__ = [
    "DETECTORS",
    "GPU_DETECTORS",
    "SYNC_API_NAMES",
    "DetectorUnavailable",
    "DeviceSyncError",
    "SyncEvent",
    "SyncGroup",
    "SyncRecorder",
    "api_base_name",
    "auto_detectors",
    "available_detectors",
    "format_sync_report",
    "is_d2h_copy_api",
    "is_forbidden_api",
    "is_sync_api",
    "mark_host",
    "no_device_sync",
    "parse_detectors",
    "record_device_syncs",
    "summarize",
]
