"""Reference decode attention in plain torch, and the tolerances a kernel is held to.

Each row's page ids are read on the host up to its length (clamped as the kernels clamp it);
its keys and values are gathered on the pool's device a chunk of rows at a time, masked past
each length, attended densely in fp32 and rounded to the input dtype. The tolerances
(``tolerances``: ``atol = 2 V (u_P + 2 e_s + (L + 16) 2^-24)``, ``rtol = 2 u``) are derived in
docs/ARCHITECTURE.md, "Paged attention, the consumer".
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

from ..kernels.contract import cdiv

#: Unit roundoff of each input dtype.
UNIT_ROUNDOFF = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11, torch.float32: 2.0**-24}
#: Relative error of the GPU's approximate exp2 (a few ulp of fp32).
EXP2_ERROR = 2.0**-22
FP32_EPS = 2.0**-24

#: A row's ``(page ids, length)``.
_Row = tuple[list[int], int]


def table_rows(page_table: torch.Tensor, cache_seqlens: torch.Tensor, page_size: int) -> list[_Row]:
    """``(page ids, length)`` of every row of a page table (``[bs, width]`` int32) with its
    ``cache_seqlens`` (``[bs]``), lengths clamped to ``[0, width * page_size]``; only the
    entries a correct consumer may read are returned."""
    width = page_table.shape[1]
    table, lens = page_table.cpu(), cache_seqlens.cpu().tolist()
    rows: list[_Row] = []
    for i, length in enumerate(lens[: page_table.shape[0]]):
        length = min(max(int(length), 0), width * page_size)
        rows.append((table[i, : cdiv(length, page_size)].tolist(), length))
    return rows


def csr_rows(
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    kv_last_page_len: torch.Tensor,
    page_size: int,
    bs: int,
) -> list[_Row]:
    """``(page ids, length)`` of the first ``bs`` rows of FlashInfer's CSR format, clamped as
    ``csr_decode_attention`` clamps it."""
    indptr, indices = kv_indptr.cpu().tolist(), kv_indices.cpu().tolist()
    last, nnz = kv_last_page_len.cpu().tolist(), len(indices)
    rows: list[_Row] = []
    for i in range(bs):
        start = min(max(indptr[i], 0), nnz)
        end = min(max(indptr[i + 1], start), nnz)
        tail = min(max(last[i], 0), page_size)
        length = (end - start - 1) * page_size + tail if end > start else 0
        rows.append((indices[start:end], length))
    return rows


#: Tokens gathered at once (a chunk's rows x the batch's longest length): bounds the fp32
#: copies of K and V the reference makes (2^16 tokens of 8 heads x 128 dims: 256 MiB each).
GATHER_TOKENS = 1 << 16


@dataclass
class LiveKV:
    """Every row's live keys and values, gathered lazily from the pool in chunks of rows.

    ``token_pages`` ``[n, L]`` int64 (on the host) holds the page of each row's token ``t <
    lengths[i]``, padded to the longest length ``L`` with page 0; ``lengths`` ``[n]`` int64.
    """

    k_cache: torch.Tensor
    v_cache: torch.Tensor
    token_pages: torch.Tensor
    lengths: torch.Tensor
    page_size: int

    def __len__(self) -> int:
        return self.lengths.shape[0]

    def chunks(self) -> Iterator[tuple[slice, torch.Tensor, torch.Tensor, torch.Tensor]]:
        """``(rows slice, k, v, mask)`` per chunk of rows: ``k``/``v`` ``[c, l, Hkv, D]`` fp32
        on the pool's device (``l``: the chunk's longest length), zero where ``mask``
        ``[c, l]`` (token below the length) is False (the padding's page may hold NaN)."""
        n, longest = self.token_pages.shape
        if longest == 0:
            return
        step = max(1, GATHER_TOKENS // longest)
        dev = self.k_cache.device
        for a in range(0, n, step):
            rows = slice(a, min(a + step, n))
            width = int(self.lengths[rows].max())
            if width == 0:
                continue  # every row empty: attend and tolerances leave zeros
            pages = self.token_pages[rows, :width].to(dev)
            slot = (torch.arange(width) % self.page_size).to(dev)
            mask = (torch.arange(width)[None, :] < self.lengths[rows, None]).to(dev)
            keep = mask[:, :, None, None]
            # Advanced indexing copies: the fills below write only the new tensors.
            k = self.k_cache[pages, slot].float().masked_fill_(~keep, 0.0)
            v = self.v_cache[pages, slot].float().masked_fill_(~keep, 0.0)
            yield rows, k, v, mask


def live_kv(
    k_cache: torch.Tensor, v_cache: torch.Tensor, rows: list[_Row], page_size: int
) -> LiveKV:
    """Each row's live keys and values from the pool ``[num_pages, page_size, num_kv_heads,
    head_dim]``, through its page ids: ``rows`` is a list of ``(page ids, length)``."""
    lengths = torch.tensor([length for _, length in rows], dtype=torch.long)
    longest = int(lengths.max()) if rows else 0
    token_pages = torch.zeros((len(rows), longest), dtype=torch.long)
    for i, (pages, length) in enumerate(rows):
        if length:
            ids = torch.tensor(pages, dtype=torch.long).repeat_interleave(page_size)
            token_pages[i, :length] = ids[:length]
    return LiveKV(k_cache, v_cache, token_pages, lengths, page_size)


def _same_rows(q: torch.Tensor, kv: LiveKV) -> None:
    if q.shape[0] != len(kv):
        raise ValueError(f"q has {q.shape[0]} rows and the live keys and values {len(kv)}")


def _grouped(q: torch.Tensor, num_kv_heads: int) -> torch.Tensor:
    """``q`` ``[c, Hq, D]`` as fp32 ``[c, Hkv, G, D]``: query head ``h`` reads KV head
    ``h // G``."""
    c, num_q_heads, head_dim = q.shape
    return q.float().view(c, num_kv_heads, num_q_heads // num_kv_heads, head_dim)


def attend(q: torch.Tensor, kv: LiveKV, sm_scale: float | None = None) -> torch.Tensor:
    """Dense fp32 attention of ``q`` ``[bs, Hq, D]`` over each row's live keys and values
    (``live_kv``); the output ``[bs, Hq, D]`` in q's dtype, zeros for rows of length 0."""
    bs, num_q_heads, head_dim = q.shape
    _same_rows(q, kv)
    scale = head_dim**-0.5 if sm_scale is None else sm_scale
    out = torch.zeros_like(q)
    for rows, k, v, mask in kv.chunks():
        qg = _grouped(q[rows], k.shape[2])
        scores = torch.einsum("chgd,cthd->chgt", qg, k) * scale
        scores = scores.masked_fill(~mask[:, None, None, :], float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        empty = (kv.lengths[rows] == 0).to(probs.device)  # all -inf: softmax gives NaN
        probs = probs.masked_fill(empty[:, None, None, None], 0.0)
        o = torch.einsum("chgt,cthd->chgd", probs, v).reshape(-1, num_q_heads, head_dim)
        out[rows] = o.to(q.dtype)
    return out


def tolerances(
    q: torch.Tensor, kv: LiveKV, sm_scale: float | None = None
) -> tuple[torch.Tensor, float]:
    """``(atol [bs] fp32 tensor on the host, rtol)`` from each row's live data, as derived in
    docs/ARCHITECTURE.md ("Paged attention, the consumer"); 0 for a row of length 0."""
    head_dim = q.shape[-1]
    _same_rows(q, kv)
    scale = head_dim**-0.5 if sm_scale is None else sm_scale
    u = UNIT_ROUNDOFF[q.dtype]
    u_p = 0.0 if q.dtype == torch.float32 else u
    s_max = torch.zeros(q.shape[0])
    v_max = torch.zeros(q.shape[0])
    for rows, k, v, _ in kv.chunks():
        qg = _grouped(q[rows], k.shape[2]).abs()
        bound = torch.einsum("chgd,cthd->chgt", qg, k.abs())  # zero past each length
        s_max[rows] = bound.flatten(1).amax(1).cpu() * scale
        v_max[rows] = v.abs().flatten(1).amax(1).cpu()
    e_s = head_dim * FP32_EPS * s_max + EXP2_ERROR
    atol = 2 * v_max * (u_p + 2 * e_s + (kv.lengths.float() + 16) * FP32_EPS)
    return atol.masked_fill(kv.lengths == 0, 0.0), 2 * u


def reference_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    page_table: torch.Tensor,
    cache_seqlens: torch.Tensor,
    *,
    page_size: int,
    sm_scale: float | None = None,
) -> torch.Tensor:
    """What ``paged_decode_attention`` computes (same arguments, no ``out``): a new
    ``[bs, Hq, D]`` tensor in q's dtype."""
    rows = table_rows(page_table[: q.shape[0]], cache_seqlens, page_size)
    return attend(q, live_kv(k_cache, v_cache, rows, page_size), sm_scale)


def reference_csr_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    kv_last_page_len: torch.Tensor,
    *,
    page_size: int,
    sm_scale: float | None = None,
) -> torch.Tensor:
    """What ``csr_decode_attention`` computes: a new ``[bs, Hq, D]`` tensor in q's dtype."""
    rows = csr_rows(kv_indptr, kv_indices, kv_last_page_len, page_size, q.shape[0])
    return attend(q, live_kv(k_cache, v_cache, rows, page_size), sm_scale)
