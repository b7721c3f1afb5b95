"""vLLM #43810: ``extract_hidden_states``'s ``basic_cache()`` wrote each token into its cache by
indexing with ``slot_mapping`` in Python, unaware of ``PADDING_SLOT_ID = -1``: under CUDA-graph
padding a padded token's slot -1 wraps to the cache's last slot, so padding overwrote the last
KV slot (the fix writes through ``reshape_and_cache_flash``, which skips negative slots).

Modelled as the decode step's cache write under vLLM's padding (``pad_slot = "skip"``): each
row's new K/V put at ``out_cache_loc`` by tensor indexing into the pool's pages (buggy: a padded
row's -1 lands in the pool's last slot), or by the fixed-shape write kernel that sends negative
slots away (fixed: pagegraph's ``write_new_tokens``). Property "cache write exact".
"""

from __future__ import annotations

from ...consumers import paged_decode_attention
from ...consumers.reader import CacheWrite, Reader, write_new_tokens
from ..wild_bug import Fidelity, Twin, WildBug


def write_by_python_indexing(w: CacheWrite, **_: object) -> None:
    """Buggy: ``cache[slot_mapping] = new`` over the pool's slots; -1 is the last slot."""
    heads, dim = w.k_new.shape[1:]
    for cache, new in ((w.k_cache, w.k_new), (w.v_cache, w.v_new)):
        pool = cache[:-2].view(-1, heads, dim)  # the engine's cache: the pool's pages
        pool[w.out_cache_loc] = new


BUG = WildBug(
    key="vllm-43810",
    engine="vLLM",
    version="main, May 2026 (extract_hidden_states, CUDA graphs on)",
    ref="vllm-project/vllm#43810",
    state="closed (fix in PR #43869)",
    bug_class="e",
    symptom="With CUDA graphs, the extracted hidden states of a request differ from eager: "
    "the last hidden-state KV slot holds a padding token's values.",
    cause="basic_cache() indexed the KV cache with slot_mapping directly; CUDA-graph padding "
    "fills slot_mapping with PADDING_SLOT_ID = -1, which Python indexing takes as the last "
    "slot (-1 // block_size = -1, -1 % block_size = block_size - 1).",
    prop="cache write exact",
    buggy=Twin(
        reader=Reader(
            "cache[slot_mapping] = new",
            paged_decode_attention,
            write_cache=write_by_python_indexing,
        )
    ),
    fixed=Twin(
        reader=Reader(
            "fixed-shape write, negative slots skipped",
            paged_decode_attention,
            write_cache=write_new_tokens,
        )
    ),
    fidelity=Fidelity(
        modelled="a cache write that indexes the cache with the slot mapping as given, while "
        "the padding convention puts -1 (PADDING_SLOT_ID) in padded rows: the -1 wraps to the "
        "cache's last slot",
        stands_in=(
            "the step's K/V cache for extract_hidden_states's hidden-state cache",
            "the pool's pages (the cache less pagegraph's sentinel and discard pages) for the "
            "layer's cache tensor",
            "pagegraph's write_new_tokens (a negative slot sent to the discard page) for "
            "reshape_and_cache_flash (a negative slot skipped)",
        ),
        fix="PR #43869: write through the fixed-shape reshape_and_cache_flash op, whose kernel "
        "returns early on a negative slot (a CPU fallback filters them likewise)",
        refs=("vllm-project/vllm#43869",),
    ),
)
