"""The builder contract, checked on the host from tensor metadata only.

Every page-table builder in pagegraph (the Triton kernel and the torch references) takes the
same arguments::

    req_to_token      [max_reqs, max_context_len]   int32 | int64   slot of each token
    req_pool_indices  [bs]                          int32 | int64   request row of each batch row
    seq_lens          [bs]                          int32 | int64   tokens of each batch row
    page_table        [bs, width]                   int32           written in place
    page_size         int >= 1
    swa_page_table    [bs, width]                   int32           optional (with full_to_swa)
    full_to_swa       [num_slots + 1]               int32 | int64   optional (with swa table)
    errors            [len(ERROR_KINDS)]            int32           optional error counters

The checks below read shapes, strides, dtypes and devices, never values: reading a value would
be a device-to-host sync, which is exactly what the builders exist to avoid.
"""

from __future__ import annotations

import os

import torch

INDEX_DTYPES = (torch.int32, torch.int64)

#: Counters of the optional ``errors`` buffer, in order. Each counts batch rows (or, for the
#: last one, page entries) whose value was outside the contract and was clamped on the device.
ERROR_KINDS = (
    "seq_len_over_capacity",
    "negative_seq_len",
    "req_pool_index_out_of_range",
    "full_to_swa_index_out_of_range",
)


def interpreter_active() -> bool:
    """True when Triton kernels run under the CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _check_tensor(name: str, t, ndim: int, dtypes: tuple[torch.dtype, ...]) -> None:
    # Ordered and written for speed: this runs on every builder call, and each tensor
    # attribute read costs ~0.1 us of Python.
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


def check_builder_args(
    req_to_token,
    req_pool_indices,
    seq_lens,
    page_table,
    page_size,
    swa_page_table=None,
    full_to_swa=None,
    errors=None,
    *,
    builder: str = "builder",
    cpu_ok: bool = True,
) -> None:
    """Validate a builder call from metadata; ``TypeError``/``ValueError`` name the argument.

    ``cpu_ok=False`` is for the Triton kernel: CPU tensors are accepted only under the
    interpreter.
    """
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
