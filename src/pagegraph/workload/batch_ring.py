"""A byte ring in shared memory that carries a workload child's page runs to the checker.

A batch of steps' page runs is megabytes; pickled onto a ``multiprocessing`` queue it crosses a
pipe in small pieces, while written into a ring both processes map it costs one copy in and one
out, or none where a GPU reads the ring in place (``pin_for_cuda``). The step descriptions
still go through the queue, with where their runs lie. The layout, why the ordering needs no
lock (x86-64 only, ``RING_SUPPORTED``) and the file's life: docs/ARCHITECTURE.md, "Steps
generated ahead".
"""

from __future__ import annotations

import mmap
import os
import platform
import shutil
import tempfile
import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from ..kernels.cudart import clear_last_error

if TYPE_CHECKING:
    import torch

#: Whether this machine carries runs through the ring (x86-64 only: docs/ARCHITECTURE.md).
RING_SUPPORTED = platform.machine().lower() in ("x86_64", "amd64")
#: Bytes before the ring: ``released`` and room for more counters, one cache line.
HEADER_BYTES = 64
#: Ring bytes per writer: sized so a segment of steps of the largest shipped scenario
#: (swa-hybrid) fits.
RING_BYTES = 128 << 20
#: Seconds a writer sleeps between two looks at ``released`` while the ring is full.
WAIT_S = 0.0005
#: The longest sleep of a waiting writer: its sleeps double from ``WAIT_S`` up to this, so
#: children whose turn is far off do not wake thousands of times a second.
MAX_WAIT_S = 0.02
#: Seconds between two calls of the writer's ``alive()`` while it waits.
ALIVE_EVERY_S = 1.0
#: ``cudaHostRegisterPortable``.
HOST_REGISTER_PORTABLE = 1


class ReaderGone(RuntimeError):
    """A writer waited for room that its reader, now gone, will never release."""


def ring_folder(nbytes: int) -> str:
    """``/dev/shm`` if it has ``nbytes`` free (twice, for what others put there meanwhile),
    else the temporary folder."""
    try:
        if shutil.disk_usage("/dev/shm").free >= 2 * nbytes:
            return "/dev/shm"
    except OSError:
        pass
    return tempfile.gettempdir()


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _cuda_unregister(base: int) -> None:
    import torch

    try:
        torch.cuda.cudart().cudaHostUnregister(base)  # type: ignore[no-untyped-call]
    except Exception:  # noqa: BLE001 - a broken CUDA context: the process is ending
        pass


def _map(path: str, size: int) -> tuple[mmap.mmap, np.ndarray, np.ndarray]:
    fd = os.open(path, os.O_RDWR)
    try:
        buf = mmap.mmap(fd, size)
    finally:
        os.close(fd)
    header = np.ndarray((HEADER_BYTES // 8,), dtype=np.int64, buffer=buf)
    data = np.ndarray((size - HEADER_BYTES,), dtype=np.uint8, buffer=buf, offset=HEADER_BYTES)
    return buf, header, data


class RingReader:
    """The reader's end, which creates the ring: ``path`` goes to the writer.

    Args:
        capacity: ring bytes (a multiple of 8, at least 64).
        folder: where the file goes (default: ``ring_folder(capacity)``).
    """

    def __init__(self, capacity: int = RING_BYTES, folder: str | None = None):
        if capacity < 64 or capacity % 8:
            raise ValueError(f"capacity must be a multiple of 8, at least 64, got {capacity}")
        self.capacity = capacity
        size = HEADER_BYTES + capacity
        where = folder or ring_folder(size)
        self.path: str | None
        fd, self.path = tempfile.mkstemp(prefix="pagegraph-ring-", dir=where)
        self._in_shm = os.path.realpath(where) == os.path.realpath("/dev/shm")
        try:
            os.ftruncate(fd, size)
            # Reserved now: a tmpfs without room says so here (OSError, and the caller falls
            # back to the queue), not with a SIGBUS in the writer once the ring has wrapped.
            os.posix_fallocate(fd, 0, size)
        except BaseException:
            os.close(fd)
            _remove(self.path)
            raise
        os.close(fd)
        # Removed at the latest when this reader is collected or the interpreter exits, even
        # if no writer ever mapped it.
        self._remove = weakref.finalize(self, _remove, self.path)
        self._buf, self._header, self._data = _map(self.path, size)
        self._registered: int | None = None  # the map's address, while registered with CUDA
        #: ``[capacity]`` uint8 torch view of the ring's bytes, once ``pin_for_cuda`` succeeded:
        #: page-locked, so device copies read blocks in place.
        self.tensor: torch.Tensor | None = None

    def pin_for_cuda(self) -> bool:
        """Register the ring's pages with CUDA (page-locked, as pinned memory is) and make
        ``tensor``; False if the ring is not in ``/dev/shm`` or the driver refuses (the caller
        then copies blocks out). Call it once, before blocks are borrowed; ``close``
        unregisters."""
        import torch

        if not self._in_shm:
            # A file on an ordinary filesystem: a driver may refuse to register one, so it is
            # not tried (the runs are then copied out, as without a GPU).
            return False
        base = self._header.ctypes.data  # the map's first byte: page-aligned
        try:
            # Portable: page-locked for every device's context, not only the current one's.
            err = torch.cuda.cudart().cudaHostRegister(  # type: ignore[no-untyped-call]
                base, HEADER_BYTES + self.capacity, HOST_REGISTER_PORTABLE
            )
        except (AttributeError, AssertionError, RuntimeError):  # no CUDA in this build
            return False
        if int(err) != 0:
            # torch's binding returns the error without clearing it: left set, the next kernel
            # launch anywhere in the process would report it as its own.
            clear_last_error()
            return False
        self._registered = base
        # Unregistered at close, or when this reader is collected unclosed (before its map
        # goes: weakref callbacks run before the object's attributes are released).
        self._unregister = weakref.finalize(self, _cuda_unregister, base)
        self.tensor = torch.from_numpy(self._data)
        return True

    def unlink(self) -> None:
        """Remove the file (once the writer has mapped it; idempotent)."""
        self._remove()
        self.path = None

    def take(self, start: int, nbytes: int) -> np.ndarray:
        """A copy of the block of ``nbytes`` the writer put at counter ``start`` (``[nbytes]``
        uint8), released to the writer."""
        block = self.borrow(start, nbytes).copy()
        self.release(start + nbytes)
        return block

    def borrow(self, start: int, nbytes: int) -> np.ndarray:
        """The block of ``nbytes`` at counter ``start`` in place (``[nbytes]`` uint8, read-only,
        no copy). It stays the reader's until ``release`` passes its end: using the view after
        that reads whatever the writer put there since."""
        at = self.offset(start, nbytes)
        block = self._data[at : at + nbytes]
        block.flags.writeable = False
        return block

    def offset(self, start: int, nbytes: int) -> int:
        """Where in the ring's bytes (``tensor`` included) the block of ``nbytes`` at counter
        ``start`` lies; ``ValueError`` if there is no such block (released or past the end)."""
        at = start % self.capacity
        if at + nbytes > self.capacity or start < int(self._header[0]):
            raise ValueError(f"no block of {nbytes} bytes at {start} in a ring of {self.capacity}")
        return at

    def release(self, end: int) -> None:
        """Give every byte before counter ``end`` back to the writer (``end`` of the last block
        the reader is done with; blocks are released in the order they were written)."""
        if end < int(self._header[0]):
            raise ValueError(f"release to {end}: the ring was released to {int(self._header[0])}")
        self._header[0] = end

    def close(self) -> None:
        """Remove the file, unregister the pages, unmap the ring (the caller has waited for any
        device copy still reading a borrowed block)."""
        self.unlink()
        if self._registered is not None:
            self._unregister()
            self._registered = None
        self.tensor = None
        self._header = self._data = None  # type: ignore[assignment]  # closed: never read again
        try:
            self._buf.close()
        except BufferError:
            # Borrowed views are still alive (a run stopped mid-batch): the map goes with them.
            pass


class RingWriter:
    """The writer's end: maps the ring the reader made at ``path``."""

    def __init__(self, path: str, capacity: int):
        self.capacity = capacity
        self._buf, self._header, self._data = _map(path, HEADER_BYTES + capacity)
        self.written = 0

    def put(self, block: np.ndarray, alive: Callable[[], bool]) -> int | None:
        """Write ``block``'s bytes (any C-contiguous array) into the ring, waiting while the
        reader has not released enough; its start counter, for the reader's ``take``. ``None``
        if the block is larger than half the ring (send it another way). Raises
        ``ReaderGone`` if ``alive()`` turned false while waiting."""
        raw = block.reshape(-1).view(np.uint8)
        n = raw.nbytes
        if 2 * n > self.capacity:
            return None
        start = self.written
        if start % self.capacity + n > self.capacity:  # no room before the end: wrap
            start += self.capacity - start % self.capacity
        next_check = time.monotonic() + ALIVE_EVERY_S
        wait = WAIT_S
        while start + n - int(self._header[0]) > self.capacity:
            time.sleep(wait)
            wait = min(2 * wait, MAX_WAIT_S)
            if time.monotonic() >= next_check:
                if not alive():
                    raise ReaderGone("the ring's reader is gone")
                next_check = time.monotonic() + ALIVE_EVERY_S
        at = start % self.capacity
        self._data[at : at + n] = raw
        self.written = start + n
        return start

    def close(self) -> None:
        self._header = self._data = None  # type: ignore[assignment]  # closed: never read again
        self._buf.close()
