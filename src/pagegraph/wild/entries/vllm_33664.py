"""vLLM #33664: a zero-length padded row reads block -1 of its block table, outside the KV cache
(the fix, #35431, pads block tables with the null block 0).

Modelled in the decode step: pagegraph's page-table builder, then the engine's padding of the
rows whose length is 0, and a reader (paged attention) that reads every row's last block, a
zero-length row's too. The scenario's null block holds data (``null_block = "finite"``), so
padded rows' outputs are judged: block -1 reads the NaN guard page before page 0.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ...consumers import DecodeWorkspace, paged_decode_attention
from ...consumers.reader import Reader
from ...kernels.page_table import build_page_table
from ..wild_bug import Fidelity, Twin, WildBug


def _padded_table(fill: int) -> Callable[..., None]:
    """A page-table builder that pads every row of length 0 with block ``fill``."""

    def build(
        req_to_token: torch.Tensor,
        req_pool_indices: torch.Tensor,
        seq_lens: torch.Tensor,
        page_table: torch.Tensor,
        page_size: int,
    ) -> None:
        build_page_table(req_to_token, req_pool_indices, seq_lens, page_table, page_size)
        # In the graph a padded row is known by its length 0 (real rows hold a token).
        page_table.masked_fill_((seq_lens <= 0)[:, None], fill)

    build.__name__ = f"page_table_padded_{'minus_one' if fill < 0 else 'null_block'}"
    return build


def last_block_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    page_table: torch.Tensor,
    cache_seqlens: torch.Tensor,
    out: torch.Tensor,
    *,
    page_size: int,
    workspace: DecodeWorkspace | None,
) -> torch.Tensor:
    """Paged decode attention whose block loop always runs on the row's last block.

    q ``[bs, Hq, D]``, caches ``[pages, page_size, Hkv, D]``, page_table ``[bs, width]`` int32,
    cache_seqlens ``[bs]`` int32. A row of length ``n > 0`` reads as ``paged_decode_attention``
    does; a zero-length row reads one token of block ``page_table[row, (n - 1) // page_size]``
    (column -1: the row's last entry).
    """
    n = cache_seqlens.long()
    last = torch.div(n - 1, page_size, rounding_mode="floor")
    cols = last.remainder(page_table.shape[1])[:, None]
    block = page_table.gather(1, cols)
    table = page_table.clone()
    table[:, :1] = torch.where((n <= 0)[:, None], block, page_table[:, :1])
    lens = n.clamp(min=1).to(torch.int32)
    return paged_decode_attention(
        q, k_cache, v_cache, table, lens, out, page_size=page_size, workspace=workspace
    )


READER = Reader("flashmla_last_block", last_block_attention)

BUG = WildBug(
    key="vllm-33664",
    engine="vLLM",
    version="V1 model runner before #35431 (FlashMLA FP8 decode; Kimi-K2.5, TP8 + EP)",
    ref="vllm-project/vllm#33664",
    state="fixed by #35431",
    bug_class="e",
    symptom="Illegal memory access in FlashMLA's FP8 decode during CUDA-graph replay, on the "
    "padded batch rows.",
    cause="Padded rows carried seq_len 0 and block table -1; the kernel reads a row's last "
    "block (n - 1) // page_size even at length 0, so block id -1 gave a negative KV offset.",
    prop="padded rows read inside the KV pool",
    buggy=Twin(_padded_table(-1), READER),
    fixed=Twin(_padded_table(0), READER),
    fidelity=Fidelity(
        modelled="Padded rows of length 0 whose block tables hold -1, read by a kernel that "
        "loads the row's last block (n - 1) // page_size even at length 0: block -1.",
        stands_in=(
            "pagegraph's paged attention made to read a zero-length row's last block for the "
            "FlashMLA FP8 decode kernel",
            "the NaN guard page before page 0 for the negative KV offset",
        ),
        fix="#35431: block-table CUDA-graph padding uses the null block 0 instead of -1 (the "
        "alternative #35969 clamped seq_lens and the table in the FlashMLA builder).",
        refs=("vllm-project/vllm#35431",),
    ),
)
