"""vLLM #34874: a second KV-cache group's metadata point at the first group's persistent buffers
(the fix copies them into each builder's own persistent buffers).

Modelled with the bed's two tables as two groups built by one builder call: the full table is
the first group's persistent buffer, the SWA table the second group's. The buggy engine hands
the builder the first group's buffer as the second group's output; the fixed one hands it the
second group's own.
"""

from __future__ import annotations

from typing import Any

import torch

from ...graph.runner import GraphRunner
from ..wild_bug import Fidelity, Twin, WildBug


def second_group_on_first_buffers(
    req_to_token: torch.Tensor,
    *,
    page_table: torch.Tensor,
    swa_page_table: torch.Tensor,
    **kwargs: Any,
) -> GraphRunner:
    """Buggy: the second group's metadata (``swa_page_table``, ``[max_bs, width]`` int32) is
    the first group's persistent buffer; its own buffer, which its reader reads, keeps what it
    held at capture."""
    del swa_page_table  # the second group's own buffer: what the update forgot
    return GraphRunner(req_to_token, page_table=page_table, swa_page_table=page_table, **kwargs)


def each_group_own_buffers(
    req_to_token: torch.Tensor,
    *,
    page_table: torch.Tensor,
    swa_page_table: torch.Tensor,
    **kwargs: Any,
) -> GraphRunner:
    """Fixed: each group's metadata are written into that group's own persistent buffer."""
    return GraphRunner(req_to_token, page_table=page_table, swa_page_table=swa_page_table, **kwargs)


BUG = WildBug(
    key="vllm-34874",
    engine="vLLM",
    version="V1 main, February 2026 (Nemotron-H, mamba_cache_mode='all', prefix caching)",
    ref="vllm-project/vllm#34874",
    state="merged (fixes #34865)",
    bug_class="f",
    symptom="NaN logprobs and garbage tokens for Nemotron hybrid models with prefix caching "
    "under CUDA graphs.",
    cause="Groups after the first reused its metadata through update_block_table on a shallow "
    "copy: block_idx_last_* stayed views of the first builder's persistent buffers, so the "
    "buffers their graphs read were never updated.",
    prop="outputs unaliased",
    buggy=Twin("build_page_table", runner=second_group_on_first_buffers),
    fixed=Twin("build_page_table", runner=each_group_own_buffers),
    fidelity=Fidelity(
        modelled="A later KV-cache group's metadata handed over as views of the first group's "
        "persistent buffers, so the buffers its graph reads are never updated.",
        stands_in=("the bed's SWA page table for the second group's block_idx_last_* buffers",),
        fix="The merged fix copies each group's metadata into that group's own persistent buffers.",
    ),
)
