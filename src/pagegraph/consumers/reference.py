"""Reference decode attention in plain torch, and the tolerances a kernel is held to.

Each row's keys and values are gathered on the host from the pool through its page ids, up to
its length (clamped as the kernels clamp it: to ``[0, width * page_size]``, or into
``kv_indices`` for the CSR format), then attended densely in fp32 and rounded to the input
dtype. A row of length 0 gives zeros, as the kernels define it.

Tolerances
----------
Let ``u`` be the unit roundoff of the dtype (bf16 ``2^-8``: 8 significant bits; fp16 ``2^-11``;
fp32 ``2^-24``), ``L`` the row's length, ``D`` the head dim, ``V = max |v|`` over the row's live
values and ``S = max_t sm_scale * sum_d |q_d k_td|`` (a bound on every score's magnitude
terms). A kernel that accumulates in fp32 differs from the exact result by at most:

* weights: the output is ``sum_t p_t v_t / sum_t p_t``; a relative error ``e`` in each
  ``p_t`` moves it by at most ``2 e V``. The scores are fp32 dot products of exact products
  (error ``<= D 2^-24 S``, which ``exp`` turns into a relative error of ``p`` of the same
  size), and ``exp2`` on the GPU is approximate (``~2^-22`` relative): ``e_s = D 2^-24 S +
  2^-22``;
* ``P`` rounded to the input dtype for the ``P V`` product on the tensor cores (not for fp32):
  ``u V``;
* fp32 summation over ``L`` tokens and the split merge: ``<= (L + 16) 2^-24 V``;
* the output rounded to its dtype: half an ulp, ``u |out|``.

The reference makes errors of the same kinds, smaller, so each bound counts twice:
``atol = 2 V (u_P + 2 e_s + (L + 16) 2^-24)`` with ``u_P = u`` for bf16/fp16 and 0 for fp32,
and ``rtol = 2 u`` (one ulp: both sides round nearly equal fp32 values). For bf16 and a few
hundred tokens ``atol`` is about ``V / 128`` (fp16: ``V / 1024``); one stale token read among
``L`` whose value is ``1000 V`` moves the output by about ``1000 V / L``, far more.
"""

from __future__ import annotations

import torch

from ..kernels.contract import cdiv

#: Unit roundoff of each input dtype.
UNIT_ROUNDOFF = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11, torch.float32: 2.0**-24}
#: Relative error of the GPU's approximate exp2 (a few ulp of fp32).
EXP2_ERROR = 2.0**-22
FP32_EPS = 2.0**-24


def table_rows(page_table: torch.Tensor, cache_seqlens: torch.Tensor, page_size: int) -> list:
    """``(page ids, length)`` of every row of a page table (``[bs, width]`` int32) with its
    ``cache_seqlens`` (``[bs]``), lengths clamped to ``[0, width * page_size]``; only the
    entries a correct consumer may read are returned."""
    width = page_table.shape[1]
    table, lens = page_table.cpu(), cache_seqlens.cpu().tolist()
    rows = []
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
) -> list:
    """``(page ids, length)`` of the first ``bs`` rows of FlashInfer's CSR format, clamped as
    ``csr_decode_attention`` clamps it."""
    indptr, indices = kv_indptr.cpu().tolist(), kv_indices.cpu().tolist()
    last, nnz = kv_last_page_len.cpu().tolist(), len(indices)
    rows = []
    for i in range(bs):
        start = min(max(indptr[i], 0), nnz)
        end = min(max(indptr[i + 1], start), nnz)
        tail = min(max(last[i], 0), page_size)
        length = (end - start - 1) * page_size + tail if end > start else 0
        rows.append((indices[start:end], length))
    return rows


def live_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, rows: list, page_size: int) -> list:
    """Each row's live keys and values, ``[L, num_kv_heads, head_dim]`` each, gathered from
    the pool ``[num_pages, page_size, num_kv_heads, head_dim]`` through its page ids."""
    out = []
    for pages, length in rows:
        tok = torch.arange(length)
        page = torch.tensor(pages, dtype=torch.long)[tok // page_size] if length else tok
        slot = tok % page_size
        out.append(
            (
                k_cache[page.to(k_cache.device), slot.to(k_cache.device)],
                v_cache[page.to(v_cache.device), slot.to(v_cache.device)],
            )
        )
    return out


def attend(q: torch.Tensor, kv: list, sm_scale: float | None = None) -> torch.Tensor:
    """Dense fp32 attention of ``q`` ``[bs, Hq, D]`` over each row's live ``(k, v)``; the
    output ``[bs, Hq, D]`` in q's dtype, zeros for rows of length 0."""
    bs, num_q_heads, head_dim = q.shape
    scale = head_dim**-0.5 if sm_scale is None else sm_scale
    out = torch.zeros_like(q)
    for i, (k, v) in enumerate(kv):
        if k.shape[0] == 0:
            continue
        group = num_q_heads // k.shape[1]
        k32 = k.float().repeat_interleave(group, dim=1)  # [L, Hq, D]
        v32 = v.float().repeat_interleave(group, dim=1)
        scores = torch.einsum("hd,thd->ht", q[i].float(), k32) * scale
        probs = torch.softmax(scores, dim=-1)
        out[i] = torch.einsum("ht,thd->hd", probs, v32).to(q.dtype)
    return out


def tolerances(q: torch.Tensor, kv: list, sm_scale: float | None = None):
    """``(atol [bs] fp32 tensor, rtol)`` per the module docstring, from each row's live data."""
    head_dim = q.shape[-1]
    scale = head_dim**-0.5 if sm_scale is None else sm_scale
    u = UNIT_ROUNDOFF[q.dtype]
    u_p = 0.0 if q.dtype == torch.float32 else u
    atol = torch.zeros(q.shape[0])
    for i, (k, v) in enumerate(kv):
        length = k.shape[0]
        if length == 0:
            continue
        group = q.shape[1] // k.shape[1]
        k32 = k.float().repeat_interleave(group, dim=1).abs()
        s_max = float(torch.einsum("hd,thd->ht", q[i].float().abs(), k32).max()) * scale
        v_max = float(v.float().abs().max())
        e_s = head_dim * FP32_EPS * s_max + EXP2_ERROR
        atol[i] = 2 * v_max * (u_p + 2 * e_s + (length + 16) * FP32_EPS)
    return atol, 2 * u


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
