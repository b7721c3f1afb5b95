"""The ``"cupti"`` detector: a CUPTI callback subscriber on the driver API (``cupti-python``).

It sees every synchronizing driver call whoever makes it (torch, Triton's launcher, other
libraries, direct driver calls), as :func:`~pagegraph.detect.sync_calls.is_forbidden_api`
classifies them. CUPTI allows one subscriber per process, so it cannot run while nsys, ncu
or torch.profiler is attached; the subscription is released on uninstall.
"""

from __future__ import annotations

import os
from typing import Any

from . import sync_hub
from .sync_calls import is_forbidden_api
from .sync_events import DetectorUnavailable
from .sync_hub import Hub
from .sync_stacks import add_machinery, add_machinery_dir

__all__ = ["CuptiHub", "import_cupti", "sync_callback_ids"]

_cupti_module: Any = None


def import_cupti() -> Any:
    """``cupti.cupti`` from cupti-python, or raise ImportError."""
    global _cupti_module
    if _cupti_module is None:
        from cupti import cupti

        _cupti_module = cupti
        # A pure-Python trampoline in the package (if any) is machinery, not the caller.
        pkg_dir = os.path.dirname(getattr(cupti, "__file__", "") or "")
        if pkg_dir:
            add_machinery_dir(pkg_dir)
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


def _noop_callback(*args: object) -> None:
    pass


def sync_callback_ids(cupti: Any) -> list[int]:
    """CUPTI's driver callback ids of every call ``is_forbidden_api`` flags (empty where the
    ``driver_api_trace_cbid`` table is missing)."""
    table: Any = getattr(cupti, "driver_api_trace_cbid", None)
    members = getattr(table, "__members__", {}) if table is not None else {}
    return sorted({int(m) for name, m in members.items() if is_forbidden_api(name)})


class CuptiHub(Hub):
    name = "cupti"
    #: only the sync calls are subscribed (see _install)
    selective = False

    def __init__(self) -> None:
        super().__init__()
        self._handle: Any = None
        self._enter: Any = None
        self._enter_value = 0

    def unavailable_reason(self, probe: bool = True) -> str | None:
        """``probe``: also try a subscription, the only way to know whether another CUPTI
        client holds it. Without it a taken CUPTI shows up when the detector starts."""
        try:
            cupti = import_cupti()
        except ImportError as e:
            return f"cupti-python is not installed (pip install cupti-python): {e}"
        except Exception as e:  # e.g. a libcupti that does not match the driver
            return f"cupti-python failed to import: {type(e).__name__}: {e}"
        if not sync_hub.cuda_available():
            return "no CUDA device (torch.cuda.is_available() is False)"
        if not probe or self.active:
            return None  # when active, it is our own subscription: nested recorders share it
        try:
            handle = cupti.subscribe(_noop_callback, None)
        except Exception as e:
            return _cupti_failure("cupti.subscribe", e)
        cupti.unsubscribe(handle)
        return None

    def _install(self) -> None:
        try:
            cupti = import_cupti()
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
        enabled = self._enable_sync_callbacks(cupti, handle, domain)
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

    @staticmethod
    def _enable_sync_callbacks(cupti: Any, handle: Any, domain: Any) -> int:
        """Subscribe the driver calls that can wait, one callback id each; how many (0: the
        caller subscribes the whole domain).

        Every other call (kernel and graph launches, async copies) then runs with no callback
        at all, so the detector can stay on for a soak. Where the release has no callback id
        table, or lacks one of the ids, the whole driver domain is subscribed instead and the
        callback filters by name.
        """
        enabled = 0
        for cbid in sync_callback_ids(cupti):
            try:
                cupti.enable_callback(1, handle, domain, cbid)
                enabled += 1
            except Exception:  # noqa: BLE001 - an id this driver lacks: the whole domain
                return 0
        return enabled

    def _pause(self) -> None:
        # With the sync calls alone subscribed, a pause costs nothing: a callback that fires
        # while paused is dropped by _dispatch. Otherwise the whole driver domain is switched
        # off: no callback at all, not a callback that returns.
        if not self.selective:
            import_cupti().enable_domain(0, self._handle, self._domain)

    def _resume(self) -> None:
        if not self.selective:
            import_cupti().enable_domain(1, self._handle, self._domain)

    def _uninstall(self) -> None:
        self.paused = False
        handle, self._handle = self._handle, None
        if handle is not None:
            import_cupti().unsubscribe(handle)

    def _callback(self, userdata: Any, domain: Any, callback_id: Any, cbdata: Any) -> None:
        # Runs on every driver API entry and exit of every thread while subscribed: only the
        # site check and a cached name lookup on the common path.
        site = cbdata.callback_site
        if site != self._enter and getattr(site, "value", site) != self._enter_value:
            return
        name = cbdata.function_name
        if isinstance(name, bytes):
            name = name.decode()
        if is_forbidden_api(name):
            self._dispatch(name)


add_machinery(CuptiHub._callback)
