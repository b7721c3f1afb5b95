"""vLLM #53658: the FULL-graph dummy run gives every dummy request a ``seq_len`` past
``max_model_len``, and TRITON_ATTN's unified attention loads the block table unmasked over
``cdiv(seq_len, block_size)`` columns: past the row, and for the last row past the table (the
fix, PR #53671, clamps the dummy run's lengths to ``max_model_len`` in the model runner).

Modelled in the decode step: padded rows stand for the dummy requests, carrying a length far
past what a row holds (``padding = "overlong"``), and vLLM's null block is page 0
(``null_block = "finite"``). The reader is unified attention written in torch: row ``i``'s
block ``j`` is loaded from the table's memory at ``i * stride + j`` for every ``j <
cdiv(seq_len, block_size)``, with no mask against the row's width, and its tokens below
``seq_len`` attended. Buggy: the dummy lengths reach the kernel as they are. Fixed: the runner
clamps them to ``max_model_len`` (the table's capacity) before the metadata is built, in the
step's first node (the builder's place), never in the kernel.
"""

from __future__ import annotations

import torch

from ...kernels.page_table import build_page_table
from ..range_attention import partials
from ..wild_bug import Fidelity, Twin, WildBug


def _pointer(t: torch.Tensor) -> torch.Tensor:
    """A flat view from ``t``'s first entry to the end of its allocation: what the kernel's
    pointer into ``t`` addresses."""
    n = t.untyped_storage().nbytes() // t.element_size() - t.storage_offset()
    return t.as_strided((n,), (1,), t.storage_offset())


def _pages(cache: torch.Tensor, page: torch.Tensor, slot: torch.Tensor) -> torch.Tensor:
    """``cache[page, slot]`` as a kernel's pointer arithmetic reads it: page -1 is the memory
    before page 0 (the bed's guard page), not the last page; ids outside the allocation are
    clamped into it (past it a GPU faults; not modelled)."""
    stride = cache.stride(0)
    before = cache.storage_offset() // stride
    total = (cache.untyped_storage().nbytes() // cache.element_size()) // stride
    whole = cache.as_strided(
        (total, *cache.shape[1:]), cache.stride(), cache.storage_offset() - before * stride
    )
    return whole[(page + before).clamp(0, total - 1), slot]


def unified_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    page_table: torch.Tensor,
    cache_seqlens: torch.Tensor,
    out: torch.Tensor,
    *,
    page_size: int,
    workspace: object,
) -> torch.Tensor:
    """TRITON_ATTN's decode (shapes as ``paged_decode_attention``'s; ``workspace`` unused):
    block ``j`` of row ``i`` loaded at ``i * stride + j`` of the table's memory, unmasked, for
    every ``j < cdiv(seq_len, page_size)``; tokens below ``seq_len`` attended. A load past the
    table's allocation reads its last entry (on a GPU an illegal address: not modelled)."""
    bs, _, head_dim = q.shape
    dev = q.device
    table = _pointer(page_table)
    entries = table.numel()  # a row may reach the end of the table's memory
    addr = torch.arange(bs, device=dev)[:, None] * page_table.stride(0)
    addr = addr + torch.arange(entries, device=dev)[None, :]
    blocks = table[addr.clamp(max=entries - 1)].long()  # [bs, entries]: no mask
    pos = torch.arange(entries * page_size, device=dev)
    live = pos[None, :] < cache_seqlens[:bs].long()[:, None]  # the length, unclamped
    page = blocks[:, pos // page_size]
    slot = (pos % page_size)[None, :].expand_as(page)
    k = _pages(k_cache, page, slot).float()
    v = _pages(v_cache, page, slot).float()
    _, total, acc = partials(q, k, v, live, head_dim**-0.5)
    # A row without a token gives zeros; a NaN read stays NaN.
    o = acc / torch.where(total == 0, 1.0, total)[..., None]
    return out.copy_(o)


def clamp_dummy_lengths(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    page_table: torch.Tensor,
    page_size: int,
) -> None:
    """The fix (#53671): the runner's lengths clamped to ``max_model_len`` (the table's
    capacity) before the attention metadata is built from them, then pagegraph's build."""
    bs, width = page_table.shape
    seq_lens[:bs].clamp_(max=width * page_size)
    build_page_table(req_to_token, req_pool_indices, seq_lens, page_table, page_size)


BUG = WildBug(
    key="vllm-53658",
    engine="vLLM",
    version="0.23 (V1 GPUModelRunner, FULL CUDA graphs)",
    ref="vllm-project/vllm#53658",
    state="open (fix PR #53671 open)",
    bug_class="d",
    symptom="Illegal memory access during FULL-graph capture warm-up (TRITON_ATTN), or a "
    "sliding-mask shape mismatch (FLEX_ATTENTION), once a capture size passes max_model_len.",
    cause="The dummy run set every dummy request's seq_len to the step's token count, past "
    "max_model_len: it claimed more blocks than a block-table row holds, and the unmasked "
    "block-table loads ran past the row.",
    prop="reader reads only its row",
    buggy=Twin("build_page_table", reader=unified_attention),
    fixed=Twin(clamp_dummy_lengths, reader=unified_attention),
    fidelity=Fidelity(
        modelled="dummy rows whose seq_len passes what a block-table row holds, read by an "
        "attention kernel that loads cdiv(seq_len, block_size) block-table entries unmasked, "
        "past its row into the next rows' and past the table",
        stands_in=(
            "padded rows with the overlong padding's length (2^31 - 1) for the dummy run's "
            "requests with seq_len = num_tokens",
            "a decode-step replay for the capture's dummy run",
            "torch over the table's memory for kernel_unified_attention's block-table loads",
            "a read past the table's allocation clamped to its last entry for the illegal "
            "address a GPU faults on",
            "the step's builder node for the model runner, where the fix clamps",
        ),
        fix="vllm-project/vllm#53671: the dummy run's seq_lens clamped to max_model_len in "
        "GPUModelRunner._dummy_run, before the attention metadata is built",
        refs=("cloudrift-ai/emmy#520",),
    ),
)
