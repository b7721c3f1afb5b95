"""vLLM #43682: the in-graph draft step gives padded rows length 1, so attention reads block -1
(the fix leaves a row of length 0 at 0).

Modelled in the decode step as a decode-metadata builder: pagegraph's page table for the
staged lengths, padded rows (length 0, the vllm padding) filled with -1, then the draft step's
kernel, which writes ``cache_seqlens`` from each row's draft position plus the draft token.
The reader is pagegraph's paged attention; with ``null_block = "finite"`` a padded row's own
output is judged, and block -1 reads the NaN guard page before page 0.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ...kernels.contract import declare_outputs
from ...kernels.page_table import build_page_table
from ..wild_bug import Fidelity, Twin, WildBug


def _draft_step(*, skip_padded: bool) -> Callable[..., None]:
    """A decode-metadata builder whose lengths come from the draft step's kernel."""

    def build(
        req_to_token: torch.Tensor,
        req_pool_indices: torch.Tensor,
        seq_lens: torch.Tensor,
        page_size: int,
        *,
        cache_seqlens: torch.Tensor,
        cu_seqlens_k: torch.Tensor,
        page_table: torch.Tensor,
        draft_tokens: int = 0,
        cu_seqlens_q: torch.Tensor | None = None,
    ) -> None:
        build_page_table(req_to_token, req_pool_indices, seq_lens, page_table, page_size)
        padded = seq_lens <= 0  # in the graph a padded row is known by its length 0
        page_table.masked_fill_(padded[:, None], -1)  # vLLM's block-table padding then
        # The draft token's position (a padded row's clamped to 0), and the length it makes.
        lengths = (seq_lens.to(torch.int32) - 1).clamp_(min=0).add_(1)
        if skip_padded:
            lengths.masked_fill_(padded, 0)  # the fix: a zero-length row returns early
        cache_seqlens.copy_(lengths)
        cu_seqlens_k[:1].zero_()  # a fill on the device: an indexed assignment of a Python
        # int copies a host scalar, which a CUDA stream capture refuses
        torch.cumsum(lengths, 0, out=cu_seqlens_k[1:])
        if cu_seqlens_q is not None:
            torch.arange(cu_seqlens_q.shape[0], out=cu_seqlens_q)

    build.__name__ = "draft_step_skips_padded_rows" if skip_padded else "draft_step_every_row"
    declare_outputs(build, "decode_metadata")
    return build


BUG = WildBug(
    key="vllm-43682",
    engine="vLLM",
    version="main, 2026-05 (Eagle, Eagle3 and MTP drafting under CUDA graphs)",
    ref="vllm-project/vllm#43682",
    state="closed (a pull request, not merged)",
    bug_class="e",
    symptom="Illegal memory access during Eagle / MTP speculative decoding with CUDA graphs "
    "when the batch size is not a capture size.",
    cause="The in-graph draft step advanced every row's seq_len, padded rows' 0 to 1, while "
    "their block tables held -1: attention then read block -1.",
    prop="padded rows read inside the KV pool",
    buggy=Twin(_draft_step(skip_padded=False)),
    fixed=Twin(_draft_step(skip_padded=True)),
    fidelity=Fidelity(
        modelled="The in-graph draft step advancing every row's length, padded rows' 0 to 1, "
        "while their block tables hold -1: attention reads block -1.",
        stands_in=(
            "a decode-metadata builder for eagle_step_slot_mapping_metadata_kernel",
            "the NaN guard page before page 0 for the out-of-bounds block -1",
        ),
        fix="#43682 (closed, not merged): the kernel returns early on a row of length 0, "
        "leaving it 0 (its slot PADDING_SLOT_ID).",
    ),
)
