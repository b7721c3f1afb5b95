"""vLLM #39064: padding named the null block 0, and an ``idx < 0`` guard let padded rows write it
(the fix turns every guard into ``<= 0`` / ``> 0``).

Modelled in the decode step with the KV cache as the state: the vllm padding's rows of length 0
get block 0, and the reader first writes each row's new key and value at the slot of its last
token (a zero-length row's position clamped to 0: block 0) unless the guard calls the block
padding's, then runs paged attention. Property "null block and guard page untouched".
"""

from __future__ import annotations

import torch

from ...consumers import paged_decode_attention
from ...consumers.reader import Reader
from ...kernels.page_table import build_page_table
from ..record import Twin, WildBug


def page_table_null_padded(req_to_token, req_pool_indices, seq_lens, page_table, page_size) -> None:
    """pagegraph's page table, every row of length 0 padded with the null block 0."""
    build_page_table(req_to_token, req_pool_indices, seq_lens, page_table, page_size)
    # In the graph a padded row is known by its length 0 (real rows hold a token).
    page_table.masked_fill_((seq_lens <= 0)[:, None], 0)


def _write_new_tokens(
    q, k_cache, v_cache, page_table, cache_seqlens, page_size, *, padding_id_max: int
) -> None:
    """Each row's new key and value at its last token's slot, for rows whose block is above
    ``padding_id_max`` (a skipped row writes back what its slot holds).

    q ``[bs, Hq, D]``: the new key is the first query head of each KV group, the new value
    the last; caches ``[pages, page_size, Hkv, D]``; page_table ``[bs, width]`` int32."""
    bs, hq, d = q.shape
    hkv = k_cache.shape[2]
    pos = (cache_seqlens.long() - 1).clamp(min=0)
    col = torch.div(pos, page_size, rounding_mode="floor")[:, None]
    block = page_table.gather(1, col)[:, 0].long()
    slot = pos.remainder(page_size)
    write = (block > padding_id_max)[:, None, None]
    target = block.clamp(min=0)
    groups = q.view(bs, hkv, hq // hkv, d)
    for cache, new in ((k_cache, groups[:, :, 0]), (v_cache, groups[:, :, -1])):
        cache[target, slot] = torch.where(write, new, cache[target, slot])


def _reader(*, padding_id_max: int) -> Reader:
    def attend(q, k_cache, v_cache, page_table, cache_seqlens, out, *, page_size, workspace):
        _write_new_tokens(
            q, k_cache, v_cache, page_table, cache_seqlens, page_size, padding_id_max=padding_id_max
        )
        return paged_decode_attention(
            q,
            k_cache,
            v_cache,
            page_table,
            cache_seqlens,
            out,
            page_size=page_size,
            workspace=workspace,
        )

    name = f"write_then_attend_skip_ids_le_{padding_id_max}".replace("-", "minus_")
    attend.__name__ = name
    return Reader(name, attend)


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
)
