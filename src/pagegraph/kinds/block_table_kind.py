"""vLLM's batch block tables (model runner v2): gathered eagerly, before each replay, from the
engine's per-request block tables into the persistent table the captured graph reads.

``build(block_table, num_blocks, idx_mapping, out, *, batch)``: for a real row ``i <
batch.num_reqs``, ``out[i, p] = block_table[idx_mapping[i], p]`` for ``p <
num_blocks[idx_mapping[i]]`` (the rest of the row is not written); rows ``num_reqs <= i <
batch.num_rows`` are cleared to the null block 0 over the whole width; nothing else is
written. ``block_table`` ``[max_reqs, width]`` and ``num_blocks`` ``[max_reqs]`` (int32) are
the engine's state between steps (``pagegraph.workload.engine_block_tables.EngineBlockTables``);
``idx_mapping`` is the batch's request slots (int32), ``out`` ``[>= num_rows, width]`` int32.
The host guarantees ``num_blocks <= width`` (vLLM raises when a row's blocks would pass its
capacity), so a longer row is a hostile injection only.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from .base import KindSpec, PaddedRows
from .seams import Builder, BuilderIO


class BlockTableKind(KindSpec):
    name = "block_table"
    signature = "build(block_table, num_blocks, idx_mapping, out, *, batch)"
    positional = 4
    keywords = ("batch",)
    where = "eager"
    swa = False
    #: the batch table is what vLLM's captured attention reads (TRITON_ATTN's block_table)
    feeds_consumer = True
    error_kinds = ()
    padded_rows = PaddedRows("cleared", 0)
    engine_state = "block_tables"
    #: vLLM pads with length 0; its padded rows are never read (``num_reqs`` bounds the copy)
    paddings = ("vllm",)
    reference = "reference_block_table"

    def load_builders(self) -> dict[str, Builder]:
        from ..kernels.block_table import gather_block_tables
        from ..kernels.vllm_reference import reference_block_table

        return {
            "gather_block_tables": gather_block_tables,
            "reference_block_table": reference_block_table,
        }

    def derived_inputs(
        self, max_bs: int, draft_tokens: int, device: torch.device
    ) -> dict[str, torch.Tensor]:
        """``idx_mapping`` ``[max_bs]`` int32, the batch's request slots as vLLM holds them
        (the staged indices may be int64)."""
        return {"idx_mapping": torch.zeros(max_bs, dtype=torch.int32, device=device)}

    def call(self, builder: Builder, io: BuilderIO, bs: int, extra: Mapping[str, object]) -> None:
        # The whole persistent table, as vLLM passes it: the bucket is ``batch.num_rows``, and
        # a builder that writes rows past it shows.
        engine, idx = self.engine_of(io), io.derived["idx_mapping"][:bs]
        idx.copy_(io.req_pool_indices[:bs])
        builder(engine.block_table, engine.num_blocks, idx, io.page_table, **extra)


BLOCK_TABLE = BlockTableKind()
