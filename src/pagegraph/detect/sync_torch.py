"""The ``"torch"`` detector: torch's sync-debug mode plus its GPU trace callbacks, which see the
``torch.cuda.synchronize()``, ``Event.synchronize()`` and ``Stream.synchronize()`` calls the
debug mode misses.

While installed it sets the sync debug mode and the ``warnings`` filters (restored on
uninstall); the first installation also activates torch's GPU trace, which cannot be turned
off again (afterwards torch calls into Python on every CUDA event, stream and allocation).
"""

from __future__ import annotations

import contextlib
import re
import warnings
from collections.abc import Callable
from typing import Any, TextIO

import torch

from . import sync_hub
from .sync_hub import Hub
from .sync_stacks import add_machinery, caller_frame, code_location

__all__ = ["TORCH_SYNC_MESSAGE", "TorchHub", "is_torch_sync_error"]

#: Text of torch's sync-debug warning (and of its error in "error" mode).
TORCH_SYNC_MESSAGE = "called a synchronizing CUDA operation"

_gpu_trace_active = False


def is_torch_sync_error(exc: BaseException) -> bool:
    """Whether ``exc`` is torch's sync-debug error (sync debug mode "error")."""
    return isinstance(exc, RuntimeError) and TORCH_SYNC_MESSAGE in str(exc)


def _activate_gpu_trace() -> None:
    # Once per process: it cannot be deactivated, and torch ignores a second call anyway.
    global _gpu_trace_active
    if not _gpu_trace_active:
        torch._C._activate_gpu_trace()
        _gpu_trace_active = True


class TorchHub(Hub):
    name = "torch"

    def __init__(self) -> None:
        super().__init__()
        self._prev_mode: Any = None
        self._warnings_cm: warnings.catch_warnings[None] | None = None
        self._prev_showwarning: Any = None
        self._trace_callbacks: list[tuple[Any, Callable[..., None]]] = []
        self.trace_error: str | None = None

    @staticmethod
    def unavailable_reason(probe: bool = True) -> str | None:
        if not sync_hub.cuda_available():
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

    def _showwarning(
        self,
        message: Warning | str,
        category: type[Warning],
        filename: str,
        lineno: int,
        file: TextIO | None = None,
        line: str | None = None,
    ) -> None:
        if TORCH_SYNC_MESSAGE in str(message):
            frame = caller_frame()
            self._dispatch(f"sync_debug: {code_location(frame)}", frame)
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

            pairs: list[tuple[Any, Callable[..., None]]] = [
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


add_machinery(
    TorchHub._showwarning,
    TorchHub._on_device_sync,
    TorchHub._on_stream_sync,
    TorchHub._on_event_sync,
)
