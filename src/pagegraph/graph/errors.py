"""What ``GraphRunner`` raises when its arguments, buffers or graphs cannot be what they must."""

from __future__ import annotations

from collections.abc import Mapping, Sequence, Sized
from typing import Protocol

import torch

from ..kernels.contract import INDEX_DTYPES


class StaticBufferMoved(RuntimeError):
    """A static buffer (or ``req_to_token``/``full_to_swa``) is not where it was at capture."""


class NotCaptured(RuntimeError):
    """``replay()`` was called before ``capture()``."""


class CaptureOutOfMemory(MemoryError):
    """Out of device memory while warming up or capturing; the message names the bucket and
    the sizes involved."""


class BufferAllocationError(MemoryError):
    """The static buffers do not fit on the device; the message names the sizes asked for."""


def check_count(name: str, value: object, minimum: int) -> None:
    """``ValueError`` unless ``value`` is an integer (not a bool) of at least ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")


def check_table_buffer(
    name: str,
    buf: object,
    device: torch.device,
    max_bs: int,
    max_num_pages: int,
    max_context_len: int,
    page_size: int,
) -> None:
    """``ValueError`` unless ``buf``, a page table the engine hands over, is a 2-D int32
    tensor on ``device`` of at least ``[max_bs, max_num_pages]`` with inner stride 1."""
    if not isinstance(buf, torch.Tensor) or buf.dim() != 2 or buf.dtype != torch.int32:
        raise ValueError(f"{name} must be a 2-D int32 tensor")
    if buf.device != device:
        raise ValueError(f"{name} is on {buf.device}, req_to_token on {device}")
    if buf.shape[0] < max_bs or buf.shape[1] < max_num_pages:
        raise ValueError(
            f"{name} of shape {tuple(buf.shape)} is smaller than [max_bs={max_bs}, "
            f"max_num_pages={max_num_pages}] (max_context_len={max_context_len} at "
            f"page_size={page_size} needs {max_num_pages} pages)"
        )
    if buf.stride(1) != 1:
        raise ValueError(f"{name} must have inner stride 1, got {tuple(buf.stride())}")


def check_vector_buffer(
    name: str, buf: object, dtype: torch.dtype, length: int, device: torch.device
) -> None:
    """``ValueError`` unless ``buf``, an output vector the engine hands over, is a contiguous
    1-D ``dtype`` tensor of at least ``length`` entries on ``device``. The message names the
    buffer, what it is (shape, dtype, device, stride) and the size the padded batch needs: an
    engine's vector sized by its request pool (``max_reqs + 1``) instead of its largest
    bucket (``max_bs + 1``) is refused here, before any capture."""
    want = (
        f"a contiguous 1-D {str(dtype).replace('torch.', '')} tensor of >= {length} entries "
        f"on {device}"
    )
    if not isinstance(buf, torch.Tensor):
        raise ValueError(f"{name} must be {want}, got {type(buf).__name__}")
    if (
        buf.dim() != 1
        or buf.dtype != dtype
        or buf.shape[0] < length
        or buf.device != device
        or (length > 1 and buf.stride(0) != 1)
    ):
        got = (
            f"shape {tuple(buf.shape)} {str(buf.dtype).replace('torch.', '')} on {buf.device}"
            f", strides {tuple(buf.stride())}"
        )
        short = (
            f": {length} entries needed, {buf.shape[0]} given"
            if buf.dim() == 1 and buf.shape[0] < length
            else ""
        )
        raise ValueError(f"{name} must be {want}, got {got}{short}")


def merge_vectors(
    keywords: Mapping[str, torch.Tensor | None],
    vectors: Mapping[str, torch.Tensor] | None,
    known: Sequence[str],
) -> dict[str, torch.Tensor | None]:
    """The output vectors handed to a ``GraphRunner`` by keyword and in ``vectors={...}``,
    by name. A keyword that is no kind's vector (``known``) is a ``TypeError``, as Python
    says of any unexpected keyword (a misspelt argument). A name given both ways as two
    different tensors is a ``ValueError`` naming it: either could be the engine's own
    buffer, and the one its graphs read must never be replaced behind its back (the same
    tensor twice, or two views of the same bytes in the same layout, is fine)."""
    for name in keywords:
        if name not in known:
            raise TypeError(f"GraphRunner() got an unexpected keyword argument {name!r}")
    merged = dict(keywords)
    for name, buf in (vectors or {}).items():
        other = merged.get(name)
        if other is not None and buf is not None and not _same_view(other, buf):
            raise ValueError(
                f"{name} is given twice, as {name}= ({_describe(other)}) and in vectors= "
                f"({_describe(buf)}), two different tensors: pass the engine's own one way"
            )
        if buf is not None:
            merged[name] = buf
    return merged


def _same_view(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether ``a`` and ``b`` are one tensor, or views of the same bytes in the same layout."""
    return a is b or (
        a.device == b.device
        and a.dtype == b.dtype
        and a.data_ptr() == b.data_ptr()
        and a.shape == b.shape
        and a.stride() == b.stride()
    )


def _describe(buf: torch.Tensor) -> str:
    """A tensor in a message: its shape, dtype and address."""
    dtype = str(buf.dtype).replace("torch.", "")
    return f"shape {tuple(buf.shape)} {dtype} at {buf.data_ptr():#x}"


def check_arguments(
    req_to_token: torch.Tensor,
    page_size: int,
    max_context_len: int,
    index_dtype: torch.dtype,
    full_to_swa: torch.Tensor | None,
) -> None:
    """``ValueError`` for a ``GraphRunner`` argument that no setting can make work."""
    if not isinstance(req_to_token, torch.Tensor) or req_to_token.dim() != 2:
        raise ValueError("req_to_token must be a 2-D tensor [max_reqs, max_context_len]")
    if isinstance(page_size, bool) or not isinstance(page_size, int) or page_size < 1:
        raise ValueError(f"page_size must be a positive integer, got {page_size!r}")
    if max_context_len < 1:
        raise ValueError(f"max_context_len must be >= 1, got {max_context_len}")
    if req_to_token.shape[1] < max_context_len:
        raise ValueError(
            f"req_to_token has {req_to_token.shape[1]} columns, fewer than "
            f"max_context_len={max_context_len}"
        )
    if index_dtype not in INDEX_DTYPES:
        raise ValueError(f"index_dtype must be int32 or int64, got {index_dtype}")
    if full_to_swa is not None and full_to_swa.device != req_to_token.device:
        raise ValueError(
            f"full_to_swa is on {full_to_swa.device}, req_to_token on {req_to_token.device}"
        )


class RunnerSizes(Protocol):
    """What ``oom_message`` reads of a ``GraphRunner`` (which imports this module)."""

    @property
    def device(self) -> torch.device: ...

    @property
    def max_num_pages(self) -> int: ...

    @property
    def swa_page_table(self) -> torch.Tensor | None: ...

    @property
    def graphs(self) -> Sized:
        """The graphs captured so far."""
        ...


def oom_message(runner: RunnerSizes, what: str, bucket: int, exc: BaseException) -> str:
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
