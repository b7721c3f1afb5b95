"""TensorRT-LLM #16290: the DSA indexer's top-k output buffer was a fresh ``torch.empty`` on every
forward, so the address a captured graph baked in went stale once the allocator's layout moved
(the fix routes the output into a persistent buffer allocated once).

Modelled with the page table as the output buffer: the buggy engine allocates a new one before
every step, as the indexer's forward did, and its graphs still write the one they captured; the
fixed engine keeps one buffer for the graphs' lifetime.
"""

from __future__ import annotations

from typing import Any

import torch

from ...graph.runner import GraphRunner
from ...graph.staging import BatchValues
from ..wild_bug import Fidelity, Twin, WildBug


class FreshOutputEachStep(GraphRunner):
    """Buggy: ``page_table``, the step's output, is a new allocation at every step: the graph
    writes the buffer it captured, and the engine's handle is the step's own ``torch.empty``."""

    def replay(
        self, req_pool_indices: BatchValues, seq_lens: BatchValues
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        out = super().replay(req_pool_indices, seq_lens)
        self.page_table = torch.empty_like(self.page_table)  # torch.empty per forward
        self._views = {}
        return out


def fresh_output_each_step(req_to_token: torch.Tensor, **kwargs: Any) -> GraphRunner:
    return FreshOutputEachStep(req_to_token, **kwargs)


def persistent_output(req_to_token: torch.Tensor, **kwargs: Any) -> GraphRunner:
    """Fixed: the output lives in one buffer allocated before capture."""
    return GraphRunner(req_to_token, **kwargs)


BUG = WildBug(
    key="tensorrt-llm-16290",
    engine="TensorRT-LLM",
    version="main, July 2026 (GLM 5.2 / DeepSeek-V3.2 DSA + MTP one-model spec decode)",
    ref="NVIDIA/TensorRT-LLM#16290",
    state="merged",
    bug_class="f",
    symptom="Illegal memory access during the advanced-sampling CUDA-graph warm-up at per-rank "
    "batch > 16.",
    cause="Indexer.sparse_attn_indexer allocated its top-k output with torch.empty on every "
    "forward; a co-captured sampler's allocations moved the pool's layout and the graph-baked "
    "output address went stale.",
    prop="static buffers unmoved",
    buggy=Twin("build_page_table", runner=fresh_output_each_step),
    fixed=Twin("build_page_table", runner=persistent_output),
    fidelity=Fidelity(
        modelled="a graph's output buffer re-allocated per step instead of persistent: the "
        "graph keeps writing the address it captured while the engine reads the new one",
        fix="PR #16290: route the top-k output into a persistent buffer created once, as the "
        "indexer's scratch buffers already were",
        stands_in=(
            "the page table for the indexer's top-k output buffer",
            "a new allocation before every replay for the pool's layout moving under a "
            "co-captured allocator user",
        ),
    ),
)
