"""The one list of CUDA API calls that synchronize the host with the device, shared by the CUPTI
detector (driver names) and the trace analyzer (runtime and driver names as Nsight or Kineto
record them), so both flag the same calls.

``is_sync_api`` (the host waits for device work) and ``is_d2h_copy_api`` (device memory copied
to the host, async or not) are kept apart because the trace analyzer reports them as different
hazards; ``is_forbidden_api``, either one, is what the CUPTI detector reports.
"""

from __future__ import annotations

import re

__all__ = [
    "SYNC_API_NAMES",
    "api_base_name",
    "is_d2h_copy_api",
    "is_forbidden_api",
    "is_sync_api",
]

# ABI-version and per-thread-default-stream suffixes, in any order: _v2, _v3020, _ptds, _ptsz.
_API_SUFFIX = re.compile(r"(?:_v\d+|_ptsz|_ptds)+$")

#: Base names (lower case) of the calls that wait, beside the blocking copies (see below).
SYNC_API_NAMES = frozenset(
    name.lower()
    for name in (
        # Explicit waits: the host blocks until the device, context, stream or event is done.
        "cudaDeviceSynchronize",
        "cudaStreamSynchronize",
        "cudaEventSynchronize",
        "cudaThreadSynchronize",
        "cuCtxSynchronize",
        "cuStreamSynchronize",
        "cuEventSynchronize",
        # Freeing device or pinned memory implicitly synchronizes the device.
        "cudaFree",
        "cudaFreeHost",
        "cudaFreeArray",
        "cuMemFree",
        "cuMemFreeHost",
    )
)
# Not listed: the non-async memsets (cuMemsetD8/16/32, cuMemsetD2D*, cudaMemset). The CUDA
# API synchronization notes say they are asynchronous with respect to the host except when
# the target is pinned host memory or a Unified Memory region; the name cannot tell the
# target, and pagegraph's buffers are device memory. Their ordering on the legacy default
# stream is a device-side dependency, like a stream waiting on an event, not a host wait.
# Nor the *Query calls (cuStreamQuery, cuEventQuery): they poll and return at once.

_D2H_COPY_API = re.compile(r"cumemcpy(?:dtoh|atoh)(?:async)?")

_forbidden_cache: dict[str, bool] = {}


def api_base_name(name: str) -> str:
    """``cudaStreamSynchronize_v3020`` -> ``cudaStreamSynchronize`` (also ``_v2``, ``_ptsz``)."""
    return _API_SUFFIX.sub("", name.strip())


def is_sync_api(name: str) -> bool:
    """Whether a CUDA runtime or driver call (any case, any version suffix) makes the host
    wait on the device.

    Explicit synchronizations, frees, and every blocking copy (``cudaMemcpy*``/``cuMemcpy*``
    without ``Async``): they return only once the copy is done. An ``*Async`` copy is not
    listed: it blocks only as a device-to-host copy, which :func:`is_d2h_copy_api` flags.
    Kernel and graph launches never wait.
    """
    base = api_base_name(name).lower()
    if base in SYNC_API_NAMES:
        return True
    return base.startswith(("cudamemcpy", "cumemcpy")) and "async" not in base


def is_d2h_copy_api(name: str) -> bool:
    """Whether a driver call copies device (or array) memory to the host, async or not."""
    return _D2H_COPY_API.fullmatch(api_base_name(name).lower()) is not None


def is_forbidden_api(name: str) -> bool:
    """:func:`is_sync_api` or :func:`is_d2h_copy_api`: a wait, or a host read of device
    memory. Cached per name: the CUPTI detector asks it on every driver call it sees."""
    flagged = _forbidden_cache.get(name)
    if flagged is None:
        flagged = _forbidden_cache[name] = is_sync_api(name) or is_d2h_copy_api(name)
    return flagged
