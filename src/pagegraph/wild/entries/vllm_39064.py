"""vLLM #39064: padding named the null block 0, and an ``idx < 0`` guard let padded rows write it
(the fix turns every guard into ``<= 0`` / ``> 0``).

Modelled in the decode step with the KV cache as the state: the vllm padding's rows of length 0
get block 0, and the step's cache write puts each row's new key and value at the slot of its
last token through its block table (a zero-length row's position clamped to 0: block 0) unless
the guard calls the block padding's; paged attention reads the cache after it. Property "null
block and guard page untouched" (and "cache write exact": block 0 is no real row's slot).
"""

from __future__ import annotations

import torch

from ...consumers import paged_decode_attention
from ...consumers.reader import CacheWrite, Reader
from ...kernels.page_table import build_page_table
from ..wild_bug import Fidelity, Twin, WildBug


def page_table_null_padded(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    page_table: torch.Tensor,
    page_size: int,
) -> None:
    """pagegraph's page table, every row of length 0 padded with the null block 0."""
    build_page_table(req_to_token, req_pool_indices, seq_lens, page_table, page_size)
    # In the graph a padded row is known by its length 0 (real rows hold a token).
    page_table.masked_fill_((seq_lens <= 0)[:, None], 0)


def _write_new_tokens(w: CacheWrite, *, padding_id_max: int, **_: object) -> None:
    """Each row's new key and value at its new token's slot through its block table (a
    zero-length row's position clamped to 0: block 0), for rows whose block is above
    ``padding_id_max``; a skipped row's write goes to the discard slot."""
    pos = (w.lengths.long() - 1).clamp(min=0)
    col = torch.div(pos, w.page_size, rounding_mode="floor")[:, None]
    block = w.page_table.gather(1, col)[:, 0].long()
    slots = block.clamp(min=0) * w.page_size + pos.remainder(w.page_size)
    slots = torch.where(block > padding_id_max, slots, w.discard_slot)
    heads, dim = w.k_new.shape[1:]
    for cache, new in ((w.k_cache, w.k_new), (w.v_cache, w.v_new)):
        cache.view(-1, heads, dim).index_copy_(0, slots, new)


def _reader(*, padding_id_max: int) -> Reader:
    def write(w: CacheWrite, **launch: object) -> None:
        _write_new_tokens(w, padding_id_max=padding_id_max)

    name = f"write_skip_ids_le_{padding_id_max}".replace("-", "minus_")
    write.__name__ = name
    return Reader(name, paged_decode_attention, write_cache=write)


BUG = WildBug(
    key="vllm-39064",
    engine="vLLM",
    version="0.19.1rc1.dev195 (GDN hybrid models, TP > 1, Blackwell)",
    ref="vllm-project/vllm#39064",
    state="merged (fixes #39025)",
    bug_class="e",
    symptom="Illegal memory access and corrupted state in GDN hybrid models under CUDA graphs "
    "after padding switched from -1 to the null block 0.",
    cause="The FLA state kernels skipped padded rows by state_idx < 0; padded rows now carry "
    "0, so they read and wrote state 0.",
    prop="null block and guard page untouched",
    buggy=Twin(page_table_null_padded, _reader(padding_id_max=-1)),
    fixed=Twin(page_table_null_padded, _reader(padding_id_max=0)),
    fidelity=Fidelity(
        modelled="A kernel guard `idx < 0` for padded rows once padding moved to the null block "
        "0: padded rows read and write block 0.",
        stands_in=(
            "the KV cache's page 0 for the GDN/FLA state slot 0",
            "the step's cache write through the block table for the state kernels' update",
        ),
        fix="The merged fix turns every guard into `<= 0` / `> 0` (the null block is padding).",
    ),
)
