"""The "paged" reader format: the page table and ``cache_seqlens`` as the builder writes them
(TensorRT-LLM's MHA, FlashAttention-3), read by ``paged_decode_attention``. Nothing is built in
the graph; the table's stale tails are the only stale entries.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ...kernels.contract import cdiv
from ..attention_reference import table_rows
from ..paged_attention import paged_decode_attention
from .spec import Metadata, ReaderFormat, Row, register_format

__all__ = ["PAGED"]


def _arguments(
    meta: Metadata, page_table: torch.Tensor, cache_seqlens: torch.Tensor
) -> tuple[torch.Tensor, ...]:
    return page_table, cache_seqlens


def _rows(args: Sequence[torch.Tensor], page_size: int, bs: int) -> list[Row]:
    page_table, cache_seqlens = args
    return table_rows(page_table[:bs], cache_seqlens, page_size)


def _overread_visible(lens: Sequence[int], page_size: int, width: int) -> bool:
    """Only a read past the width of the last real row lands outside every row the graph
    reads (the table's rows past the bucket): that row's pages must fill the width."""
    return cdiv(lens[-1] if lens else 0, page_size) >= width


PAGED = register_format(
    ReaderFormat(
        name="paged",
        kernel=paged_decode_attention,
        arguments=_arguments,
        rows=_rows,
        overread_visible=_overread_visible,
        past_row="the page table past its row's width ({width} entries)",
    )
)
