"""FlashAttention #1164: ``flash_attn_varlen_func`` under a CUDA graph attends as far as the
``max_seqlen_k`` it was captured with (fixed in the kernel by vllm-project/flash-attention#18).

The reader is the split-KV varlen kernel: ``SPLITS`` splits a row (a host value, the launch's
grid), each covering ``n_blocks_per_split`` key blocks of ``BLOCK_N`` tokens, combined per row;
each split stops at the row's own length. Buggy: ``n_blocks_per_split`` comes from
``params.seqlen_k``, the host ``max_seqlen_k`` (the batch's longest length, one token at
capture), so a replay's splits cover only what the capture's bound spread over them. Fixed, as
the kernel fix has it: from each row's own ``actual_seqlen_k`` (its ``cache_seqlens``), read on
the device.
"""

from __future__ import annotations

import torch

from ...consumers.reader import HostBatch, Reader
from ...kernels.contract import cdiv
from ..range_attention import merge, partials, token_kv
from ..wild_bug import Fidelity, Twin, WildBug

#: Splits of a row (``num_splits``: a host value, the grid of the captured launch).
SPLITS = 4
#: Tokens of one key block (``kBlockN``).
BLOCK_N = 16


def _cdiv_rows(a: torch.Tensor, b: int) -> torch.Tensor:
    """``cdiv`` of each entry of ``a``."""
    return -(-a // b)


def _split_kv(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    page_table: torch.Tensor,
    cache_seqlens: torch.Tensor,
    out: torch.Tensor,
    page_size: int,
    seqlen_k: torch.Tensor,
) -> torch.Tensor:
    """Split-KV decode attention: split ``s`` of row ``i`` covers key blocks ``[s * nb_i, (s +
    1) * nb_i)``, ``nb_i = cdiv(cdiv(seqlen_k[i], BLOCK_N), SPLITS)``, below the row's length
    (``seqlen_k`` ``[bs]`` int64: the value the partition is computed from). Shapes as
    ``paged_decode_attention``'s."""
    bs, num_q_heads, head_dim = q.shape
    dev, width = q.device, page_table.shape[1]
    cap = width * page_size
    span = cdiv(cdiv(cap, BLOCK_N), SPLITS) * BLOCK_N  # the most tokens a split may cover
    per_split = _cdiv_rows(_cdiv_rows(seqlen_k.clamp(0, cap), BLOCK_N), SPLITS) * BLOCK_N  # [bs]
    lens = cache_seqlens[:bs].long().clamp(0, cap)
    s = torch.arange(SPLITS, device=dev)[None, :, None]
    t = torch.arange(span, device=dev)[None, None, :]
    pos = s * per_split[:, None, None] + t  # [bs, SPLITS, span]
    live = (t < per_split[:, None, None]) & (pos < lens[:, None, None])
    rows = torch.arange(bs, device=dev).repeat_interleave(SPLITS)
    k, v = token_kv(k_cache, v_cache, page_table, rows, pos.reshape(bs * SPLITS, span), page_size)
    m, total, acc = partials(q[rows], k, v, live.reshape(bs * SPLITS, span), head_dim**-0.5)
    shape = (bs, SPLITS, num_q_heads)
    o = merge(m.reshape(shape), total.reshape(shape), acc.reshape(*shape, head_dim), dim=1)
    return out.copy_(o)


def split_from_max_seqlen_k(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    page_table: torch.Tensor,
    cache_seqlens: torch.Tensor,
    out: torch.Tensor,
    *,
    page_size: int,
    workspace: object,
    max_seqlen_k: int,
) -> torch.Tensor:
    """Buggy: the splits are sized from ``params.seqlen_k`` (the host ``max_seqlen_k``)."""
    seqlen_k = torch.full((q.shape[0],), max_seqlen_k, dtype=torch.int64, device=q.device)
    return _split_kv(q, k_cache, v_cache, page_table, cache_seqlens, out, page_size, seqlen_k)


def split_from_actual_seqlen_k(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    page_table: torch.Tensor,
    cache_seqlens: torch.Tensor,
    out: torch.Tensor,
    *,
    page_size: int,
    workspace: object,
    max_seqlen_k: int,
) -> torch.Tensor:
    """Fixed (flash-attention#18): the splits are sized from each row's ``actual_seqlen_k``."""
    seqlen_k = cache_seqlens[: q.shape[0]].long()
    return _split_kv(q, k_cache, v_cache, page_table, cache_seqlens, out, page_size, seqlen_k)


def _batch_max(host: HostBatch) -> dict[str, int]:
    """``max_seqlen_k`` as the engine passes it: the batch's longest length, on the host (the
    capture's one token, in a graph)."""
    return {"max_seqlen_k": host.max_len}


BUG = WildBug(
    key="flashattn-1164",
    engine="FlashAttention",
    version="2.6 (flash_attn_varlen_func, as vLLM used it; not stated in the thread)",
    ref="Dao-AILab/flash-attention#1164",
    state="open (kernel fix in vllm-project/flash-attention#18, merged)",
    bug_class="b",
    symptom="Under CUDA graphs, flash_attn_varlen_func's output depends on the context length "
    "used at capture.",
    cause="compute_attn_1rowblock_splitkv sized its splits from params.seqlen_k (the host "
    "max_seqlen_k baked into the captured launch) instead of the row's actual_seqlen_k, so "
    "replays cover only the keys the capture's bound reached.",
    prop="output correct through the consumer",
    buggy=Twin(
        reader=Reader(
            "split-KV varlen, splits from max_seqlen_k", split_from_max_seqlen_k, _batch_max
        )
    ),
    fixed=Twin(
        reader=Reader(
            "split-KV varlen, splits from actual_seqlen_k", split_from_actual_seqlen_k, _batch_max
        )
    ),
    fidelity=Fidelity(
        modelled="The split-KV kernel's blocks per split computed from the launch's host "
        "seqlen_k (max_seqlen_k, frozen at capture) rather than each row's actual_seqlen_k.",
        stands_in=(
            "plain-torch split attention (4 splits of 16-token key blocks) for the CUDA kernel",
        ),
        fix="vllm-project/flash-attention#18: compute_attn_1rowblock_splitkv uses "
        "binfo.actual_seqlen_k (the row's device length) for its split partition; the host "
        "max_seqlen_k is still passed, and no longer bounds the keys.",
        refs=("vllm-project/flash-attention#18",),
    ),
)
