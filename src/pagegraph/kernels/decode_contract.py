"""Host checks of a ``build_decode_metadata`` call, from metadata only (no device value is
read): the full checks, which name every mistake (``check_decode_args``), and the fast ones of
the common all-CUDA eager call (``fast_decode_checks``), which only say whether it passes.
Also the limits they enforce (``MAX_DRAFT_TOKENS``, the batch's ``MAX_BATCH``) and the
``errors`` counters of ``build_decode_metadata`` (``DECODE_ERROR_KINDS``).
"""

from __future__ import annotations

from typing import Any

import torch

from .contract import ERROR_KINDS, check_builder_args, cuda_call_metadata
from .page_table import MAX_BATCH

__all__ = ["DECODE_ERROR_KINDS", "MAX_DRAFT_TOKENS", "check_decode_args", "fast_decode_checks"]

#: Counters of the ``errors`` buffer of ``build_decode_metadata``, in order: those of
#: ``build_page_table`` (``seq_len_over_capacity`` compares ``cache_seqlens``, draft tokens
#: included, with the row's capacity) plus the entries of an int32 ``cu_seqlens_k`` whose
#: true running sum passed 2^31 - 1 (stored saturated).
DECODE_ERROR_KINDS = ERROR_KINDS + ("cu_seqlens_k_overflow",)

#: Largest ``draft_tokens``: ``MAX_BATCH * MAX_DRAFT_TOKENS`` < 2^31, so every entry of
#: ``cu_seqlens_q`` fits its int32 (and ``draft_tokens`` stays an i32 kernel argument).
MAX_DRAFT_TOKENS = (2**31 - 1) // MAX_BATCH


def check_decode_args(
    req_to_token: Any,
    req_pool_indices: Any,
    seq_lens: Any,
    page_size: Any,
    cache_seqlens: Any,
    cu_seqlens_k: Any,
    page_table: Any,
    draft_tokens: Any = 0,
    cu_seqlens_q: Any = None,
    swa_page_table: Any = None,
    full_to_swa: Any = None,
    errors: Any = None,
    *,
    caller: str = "build_decode_metadata",
    cpu_ok: bool = True,
) -> None:
    """Validate a decode-metadata call from metadata only (no device value is read); each
    mistake raises a ``TypeError``/``ValueError`` naming the argument. ``cpu_ok=False`` is
    for the kernel: CPU tensors only under the Triton interpreter. The torch references use
    this too, so every implementation accepts and refuses the same calls."""
    if errors is not None:
        _check_errors(errors)
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
        is None
    ):
        check_builder_args(
            req_to_token,
            req_pool_indices,
            seq_lens,
            page_table,
            page_size,
            swa_page_table,
            full_to_swa,
            errors,
            builder=caller,
            cpu_ok=cpu_ok,
        )
    _check_draft_tokens(draft_tokens)
    _check_outputs(cache_seqlens, cu_seqlens_k, cu_seqlens_q, page_table)
    if page_table.shape[0] > MAX_BATCH:
        raise ValueError(f"{caller}: batch size {page_table.shape[0]} exceeds {MAX_BATCH} rows")


def _check_draft_tokens(draft_tokens: Any) -> None:
    if type(draft_tokens) is not int:
        if isinstance(draft_tokens, bool) or not isinstance(draft_tokens, int):
            raise TypeError(f"draft_tokens must be an int, got {type(draft_tokens).__name__}")
    if not 0 <= draft_tokens <= MAX_DRAFT_TOKENS:
        raise ValueError(f"draft_tokens must be in 0..{MAX_DRAFT_TOKENS}, got {draft_tokens}")


def _check_errors(errors: Any) -> None:
    # Before the builder checks, which accept the four counters build_page_table needs.
    if isinstance(errors, torch.Tensor) and errors.dim() == 1:
        if errors.dtype is torch.int32 and errors.shape[0] < len(DECODE_ERROR_KINDS):
            raise ValueError(
                f"errors must hold at least {len(DECODE_ERROR_KINDS)} int32 counters "
                f"(DECODE_ERROR_KINDS), got {errors.shape[0]}"
            )


def _check_outputs(
    cache_seqlens: Any, cu_seqlens_k: Any, cu_seqlens_q: Any, page_table: Any
) -> None:
    """The metadata outputs: shapes against ``page_table``'s batch, dtypes, contiguity and
    device, each mistake named (``fast_decode_checks`` is the passing path of eager calls)."""
    bs = page_table.shape[0]
    device = page_table.get_device()
    _check_vector("cache_seqlens", cache_seqlens, bs, _I32, device, page_table)
    _check_vector("cu_seqlens_k", cu_seqlens_k, bs + 1, _I32_I64, device, page_table)
    if cu_seqlens_q is not None:
        _check_vector("cu_seqlens_q", cu_seqlens_q, bs + 1, _I32, device, page_table)


_I32 = (torch.int32,)
_I32_I64 = (torch.int32, torch.int64)
# Module globals: one lookup each on the eager path instead of torch's attributes.
_INT32, _INT64, _Tensor = torch.int32, torch.int64, torch.Tensor


def _check_vector(
    name: str, t: Any, length: int, dtypes: tuple[Any, ...], device: int, page_table: Any
) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in dtypes:
        allowed = " or ".join(str(d).removeprefix("torch.") for d in dtypes)
        raise TypeError(f"{name} must be {allowed}, got {str(t.dtype).removeprefix('torch.')}")
    shape = t.shape
    if len(shape) != 1 or shape[0] != length:
        raise ValueError(f"{name} must have shape [{length}], got {tuple(shape)}")
    if length > 1 and t.stride(0) != 1:
        raise ValueError(f"{name} must be contiguous, got stride {t.stride(0)}")
    index = t.get_device()
    # -1 is every non-CUDA device (cpu, meta, ...): those need their type compared too.
    if index != device or (index < 0 and t.device.type != page_table.device.type):
        raise ValueError(
            f"{name} is on {t.device} but page_table is on {page_table.device}: "
            "all tensors must be on one device"
        )


def fast_decode_checks(
    device: Any,
    bs: Any,
    cache_seqlens: Any,
    cu_seqlens_k: Any,
    cu_seqlens_q: Any,
    draft_tokens: Any,
    errors: Any,
) -> bool:
    """Whether the arguments ``cuda_call_metadata`` does not see are in contract, for the
    common all-CUDA call: a handful of attribute reads (this runs on every eager call). False
    sends the call to ``check_decode_args``, which names what is wrong."""
    if type(draft_tokens) is not int or not 0 <= draft_tokens <= MAX_DRAFT_TOKENS:
        return False
    i32 = _INT32
    try:
        if bs > MAX_BATCH or (errors is not None and errors.shape[0] < len(DECODE_ERROR_KINDS)):
            return False
        # is_contiguous() of a 1-D tensor is exactly "inner stride 1 or at most one entry".
        t = cache_seqlens
        if not (
            isinstance(t, _Tensor)
            and t.dtype is i32
            and t.shape == (bs,)
            and t.get_device() == device
            and t.is_contiguous()
        ):
            return False
        t, n = cu_seqlens_k, (bs + 1,)
        dtype = t.dtype
        if not (
            isinstance(t, _Tensor)
            and (dtype is i32 or dtype is _INT64)
            and t.shape == n
            and t.get_device() == device
            and t.is_contiguous()
        ):
            return False
        t = cu_seqlens_q
        return t is None or (
            isinstance(t, _Tensor)
            and t.dtype is i32
            and t.shape == n
            and t.get_device() == device
            and t.is_contiguous()
        )
    except (AttributeError, TypeError):
        return False
