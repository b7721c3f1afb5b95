"""ik_llama.cpp #2136: the CUDA backend's graph-reuse test exempted a copy node's read source from
the address comparison, so when the source view stepped to a new block the graph was not
re-captured and replays read the old address (the fix compares the read source like any other
source, and re-captures).

Modelled with the table the graphs read from, ``req_to_token``, as the copy's read source: the
buggy engine steps its view of that data to new storage after a step and keeps replaying the
graphs captured on the old one, as the exempted comparison let it; the fixed engine's graphs
read the storage they were captured on, which it keeps current (a stand-in for re-capturing on
a moved source: the bed's graphs are captured once).
"""

from __future__ import annotations

from typing import Any

import torch

from ...graph.runner import GraphRunner
from ...graph.staging import BatchValues
from ..wild_bug import Fidelity, Twin, WildBug


class SourceStepsWithoutRecapture(GraphRunner):
    """Buggy: after each step the engine's ``req_to_token`` is a view at a new address (the
    window stepped to a new block); the graphs are not re-captured."""

    def replay(
        self, req_pool_indices: BatchValues, seq_lens: BatchValues
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        out = super().replay(req_pool_indices, seq_lens)
        self.req_to_token = self.req_to_token.clone()  # the stepped view: new storage
        return out


def source_steps_without_recapture(req_to_token: torch.Tensor, **kwargs: Any) -> GraphRunner:
    return SourceStepsWithoutRecapture(req_to_token, **kwargs)


def source_where_captured(req_to_token: torch.Tensor, **kwargs: Any) -> GraphRunner:
    """Fixed: the graphs' read source stays the storage they were captured on."""
    return GraphRunner(req_to_token, **kwargs)


BUG = WildBug(
    key="ik-llama-cpp-2136",
    engine="ik_llama.cpp",
    version="main, July 2026 (openPangu-2.0-Flash, q8_0 latent cache, -fa off, CUDA graphs)",
    ref="ikawrakow/ik_llama.cpp#2136",
    state="merged",
    bug_class="f",
    symptom="Past about 600 tokens the output collapses into a repetition loop: the "
    "sliding-window latent-K read replays the previous block's bytes.",
    cause="ggml_graph_node_has_matching_properties exempted GGML_OP_CPY from re-capture when "
    "its source address changed, for both operands; the read source src[0] has no "
    "indirection, so a moved source replayed a stale pointer.",
    prop="static buffers unmoved",
    buggy=Twin("build_page_table", runner=source_steps_without_recapture),
    fixed=Twin("build_page_table", runner=source_where_captured),
    fidelity=Fidelity(
        modelled="a graph input whose address moves between steps while the captured graph "
        "is reused: replays read the address captured, not the data the engine now holds",
        fix="PR #2136: compare the copy's read source (src[0]) like any other source, so a "
        "moved source re-captures; here the source stays where the graphs were captured",
        stands_in=(
            "req_to_token for the copy's read source (the latent-K window's view)",
            "a clone after each step for the view stepping to a new block",
            "a source that stays put for re-capturing on a moved source",
        ),
    ),
)
