"""vLLM #20301: FA3's split count, chosen on the host at capture, caps what a full-graph
replay reduces (the fix passes ``num_splits`` as an upper bound at capture and run time).

The reader: split-K attention whose splits each cover a fixed number of tokens, the combine
reducing the host ``num_splits`` splits, so tokens past ``num_splits * SPLIT_TOKENS`` are never
reduced. Buggy: ``num_splits`` from the heuristic on the batch at hand (one split at capture,
whose rows hold one token). Fixed: the upper bound from the table's capacity, at every launch.
"""

from __future__ import annotations

import torch

from ...consumers.reader import HostBatch, Reader
from ...kernels.contract import cdiv
from ..readers import split_attention
from ..record import Twin, WildBug

#: Tokens one split covers.
SPLIT_TOKENS = 64


def split_k_attention(
    q, k_cache, v_cache, page_table, cache_seqlens, out, *, page_size, workspace, num_splits: int
) -> torch.Tensor:
    """Decode attention reduced over ``num_splits`` splits of ``SPLIT_TOKENS`` tokens (shapes
    as ``paged_decode_attention``'s; ``workspace``, pagegraph's split-K buffers, unused)."""
    o = split_attention(
        q,
        k_cache,
        v_cache,
        page_table,
        cache_seqlens,
        page_size=page_size,
        splits=num_splits,
        split_tokens=SPLIT_TOKENS,
    )
    return out.copy_(o)


def _heuristic_splits(host: HostBatch) -> dict:
    """Buggy: as many splits as the longest row of this batch fills (one at capture)."""
    bound = cdiv(host.capacity, SPLIT_TOKENS)
    return {"num_splits": max(1, min(bound, cdiv(host.max_len, SPLIT_TOKENS)))}


def _upper_bound_splits(host: HostBatch) -> dict:
    """Fixed: the splits the capacity needs, passed at capture and at run time alike."""
    return {"num_splits": cdiv(host.capacity, SPLIT_TOKENS)}


BUG = WildBug(
    key="vllm-20301",
    engine="vLLM",
    version="V1, mid-2025 (FlashAttention-3 AoT scheduling under full CUDA graphs)",
    ref="vllm-project/vllm#20301",
    state="merged",
    bug_class="b",
    symptom="Illegal memory access with full CUDA graphs and FA3 ahead-of-time scheduling, "
    "which had been disabled under full graphs for it.",
    cause="num_splits was chosen by FA3's host heuristic from the batch at capture; replays "
    "kept that split layout while later batches needed more splits.",
    prop="output correct through the consumer",
    buggy=Twin(
        reader=Reader("FA3 split-K, heuristic num_splits", split_k_attention, _heuristic_splits)
    ),
    fixed=Twin(
        reader=Reader("FA3 split-K, num_splits upper bound", split_k_attention, _upper_bound_splits)
    ),
)
