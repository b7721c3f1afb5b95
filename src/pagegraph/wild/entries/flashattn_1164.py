"""FlashAttention #1164: ``flash_attn_varlen_func`` under a CUDA graph attends as far as the
``max_seqlen_k`` it was captured with.

The reader: each row attends to ``min(cache_seqlens[i], max_seqlen_k)`` tokens (the key blocks
the launch covers), clamped in a buffer allocated once, then pagegraph's paged attention.
Buggy: ``max_seqlen_k`` is the batch's longest length, computed on the host at each launch
(one token at capture). Fixed: the table's capacity, a static bound, as an engine that captures
passes it.
"""

from __future__ import annotations

import torch

from ...consumers import paged_decode_attention
from ...consumers.reader import HostBatch, Reader
from ..record import Twin, WildBug


def _lengths_buffer(max_bs: int, width: int, page_size: int, device) -> dict[str, torch.Tensor]:
    """The clamped lengths, ``[max_bs]`` int32, allocated once before capture."""
    return {"seqlen_k": torch.zeros(max_bs, dtype=torch.int32, device=device)}


def varlen_attention(
    q,
    k_cache,
    v_cache,
    page_table,
    cache_seqlens,
    out,
    *,
    page_size,
    workspace,
    max_seqlen_k: int,
    plan: dict,
) -> torch.Tensor:
    """Decode attention whose key blocks stop at the host ``max_seqlen_k`` (shapes as
    ``paged_decode_attention``'s)."""
    lens = plan["seqlen_k"][: q.shape[0]]
    torch.clamp(cache_seqlens, max=max_seqlen_k, out=lens)
    return paged_decode_attention(
        q, k_cache, v_cache, page_table, lens, out, page_size=page_size, workspace=workspace
    )


def _batch_max(host: HostBatch) -> dict:
    """Buggy: the longest length of the batch at hand (the capture's one token, in a graph)."""
    return {"max_seqlen_k": host.max_len}


def _capacity(host: HostBatch) -> dict:
    """Fixed: the static capacity of a row, whatever the batch."""
    return {"max_seqlen_k": host.capacity}


BUG = WildBug(
    key="flashattn-1164",
    engine="FlashAttention",
    version="2.6 (flash_attn_varlen_func, as vLLM used it; not stated in the thread)",
    ref="Dao-AILab/flash-attention#1164",
    state="open (kernel fix in vllm-project/flash-attention#18, merged)",
    bug_class="b",
    symptom="Under CUDA graphs, flash_attn_varlen_func's output depends on the context length "
    "used at capture.",
    cause="max_seqlen_k is a host argument baked into the captured launch (and the split-KV "
    "kernel used it instead of each sequence's length), so replays keep the capture's bound.",
    prop="output correct through the consumer",
    buggy=Twin(
        reader=Reader(
            "varlen attention, max_seqlen_k from the batch",
            varlen_attention,
            _batch_max,
            workspace=_lengths_buffer,
        )
    ),
    fixed=Twin(
        reader=Reader(
            "varlen attention, max_seqlen_k = capacity",
            varlen_attention,
            _capacity,
            workspace=_lengths_buffer,
        )
    ),
)
