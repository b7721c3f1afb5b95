"""Decode attention in plain torch, by token ranges, for the corpus entries' readers.

Class (b) entries model kernels whose launch or schedule depends on host values (a host number
of fixed-size splits, a per-row tile schedule, a work list of items). These functions compute
such attention with static shapes and torch ops only, so a reader built on them is legal inside
a CUDA graph and captured by the CPU's emulated graphs. A partial result (running max, sum,
unnormalised output) covers one range of a row's tokens; ``merge`` combines them as a split-K
combine does, and dead tokens never reach a real row's output.
"""

from __future__ import annotations

import torch

__all__ = ["merge", "partials", "split_attention", "token_kv"]


def token_kv(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    page_table: torch.Tensor,
    rows: torch.Tensor,
    pos: torch.Tensor,
    page_size: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys and values at token positions ``pos`` ``[I, T]`` int64 of table rows ``rows``
    ``[I]`` int64, as fp32 ``[I, T, Hkv, D]``. Rows, columns and page ids are clamped into the
    table and the pool (a garbage schedule reads wrong data, never outside the buffers)."""
    bs, width = page_table.shape
    r = rows.clamp(0, bs - 1)[:, None]
    col = pos.div(page_size, rounding_mode="floor").clamp(0, width - 1)
    pages = page_table[r, col].long().clamp(0, k_cache.shape[0] - 1)
    slot = pos.remainder(page_size)
    return k_cache[pages, slot].float(), v_cache[pages, slot].float()


def partials(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    live: torch.Tensor,
    scale: float,
    pv_dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One partial result an item: ``q`` ``[I, Hq, D]``, ``k`` / ``v`` fp32 ``[I, T, Hkv,
    D]``, ``live`` ``[I, T]`` bool. Returns ``m`` (the running max, ``-inf`` with no live
    token) and ``l`` (the exponential sum) ``[I, Hq]`` and the unnormalised ``acc`` ``[I, Hq,
    D]``, fp32. Keys and values of dead tokens are zeroed before use and their scores set to
    ``-inf``, so a stale page id (another live page, or the NaN page) never reaches a real row.
    With ``pv_dtype``, the probabilities are rounded to it for the PV product only (``l`` stays
    summed in fp32), as a tensor-core kernel feeds its MMA: the result then depends on the
    partial's own max."""
    items, num_q_heads, head_dim = q.shape
    num_kv_heads = k.shape[2]
    qg = q.float().reshape(items, num_kv_heads, num_q_heads // num_kv_heads, head_dim)
    keep = live[:, :, None, None]
    k = torch.where(keep, k, 0.0)
    v = torch.where(keep, v, 0.0)
    scores = torch.einsum("ihgd,ithd->ihgt", qg, k) * scale
    scores = torch.where(live[:, None, None, :], scores, float("-inf"))
    m = scores.amax(-1)
    # A range without a live token has m = -inf: exp(-inf - 0) = 0 everywhere.
    p = torch.exp(scores - torch.where(torch.isfinite(m), m, 0.0)[..., None])
    p_pv = p if pv_dtype is None else p.to(pv_dtype).float()
    acc = torch.einsum("ihgt,ithd->ihgd", p_pv, v)
    return (
        m.reshape(items, num_q_heads),
        p.sum(-1).reshape(items, num_q_heads),
        acc.reshape(items, num_q_heads, head_dim),
    )


def merge(m: torch.Tensor, total: torch.Tensor, acc: torch.Tensor, dim: int) -> torch.Tensor:
    """Combine partials along ``dim`` (``m`` and ``total``, their ``l``, ``[..., S, Hq]``;
    ``acc`` ``[..., S, Hq, D]``): fp32 ``[..., Hq, D]``, zeros where no partial holds a
    token."""
    top = m.amax(dim, keepdim=True)
    w = torch.exp(m - torch.where(torch.isfinite(top), top, 0.0))
    weight = (w * total).sum(dim)
    out = (w[..., None] * acc).sum(dim)
    return torch.where(weight[..., None] > 0, out / weight[..., None], 0.0)


def split_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    page_table: torch.Tensor,
    cache_seqlens: torch.Tensor,
    *,
    page_size: int,
    splits: int,
    split_tokens: int,
    live_splits: torch.Tensor | None = None,
) -> torch.Tensor:
    """Split-K decode attention with fixed-size splits: split ``s`` of row ``i`` covers tokens
    ``[s * split_tokens, (s + 1) * split_tokens)`` below ``cache_seqlens[i]`` (clamped to the
    table's capacity), and the combine reduces the ``splits`` splits, those of
    ``live_splits`` ``[bs, splits]`` bool only when given: tokens past ``splits *
    split_tokens`` are never read. Returns fp32 ``[bs, Hq, D]``.

    ``q`` ``[bs, Hq, D]``; ``page_table`` ``[bs, width]`` int32; ``cache_seqlens`` ``[bs]``
    int32; ``splits``: a host int (a launch's grid, frozen in a graph)."""
    bs, num_q_heads, head_dim = q.shape
    dev, width = q.device, page_table.shape[1]
    rows = torch.arange(bs, device=dev)[:, None].expand(bs, splits).reshape(-1)
    pos = torch.arange(splits * split_tokens, device=dev).reshape(splits, split_tokens)
    pos = pos.repeat(bs, 1)
    lens = cache_seqlens[:bs].long().clamp(0, width * page_size)
    live = pos < lens[rows][:, None]
    if live_splits is not None:
        live = live & live_splits.reshape(-1)[:, None]
    k, v = token_kv(k_cache, v_cache, page_table, rows, pos, page_size)
    m, total, acc = partials(q[rows], k, v, live, head_dim**-0.5)
    shape = (bs, splits, num_q_heads)
    return merge(m.reshape(shape), total.reshape(shape), acc.reshape(*shape, head_dim), dim=1)
