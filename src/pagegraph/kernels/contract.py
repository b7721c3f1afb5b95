"""The page-table builder contract, checked on the host from tensor metadata only.

Every page-table builder in pagegraph (the Triton kernel and the torch references) takes the
same arguments (docs/ARCHITECTURE.md, "The page-table contract", has their shapes and dtypes).
The checks here read shapes, strides, dtypes and devices, never values: reading a value would
be a device-to-host sync, which is exactly what the builders exist to avoid.
"""

from __future__ import annotations

import os
from typing import Any, TypeAlias

import torch

INDEX_DTYPES = (torch.int32, torch.int64)

#: A value no builder writes: the checker fills tables with it before each replay, and a
#: reader's workspace before each plan, so an entry still holding it was never written.
POISON = -0x5A5A5A5

#: Counters of the optional ``errors`` buffer, in order. Each counts batch rows (or, for the
#: last one, page entries) whose value was outside the contract and was clamped on the device.
ERROR_KINDS = (
    "seq_len_over_capacity",
    "negative_seq_len",
    "req_pool_index_out_of_range",
    "full_to_swa_index_out_of_range",
)


#: The attribute by which a builder that is not a built-in names the kind of its outputs
#: (``pagegraph.kinds.kind_of``).
OUTPUTS_ATTRIBUTE = "pagegraph_outputs"


def declare_outputs(builder: object, kind: str) -> None:
    """Set ``builder.pagegraph_outputs`` to ``kind`` (``OUTPUTS_ATTRIBUTE``)."""
    setattr(builder, OUTPUTS_ATTRIBUTE, kind)


def declared_outputs(builder: object) -> object:
    """The kind ``builder`` names for its outputs (``declare_outputs``, or the attribute set
    by hand), as set; None when it names none."""
    return getattr(builder, OUTPUTS_ATTRIBUTE, None)


def interpreter_active() -> bool:
    """True when Triton kernels run under the CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _check_tensor(name: str, t: Any, ndim: int, dtypes: tuple[torch.dtype, ...]) -> None:
    # Ordered and written for speed: this runs on every builder call, and each tensor
    # attribute read is a Python call into torch.
    try:
        dtype = t.dtype
    except AttributeError:
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}") from None
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if dtype not in dtypes:
        allowed = " or ".join(str(d).removeprefix("torch.") for d in dtypes)
        raise TypeError(f"{name} must be {allowed}, got {str(dtype).removeprefix('torch.')}")
    if t.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dimension(s), got shape {tuple(t.shape)}")
    # A size-1 dimension may report any stride; only a real inner extent needs stride 1.
    if t.stride(-1) != 1 and t.shape[-1] > 1:
        raise ValueError(f"{name} must have inner stride 1, got strides {tuple(t.stride())}")


#: ``cuda_call_metadata``'s answer: device, bs, width, r2t_rows, r2t_cols, r2t_row_stride,
#: pt_row_stride, swa_row_stride, f2s_len (the last two None without SWA).
CallMetadata: TypeAlias = tuple[int, int, int, int, int, int, int, int | None, int | None]


def cuda_call_metadata(
    req_to_token: Any,
    req_pool_indices: Any,
    seq_lens: Any,
    page_table: Any,
    page_size: Any,
    swa_page_table: Any = None,
    full_to_swa: Any = None,
    errors: Any = None,
) -> CallMetadata | None:
    """The metadata a builder needs, when the call is in contract with every tensor on one
    CUDA device; ``None`` otherwise (then ``check_builder_args`` says what is wrong, or
    accepts what this fast path does not try to judge: CPU tensors, int subclasses).

    Returns ``(device, bs, width, r2t_rows, r2t_cols, r2t_row_stride, pt_row_stride,
    swa_row_stride, f2s_len)``; ``swa_row_stride`` and ``f2s_len`` are ``None`` without SWA.
    Each tensor attribute read is a Python call into torch, so each is read once: this runs
    on every eager builder call.
    """
    tensor = torch.Tensor
    try:
        if type(page_size) is not int or page_size < 1:
            return None
        if not (
            isinstance(page_table, tensor)
            and isinstance(req_to_token, tensor)
            and isinstance(req_pool_indices, tensor)
            and isinstance(seq_lens, tensor)
        ):
            return None
        if (
            page_table.dtype is not torch.int32
            or req_to_token.dtype not in INDEX_DTYPES
            or req_pool_indices.dtype not in INDEX_DTYPES
            or seq_lens.dtype not in INDEX_DTYPES
        ):
            return None
        device = page_table.get_device()
        if (
            device < 0
            or req_to_token.get_device() != device
            or req_pool_indices.get_device() != device
            or seq_lens.get_device() != device
        ):
            return None
        pt_shape = page_table.shape
        r2t_shape = req_to_token.shape
        rpi_shape = req_pool_indices.shape
        if len(pt_shape) != 2 or len(r2t_shape) != 2 or len(rpi_shape) != 1:
            return None
        bs, width = pt_shape
        r2t_rows, r2t_cols = r2t_shape
        if r2t_rows == 0 or rpi_shape[0] != bs or seq_lens.shape != rpi_shape:
            return None
        pt_strides = page_table.stride()
        r2t_strides = req_to_token.stride()
        # Inner stride 1 wherever the inner extent is real (a size-1 dimension may report any).
        if bs > 1 and (req_pool_indices.stride()[0] != 1 or seq_lens.stride()[0] != 1):
            return None
        if (pt_strides[1] != 1 and width > 1) or (r2t_strides[1] != 1 and r2t_cols > 1):
            return None
        swa_row_stride = f2s_len = None
        if swa_page_table is not None or full_to_swa is not None:
            if not (isinstance(swa_page_table, tensor) and isinstance(full_to_swa, tensor)):
                return None
            if swa_page_table.dtype is not torch.int32 or full_to_swa.dtype not in INDEX_DTYPES:
                return None
            if swa_page_table.get_device() != device or full_to_swa.get_device() != device:
                return None
            f2s_shape = full_to_swa.shape
            if swa_page_table.shape != pt_shape or len(f2s_shape) != 1:
                return None
            f2s_len = f2s_shape[0]
            swa_strides = swa_page_table.stride()
            if f2s_len == 0 or (swa_strides[1] != 1 and width > 1):
                return None
            if f2s_len > 1 and full_to_swa.stride()[0] != 1:
                return None
            swa_row_stride = swa_strides[0]
        if errors is not None:
            if not isinstance(errors, tensor) or errors.dtype is not torch.int32:
                return None
            e_shape = errors.shape
            if len(e_shape) != 1 or e_shape[0] < len(ERROR_KINDS) or errors.stride()[0] != 1:
                return None
            if errors.get_device() != device:
                return None
    except (AttributeError, TypeError, ValueError):
        return None
    return (
        device,
        bs,
        width,
        r2t_rows,
        r2t_cols,
        r2t_strides[0],
        pt_strides[0],
        swa_row_stride,
        f2s_len,
    )


def check_builder_args(
    req_to_token: Any,
    req_pool_indices: Any,
    seq_lens: Any,
    page_table: Any,
    page_size: Any,
    swa_page_table: Any = None,
    full_to_swa: Any = None,
    errors: Any = None,
    *,
    builder: str = "builder",
    cpu_ok: bool = True,
) -> None:
    """Validate a builder call from metadata; ``TypeError``/``ValueError`` name the argument.

    ``cpu_ok=False`` is for the Triton kernel: CPU tensors are accepted only under the
    interpreter.
    """
    if (
        cuda_call_metadata(
            req_to_token,
            req_pool_indices,
            seq_lens,
            page_table,
            page_size,
            swa_page_table,
            full_to_swa,
            errors,
        )
        is not None
    ):
        return  # the common case, judged in one pass
    _check_tensor("req_to_token", req_to_token, 2, INDEX_DTYPES)
    _check_tensor("req_pool_indices", req_pool_indices, 1, INDEX_DTYPES)
    _check_tensor("seq_lens", seq_lens, 1, INDEX_DTYPES)
    _check_tensor("page_table", page_table, 2, (torch.int32,))
    if (swa_page_table is None) != (full_to_swa is None):
        given, missing = (
            ("swa_page_table", "full_to_swa")
            if full_to_swa is None
            else ("full_to_swa", "swa_page_table")
        )
        raise ValueError(f"{given} was given without {missing}: the two go together")
    if swa_page_table is not None:
        _check_tensor("swa_page_table", swa_page_table, 2, (torch.int32,))
        _check_tensor("full_to_swa", full_to_swa, 1, INDEX_DTYPES)
        if swa_page_table.shape != page_table.shape:
            raise ValueError(
                f"swa_page_table shape {tuple(swa_page_table.shape)} differs from "
                f"page_table shape {tuple(page_table.shape)}"
            )
        if full_to_swa.numel() == 0:
            raise ValueError("full_to_swa is empty: it needs one entry per slot plus a sentinel")
    if errors is not None:
        _check_tensor("errors", errors, 1, (torch.int32,))
        if errors.numel() < len(ERROR_KINDS):
            raise ValueError(
                f"errors must hold at least {len(ERROR_KINDS)} int32 counters, got {errors.numel()}"
            )
    if isinstance(page_size, bool) or not isinstance(page_size, int):
        raise TypeError(f"page_size must be an int, got {type(page_size).__name__}")
    if page_size < 1:
        raise ValueError(f"page_size must be >= 1, got {page_size}")

    bs = page_table.shape[0]
    for name, t in (("req_pool_indices", req_pool_indices), ("seq_lens", seq_lens)):
        if t.shape[0] != bs:
            raise ValueError(
                f"{name} must have shape [page_table.shape[0]] = [{bs}], got {tuple(t.shape)}"
            )
    if req_to_token.shape[0] == 0:
        raise ValueError("req_to_token has no rows")

    # Devices compared as indices (-1 for the CPU): cheaper than torch.device objects.
    device = page_table.get_device()
    tensors = (
        ("req_to_token", req_to_token),
        ("req_pool_indices", req_pool_indices),
        ("seq_lens", seq_lens),
        ("swa_page_table", swa_page_table),
        ("full_to_swa", full_to_swa),
        ("errors", errors),
    )
    for name, t in tensors:
        if t is None:
            continue
        index = t.get_device()
        # -1 is every non-CUDA device (cpu, meta, ...): those need their type compared too.
        if index != device or (index < 0 and t.device.type != page_table.device.type):
            raise ValueError(
                f"{name} is on {t.device} but page_table is on {page_table.device}: "
                "all tensors must be on one device"
            )
    if device < 0 and not (cpu_ok or (page_table.device.type == "cpu" and interpreter_active())):
        raise ValueError(
            f"{builder} needs CUDA tensors (got {page_table.device}); CPU tensors run only "
            "under the Triton interpreter (TRITON_INTERPRET=1)"
        )


def bit_view(t: torch.Tensor) -> torch.Tensor:
    """``t``'s entries as integers of their size, ``t`` itself for bool: compared, two tensors
    are equal bit for bit (a NaN equals the same NaN, -0.0 differs from 0.0)."""
    if t.dtype == torch.bool:
        return t
    ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    return t.view(ints[t.element_size()])


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit equality of two tensors of one dtype and shape (``bit_view``)."""
    return torch.equal(bit_view(a), bit_view(b))
