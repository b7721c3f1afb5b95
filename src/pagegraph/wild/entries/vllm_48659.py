"""vLLM #48659: with dual-batch overlap, micro-batch 1 reuses micro-batch 0's cached attention
metadata, swapping in only its own block table (the fix adds the micro-batch id to the
metadata cache's key).

Modelled as an engine that runs each bucket as two micro-batches (its first and second half of
rows), each built by its own builder call into its rows of the page table, through a cache of
each micro-batch's metadata. On a cache hit the engine takes the update path, as vLLM's
``update_block_table`` does: the micro-batch's own block table (its own requests' rows of the
pool) comes in, the cached lengths stay. The page table's live extent (``cdiv(seq_len,
page_size)`` entries a row) is how the bed sees the lengths a block table is read with: with
micro-batch 0's lengths, micro-batch 1's rows stop short of their own pages (never written) or
run past them.
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace
from typing import Any

import torch

from ...graph.runner import GraphRunner
from ..wild_bug import Fidelity, Twin, WildBug


@dataclasses.dataclass(frozen=True)
class UbatchMetadata:
    """One micro-batch's metadata: views of its rows of the static buffers (``[rows]`` index
    vectors of the staged batch, ``[rows, width]`` int32 page table)."""

    req_pool_indices: torch.Tensor
    seq_lens: torch.Tensor
    page_table: torch.Tensor


class DualBatchRunner(GraphRunner):
    """Runs each bucket of ``bs >= 2`` rows as two micro-batches, rows ``[0, bs // 2)`` and
    ``[bs // 2, bs)``, each with its own builder call (a page-table builder, no SWA), whose
    metadata come from a cache keyed by ``cache_key``. A hit keeps the cached metadata and
    swaps in the micro-batch's own block table, its requests' rows of the pool, and keeps the
    cached lengths (vLLM's ``update_block_table``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._metadata: dict[tuple[int, ...], UbatchMetadata] = {}

    def cache_key(self, bucket: int, ubatch: int) -> tuple[int, ...]:
        """Fixed: the bucket and the micro-batch."""
        return (bucket, ubatch)

    def _build(self, bs: int, n: int | None = None) -> None:
        if bs < 2:
            super()._build(bs, n)
            return
        half = bs // 2
        for ubatch, rows in enumerate((slice(0, half), slice(half, bs))):
            meta = self._ubatch_metadata(bs, ubatch, rows)
            io = SimpleNamespace(
                req_to_token=self.req_to_token,
                page_size=self.page_size,
                req_pool_indices=meta.req_pool_indices,
                seq_lens=meta.seq_lens,
                page_table=meta.page_table,
            )
            self.kind.call(self.builder, io, rows.stop - rows.start, {})

    def _ubatch_metadata(self, bucket: int, ubatch: int, rows: slice) -> UbatchMetadata:
        own_table = self.page_table[rows]
        key = self.cache_key(bucket, ubatch)
        meta = self._metadata.get(key)
        if meta is None:
            meta = self._metadata[key] = UbatchMetadata(
                self.req_pool_indices[rows], self.seq_lens[rows], own_table
            )
        # The update path: the block table (the requests' rows) is the micro-batch's own, the
        # lengths (seq_lens, cu_seqlens_q, the scheduler metadata) are the cached entry's.
        return dataclasses.replace(
            meta, req_pool_indices=self.req_pool_indices[rows], page_table=own_table
        )


class UbatchBlindCacheRunner(DualBatchRunner):
    """Buggy: the key lacks the micro-batch, so micro-batch 1 hits micro-batch 0's entry: its
    own block table, micro-batch 0's lengths."""

    def cache_key(self, bucket: int, ubatch: int) -> tuple[int, ...]:
        return (bucket,)


BUG = WildBug(
    key="vllm-48659",
    engine="vLLM",
    version="V1 main, 2026 (dual-batch overlap, FlashAttention)",
    ref="vllm-project/vllm#48659",
    state="open",
    bug_class="f",
    symptom="With DBO, FlashAttention's AssertionError on page_table.shape (micro-batch 1 "
    "run with micro-batch 0's lengths and scheduler metadata).",
    cause="The attention-metadata cache key was (kv_cache_spec, builder_type) without the "
    "micro-batch id: micro-batch 1 reused micro-batch 0's metadata tensors, swapping in only "
    "its own block table.",
    prop="correct",
    buggy=Twin("build_page_table", runner=UbatchBlindCacheRunner),
    fixed=Twin("build_page_table", runner=DualBatchRunner),
    fidelity=Fidelity(
        modelled="The metadata cache keyed without the micro-batch id: micro-batch 1 takes the "
        "update path on micro-batch 0's entry, its own block table with micro-batch 0's lengths.",
        stands_in=(
            "the page table's live extent (cdiv(seq_len, page_size) entries a row) for the "
            "seq_lens and cu_seqlens_q FlashAttention reads with the block table",
            "two halves of one bucket for the two micro-batches (scheduler metadata not modelled)",
        ),
        fix="#48659: the micro-batch id in the cache key (bucket, micro-batch): each micro-batch "
        "keeps its own metadata, lengths and block table together.",
    ),
)
