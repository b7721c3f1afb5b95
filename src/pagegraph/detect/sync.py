"""Sync detectors: prove that a region of host code never waits on the device.

The builder contract says a page-table build does no host synchronization and no host read
of a device value. Capturing it in a CUDA graph proves that only for the captured region;
the host code around ``replay()`` (staging inputs, bucket selection, verification hooks) can
still sync, and one D2H copy plus sync per decode step is expensive (hundreds of
microseconds per iteration in a serving engine).
Two detectors look at a region from two sides:

``"torch"``
    ``torch.cuda.set_sync_debug_mode("warn")`` for ``.item()``, ``bool(t)``, ``nonzero``,
    blocking ``copy_``/``.cpu()``/``.to()`` and ``Stream.synchronize()``, plus torch's GPU
    trace callbacks for ``torch.cuda.synchronize()``, ``Event.synchronize()`` and
    ``Stream.synchronize()``, which the debug mode does not see. Blind to anything outside
    torch (Triton's launcher, other libraries, direct driver calls) and to ``non_blocking``
    D2H copies into pageable memory, which block inside the driver.
``"cupti"``
    a CUPTI callback subscriber on the driver API (``cupti-python``): sees every
    synchronizing driver call whoever makes it. CUPTI allows one subscriber per process, so it
    cannot run while nsys, ncu or torch.profiler is attached.

Every offending call is recorded as a :class:`SyncEvent` with the innermost
:mod:`pagegraph.ranges` range open on the calling thread, so an in-process report and an
Nsight timeline name the same phase (``replay/bs=8``).

:func:`record_device_syncs` only records; :func:`no_device_sync` raises
:class:`DeviceSyncError` when anything was recorded. Requesting a detector that cannot run
raises :class:`DetectorUnavailable` before the body runs: a check that silently checked
nothing would read as a pass.

Process-wide side effects, while a detector is active: the sync debug mode and the
``warnings`` filters/``showwarning`` (restored on exit), the CUPTI subscription (released on
exit). The first use of the torch detector also activates torch's GPU trace, which cannot be
turned off again: afterwards torch calls into Python on every CUDA event, stream and
caching-allocator operation. Benchmarks should run in a process that has not used it.
Nested recorders share one installation (one hook, one subscription) and each sees the calls
made while it is active.
"""

from __future__ import annotations

import contextlib
import fnmatch
import linecache
import os
import re
import sys
import threading
import traceback
import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

import torch

from . import ranges

__all__ = [
    "CUPTI_SYNC_API",
    "DETECTORS",
    "DetectorUnavailable",
    "DeviceSyncError",
    "PlantedSync",
    "SyncEvent",
    "SyncGroup",
    "SyncRecorder",
    "available_detectors",
    "detector_matrix",
    "format_detector_matrix",
    "format_sync_report",
    "is_sync_api",
    "no_device_sync",
    "planted_syncs",
    "record_device_syncs",
    "summarize",
]

#: Every detector pagegraph knows, in the order they are started.
DETECTORS = ("torch", "cupti")
NO_RANGE = "<no range>"
#: Frames kept of the Python stack of the first occurrence of each offending call.
STACK_FRAMES = 8
#: Text of torch's sync-debug warning (and of its error in "error" mode).
TORCH_SYNC_MESSAGE = "called a synchronizing CUDA operation"

# Driver API names that make the host wait on the device. Matched on API_ENTER against
# CUPTI's function_name (``cuStreamSynchronize``, ``cuMemcpyDtoHAsync_v2``, ...).
CUPTI_SYNC_API = re.compile(
    r"""
    ^(?:
        # Explicit waits: the host blocks until the context, stream or event is done.
        cu(?:Ctx|Stream|Event)Synchronize
        # Every device-to-host (or array-to-host) read, async or not. The host reading a
        # device value is what the contract forbids; an "async" copy into pageable memory
        # blocks anyway; torch's .item()/.cpu() follow theirs with cuStreamSynchronize.
      | cuMemcpy(?:DtoH|AtoH)(?:Async)?
        # Blocking copies of every other kind return only once the copy is done, the generic
        # cuMemcpy included. Their *Async forms (cuMemcpyHtoDAsync, ...) do not block.
      | cuMemcpy(?:HtoD|DtoD|HtoA|AtoD|DtoA|AtoA|2D|2DUnaligned|3D|Peer|3DPeer)?
        # Freeing device or pinned memory implicitly synchronizes the device.
      | cuMemFree(?:Host)?
        # Non-async memsets run on the legacy default stream, which serializes with every
        # blocking stream, and block the host for pinned or managed targets.
      | cuMemsetD(?:8|16|32|2D8|2D16|2D32)
    )
    # ABI-version and per-thread-default-stream suffixes: _v2, _v2_ptds, _ptsz, ...
    (?:_v\d+)?(?:_pt(?:ds|sz))?$
    """,
    re.VERBOSE,
)

_sync_api_cache: dict[str, bool] = {}


def is_sync_api(name: str) -> bool:
    """Whether a CUDA driver API name (as CUPTI reports it) makes the host wait on the device.

    ``cuStreamQuery``/``cuEventQuery`` poll and return at once: not syncs. Neither are kernel
    or graph launches, nor any ``*Async`` copy other than device-to-host.
    """
    flagged = _sync_api_cache.get(name)
    if flagged is None:
        flagged = _sync_api_cache[name] = CUPTI_SYNC_API.match(name) is not None
    return flagged


# --------------------------------------------------------------------------- results


@dataclass
class SyncEvent:
    """One offending call. ``stack`` is set on the first occurrence of each
    (detector, name, range) only, to keep the detector callbacks cheap."""

    detector: str
    name: str
    range: str | None
    stack: str | None = None


@dataclass(frozen=True)
class SyncGroup:
    detector: str
    name: str
    range: str | None
    count: int
    stack: str | None


def summarize(events: Iterable[SyncEvent]) -> list[SyncGroup]:
    """Group events by (detector, name, range), in order of first occurrence, with counts and
    the stack of the first occurrence that has one."""
    counts: dict[tuple, int] = {}
    stacks: dict[tuple, str | None] = {}
    for e in events:
        key = (e.detector, e.name, e.range)
        counts[key] = counts.get(key, 0) + 1
        if stacks.get(key) is None:
            stacks[key] = e.stack
    return [SyncGroup(*key, count=n, stack=stacks[key]) for key, n in counts.items()]


def format_sync_report(
    events: Iterable[SyncEvent], detectors: Iterable[str] = (), *, title: str = "no_device_sync"
) -> str:
    """Human-readable list of offending calls, one group per (detector, name, range)."""
    events = list(events)
    detectors = tuple(detectors)
    ran = ", ".join(detectors) if detectors else "none"
    lines = [f"{title}: {len(events)} synchronizing call(s) (detectors that ran: {ran})"]
    for g in summarize(events):
        lines.append(f"  [{g.detector}] {g.name} x{g.count} in {g.range or NO_RANGE}")
        if g.stack:
            lines.append("    first occurrence:")
            lines.extend("      " + ln for ln in g.stack.rstrip("\n").splitlines())
    return "\n".join(lines)


class DeviceSyncError(AssertionError):
    """A region that must not synchronize with the device did.

    ``events``: every offending call (:class:`SyncEvent`); ``detectors``: the detectors that
    ran. The message lists each (detector, call, range) with its count and the Python stack
    of its first occurrence.
    """

    def __init__(self, events: Iterable[SyncEvent], detectors: Iterable[str] = ()):
        self.events = list(events)
        self.detectors = tuple(detectors)
        super().__init__(format_sync_report(self.events, self.detectors))


class DetectorUnavailable(RuntimeError):
    """A requested detector cannot run here (missing package, no GPU, CUPTI taken)."""


# --------------------------------------------------------------------------- stacks

_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_WARNINGS_FILE = warnings.__file__
_MACHINERY_CODES: set = set()  # filled at the bottom of this module
_machinery_dirs: list[str] = []  # a cupti package directory, once imported


def _is_machinery(frame) -> bool:
    code = frame.f_code
    if code in _MACHINERY_CODES:
        return True
    filename = code.co_filename
    if filename == _WARNINGS_FILE:
        return True
    # torch's CallbackRegistry.fire_callbacks, between the C++ trace hook and our callback.
    if code.co_name == "fire_callbacks" and filename.startswith(_TORCH_DIR):
        return True
    return any(filename.startswith(d) for d in _machinery_dirs)


def _caller_frame():
    """Innermost frame that is not detector machinery (our hooks, warnings, trampolines)."""
    frame = sys._getframe(1)
    while frame is not None and _is_machinery(frame):
        frame = frame.f_back
    return frame


def _format_stack(frame) -> str | None:
    if frame is None:
        return None
    thread = threading.current_thread().name
    entries = traceback.format_list(traceback.extract_stack(frame, limit=STACK_FRAMES))
    return f"(thread {thread})\n" + "".join(entries)


def _code_location(frame) -> str:
    """Source of the innermost frame outside torch, e.g. ``t.sum().item()``."""
    while frame is not None and frame.f_code.co_filename.startswith(_TORCH_DIR):
        frame = frame.f_back
    if frame is None:
        return "<unknown location>"
    filename, lineno = frame.f_code.co_filename, frame.f_lineno
    code = linecache.getline(filename, lineno).strip()
    if not code:
        return f"{os.path.basename(filename)}:{lineno}"
    return code if len(code) <= 60 else code[:57] + "..."


# --------------------------------------------------------------------------- recorder


class SyncRecorder:
    """What :func:`record_device_syncs` yields.

    ``detectors``: the detectors that ran; ``unavailable``: detector -> reason for those that
    were skipped (``"auto"`` only); ``events``: every offending call, in order.
    """

    def __init__(self, requested: tuple[str, ...]):
        self.requested = requested
        self.detectors: tuple[str, ...] = ()
        self.unavailable: dict[str, str] = {}
        self.events: list[SyncEvent] = []
        self._seen: set[tuple] = set()

    def _record(self, detector: str, name: str, frame=None) -> None:
        rng = ranges.current_range()
        key = (detector, name, rng)
        stack = None
        if key not in self._seen:
            self._seen.add(key)
            stack = _format_stack(frame if frame is not None else _caller_frame())
        self.events.append(SyncEvent(detector, name, rng, stack))

    def summary(self) -> list[SyncGroup]:
        return summarize(self.events)

    def count(self, detector: str | None = None, name: str | None = None) -> int:
        return sum(
            1
            for e in self.events
            if (detector is None or e.detector == detector) and (name is None or e.name == name)
        )

    def names(self, detector: str | None = None) -> list[str]:
        """Distinct call names seen, in order of first occurrence."""
        seen: dict[str, None] = {}
        for e in self.events:
            if detector is None or e.detector == detector:
                seen.setdefault(e.name)
        return list(seen)

    def report(self) -> str:
        return format_sync_report(self.events, self.detectors, title="record_device_syncs")

    def pause(self) -> None:
        """Stop watching until ``resume()``: the detectors stay installed but see nothing (a
        caller that judges only some phases pays the detectors' cost in those alone: torch's
        sync-debug checks are switched off, and CUPTI's driver domain too where it watches
        the whole domain; where it watches the sync calls alone, their rare callbacks are
        dropped)."""
        for name in self.detectors:
            _HUBS[name].pause()

    def resume(self) -> None:
        for name in self.detectors:
            _HUBS[name].resume()

    def __repr__(self) -> str:
        return (
            f"SyncRecorder(detectors={self.detectors}, events={len(self.events)}, "
            f"unavailable={self.unavailable})"
        )


# --------------------------------------------------------------------------- detectors


def _cuda_available() -> bool:
    return torch.cuda.is_available()


class _Hub:
    """One process-wide installation shared by the active recorders of a detector."""

    name = ""

    def __init__(self):
        self._lock = threading.Lock()
        self._recorders: list[SyncRecorder] = []

    def acquire(self, recorder: SyncRecorder) -> None:
        with self._lock:
            if not self._recorders:
                self._install()
            self._recorders.append(recorder)

    def release(self, recorder: SyncRecorder) -> None:
        with self._lock:
            self._recorders.remove(recorder)
            if not self._recorders:
                self._uninstall()

    @property
    def active(self) -> bool:
        return bool(self._recorders)

    paused = False

    def pause(self) -> None:
        if self.active and not self.paused:
            self.paused = True
            self._pause()

    def resume(self) -> None:
        if self.active and self.paused:
            self.paused = False
            self._resume()

    def _pause(self) -> None:
        pass

    def _resume(self) -> None:
        pass

    def _dispatch(self, name: str, frame=None) -> None:
        if self.paused:
            return
        if frame is None:
            frame = _caller_frame()
        for recorder in tuple(self._recorders):
            recorder._record(self.name, name, frame)

    def _install(self) -> None:
        raise NotImplementedError

    def _uninstall(self) -> None:
        raise NotImplementedError


_gpu_trace_active = False


def _activate_gpu_trace() -> None:
    # Once per process: it cannot be deactivated, and torch ignores a second call anyway.
    global _gpu_trace_active
    if not _gpu_trace_active:
        torch._C._activate_gpu_trace()
        _gpu_trace_active = True


class _TorchHub(_Hub):
    name = "torch"

    def __init__(self):
        super().__init__()
        self._prev_mode = None
        self._warnings_cm = None
        self._prev_showwarning = None
        self._trace_callbacks: list[tuple[object, Callable]] = []
        self.trace_error: str | None = None

    @staticmethod
    def unavailable_reason(probe: bool = True) -> str | None:
        if not _cuda_available():
            return "torch.cuda.is_available() is False (CPU-only torch build, or no GPU/driver)"
        if not hasattr(torch.cuda, "set_sync_debug_mode"):
            return f"torch {torch.__version__} has no torch.cuda.set_sync_debug_mode"
        return None

    def _install(self) -> None:
        self._prev_mode = torch.cuda.get_sync_debug_mode()
        cm = warnings.catch_warnings()
        cm.__enter__()
        try:
            # "always": the default filter shows a warning once per code location, and the
            # point is to count every call, including repeats of the same line.
            warnings.filterwarnings("always", message=".*" + re.escape(TORCH_SYNC_MESSAGE))
            self._prev_showwarning = warnings.showwarning
            warnings.showwarning = self._showwarning
            self._register_trace_callbacks()
            # "warn", not "error": an error would stop the body at the first sync, so the
            # report would list one call and hide the rest (and the body's later work would
            # not run). With "warn" the body runs to the end and every call is listed.
            torch.cuda.set_sync_debug_mode("warn")
        except BaseException:
            self._unregister_trace_callbacks()
            cm.__exit__(None, None, None)
            raise
        self._warnings_cm = cm

    def _pause(self) -> None:
        torch.cuda.set_sync_debug_mode(0)

    def _resume(self) -> None:
        torch.cuda.set_sync_debug_mode("warn")

    def _uninstall(self) -> None:
        self.paused = False
        try:
            torch.cuda.set_sync_debug_mode(self._prev_mode)
        finally:
            self._unregister_trace_callbacks()
            cm, self._warnings_cm = self._warnings_cm, None
            if cm is not None:
                cm.__exit__(None, None, None)

    def _showwarning(self, message, category, filename, lineno, file=None, line=None):
        if TORCH_SYNC_MESSAGE in str(message):
            frame = _caller_frame()
            self._dispatch(f"sync_debug: {_code_location(frame)}", frame)
            return
        self._prev_showwarning(message, category, filename, lineno, file, line)

    # torch's GPU trace fires these from C++ on the calling thread, before the CUDA call.
    def _on_device_sync(self) -> None:
        self._dispatch("device_synchronize")

    def _on_stream_sync(self, stream: int) -> None:
        self._dispatch("stream_synchronize")

    def _on_event_sync(self, event: int) -> None:
        self._dispatch("event_synchronize")

    def _register_trace_callbacks(self) -> None:
        try:
            from torch.cuda import _gpu_trace

            pairs = [
                (_gpu_trace.DeviceSynchronizationCallbacks, self._on_device_sync),
                (_gpu_trace.StreamSynchronizationCallbacks, self._on_stream_sync),
                (_gpu_trace.EventSynchronizationCallbacks, self._on_event_sync),
            ]
            _activate_gpu_trace()
        except (ImportError, AttributeError) as e:
            # The sync debug mode still works; only synchronize() calls go unseen.
            self.trace_error = f"torch GPU trace unavailable: {e}"
            return
        for registry, cb in pairs:
            registry.add_callback(cb)
            self._trace_callbacks.append((registry, cb))

    def _unregister_trace_callbacks(self) -> None:
        while self._trace_callbacks:
            registry, cb = self._trace_callbacks.pop()
            with contextlib.suppress(ValueError):
                registry.callback_list.remove(cb)


_cupti_module = None


def _import_cupti():
    """``cupti.cupti`` from cupti-python, or raise ImportError."""
    global _cupti_module
    if _cupti_module is None:
        from cupti import cupti

        _cupti_module = cupti
        # A pure-Python trampoline in the package (if any) is machinery, not the caller.
        pkg_dir = os.path.dirname(getattr(cupti, "__file__", "") or "")
        if pkg_dir:
            _machinery_dirs.append(pkg_dir + os.sep)
    return _cupti_module


def _cupti_failure(action: str, e: BaseException) -> str:
    text = f"{type(e).__name__}: {e}"
    if "MULTIPLE_SUBSCRIBERS" in text.upper():
        return (
            f"{action} failed: another CUPTI client (nsys, ncu, torch.profiler/Kineto, or "
            f"another CUPTI subscriber in this process) is attached; CUPTI allows one "
            f"subscriber per process ({text})"
        )
    if "NOT_SUPPORTED" in text.upper() or "NOTSUPPORTED" in text.upper():
        return f"{action} failed: CUPTI is not supported here (no CUDA driver or GPU?) ({text})"
    return f"{action} failed: {text}"


def _noop_callback(*args) -> None:
    pass


def _sync_callback_ids(cupti) -> list[int]:
    """CUPTI's driver callback ids of every call ``is_sync_api`` flags (empty where the
    ``driver_api_trace_cbid`` table is missing)."""
    table = getattr(cupti, "driver_api_trace_cbid", None)
    members = getattr(table, "__members__", {}) if table is not None else {}
    return sorted({int(m) for name, m in members.items() if is_sync_api(name)})


class _CuptiHub(_Hub):
    name = "cupti"
    #: only the sync calls are subscribed (see _install)
    selective = False

    def __init__(self):
        super().__init__()
        self._handle = None
        self._enter = None
        self._enter_value = 0

    @staticmethod
    def unavailable_reason(probe: bool = True) -> str | None:
        """``probe``: also try a subscription, the only way to know whether another CUPTI
        client holds it. Without it a taken CUPTI shows up when the detector starts."""
        try:
            _import_cupti()
        except ImportError as e:
            return f"cupti-python is not installed (pip install cupti-python): {e}"
        except Exception as e:  # e.g. a libcupti that does not match the driver
            return f"cupti-python failed to import: {type(e).__name__}: {e}"
        if not _cuda_available():
            return "no CUDA device (torch.cuda.is_available() is False)"
        if not probe or _CUPTI_HUB.active:
            return None  # when active, it is our own subscription: nested recorders share it
        cupti = _import_cupti()
        try:
            handle = cupti.subscribe(_noop_callback, None)
        except Exception as e:
            return _cupti_failure("cupti.subscribe", e)
        cupti.unsubscribe(handle)
        return None

    def _install(self) -> None:
        try:
            cupti = _import_cupti()
        except ImportError as e:
            raise DetectorUnavailable(f"cupti: cupti-python is not installed: {e}") from e
        # cupti-python 13.0 names, as in NVIDIA's samples: ApiCallbackSite.API_ENTER and
        # CallbackDomain.DRIVER_API. The fallbacks are the C enum values (CUPTI_API_ENTER = 0,
        # CUPTI_CB_DOMAIN_DRIVER_API = 1) in case a release renames the Python enums.
        site = getattr(cupti, "ApiCallbackSite", None)
        self._enter = getattr(site, "API_ENTER", 0)
        self._enter_value = int(getattr(self._enter, "value", self._enter))
        domain = getattr(getattr(cupti, "CallbackDomain", None), "DRIVER_API", 1)
        try:
            handle = cupti.subscribe(self._callback, None)
        except Exception as e:
            raise DetectorUnavailable("cupti: " + _cupti_failure("cupti.subscribe", e)) from e
        # Only the driver calls that can wait are subscribed, one callback id each: every
        # other call (kernel and graph launches, async copies) then runs with no callback at
        # all, so the detector can stay on for a soak. Where the release has no callback id
        # table, the whole driver domain is subscribed and the callback filters by name.
        enabled = 0
        for cbid in _sync_callback_ids(cupti):
            try:
                cupti.enable_callback(1, handle, domain, cbid)
                enabled += 1
            except Exception:  # noqa: BLE001 - an id this driver lacks: the domain below
                enabled = 0
                break
        if not enabled:
            try:
                cupti.enable_domain(1, handle, domain)
            except Exception as e:
                cupti.unsubscribe(handle)
                raise DetectorUnavailable(
                    "cupti: " + _cupti_failure("cupti.enable_domain(DRIVER_API)", e)
                ) from e
        self._handle = handle
        self._domain = domain
        self.selective = bool(enabled)

    def _pause(self) -> None:
        # With the sync calls alone subscribed, a pause costs nothing: a callback that fires
        # while paused is dropped by _dispatch. Otherwise the whole driver domain is switched
        # off: no callback at all, not a callback that returns.
        if not self.selective:
            _import_cupti().enable_domain(0, self._handle, self._domain)

    def _resume(self) -> None:
        if not self.selective:
            _import_cupti().enable_domain(1, self._handle, self._domain)

    def _uninstall(self) -> None:
        self.paused = False
        handle, self._handle = self._handle, None
        if handle is not None:
            _import_cupti().unsubscribe(handle)

    def _callback(self, userdata, domain, callback_id, cbdata) -> None:
        # Runs on every driver API entry and exit of every thread while subscribed: only the
        # site check and a cached name lookup on the common path.
        site = cbdata.callback_site
        if site != self._enter and getattr(site, "value", site) != self._enter_value:
            return
        name = cbdata.function_name
        if isinstance(name, bytes):
            name = name.decode()
        if is_sync_api(name):
            self._dispatch(name)


_TORCH_HUB = _TorchHub()
_CUPTI_HUB = _CuptiHub()
# name -> hub; tests swap in fakes. A hub has unavailable_reason(probe), acquire(recorder)
# and release(recorder).
_HUBS: dict[str, _Hub] = {"torch": _TORCH_HUB, "cupti": _CUPTI_HUB}


def available_detectors() -> dict[str, str | None]:
    """Detector name -> ``None`` if it can run now, else the reason it cannot."""
    return {name: hub.unavailable_reason() for name, hub in _HUBS.items()}


def parse_detectors(spec) -> str | tuple[str, ...]:
    """Normalise a detector choice, in any spelling the CLI, scenario files and the Python
    API accept: ``"auto"``; ``"none"``, ``""`` or an empty sequence (no detector); a name
    (``"torch"``); a comma-separated list (``"torch,cupti"``); or a sequence of names.
    Returns ``"auto"`` or a tuple of distinct names; ``ValueError`` names a bad one."""
    if spec is None or (isinstance(spec, str) and spec.strip() in ("none", "")):
        return ()
    if isinstance(spec, str):
        if spec.strip() == "auto":
            return "auto"
        names = [part.strip() for part in spec.split(",") if part.strip()]
    else:
        try:
            names = list(spec)
        except TypeError:
            raise ValueError(f"detectors must be a string or a sequence, got {spec!r}") from None
    for name in names:
        if not isinstance(name, str) or name not in DETECTORS:
            raise ValueError(
                f"unknown detector {name!r}: use auto, none, or names among "
                f"{', '.join(DETECTORS)} (e.g. 'torch,cupti')"
            )
    return tuple(dict.fromkeys(names))


def _parse_detectors(detectors) -> tuple[tuple[str, ...], bool]:
    if isinstance(detectors, str):
        if detectors == "auto":
            return tuple(_HUBS), True
        detectors = (detectors,)
    names = tuple(detectors)
    unknown = [n for n in names if n not in _HUBS]
    if unknown:
        raise ValueError(f"unknown detector(s) {unknown}; known: {list(_HUBS)} or 'auto'")
    return tuple(dict.fromkeys(names)), False


@contextlib.contextmanager
def record_device_syncs(detectors="auto") -> Iterator[SyncRecorder]:
    """Record every synchronizing call made while the body runs; never raises on syncs.

    ``detectors``: ``"auto"`` (every detector that can run here; check ``.detectors`` for
    which did), one name, or a sequence of names. A named detector that cannot run raises
    :class:`DetectorUnavailable` before the body runs.
    """
    names, auto = _parse_detectors(detectors)
    recorder = SyncRecorder(names)
    # Cheap checks only (package, device): a subscription that is taken surfaces when the
    # detector starts, which saves a trial subscribe on every call.
    if not auto:
        reasons = {
            n: r for n in names if (r := _HUBS[n].unavailable_reason(probe=False)) is not None
        }
        if reasons:
            raise DetectorUnavailable(
                "requested detector(s) cannot run: "
                + "; ".join(f"{n}: {r}" for n, r in reasons.items())
            )
    started: list[str] = []
    try:
        for name in names:
            hub = _HUBS[name]
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
            started.append(name)
        recorder.detectors = tuple(started)
        yield recorder
    finally:
        for name in reversed(started):
            _HUBS[name].release(recorder)


def _is_torch_sync_error(exc: BaseException) -> bool:
    return isinstance(exc, RuntimeError) and TORCH_SYNC_MESSAGE in str(exc)


def _event_from_torch_error(exc: BaseException) -> SyncEvent:
    tb = traceback.extract_tb(exc.__traceback__)
    where = f"{os.path.basename(tb[-1].filename)}:{tb[-1].lineno}" if tb else "?"
    for entry in reversed(tb):  # innermost frame outside torch names the call
        if not entry.filename.startswith(_TORCH_DIR) and entry.line:
            where = entry.line.strip()
            break
    stack = "".join(traceback.format_list(tb[-STACK_FRAMES:])) if tb else None
    return SyncEvent(
        "torch", f"sync_debug error: {where}", getattr(exc, "pagegraph_range", None), stack
    )


@contextlib.contextmanager
def no_device_sync(detectors=DETECTORS, *, allow: Iterable[str] = ()) -> Iterator[SyncRecorder]:
    """Assert that the body makes no synchronizing call; yields the recorder.

    On normal exit, raises :class:`DeviceSyncError` listing every offending call (so the body
    runs to its end and all of them are reported, not just the first). ``allow``: glob
    patterns of call names that are tolerated (``"cuMemFree*"``). If the body raises, its
    exception propagates unchanged (a note lists the syncs seen, on Python 3.11+), except
    torch's sync-debug ``RuntimeError``, which becomes a :class:`DeviceSyncError`.

    ``detectors="auto"`` uses whatever can run here, but raises :class:`DetectorUnavailable`
    when nothing can: an assertion that checked nothing must not pass.
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
            if _is_torch_sync_error(e):
                events = offending(recorder.events) + [_event_from_torch_error(e)]
                raise DeviceSyncError(events, recorder.detectors) from e
            seen = offending(recorder.events)
            if seen and hasattr(e, "add_note"):
                e.add_note(format_sync_report(seen, recorder.detectors, title="while raising"))
            raise
    events = offending(recorder.events)
    if events:
        raise DeviceSyncError(events, recorder.detectors)


# --------------------------------------------------------------------------- planted syncs


def _no_requirement() -> str | None:
    return None


def _cuda_python_reason() -> str | None:
    try:
        from cuda.bindings import driver  # noqa: F401
    except ImportError as e:
        return f"cuda-python is not installed (pip install cuda-python): {e}"
    return None


@dataclass(frozen=True)
class PlantedSync:
    """A known sync (or a known clean operation) for checking the detectors.

    Calling it with a device prepares and runs it; :meth:`prepare` splits the two so that
    set-up (allocation, warm-up, graph capture, which do sync) stays outside the recording.
    ``expected``: detectors that should catch it; empty means it must stay silent.
    """

    name: str
    description: str
    expected: frozenset
    setup: Callable[[torch.device], Callable[[], object]] = field(repr=False)
    requires: Callable[[], str | None] = field(default=_no_requirement, repr=False)

    def unavailable_reason(self) -> str | None:
        return self.requires()

    def prepare(self, device="cuda") -> Callable[[], object]:
        """Set up on ``device`` (then wait for the device); return the planted action."""
        reason = self.requires()
        if reason is not None:
            raise RuntimeError(f"planted sync {self.name!r} cannot run: {reason}")
        action = self.setup(torch.device(device))
        torch.cuda.synchronize(device)
        return action

    def __call__(self, device="cuda") -> None:
        self.prepare(device)()


def _vec(device: torch.device) -> torch.Tensor:
    t = torch.arange(1, 65, dtype=torch.float32, device=device)
    t.sum()  # warm up the reduction's module load outside the recording
    t.add_(0)
    return t


def _setup_item(device):
    t = _vec(device)

    def run():
        with ranges.phase("replay", bs=1):
            return t.sum().item()

    return run


def _setup_bool(device):
    t = _vec(device)

    def run():
        with ranges.phase("replay", bs=1):
            return bool(t.sum() > 0)

    return run


def _setup_cpu(device):
    t = _vec(device)

    def run():
        with ranges.phase("replay", bs=1):
            return t.cpu()

    return run


def _setup_tolist(device):
    t = _vec(device)

    def run():
        with ranges.phase("replay", bs=1):
            return t.tolist()

    return run


def _setup_copy_to_host(device):
    t = _vec(device)
    host = torch.empty(t.shape, dtype=t.dtype)

    def run():
        with ranges.phase("replay", bs=1):
            host.copy_(t)

    return run


def _setup_nonblocking_pageable(device):
    t = _vec(device)
    host = torch.empty(t.shape, dtype=t.dtype)  # pageable: not pin_memory()
    assert not host.is_pinned()

    def run():
        with ranges.phase("replay", bs=1):
            # non_blocking only helps with pinned memory: into pageable memory the driver
            # stages the copy and returns once it is done, and torch calls no sync for it.
            host.copy_(t, non_blocking=True)

    return run


def _setup_cuda_synchronize(device):
    t = _vec(device)

    def run():
        with ranges.phase("replay", bs=1):
            t.add_(1)
            torch.cuda.synchronize(device)

    return run


def _setup_event_synchronize(device):
    t = _vec(device)
    event = torch.cuda.Event()

    def run():
        with ranges.phase("replay", bs=1):
            t.add_(1)
            event.record()
            event.synchronize()

    return run


def _setup_stream_synchronize(device):
    t = _vec(device)

    def run():
        with ranges.phase("replay", bs=1):
            t.add_(1)
            torch.cuda.current_stream(device).synchronize()

    return run


def _setup_cu_stream_synchronize(device):
    from cuda.bindings import driver

    t = _vec(device)

    def run():
        with ranges.phase("replay", bs=1):
            t.add_(1)
            stream = driver.CUstream(torch.cuda.current_stream(device).cuda_stream)
            (err,) = driver.cuStreamSynchronize(stream)
            if err != driver.CUresult.CUDA_SUCCESS:
                raise RuntimeError(f"cuStreamSynchronize failed: {err}")

    return run


def _setup_clean(device):
    t = _vec(device)
    t.mul_(1)

    def run():
        with ranges.phase("replay", bs=1):
            t.add_(1)
            t.mul_(1)

    return run


def _setup_clean_graph_replay(device):
    static = torch.zeros(64, dtype=torch.float32, device=device)
    # Warm up on a side stream, then capture: the capture itself synchronizes (torch.cuda.graph
    # calls synchronize() around it), which is why it happens here, outside the recording.
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(3):
            static.add_(1)
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static.add_(1)
    graph.replay()

    def run():
        with ranges.phase("replay", bs=1):
            graph.replay()

    run.graph = graph  # keeps the graph (and its pool) alive as long as the action
    run.static = static
    return run


_BOTH = frozenset({"torch", "cupti"})
_CUPTI_ONLY = frozenset({"cupti"})
_NONE = frozenset()

_PLANTED = {
    p.name: p
    for p in (
        PlantedSync("item", "t.sum().item()", _BOTH, _setup_item),
        PlantedSync("bool", "bool(t.sum() > 0)", _BOTH, _setup_bool),
        PlantedSync("cpu", "t.cpu()", _BOTH, _setup_cpu),
        PlantedSync("tolist", "t.tolist()", _BOTH, _setup_tolist),
        PlantedSync("copy_to_host", "host.copy_(t)", _BOTH, _setup_copy_to_host),
        PlantedSync(
            "nonblocking_pageable",
            "host_pageable.copy_(t, non_blocking=True)",
            _CUPTI_ONLY,
            _setup_nonblocking_pageable,
        ),
        PlantedSync("cuda_synchronize", "torch.cuda.synchronize()", _BOTH, _setup_cuda_synchronize),
        PlantedSync(
            "event_synchronize",
            "event.record(); event.synchronize()",
            _BOTH,
            _setup_event_synchronize,
        ),
        PlantedSync(
            "stream_synchronize",
            "torch.cuda.current_stream().synchronize()",
            _BOTH,
            _setup_stream_synchronize,
        ),
        PlantedSync(
            "cu_stream_synchronize",
            "cuda.bindings.driver.cuStreamSynchronize(current stream)",
            _CUPTI_ONLY,
            _setup_cu_stream_synchronize,
            requires=_cuda_python_reason,
        ),
        PlantedSync("clean", "t.add_(1); t.mul_(1) (no sync)", _NONE, _setup_clean),
        PlantedSync(
            "clean_graph_replay",
            "graph.replay() of a captured t.add_(1) (no sync)",
            _NONE,
            _setup_clean_graph_replay,
        ),
    )
}


def planted_syncs() -> dict[str, PlantedSync]:
    """Name -> planted sync; each is ``callable(device)`` and does its device work inside
    ``phase("replay", bs=1)``. ``clean`` and ``clean_graph_replay`` must stay silent."""
    return dict(_PLANTED)


def detector_matrix(device="cuda") -> list[dict]:
    """Run every planted sync under each detector alone; one row per (planted, detector).

    Row keys: ``planted``, ``detector``, ``status`` (``"caught"``, ``"missed"``, ``"n/a"``
    or ``"error"``), ``names`` (distinct call names recorded), ``count``, ``expected``
    (whether the detector should catch it), ``reason`` (for n/a and error).
    """
    available = available_detectors()
    rows = []
    for planted in planted_syncs().values():
        planted_reason = planted.unavailable_reason()
        for det in _HUBS:
            row = {
                "planted": planted.name,
                "detector": det,
                "status": "n/a",
                "names": [],
                "count": 0,
                "expected": det in planted.expected,
                "reason": available.get(det) or planted_reason,
            }
            if row["reason"] is None:
                try:
                    action = planted.prepare(device)
                    with record_device_syncs((det,)) as recorder:
                        action()
                except Exception as e:
                    row.update(status="error", reason=f"{type(e).__name__}: {e}")
                else:
                    row.update(
                        status="caught" if recorder.events else "missed",
                        names=recorder.names(),
                        count=len(recorder.events),
                    )
            rows.append(row)
    return rows


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def format_detector_matrix(rows: Iterable[dict]) -> str:
    """Markdown table: one row per planted sync, one column per detector.

    A cell that contradicts the expectation is marked ``(unexpected)``.
    """
    rows = list(rows)
    detectors = list(dict.fromkeys(r["detector"] for r in rows))
    planted = list(dict.fromkeys(r["planted"] for r in rows))
    cells = {(r["planted"], r["detector"]): r for r in rows}
    expected: dict[str, list[str]] = {p: [] for p in planted}
    for r in rows:
        if r["expected"]:
            expected[r["planted"]].append(r["detector"])
    header = ["planted sync", *detectors, "expected to catch it"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for p in planted:
        line = [f"`{p}`"]
        for det in detectors:
            r = cells.get((p, det))
            if r is None:
                line.append("")
                continue
            if r["status"] == "caught":
                cell = f"caught ({', '.join(r['names'])})"
            elif r["status"] == "missed":
                cell = "missed"
            else:
                cell = f"{r['status']}: {r['reason']}"
            if r["status"] in ("caught", "missed") and (r["status"] == "caught") != r["expected"]:
                cell += " **(unexpected)**"
            line.append(_md(cell))
        line.append(", ".join(expected[p]) or "none (must stay silent)")
        lines.append("| " + " | ".join(line) + " |")
    return "\n".join(lines)


# Frames of these functions are detector machinery: left out of reported stacks.
_MACHINERY_CODES.update(
    f.__code__
    for f in (
        _caller_frame,
        _Hub._dispatch,
        SyncRecorder._record,
        _TorchHub._showwarning,
        _TorchHub._on_device_sync,
        _TorchHub._on_stream_sync,
        _TorchHub._on_event_sync,
        _CuptiHub._callback,
    )
)
