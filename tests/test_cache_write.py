"""Invariant: the decode step's KV-cache write leaves each real row's new K/V at the slot the
host model gives its new token and changes no other slot of the pool; padded rows' writes are
discarded the scenario's way (``[consumer] pad_slot``: "skip", PAD_SLOT_ID; "null", slot 0).
Judged from the model before the replay, never from the cache the replay left.

Planted writers: one whose slots are frozen at its first call (capture), one that skips real
row 0, one that writes every row through the page table, padded rows into live slots; beside
them pagegraph's own write and a page-table writer that masks padded rows to the discard slot.
"""

from __future__ import annotations

import pytest
import torch

from pagegraph.check.checker import check_decode_step
from pagegraph.check.config import CheckConfig, ConfigError, validate_config
from pagegraph.consumers import paged_decode_attention
from pagegraph.consumers.cache_write import write_new_tokens
from pagegraph.consumers.reader import CacheWrite, Reader

PROP = "cache write exact"
OUTPUT = "output correct through the consumer"


def tiny(**changes) -> CheckConfig:
    """A decode step the Triton interpreter runs in seconds, with padded rows."""
    base = dict(
        max_bs=4,
        max_context_len=128,
        page_size=16,
        steps=6,
        seed=11,
        consumer="paged",
        num_q_heads=4,
        num_kv_heads=2,
        head_dim=16,
        buckets=[2, 4],
        initial_len=(20, 100),
        timing_iters=0,
        finish_rate=0.3,
    )
    return CheckConfig(**{**base, **changes})


def attend(q, k_cache, v_cache, page_table, cache_seqlens, out, *, page_size, workspace):
    return paged_decode_attention(
        q, k_cache, v_cache, page_table, cache_seqlens, out, page_size=page_size,
        workspace=workspace,
    )  # fmt: skip


def _scatter(w: CacheWrite, slots: torch.Tensor) -> None:
    heads, dim = w.k_new.shape[1:]
    for cache, new in ((w.k_cache, w.k_new), (w.v_cache, w.v_new)):
        cache.view(-1, heads, dim).index_copy_(0, slots, new)


def _table_slots(w: CacheWrite) -> torch.Tensor:
    """Each row's new token's slot through the page table and ``positions``."""
    col = torch.div(w.positions, w.page_size, rounding_mode="floor")[:, None]
    page = w.page_table.gather(1, col)[:, 0].long()
    return page * w.page_size + w.positions.remainder(w.page_size)


class FrozenSlots:
    """Copies ``out_cache_loc`` on its first call (the warm-up before capture) and writes
    there ever after: the capture's dummy slots."""

    def __init__(self) -> None:
        self.slots: dict[int, torch.Tensor] = {}

    def __call__(self, w: CacheWrite, **_: object) -> None:
        bs = w.k_new.shape[0]
        if bs not in self.slots:
            self.slots[bs] = torch.where(w.out_cache_loc < 0, w.discard_slot, w.out_cache_loc)
        _scatter(w, self.slots[bs])


def skips_row_0(w: CacheWrite, **_: object) -> None:
    """Writes every row but the first (its slot sent to the discard slot)."""
    slots = torch.where(w.out_cache_loc < 0, w.discard_slot, w.out_cache_loc).clone()
    slots[0:1].fill_(w.discard_slot)
    _scatter(w, slots)


def through_table_unmasked(w: CacheWrite, **_: object) -> None:
    """Every row's slot from the page table and its position, padded rows included."""
    _scatter(w, _table_slots(w))


def through_table_masked(w: CacheWrite, **_: object) -> None:
    """The same, padded rows (``idx_mapping`` -1) sent to the discard slot."""
    slots = torch.where(w.idx_mapping < 0, w.discard_slot, _table_slots(w))
    _scatter(w, slots)


def _check(writer, **cfg):
    reader = Reader(getattr(writer, "__name__", type(writer).__name__), attend, write_cache=writer)
    return check_decode_step("build_page_table", tiny(**cfg), consumer=reader)


def _status(report, name=PROP):
    return next(p for p in report.properties if p.name == name)


@pytest.mark.cpu_heavy  # a decode step: long under the Triton interpreter
@pytest.mark.parametrize("padding", ["sglang", "vllm"])
def test_pagegraphs_own_write_is_exact(padding):
    report = _check(write_new_tokens, padding=padding)
    assert report.verdict == "SAFE", report.format()
    prop = _status(report)
    assert prop.status == "pass" and "write_new_tokens" in prop.detail
    assert ("slot 0" in prop.detail) == (padding == "sglang")


@pytest.mark.cpu_heavy  # a decode step: long under the Triton interpreter
def test_a_writer_frozen_at_capture_fails():
    report = _check(FrozenSlots())
    prop = _status(report)
    assert prop.status == "FAIL", report.format()
    assert "is not at slot" in str(prop.first_failure)
    # The reference reads the model's cache: the output is judged against what the write
    # had to leave, so the frozen write shows in the output as well.
    assert _status(report, OUTPUT).status == "FAIL"


@pytest.mark.cpu_heavy  # a decode step: long under the Triton interpreter
def test_a_writer_that_skips_a_real_row_fails():
    report = _check(skips_row_0)
    failure = str(_status(report).first_failure)
    assert _status(report).status == "FAIL"
    assert "row 0 " in failure and "is not at slot" in failure


@pytest.mark.cpu_heavy  # a decode step: long under the Triton interpreter
def test_a_padded_row_written_into_a_live_slot_fails():
    # SGLang's padding: padded rows hold a running request's index and length 1, so their
    # slot through the table is that request's first token.
    report = _check(through_table_unmasked, padding="sglang", seed=3, finish_rate=0.5)
    prop = _status(report)
    assert prop.status == "FAIL", report.format()
    assert "which no real row of the step writes" in str(prop.first_failure)
    assert "request" in str(prop.first_failure)


@pytest.mark.cpu_heavy  # a decode step: long under the Triton interpreter
def test_the_masked_twin_passes():
    report = _check(through_table_masked, padding="sglang", seed=3, finish_rate=0.5)
    assert report.verdict == "SAFE", report.format()


def test_pad_slot_null_needs_a_nan_null_block():
    with pytest.raises(ConfigError, match="pad_slot"):
        validate_config(tiny(padding="vllm", pad_slot="null", null_block="finite"))
    with pytest.raises(ConfigError, match="pad_slot"):
        validate_config(tiny(pad_slot="sometimes"))
    assert tiny(padding="vllm").cache_pad_slot == "skip"
    assert tiny(padding="sglang").cache_pad_slot == "null"


def test_write_new_tokens_puts_each_row_at_its_slot_and_pads_at_the_discard_slot():
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    pages, ps, heads, dim = 6, 4, 2, 16
    gen = torch.Generator().manual_seed(5)
    cache = [torch.randn(pages, ps, heads, dim, generator=gen).to(dev) for _ in range(2)]
    before = [c.clone() for c in cache]
    new = [torch.randn(3, heads, dim, generator=gen).to(dev) for _ in range(2)]
    loc = torch.tensor([9, -1, 2], dtype=torch.int64, device=dev)
    discard = (pages - 1) * ps
    w = CacheWrite(
        k_new=new[0], v_new=new[1], k_cache=cache[0], v_cache=cache[1], out_cache_loc=loc,
        positions=loc, idx_mapping=loc.int(), page_table=loc[None], lengths=loc.int(),
        page_size=ps, discard_slot=discard, inputs=None,
    )  # fmt: skip
    write_new_tokens(w)
    for c, b, n in zip(cache, before, new):
        flat, old = c.view(-1, heads, dim), b.view(-1, heads, dim)
        want = old.clone()
        want[9], want[2], want[discard] = n[0], n[2], n[1]
        assert torch.equal(flat, want)
