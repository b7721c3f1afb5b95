"""pagegraph's own KV-cache write for a decode step: each row's new token's key and value at its
slot, one Triton program a row (``write_new_tokens``).

A negative slot (``PAD_SLOT_ID``) sends the row to the discard slot instead of skipping it, so
every program writes the same amount and the launch has no branch on data; the grid is the
batch size, a host value frozen in a graph, and nothing is allocated or read back.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import triton
import triton.language as tl

if TYPE_CHECKING:
    from .reader import CacheWrite

__all__ = ["write_new_tokens"]


@triton.jit
def _write_rows(
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
