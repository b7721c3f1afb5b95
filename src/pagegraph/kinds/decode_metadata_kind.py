"""The fused decode-metadata kind: the contract of
``pagegraph.kernels.decode_metadata.build_decode_metadata``.

``build(req_to_token, req_pool_indices, seq_lens, page_size, *, cache_seqlens, cu_seqlens_k,
page_table, draft_tokens=0, cu_seqlens_q=None, swa_page_table=None, full_to_swa=None,
errors=None)`` writes ``cache_seqlens = max(len, 0) + draft_tokens``, ``cu_seqlens_k`` (0, then
the running sums), ``cu_seqlens_q[i] = i * max(draft_tokens, 1)`` and the page tables built
for ``cache_seqlens``. ``cu_seqlens_k[0]`` and ``cu_seqlens_q[0]`` may be preset by the engine.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from ..kernels.decode_contract import DECODE_ERROR_KINDS
from .base import KindSpec, VectorSpec
from .seams import Builder, BuilderIO, ReplayModel, VectorVerifier

INT32_MAX = 2**31 - 1


class DecodeMetadataKind(KindSpec):
    name = "decode_metadata"
    signature = (
        "build(req_to_token, req_pool_indices, seq_lens, page_size, *, cache_seqlens, "
        "cu_seqlens_k, page_table, draft_tokens=0, cu_seqlens_q=None, swa_page_table=None, "
        "full_to_swa=None, errors=None)"
    )
    positional = 4
    keywords = ("cache_seqlens", "cu_seqlens_k", "page_table", "draft_tokens", "cu_seqlens_q")
    vectors = (
        VectorSpec("cache_seqlens", torch.int32, lambda max_bs, width, d: max_bs),
        VectorSpec("cu_seqlens_k", torch.int32, lambda max_bs, width, d: max_bs + 1),
        VectorSpec("cu_seqlens_q", torch.int32, lambda max_bs, width, d: max_bs + 1),
    )
    presets = {"cu_seqlens_k[0]": (1, 1), "cu_seqlens_q[0]": (2, 1)}
    consumer_lengths = "cache_seqlens"
    error_kinds = DECODE_ERROR_KINDS
    tables_include_draft = True
    reference = "reference_decode_metadata"

    def load_builders(self) -> dict[str, Builder]:
        from ..kernels.decode_metadata import build_decode_metadata
        from ..kernels.reference import reference_decode_metadata, unfused_decode_metadata

        return {
            "build_decode_metadata": build_decode_metadata,
            "reference_decode_metadata": reference_decode_metadata,
            "unfused_decode_metadata": unfused_decode_metadata,
        }

    def vector_fields(self, verifier: VectorVerifier, model: ReplayModel) -> torch.Tensor:
        """The vectors against the independent ``model`` (from it, ``sl`` ``[K, M]`` int64
        lengths and ``in_bucket`` ``[K, M]`` bool), in ``verifier``'s buffers:
        ``cache_seqlens[i] = min(max(len, 0) + draft, 2^31 - 1)`` for the bucket's rows,
        ``cu_seqlens_k = [0, running sums]`` (stored saturated, int32), ``cu_seqlens_q[i] = i
        * max(draft, 1)`` for ``i <= bucket``; poison everywhere else. Two masks' fields a
        replay (``[K, 8]`` int64): wrong entries inside that live region, and writes outside
        it."""
        sl, in_bucket = model.sl, model.in_bucket
        M, d, poison = verifier.max_bs, verifier.draft_tokens, verifier.poison_value
        index = verifier.vector_index  # [M + 1]: 0..M
        exp = verifier.expected_vectors
        exp.fill_(poison)
        cache = (sl.clamp(min=0) + d).clamp(max=INT32_MAX)
        exp[:, 0, 1 : 1 + M] = torch.where(in_bucket, cache, poison)
        bucket = in_bucket.sum(-1, keepdim=True)  # [K, 1]
        live_k = index <= bucket  # [K, M + 1]: entries 0..bucket of the sums
        sums = verifier.running_sums(sl, in_bucket).clamp(max=INT32_MAX)
        exp[:, 1, 1:2].fill_(0)  # a fill: assigning a Python int would copy from the host
        exp[:, 1, 2 : 2 + M] = torch.where(live_k[:, 1:], sums, poison)
        exp[:, 2, 1 : 2 + M] = torch.where(live_k, index * max(d, 1), poison)
        return verifier.vector_masks(exp, exp != poison)

    def call(self, builder: Builder, io: BuilderIO, bs: int, extra: Mapping[str, object]) -> None:
        v = io.vectors
        builder(
            io.req_to_token,
            io.req_pool_indices[:bs],
            io.seq_lens[:bs],
            io.page_size,
            cache_seqlens=v["cache_seqlens"][:bs],
            cu_seqlens_k=v["cu_seqlens_k"][: bs + 1],
            page_table=io.page_table[:bs],
            draft_tokens=io.draft_tokens,
            cu_seqlens_q=v["cu_seqlens_q"][: bs + 1],
            **extra,
        )


DECODE_METADATA = DecodeMetadataKind()
