"""What ``GraphRunner`` raises when its buffers or graphs cannot be what they must."""

from __future__ import annotations


class StaticBufferMoved(RuntimeError):
    """A static buffer (or ``req_to_token``/``full_to_swa``) is not where it was at capture."""


class NotCaptured(RuntimeError):
    """``replay()`` was called before ``capture()``."""


class CaptureOutOfMemory(MemoryError):
    """Out of device memory while warming up or capturing; the message names the bucket and
    the sizes involved."""


class BufferAllocationError(MemoryError):
    """The static buffers do not fit on the device; the message names the sizes asked for."""
