"""Invariant: every batch of 1..max_bs requests maps to the smallest bucket that holds it, and
padding policies write exactly the padded rows."""

from __future__ import annotations

import bisect

import pytest
import torch

from pagegraph.graph.buckets import PADDING, Buckets, PaddingPolicy, resolve_padding


def test_sglang_default_list():
    b = Buckets("sglang", 512)
    assert b.sizes[:8] == [1, 2, 4, 8, 12, 16, 24, 32]
    assert 256 in b.sizes and 264 not in b.sizes and 272 in b.sizes and 496 in b.sizes
    assert b.sizes[-1] == 512
    assert all(b2 - b1 == 8 for b1, b2 in zip(b.sizes[5:35], b.sizes[6:36]))


def test_presets_clamped_and_max_appended():
    assert Buckets("sglang", 100).sizes[-2:] == [96, 100]
    assert Buckets("vllm", 512).sizes[-3:] == [480, 496, 512]
    assert Buckets("pow2", 48).sizes == [1, 2, 4, 8, 16, 32, 48]
    spec = Buckets("sglang-spec", 64).sizes
    assert spec[:8] == list(range(1, 9)) and 10 in spec and 9 not in spec


@pytest.mark.parametrize("spec", ["sglang", "sglang-spec", "vllm", "pow2", [3, 1, 3, 9]])
@pytest.mark.parametrize("max_bs", [1, 9, 100, 256, 512])
def test_bucket_for_is_smallest_holding_bucket(spec, max_bs):
    if isinstance(spec, list):
        spec = [min(x, max_bs) for x in spec]
    b = Buckets(spec, max_bs)
    assert b.sizes == sorted(set(b.sizes)) and b.sizes[-1] == max_bs
    for n in range(1, max_bs + 1):
        k = b.bucket_for(n)
        assert k >= n and k in b.sizes
        assert b.sizes[bisect.bisect_left(b.sizes, n)] == k


def test_bucket_for_out_of_range_names_both_numbers():
    b = Buckets("pow2", 16)
    with pytest.raises(ValueError, match=r"17.*max_bs=16"):
        b.bucket_for(17)
    with pytest.raises(ValueError, match=r"0.*max_bs=16"):
        b.bucket_for(0)


@pytest.mark.parametrize(
    "spec,match",
    [
        ([], "empty"),
        ([0, 2], "positive"),
        ([-1], "positive"),
        ([1.5], "integers"),
        ([True], "integers"),
        ([4, 32], "above max_bs"),
        ("nope", "unknown bucket preset"),
    ],
)
def test_invalid_bucket_lists(spec, match):
    with pytest.raises(ValueError, match=match):
        Buckets(spec, 16)


@pytest.mark.parametrize("max_bs", [0, -3, 2.0])
def test_invalid_max_bs(max_bs):
    with pytest.raises(ValueError, match="max_bs"):
        Buckets("sglang", max_bs)


@pytest.mark.parametrize("name", sorted(PADDING))
def test_padding_policies_touch_only_padded_rows(name):
    policy = resolve_padding(name)
    gen = torch.Generator().manual_seed(3)
    rpi = torch.randint(5, 50, (16,), generator=gen, dtype=torch.int32)
    sl = torch.randint(100, 900, (16,), generator=gen, dtype=torch.int32)
    rpi0, sl0 = rpi.clone(), sl.clone()
    policy.apply(rpi, sl, 5, 12)
    assert torch.equal(sl[:5], sl0[:5]) and torch.equal(sl[12:], sl0[12:])
    assert torch.equal(rpi[:5], rpi0[:5]) and torch.equal(rpi[12:], rpi0[12:])
    assert (sl[5:12] == policy.seq_len).all()
    if policy.req_pool_index is None:  # stale indices stay, as in SGLang
        assert torch.equal(rpi[5:12], rpi0[5:12])
    else:
        assert (rpi[5:12] == policy.req_pool_index).all()


def test_padding_conventions():
    assert PADDING["sglang"] == PaddingPolicy("sglang", 1, None)
    assert PADDING["vllm"].seq_len == 0
    assert PADDING["dummy-row"] == PaddingPolicy("dummy-row", 1, 0)
    with pytest.raises(ValueError, match="unknown padding"):
        resolve_padding("tgi")
