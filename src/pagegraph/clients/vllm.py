"""vLLM's GPU block-table kernels (model runner v2) behind pagegraph's builder contracts.

``vllm_gather_block_tables`` (a ``"block_table"`` builder) and ``vllm_compute_slot_mappings``
(a ``"slot_mapping"`` builder) launch vLLM 0.34.0's own kernels, loaded from its files by
``pagegraph.clients.vllm_files``, with the arguments vLLM's ``BlockTables`` passes for one
KV-cache group. What those kernels assume that pagegraph's contracts do not (one row stride for
every table, no clamps, 16-byte aligned tables): docs/ARCHITECTURE.md, "vLLM's own kernels".
"""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace

import torch

from ..kernels.batch import BatchContext
from ..kernels.contract import declare_outputs
from ..kernels.group_slot_mappings import RingGroup
from .vllm_files import (
    STUBBED_IMPORTS,
    TESTED_VERSION,
    VLLMUnavailable,
    load_vllm_kernels,
    vllm_available,
    vllm_unavailable_reason,
)

__all__ = [
    "STUBBED_IMPORTS",
    "TESTED_VERSION",
    "VLLM_BUILDERS",
    "VLLMUnavailable",
    "clear_launch_args",
    "gather_launch_args",
    "slot_mapping_launch_args",
    "vllm_available",
    "vllm_compute_slot_mappings",
    "vllm_gather_block_tables",
    "vllm_unavailable_reason",
]

#: vLLM's copy block (``BlockTables.gather_block_tables``) and token block
#: (``BlockTables.compute_slot_mappings``).
GATHER_BLOCK_SIZE = 1024
SLOT_BLOCK_SIZE = 1024

_launch_args: dict[tuple[object, ...], SimpleNamespace] = {}


def clear_launch_args() -> None:
    """Forget the cached pointer tensors (their buffers are never kept alive by the cache:
    only their addresses are keys)."""
    _launch_args.clear()


def _small(values: list[int], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A small device tensor from host values (vLLM's ``_make_ptr_tensor``): a host-to-device
    copy, which a stream capture forbids."""
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        raise RuntimeError(
            "vLLM's pointer tensors are made on a builder's first call for a set of buffers: "
            "call it once before capturing (at warm-up)"
        )
    return torch.tensor(values, dtype=dtype, device=device)


def gather_launch_args(block_table: torch.Tensor, out: torch.Tensor) -> SimpleNamespace:
    """The gather kernel's table arguments for these buffers, made on the first call:
    ``src_ptrs``/``dst_ptrs`` ``[1]`` uint64, ``strides`` ``[1]`` int64, ``reach`` ``[1]``
    int32 zeros (vLLM passes its sliding-window reach, also as ``num_computed_tokens`` when
    masking is off) and ``block_sizes`` ``[1]`` int32 (read only when masking)."""
    device = block_table.device
    key = ("gather", device, block_table.data_ptr(), block_table.stride(0), out.data_ptr())
    args = _launch_args.get(key)
    if args is None:
        args = SimpleNamespace(
            src_ptrs=_small([block_table.data_ptr()], torch.uint64, device),
            dst_ptrs=_small([out.data_ptr()], torch.uint64, device),
            strides=_small([block_table.stride(0)], torch.int64, device),
            reach=_small([0], torch.int32, device),
            block_sizes=_small([0], torch.int32, device),
        )
        _launch_args[key] = args
    return args


def slot_mapping_launch_args(block_table: torch.Tensor, page_size: int) -> SimpleNamespace:
    """The slot-mapping kernel's group arguments, made on the first call: ``ptrs`` ``[1]``
    uint64, ``strides`` ``[1]`` int64, ``block_sizes`` ``[1]`` int32, ``enabled`` and
    ``dcp_sharded`` ``[1]`` bool (True, vLLM's defaults)."""
    device = block_table.device
    key = ("slots", device, block_table.data_ptr(), block_table.stride(0), page_size)
    args = _launch_args.get(key)
    if args is None:
        args = SimpleNamespace(
            ptrs=_small([block_table.data_ptr()], torch.uint64, device),
            strides=_small([block_table.stride(0)], torch.int64, device),
            block_sizes=_small([page_size], torch.int32, device),
            enabled=_small([True], torch.bool, device),
            dcp_sharded=_small([True], torch.bool, device),
        )
        _launch_args[key] = args
    return args


def _check_aligned(name: str, t: torch.Tensor) -> None:
    # vLLM's _load_ptr declares every table pointer it loads a multiple of 16 bytes
    # (tl.multiple_of): the compiler may use that, so a view that is not must be refused.
    if t.data_ptr() % 16:
        raise ValueError(
            f"vLLM's kernels require {name} to start on a 16-byte boundary (_load_ptr declares "
            f"it), got an address {t.data_ptr() % 16} bytes past one"
        )


def vllm_gather_block_tables(
    block_table: torch.Tensor,
    num_blocks: torch.Tensor,
    idx_mapping: torch.Tensor,
    out: torch.Tensor,
    *,
    batch: BatchContext,
) -> None:
    """vLLM's ``_gather_block_tables_kernel`` under the ``"block_table"`` contract (shapes as
    ``pagegraph.kernels.block_table.gather_block_tables``), launched as
    ``BlockTables.gather_block_tables`` launches it for one group. ``ValueError`` when the two
    tables' row strides differ (vLLM's kernel has one stride for both) or when either does
    not start on a 16-byte boundary."""
    if block_table.stride(0) != out.stride(0):
        raise ValueError(
            "vLLM's _gather_block_tables_kernel requires equal row strides of block_table and "
            f"out (one stride for both), got {block_table.stride(0)} and {out.stride(0)}"
        )
    _check_aligned("block_table", block_table)
    _check_aligned("out", out)
    if batch.num_rows == 0:
        return
    kernel = load_vllm_kernels().gather
    args = gather_launch_args(block_table, out)
    counts = num_blocks.unsqueeze(0)  # vLLM's [num_groups, max_reqs] (a view)
    kernel[(1, batch.num_rows)](
        idx_mapping,
        args.src_ptrs,
        args.dst_ptrs,
        args.strides,
        counts,
        counts.stride(0),
        batch.num_reqs,
        args.reach,
        args.reach,
        args.block_sizes,
        MASK_SLIDING_WINDOW=False,
        BLOCK_SIZE=GATHER_BLOCK_SIZE,
    )


declare_outputs(vllm_gather_block_tables, "block_table")


def vllm_compute_slot_mappings(
    block_table: torch.Tensor,
    idx_mapping: torch.Tensor,
    query_start_loc: torch.Tensor,
    positions: torch.Tensor,
    slot_mapping: torch.Tensor,
    page_size: int,
    *,
    group: RingGroup | None = None,
) -> None:
    """vLLM's ``_compute_slot_mappings_kernel`` under the ``"slot_mapping"`` contract (shapes as
    ``pagegraph.kernels.slot_mapping.compute_slot_mappings``), launched as
    ``BlockTables.compute_slot_mappings`` launches it for one group, no context parallelism.
    ``ValueError`` when ``block_table`` does not start on a 16-byte boundary.

    ``group`` (a ``pagegraph.kinds.kv_group_layout.KVGroup`` on a scenario with ``kv_groups``):
    the group's block size and row stride are ``page_size`` and ``block_table``'s; its slot
    mapping is enabled whatever its kind, as ``BlockTables`` enables every group by default
    (``slot_mapping_enabled=None``; which groups vLLM's runner disables is decided outside
    the files loaded here)."""
    _check_aligned("block_table", block_table)
    kernels = load_vllm_kernels()
    args = slot_mapping_launch_args(block_table, page_size)
    slots = slot_mapping.unsqueeze(0)  # vLLM's [num_groups, max_num_tokens] (a view)
    kernels.slot_mappings[(1, idx_mapping.shape[0] + 1)](
        slots.shape[1],
        idx_mapping,
        query_start_loc,
        positions,
        args.ptrs,
        args.strides,
        args.block_sizes,
        args.enabled,
        args.dcp_sharded,
        slots,
        slots.stride(0),
        0,
        CP_SIZE=1,
        CP_INTERLEAVE=1,
        PAD_ID=kernels.pad_slot_id,
        TRITON_BLOCK_SIZE=SLOT_BLOCK_SIZE,
    )


declare_outputs(vllm_compute_slot_mappings, "slot_mapping")

#: vLLM's builders under pagegraph's contracts, by the name the checker knows them by; empty
#: where vLLM's kernel files are not found (``vllm_unavailable_reason()`` says why).
VLLM_BUILDERS: dict[str, Callable[..., object]] = (
    {
        "vllm_gather_block_tables": vllm_gather_block_tables,
        "vllm_compute_slot_mappings": vllm_compute_slot_mappings,
    }
    if vllm_available()
    else {}
)
