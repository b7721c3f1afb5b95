"""xLLM #932: the decode step's KV-cache write read each row's block id as if the block table were
contiguous (row ``i`` at ``i * width``), while under CUDA-graph replay the table is a slice of a
persistent buffer with a wider row stride; rows past the first read other rows' entries and
wrote their KV at wrong slots (the fix reads the table through its row stride).

Modelled in the decode step: the page table is a column slice of a wider buffer (``[layout]
table_pad_cols``), and the step's cache write finds each real row's new-token slot through the
block table, flattened with the width as the row stride (buggy) or with the table's own
``stride(0)`` (fixed); padded rows go to the discard slot. Paged attention reads the cache
after it. Property "cache write exact".
"""

from __future__ import annotations

import torch

from ...consumers import paged_decode_attention
from ...consumers.reader import CacheWrite, Reader
from ..wild_bug import Fidelity, Twin, WildBug


def _write_through_block_table(w: CacheWrite, *, row_stride_from_table: bool) -> None:
    """Each real row's new K/V at ``block * page_size + pos % page_size``, its block read
    from the table flattened with a row stride of the table's (fixed) or its width (buggy)."""
    table = w.page_table
    bs, width = table.shape
    stride = table.stride(0) if row_stride_from_table else width
    flat = table.as_strided(((bs - 1) * stride + width,), (1,))  # the table's span, a view
    pos = (w.lengths.long() - 1).clamp(min=0)
    col = torch.div(pos, w.page_size, rounding_mode="floor").clamp(max=width - 1)
    rows = torch.arange(bs, device=table.device)
    block = flat[rows * stride + col].long()
    slots = block.clamp(min=0) * w.page_size + pos.remainder(w.page_size)
    slots = torch.where(w.idx_mapping >= 0, slots, w.discard_slot)
    heads, dim = w.k_new.shape[1:]
    for cache, new in ((w.k_cache, w.k_new), (w.v_cache, w.v_new)):
        cache.view(-1, heads, dim).index_copy_(0, slots, new)


def _reader(*, row_stride_from_table: bool) -> Reader:
    def write(w: CacheWrite, **launch: object) -> None:
        _write_through_block_table(w, row_stride_from_table=row_stride_from_table)

    name = "write_rows_at_table_stride" if row_stride_from_table else "write_rows_at_width"
    write.__name__ = name
    return Reader(name, paged_decode_attention, write_cache=write)


BUG = WildBug(
    key="xllm-932",
    engine="xLLM",
    version="main, February 2026 (REC multi-round decode, enable_graph=true)",
    ref="xLLM-AI/xllm#932",
    state="merged",
    bug_class="d",
    symptom="Accuracy mismatch in REC multi-round decode with CUDA graphs on: wrong KV-cache "
    "writes and decode divergence.",
    cause="decoder_reshape_and_cache read block ids with a stride-1 row layout; under graph "
    "replay block_table is a slice of a persistent tensor with a larger row stride, so rows "
    "past the first read the wrong entries.",
    prop="cache write exact",
    buggy=Twin("build_page_table", _reader(row_stride_from_table=False)),
    fixed=Twin("build_page_table", _reader(row_stride_from_table=True)),
    fidelity=Fidelity(
        modelled="a cache write that indexes the block table as contiguous rows while the "
        "graph's table is a strided slice of a persistent buffer: rows past the first read "
        "outside their own row, and their K/V land at wrong slots",
        fix="PR #932: read block_table through its actual stride(0) in decoder_reshape_and_cache",
        stands_in=(
            "pagegraph's page table, a column slice with pad columns, for xLLM's "
            "sliced persistent block table",
        ),
    ),
)
