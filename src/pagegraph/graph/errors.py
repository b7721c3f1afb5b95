"""What ``GraphRunner`` raises when its buffers or graphs cannot be what they must."""

from __future__ import annotations

import torch


class StaticBufferMoved(RuntimeError):
    """A static buffer (or ``req_to_token``/``full_to_swa``) is not where it was at capture."""


class NotCaptured(RuntimeError):
    """``replay()`` was called before ``capture()``."""


class CaptureOutOfMemory(MemoryError):
    """Out of device memory while warming up or capturing; the message names the bucket and
    the sizes involved."""


class BufferAllocationError(MemoryError):
    """The static buffers do not fit on the device; the message names the sizes asked for."""


def oom_message(runner, what: str, bucket: int, exc: BaseException) -> str:
    """What ran out of memory during ``what`` (warm-up or capture) of ``bucket``: the
    runner's tables, the graphs captured so far, and the device's free memory now."""
    tables = 2 if runner.swa_page_table is not None else 1
    table_bytes = tables * bucket * runner.max_num_pages * 4
    free = ""
    if runner.device.type == "cuda":
        try:
            free_bytes, total = torch.cuda.mem_get_info(runner.device)
            free = f", {free_bytes / 2**30:.2f} of {total / 2**30:.2f} GiB free now"
        except Exception:  # noqa: BLE001 - the message matters more than this figure
            pass
    return (
        f"out of memory during {what} of bucket {bucket}: {tables} page table(s) of "
        f"[{bucket}, {runner.max_num_pages}] int32 ({table_bytes / 2**20:.1f} MiB), "
        f"{len(runner.graphs)} graph(s) captured so far{free} ({exc})"
    )
