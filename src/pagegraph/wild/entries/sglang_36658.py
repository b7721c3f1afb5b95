"""SGLang #36658: a small metadata tensor made from a Python list inside a captured forward (the
fix makes the same values on the device with ``arange`` arithmetic).

Modelled as a plain-torch page-table builder that clamps each row's page count to the segment
``[0, width]`` of its table, the bounds made at each call from a Python list (buggy) or on the
device (fixed). The CPU's emulated capture refuses a device tensor made from host data as a
CUDA capture does.
"""

from __future__ import annotations

import torch

from ..wild_bug import Fidelity, Twin, WildBug


def _build(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    page_table: torch.Tensor,
    page_size: int,
    bounds: torch.Tensor,
) -> None:
    """``page_table[i, p] = req_to_token[req_pool_indices[i], p * page_size] // page_size`` for
    ``p < clamp(cdiv(seq_lens[i], page_size), bounds[0], bounds[1])``, every other entry
    written back unchanged (``page_table`` ``[bs, width]`` int32; ``bounds`` ``[2]`` int64
    ``[0, width]``; sync-free torch ops)."""
    bs, width = page_table.shape
    pages = torch.div(seq_lens[:bs].long() + page_size - 1, page_size, rounding_mode="floor")
    pages = torch.clamp(pages, bounds[0], bounds[1])
    live = torch.arange(width, device=page_table.device) < pages[:, None]
    rows = req_pool_indices[:bs].long().clamp(0, req_to_token.shape[0] - 1)
    starts = req_to_token[:, ::page_size][:, :width]  # each page's first slot, a view
    ids = torch.div(starts[rows], page_size, rounding_mode="floor").to(page_table.dtype)
    page_table.copy_(torch.where(live, ids, page_table))


def bounds_from_list(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    page_table: torch.Tensor,
    page_size: int,
) -> None:
    """Buggy: the bounds are a device tensor made from a Python list at every call."""
    width = page_table.shape[1]
    bounds = torch.tensor([0, width], device=page_table.device)
    _build(req_to_token, req_pool_indices, seq_lens, page_table, page_size, bounds)


def bounds_on_device(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    page_table: torch.Tensor,
    page_size: int,
) -> None:
    """Fixed: the same bounds made on the device, ``arange(2) * width``."""
    width = page_table.shape[1]
    bounds = torch.arange(2, device=page_table.device) * width
    _build(req_to_token, req_pool_indices, seq_lens, page_table, page_size, bounds)


BUG = WildBug(
    key="sglang-36658",
    engine="SGLang",
    version="main, August 2026 (multimodal_gen, sequence-parallel DiT with tail padding)",
    ref="sgl-project/sglang#36658",
    state="merged",
    bug_class="c",
    symptom="Capture of a whole signature aborts with 'Cannot copy between CPU and CUDA "
    "tensors during CUDA graph capture unless the CPU tensor is pinned'; it silently runs "
    "eagerly instead.",
    cause="tail_attn_meta built cu_seqlens_tail with torch.tensor([valid, num_pad], "
    "device=cuda) on every forward: a host-to-device copy from pageable memory inside capture.",
    prop="capture",
    buggy=Twin(bounds_from_list),
    fixed=Twin(bounds_on_device),
    fidelity=Fidelity(
        modelled="A small device tensor made from a Python list inside the captured forward: "
        "a pageable host-to-device copy the capture refuses.",
        stands_in=("a page-table builder's clamp bounds for tail_attn_meta's cu_seqlens_tail",),
        fix="The merged fix builds the same values on the device (arange arithmetic), no host "
        "data.",
    ),
)
