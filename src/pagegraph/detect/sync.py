"""Sync detectors: prove that a region of host code never waits on the device.

Three detectors look at a region: ``"torch"`` (torch's sync-debug mode and GPU trace
callbacks), ``"cupti"`` (a CUPTI subscriber that sees every synchronizing driver call) and
``"cpu"`` (torch's dispatch and function modes, on any machine). ``record_device_syncs``
records each offending call as a ``SyncEvent`` with its innermost range; ``no_device_sync``
raises ``DeviceSyncError``; a detector that cannot run raises ``DetectorUnavailable`` first.
This module gathers the public names (docs/ARCHITECTURE.md, "Sync detectors, ranges and traces").
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
