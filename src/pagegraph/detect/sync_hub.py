"""The recorder a detector feeds, and the base of a detector's process-wide installation."""

from __future__ import annotations

import threading
from types import FrameType

import torch

from . import ranges
from .sync_events import SyncEvent, SyncGroup, format_sync_report, summarize
from .sync_stacks import add_machinery, caller_frame, format_stack

__all__ = ["Hub", "SyncRecorder", "cuda_available"]


def cuda_available() -> bool:
    """Called through the module (``sync_hub.cuda_available()``), so tests can fake it."""
    return torch.cuda.is_available()


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
        self._seen: set[tuple[str, str, str | None]] = set()
        #: detector name -> its hub, for those started for this recorder
        self._hubs: dict[str, Hub] = {}

    def _record(self, detector: str, name: str, frame: FrameType | None = None) -> None:
        rng = ranges.current_range()
        key = (detector, name, rng)
        stack = None
        if key not in self._seen:
            self._seen.add(key)
            stack = format_stack(frame if frame is not None else caller_frame())
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
            self._hubs[name].pause()

    def resume(self) -> None:
        for name in self.detectors:
            self._hubs[name].resume()

    def __repr__(self) -> str:
        return (
            f"SyncRecorder(detectors={self.detectors}, events={len(self.events)}, "
            f"unavailable={self.unavailable})"
        )


class Hub:
    """One process-wide installation shared by the active recorders of a detector.

    A hub has ``unavailable_reason(probe)``, ``acquire(recorder)`` and ``release(recorder)``;
    the first recorder installs it, the last one uninstalls it.
    """

    name = ""
    paused = False

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._recorders: list[SyncRecorder] = []

    def unavailable_reason(self, probe: bool = True) -> str | None:
        """Why this detector cannot run here, or None where it can (each detector's own)."""
        raise NotImplementedError

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

    def _dispatch(self, name: str, frame: FrameType | None = None) -> None:
        if self.paused:
            return
        if frame is None:
            frame = caller_frame()
        for recorder in tuple(self._recorders):
            recorder._record(self.name, name, frame)

    def _install(self) -> None:
        raise NotImplementedError

    def _uninstall(self) -> None:
        raise NotImplementedError


add_machinery(Hub._dispatch, SyncRecorder._record)
