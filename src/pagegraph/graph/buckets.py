"""Padded batch buckets and padding policies, as engines capture them. No GPU needed.

An engine captures one CUDA graph per bucket and pads a batch of ``n`` requests to the
smallest bucket ``>= n``. Padded rows still run through the captured kernels, so what they
hold matters: each engine has its own convention, and each is a ``PaddingPolicy`` here.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch


def _sglang_decode(max_bs: int) -> list[int]:
    return (
        [1, 2, 4, 8, 12]
        + list(range(16, 257, 8))
        + list(range(272, 512, 16))
        + list(range(512, max(max_bs, 512) + 1, 32))
    )


def _sglang_speculative(max_bs: int) -> list[int]:
    return (
        list(range(1, 9))
        + list(range(10, 33, 2))
        + list(range(40, 65, 8))
        + list(range(80, 161, 16))
        + list(range(192, max(max_bs, 192) + 1, 32))
    )


def _vllm(max_bs: int) -> list[int]:
    return [1, 2, 4] + list(range(8, 257, 8)) + list(range(272, max(max_bs, 272) + 1, 16))


def _pow2(max_bs: int) -> list[int]:
    sizes, b = [], 1
    while b <= max_bs:
        sizes.append(b)
        b *= 2
    return sizes


PRESETS = {
    "sglang": _sglang_decode,
    "sglang-spec": _sglang_speculative,
    "vllm": _vllm,
    "pow2": _pow2,
}


class Buckets:
    """Sorted, unique batch sizes to capture, ending at ``max_bs``.

    ``spec`` is a preset name (``"sglang"``, ``"sglang-spec"``, ``"vllm"``, ``"pow2"``), whose
    sizes above ``max_bs`` are dropped, or an explicit list, whose sizes must lie in
    ``1..max_bs``. Either way ``max_bs`` itself is appended when missing, so every batch of
    ``1..max_bs`` requests has a bucket.
    """

    def __init__(self, spec: str | Sequence[int] = "sglang", max_bs: int = 256) -> None:
        if isinstance(max_bs, bool) or not isinstance(max_bs, int) or max_bs < 1:
            raise ValueError(f"max_bs must be a positive integer, got {max_bs!r}")
        self.max_bs = max_bs
        if isinstance(spec, str):
            if spec not in PRESETS:
                known = ", ".join(sorted(PRESETS))
                raise ValueError(f"unknown bucket preset {spec!r}: use one of {known} or a list")
            self.preset: str | None = spec
            sizes = [b for b in PRESETS[spec](max_bs) if b <= max_bs]
        else:
            self.preset = None
            sizes = list(spec)
            if not sizes:
                raise ValueError("bucket list is empty")
            for b in sizes:
                if isinstance(b, bool) or not isinstance(b, int):
                    raise ValueError(f"bucket sizes must be integers, got {b!r}")
                if b < 1:
                    raise ValueError(f"bucket sizes must be positive, got {b}")
                if b > max_bs:
                    raise ValueError(f"bucket {b} is above max_bs={max_bs}")
        sizes = sorted(set(sizes))
        if sizes[-1] != max_bs:
            sizes.append(max_bs)
        self.sizes: list[int] = sizes

    def bucket_for(self, n: int) -> int:
        """Smallest bucket ``>= n``; ``ValueError`` naming both numbers outside ``1..max_bs``."""
        if n < 1:
            raise ValueError(f"batch of {n} requests: need at least 1 (max_bs={self.max_bs})")
        if n > self.max_bs:
            raise ValueError(f"batch of {n} requests exceeds max_bs={self.max_bs}")
        return self.sizes[bisect.bisect_left(self.sizes, n)]

    def __iter__(self) -> Iterator[int]:
        return iter(self.sizes)

    def __len__(self) -> int:
        return len(self.sizes)

    def __repr__(self) -> str:
        name = self.preset or "custom"
        return f"Buckets({name}, max_bs={self.max_bs}, {len(self.sizes)} sizes)"


@dataclass(frozen=True)
class PaddingPolicy:
    """What the padded rows ``n..bucket`` of the static inputs hold during a replay.

    ``seq_len`` is written into every padded row; ``req_pool_index`` too, unless it is ``None``,
    in which case padded rows keep whatever request index a previous batch left there (so the
    builder must cope with any valid request row, finished or not).
    """

    name: str
    seq_len: int
    req_pool_index: int | None

    def apply(
        self, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor, n: int, bucket: int
    ) -> None:
        """Pad rows ``n:bucket`` of the static ``[max_bs]`` buffers in place (device fills,
        no sync)."""
        if bucket <= n:
            return
        seq_lens[n:bucket].fill_(self.seq_len)
        if self.req_pool_index is not None:
            req_pool_indices[n:bucket].fill_(self.req_pool_index)


PADDING = {
    # SGLang: fill value 1, request indices of padded rows are not reset.
    "sglang": PaddingPolicy("sglang", seq_len=1, req_pool_index=None),
    # vLLM: padded rows have length 0, so nothing of theirs is read.
    "vllm": PaddingPolicy("vllm", seq_len=0, req_pool_index=None),
    # A dummy request: length 1 in request row 0, whose slot 0 is reserved for padding.
    "dummy-row": PaddingPolicy("dummy-row", seq_len=1, req_pool_index=0),
    # vLLM's drafter graph: padded rows are marked by request index -1 (no request, no
    # blocks) and length 0.
    "vllm-graph": PaddingPolicy("vllm-graph", seq_len=0, req_pool_index=-1),
    # Padded rows carry a huge length, as a dummy or stale row can: out of the contract, so
    # replays of a partly padded bucket are judged by row containment.
    "overlong": PaddingPolicy("overlong", seq_len=2**31 - 1, req_pool_index=None),
}


def resolve_padding(policy: str | PaddingPolicy) -> PaddingPolicy:
    if isinstance(policy, PaddingPolicy):
        return policy
    if policy not in PADDING:
        known = ", ".join(sorted(PADDING))
        raise ValueError(f"unknown padding policy {policy!r}: use one of {known}")
    return PADDING[policy]
