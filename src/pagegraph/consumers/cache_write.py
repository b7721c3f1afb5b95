"""A decode step's KV-cache write: what a writer is given (``CacheWrite``, ``StepInputs``, the
padded rows' slot conventions) and pagegraph's own write, one Triton program a row
(``write_new_tokens``).

A negative slot (``PAD_SLOT_ID``) sends the row to the discard slot instead of skipping it, so
every program writes the same amount and the launch has no branch on data; the grid is the
batch size, a host value frozen in a graph, and nothing is allocated or read back.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

__all__ = ["PAD_SLOTS", "PAD_SLOT_ID", "CacheWrite", "StepInputs", "write_new_tokens"]

#: The slot a padded row's new token goes to under ``pad_slot = "skip"``: vLLM's
#: ``PAD_SLOT_ID``, which a cache write skips.
PAD_SLOT_ID = -1
#: Values of ``[consumer] pad_slot``: what a padded row's ``out_cache_loc`` holds. "skip":
#: ``PAD_SLOT_ID`` (vLLM: the write skips it); "null": slot 0, padding's own reserved slot,
#: written like any other (SGLang's ``out_cache_loc`` of padded rows).
PAD_SLOTS = ("skip", "null")


@dataclass(frozen=True)
class StepInputs:
    """The step's staged inputs, for a reader that builds its own metadata from them (SGLang's
    Triton backend builds its CSR from ``req_to_token``): ``req_to_token`` ``[rows, >= context]``
    int32/int64 (the pool's), ``req_pool_indices`` and ``seq_lens`` ``[bs]`` of the index dtype,
    padded by the scenario's convention (the runner's static buffers, rows ``:bs``)."""

    req_to_token: torch.Tensor
    req_pool_indices: torch.Tensor
    seq_lens: torch.Tensor


@dataclass(frozen=True)
class CacheWrite:
    """What the step's KV-cache write is given for ``bs`` rows (each row one new token).

    ``k_new``, ``v_new`` ``[bs, Hkv, D]`` (the cache's dtype): each row's new token's key and
    value. ``k_cache``, ``v_cache`` ``[num_pages + 2, page_size, Hkv, D]``: the pool's pages,
    then the sentinel page (``num_pages``, which nothing may write) and the discard page
    (``num_pages + 1``). ``out_cache_loc`` ``[bs]`` int64: the slot (``page * page_size +
    offset``) the engine's allocator gave each real row's new token (SGLang's), a padded row's
    by ``pad_slot``: ``PAD_SLOT_ID`` or 0. ``positions`` ``[bs]`` int64: each real row's new
    token's position (``seq_len - 1``), 0 for a padded row. ``idx_mapping`` ``[bs]`` int32:
    ``i`` for a real row, -1 for a padded one (vLLM's padded requests). ``page_table``
    ``[bs, width]`` int32 and ``lengths`` ``[bs]`` int32: the builder's table and the lengths
    the reader attends over (each real row's, its new token included).
    ``discard_slot``: the first slot of the discard page, where a masked write may go (no one
    reads it). ``inputs``: the staged inputs (``StepInputs``)."""

    k_new: torch.Tensor
    v_new: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    out_cache_loc: torch.Tensor
    positions: torch.Tensor
    idx_mapping: torch.Tensor
    page_table: torch.Tensor
    lengths: torch.Tensor
    page_size: int
    discard_slot: int
    inputs: StepInputs


@triton.jit  # type: ignore[untyped-decorator]  # Triton ships no types
def _write_rows(  # type: ignore[no-untyped-def]  # a Triton kernel
    k_new,
    v_new,
    k_cache,
    v_cache,
    out_cache_loc,
    discard_slot,
    ROW: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """Program ``i``: ``ROW`` values of row ``i`` of ``k_new`` / ``v_new`` to slot
    ``out_cache_loc[i]`` (``discard_slot`` where it is negative)."""
    i = tl.program_id(0)
    slot = tl.load(out_cache_loc + i)
    slot = tl.where(slot < 0, discard_slot, slot).to(tl.int64)
    for start in range(0, ROW, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < ROW
        src = i.to(tl.int64) * ROW + offs
        dst = slot * ROW + offs
        tl.store(k_cache + dst, tl.load(k_new + src, mask=mask), mask=mask)
        tl.store(v_cache + dst, tl.load(v_new + src, mask=mask), mask=mask)


def write_new_tokens(w: CacheWrite, **_: object) -> None:
    """pagegraph's own cache write: row ``i``'s ``k_new`` / ``v_new`` ``[bs, Hkv, D]`` at slot
    ``out_cache_loc[i]`` of the caches ``[pages, page_size, Hkv, D]`` (contiguous), a negative
    slot sent to ``w.discard_slot`` instead."""
    bs, heads, dim = w.k_new.shape
    if bs == 0:
        return
    for t in (w.k_new, w.v_new, w.k_cache, w.v_cache):
        if not t.is_contiguous():
            raise ValueError("write_new_tokens needs contiguous K/V and caches")
    row = heads * dim
    block = min(triton.next_power_of_2(row), 1024)
    _write_rows[(bs,)](
        w.k_new,
        w.v_new,
        w.k_cache,
        w.v_cache,
        w.out_cache_loc,
        w.discard_slot,
        ROW=row,
        BLOCK=block,
    )
