"""vLLM #53658: the FULL-graph dummy run's lengths claim more blocks than a row holds (the fix
clamps the dummy lengths to ``max_model_len``).

Modelled as a page-table builder over rows padded with a huge dummy length (``padding =
"overlong"``, as the dummy run's): each row's blocks, ``cdiv(seq_len, page_size)`` of them,
go through the flat table at ``row * stride + block``, as an unmasked access does, within the
table's own rows (what lies past them is not modelled). The fixed twin clamps a row's blocks
to its capacity, the table's width.
"""

from __future__ import annotations

import torch

from ..record import Twin, WildBug


def _blocks_from_lengths(*, clamp_to_row: bool):
    def build(req_to_token, req_pool_indices, seq_lens, page_table, page_size) -> None:
        bs, width = page_table.shape
        stride = page_table.stride(0)
        span = bs * stride  # the table's rows, their padding columns included
        flat = page_table.as_strided((span,), (1,))
        cols = torch.arange(span, device=page_table.device)
        blocks = (seq_lens[:bs].long().clamp(min=0) + page_size - 1) // page_size
        if clamp_to_row:
            blocks = blocks.clamp(max=width)  # the fix: no more than the row holds
        rows = req_pool_indices[:bs].long().clamp(0, req_to_token.shape[0] - 1)
        last = req_to_token.shape[1] - 1
        for i in range(bs):  # host sizes only: one where per row, rows in order
            p = cols - i * stride
            token = (p * page_size).clamp(0, last)
            pages = req_to_token[rows[i : i + 1, None], token[None]][0].long() // page_size
            mine = (p >= 0) & (p < blocks[i : i + 1])
            flat.copy_(torch.where(mine, pages.to(flat.dtype), flat))

    build.__name__ = build.__qualname__ = (
        "dummy_blocks_clamped_to_row" if clamp_to_row else "dummy_blocks_from_length"
    )
    return build


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
    prop="row containment",
    buggy=Twin(_blocks_from_lengths(clamp_to_row=False)),
    fixed=Twin(_blocks_from_lengths(clamp_to_row=True)),
)
