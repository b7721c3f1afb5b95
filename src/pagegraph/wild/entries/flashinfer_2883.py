"""FlashInfer #2883: a zero-length padded row's output is NaN, and a batch-wide scale spreads it
(the fix writes the empty-KV identity, 0, for a zero-length row).

Modelled in the decode step by a reader written in torch: attention over each row's pages up to
its length, normalised by the row's softmax sum (0 / 0 for a zero-length row), then the output
divided and multiplied by its per-tensor scale (amax over the batch / the FP8 maximum; the FP8
rounding in between is not the bug). The builder is pagegraph's.
"""

from __future__ import annotations

import torch

from ...consumers.reader import Reader
from ..record import Twin, WildBug

#: The largest finite FP8 E4M3 value: a per-tensor scale maps the batch's amax onto it.
FP8_MAX = 448.0


def _attention(
    q, k_cache, v_cache, page_table, cache_seqlens, out, *, page_size, guard_empty: bool
) -> torch.Tensor:
    """Decode attention in fp32, torch ops only.

    q ``[bs, Hq, D]``, caches ``[pages, page_size, Hkv, D]``, page_table ``[bs, width]`` int32
    (entries past a row's length are loaded, then dropped by a select, never multiplied),
    cache_seqlens ``[bs]`` int32. Returns ``[bs, Hq, D]`` fp32, before the scale."""
    bs, hq, d = q.shape
    hkv, width = k_cache.shape[2], page_table.shape[1]
    tokens = width * page_size
    n = cache_seqlens[:bs].long().clamp(0, tokens)
    live = torch.arange(tokens, device=q.device)[None, :] < n[:, None]  # [bs, T]
    pages = page_table[:bs].long()
    k = k_cache[pages].flatten(1, 2).float()  # [bs, T, Hkv, D]
    v = v_cache[pages].flatten(1, 2).float()
    k = torch.where(live[:, :, None, None], k, 0.0)
    v = torch.where(live[:, :, None, None], v, 0.0)
    qg = q.float().view(bs, hkv, hq // hkv, d)
    s = torch.einsum("bkgd,btkd->bkgt", qg, k) * d**-0.5
    s = s.masked_fill(~live[:, None, None, :], float("-inf"))
    m = s.amax(-1, keepdim=True)
    p = torch.exp(s - torch.where(torch.isfinite(m), m, 0.0))  # a zero-length row: all 0
    o = torch.einsum("bkgt,btkd->bkgd", p, v) / p.sum(-1, keepdim=True)  # there 0 / 0: NaN
    o = o.reshape(bs, hq, d)
    if guard_empty:
        o = torch.where((n > 0)[:, None, None], o, 0.0)  # the fix: the empty-KV identity
    return o


def _reader(*, guard_empty: bool) -> Reader:
    def attend(q, k_cache, v_cache, page_table, cache_seqlens, out, *, page_size, workspace):
        o = _attention(
            q,
            k_cache,
            v_cache,
            page_table,
            cache_seqlens,
            out,
            page_size=page_size,
            guard_empty=guard_empty,
        )
        # The next layer's per-tensor FP8 input scale: one amax over the whole batch.
        scale = o.abs().amax() / FP8_MAX
        out.copy_(o / scale * scale)
        return out

    name = "mla_decode_empty_rows_zero" if guard_empty else "mla_decode_empty_rows_nan"
    attend.__name__ = name
    return Reader(name, attend)


BUG = WildBug(
    key="flashinfer-2883",
    engine="FlashInfer",
    version="0.6.4 and 0.6.6 (B200; DeepSeek-R1-0528-NVFP4-v2 in vLLM)",
    ref="flashinfer-ai/flashinfer#2883",
    state="open (fix proposed in #4975; vLLM worked around it)",
    bug_class="e",
    symptom="NaN in the output rows of CUDA-graph padded rows (seq_lens 0), spread to the real "
    "rows by the batch-wide FP8 quantization scale.",
    cause="The MLA decode kernel leaves zero-length rows undefined (NaN); the per-tensor amax "
    "of the next layer's FP8 input reads the whole batch.",
    prop="padded rows contained",
    buggy=Twin(reader=_reader(guard_empty=False)),
    fixed=Twin(reader=_reader(guard_empty=True)),
)
