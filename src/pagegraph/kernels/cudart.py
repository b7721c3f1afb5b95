"""CUDA runtime calls that torch's bindings do not offer, made through the ``libcudart`` this
process has loaded (torch's own, found in ``/proc/self/maps``; ``None`` where there is none,
and callers then fall back to torch): ``clear_last_error``, after a refused
``cudaHostRegister`` whose error the next launch would otherwise report as its own, and
``HostToDevice``, a non-blocking copy from page-locked memory without torch's ``copy_``
overhead, for the checker's upload of its model every replay (both ways were timed on an
H200: docs/HISTORY.md, "Checked replays per second"). From pageable memory the copy would be
synchronous.
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterable
from typing import cast

import torch

from .launch import current_stream, raw_stream

#: ``cudaMemcpyHostToDevice``.
_HOST_TO_DEVICE = 1
_UNRESOLVED = object()
_runtime: ctypes.CDLL | None | object = _UNRESOLVED


def runtime_paths(maps_lines: Iterable[str]) -> list[str]:
    """Paths of the ``libcudart`` files in lines of ``/proc/<pid>/maps``, once each, in order."""
    paths: list[str] = []
    for line in maps_lines:
        fields = line.split(maxsplit=5)
        path = fields[5].strip() if len(fields) == 6 else ""
        # A file replaced on disk since it was loaded shows as "... (deleted)".
        if "libcudart" in path and path.startswith("/") and not path.endswith("(deleted)"):
            if path not in paths:
                paths.append(path)
    return paths


def _loaded_runtimes() -> list[str]:
    with open("/proc/self/maps") as maps:
        return runtime_paths(maps)


def _major(version: int) -> int:
    return version // 1000  # cudaRuntimeGetVersion: 1000 * major + 10 * minor


def runtime() -> ctypes.CDLL | None:
    """The loaded ``libcudart`` (looked up until one is found, then kept), or ``None``.
    Where several are loaded, the one of torch's CUDA major version."""
    global _runtime
    if _runtime is not _UNRESOLVED:
        return cast("ctypes.CDLL | None", _runtime)
    libs = []
    try:
        for path in _loaded_runtimes():
            libs.append(ctypes.CDLL(path))
    except OSError:
        pass
    if not libs:
        return None  # not loaded yet, perhaps: looked up again next time
    lib = libs[0]
    wanted = (torch.version.cuda or "").split(".")[0]
    for candidate in libs:
        version = ctypes.c_int(0)
        if (
            candidate.cudaRuntimeGetVersion(ctypes.byref(version)) == 0
            and str(_major(version.value)) == wanted
        ):
            lib = candidate
            break
    lib.cudaMemcpyAsync.argtypes = [
        ctypes.c_void_p,
        ctypes.c_void_p,
        ctypes.c_size_t,
        ctypes.c_int,
        ctypes.c_void_p,
    ]
    lib.cudaMemcpyAsync.restype = ctypes.c_int
    _runtime = lib
    return lib


def clear_last_error() -> None:
    """Reset the runtime's last error (``cudaGetLastError``); nothing without a runtime."""
    lib = runtime()
    if lib is not None:
        lib.cudaGetLastError()


class HostToDevice:
    """Copies ``nbytes`` from page-locked host memory into ``dst`` (a contiguous CUDA tensor)
    on its device's current stream, without waiting.

    ``HostToDevice.make(dst)`` is ``None`` where no runtime is loaded or ``dst`` is not a
    contiguous CUDA tensor: the caller copies with torch then. The caller keeps the host
    memory unchanged until the copy has completed (an event recorded after the call).
    """

    def __init__(self, dst: torch.Tensor, lib: ctypes.CDLL):
        self.dst = dst.data_ptr()
        self.nbytes = dst.numel() * dst.element_size()
        self.index = dst.get_device()
        self._memcpy = lib.cudaMemcpyAsync
        self._stream = raw_stream if raw_stream is not None else current_stream

    @classmethod
    def make(cls, dst: torch.Tensor) -> HostToDevice | None:
        if not dst.is_cuda or not dst.is_contiguous():
            return None
        lib = runtime()
        return None if lib is None else cls(dst, lib)

    def __call__(self, src: int) -> None:
        """Copy from host address ``src`` (page-locked, ``nbytes`` long)."""
        if self.index != torch._C._cuda_getDevice():
            with torch.cuda.device(self.index):
                self._copy(src)
            return
        self._copy(src)

    def _copy(self, src: int) -> None:
        err = self._memcpy(self.dst, src, self.nbytes, _HOST_TO_DEVICE, self._stream(self.index))
        if err:
            clear_last_error()
            raise RuntimeError(f"cudaMemcpyAsync failed with CUDA error {err}")
