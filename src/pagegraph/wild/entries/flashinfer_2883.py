"""FlashInfer #2883: the trtllm-gen MLA decode kernel writes nothing for a row of length 0, so a
CUDA-graph padded row (vLLM pads with ``seq_lens`` 0) keeps whatever ``out`` held, and the next
layer's per-tensor FP8 scale (one amax over the whole output) carries it to the real rows (the
fix, #4975, writes the empty-KV identity, zeros, for those rows).

Modelled in the decode step by a reader written in torch: attention over each row's pages up to
its length, stored only for rows of length > 0 (buggy; the row of length 0 keeps the bits it
held: the bed poisons ``out`` before every replay with a finite bit pattern, far above any
attention output) or zeros for them (fixed), then the next layer's FP8 input quantised with one
scale over the whole ``out`` of the bucket, padded rows included, and dequantised back into
``out``. The FP8 range is kept (values under E4M3's smallest subnormal flush to zero, values
past 448 saturate); its mantissa rounding is not (it would move every row past the bed's
bf16 tolerance, and it is not the bug). The builder is pagegraph's.
"""

from __future__ import annotations

import torch

from ...consumers.reader import Reader
from ..range_attention import split_attention
from ..wild_bug import Fidelity, Twin, WildBug

#: The largest finite FP8 E4M3 value: a per-tensor scale maps the batch's amax onto it.
FP8_MAX = 448.0
#: E4M3's smallest subnormal: a scaled value under half of it rounds to zero.
FP8_MIN = 2.0**-9


def fp8_per_tensor(out: torch.Tensor) -> None:
    """The next layer's FP8 input, quantised with one scale over all of ``out`` and dequantised
    back in place (range only: module docstring)."""
    o = out.float()
    scale = (o.abs().amax() / FP8_MAX).clamp(min=torch.finfo(torch.float32).tiny)
    x = (o / scale).clamp(-FP8_MAX, FP8_MAX)
    x = torch.where(x.abs() < FP8_MIN / 2, 0.0, x)
    out.copy_(x * scale)


def _reader(*, zero_empty: bool) -> Reader:
    def attend(
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        page_table: torch.Tensor,
        cache_seqlens: torch.Tensor,
        out: torch.Tensor,
        *,
        page_size: int,
        workspace: object,
    ) -> torch.Tensor:
        bs = q.shape[0]
        capacity = page_table.shape[1] * page_size
        o = split_attention(
            q,
            k_cache,
            v_cache,
            page_table,
            cache_seqlens,
            page_size=page_size,
            splits=1,
            split_tokens=capacity,
        )
        empty = (cache_seqlens[:bs] <= 0)[:, None, None]
        if zero_empty:
            out.copy_(torch.where(empty, 0.0, o))  # the fix: the empty-KV identity
        else:
            out.copy_(torch.where(empty, out, o.to(out.dtype)))  # nothing written for them
        fp8_per_tensor(out)  # over the whole bucket: padded rows included
        return out

    name = "mla_decode_empty_rows_zeroed" if zero_empty else "mla_decode_empty_rows_skipped"
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
    cause="The MLA decode kernel skips rows of length 0, leaving their output as stale or "
    "uninitialised memory; the per-tensor amax of the next layer's FP8 input reads the whole "
    "batch, padded rows included.",
    prop="output correct through the consumer",
    buggy=Twin(reader=_reader(zero_empty=False)),
    fixed=Twin(reader=_reader(zero_empty=True)),
    fidelity=Fidelity(
        modelled="a decode kernel that writes nothing for rows of length 0 (vLLM's padded "
        "rows), followed by one FP8 scale over the whole output buffer, padded rows included",
        stands_in=(
            "the bed's finite poison in out before each replay for the stale or uninitialised "
            "memory (NaN in production) a skipped row keeps",
            "torch attention over the page table for trtllm-gen's MLA kernel",
            "FP8 E4M3's range (flush to zero, saturation) for its rounding",
        ),
        fix="flashinfer-ai/flashinfer#4975: write the empty-KV identity (zeros) for rows "
        "with seq_lens == 0",
        refs=(
            "vllm-project/vllm#37442",
            "vllm-project/vllm#38436",
            "vllm-project/vllm#57094",
        ),
    ),
)
