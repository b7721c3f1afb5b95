"""Invariant: the decode step judges its reader itself. It does not sync the host (named by
file:line), it writes every real row of ``out``, a replay gives its own eager call's bits
(judged with ``[consumer] bitwise = true``, advice otherwise), and it reads no table entry
past its row.

Planted readers, each beside a twin that passes: syncs by ``.item()``, ``.tolist()`` and
indexing with a 0-dim device tensor; a reader that skips row 0 and one that skips rows shorter
than a page; a key tile chosen from a host bound frozen at capture; a page-table read one
column past the row (into the next row) and a CSR read one entry past the row's span.
"""

from __future__ import annotations

import pytest
import torch

from pagegraph.check.checker import check_decode_step
from pagegraph.check.config import CheckConfig
from pagegraph.check.judges.reader_judges import (
    BITWISE,
    OWN_ROW,
    SYNC_FREE,
    WRITES_ROWS,
    ulp_distance,
)
from pagegraph.check.reports.step_report import STEP_PROPERTIES
from pagegraph.consumers import csr_decode_attention, paged_decode_attention
from pagegraph.consumers.reader import Reader

#: Each test runs a decode step: long under the Triton interpreter (make test-heavy there).
pytestmark = pytest.mark.cpu_heavy

OUTPUT_PROP = "output correct through the consumer"


def tiny(**changes) -> CheckConfig:
    base = dict(
        max_bs=4,
        max_context_len=128,
        page_size=16,
        steps=3,
        seed=7,
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


def test_the_properties_are_in_the_step_table():
    for name in (SYNC_FREE, WRITES_ROWS, BITWISE, OWN_ROW):
        assert name in STEP_PROPERTIES


def test_ulp_distance_counts_representable_values_across_zero():
    a = torch.tensor([1.0, -0.0, 0.0], dtype=torch.float16)
    b = torch.tensor([1.0, 0.0, 0.0], dtype=torch.float16)
    assert ulp_distance(a, b).tolist() == [0, 0, 0]
    up = torch.nextafter(torch.tensor([1.0]), torch.tensor([2.0])).to(torch.float32)
    assert ulp_distance(up, torch.tensor([1.0])).tolist() == [1]
    small = torch.tensor([torch.finfo(torch.float16).tiny], dtype=torch.float16)
    assert int(ulp_distance(small, -small)) == 2 * int(small.view(torch.int16))


# -- sync-free reader ----------------------------------------------------------------------------


def item_reader(q, k_cache, v_cache, page_table, cache_seqlens, out, *, page_size, workspace):
    longest = int(cache_seqlens.max().item())  # SYNC: item
    assert longest >= 0
    paged_decode_attention(
        q, k_cache, v_cache, page_table, cache_seqlens, out, page_size=page_size,
        workspace=workspace,
    )  # fmt: skip


def tolist_reader(q, k_cache, v_cache, page_table, cache_seqlens, out, *, page_size, workspace):
    lens = cache_seqlens.tolist()  # SYNC: tolist
    assert len(lens) == q.shape[0]
    paged_decode_attention(
        q, k_cache, v_cache, page_table, cache_seqlens, out, page_size=page_size,
        workspace=workspace,
    )  # fmt: skip


def index_reader(q, k_cache, v_cache, page_table, cache_seqlens, out, *, page_size, workspace):
    first = (cache_seqlens[0] * 0).long()  # a 0-dim device tensor
    row = page_table[first]  # SYNC: 0-dim index
    assert row.shape[-1] == page_table.shape[1]
    paged_decode_attention(
        q, k_cache, v_cache, page_table, cache_seqlens, out, page_size=page_size,
        workspace=workspace,
    )  # fmt: skip


def _line_of(marker: str) -> int:
    with open(__file__) as f:
        return next(i for i, line in enumerate(f, 1) if marker in line and "# SYNC" in line)


@pytest.mark.parametrize(
    ("reader", "marker"),
    [(item_reader, "item"), (tolist_reader, "tolist"), (index_reader, "0-dim index")],
)
def test_a_reader_that_syncs_fails_naming_its_line(reader, marker):
    report = check_decode_step("build_page_table", tiny(steps=1), consumer=reader)
    prop = report.property(SYNC_FREE)
    assert prop.status == "FAIL", report.format()
    assert report.verdict == "UNSAFE"
    line = _line_of(f"SYNC: {marker}")
    assert f"test_reader_properties.py:{line}" in str(prop.first_failure), prop.first_failure


def test_pagegraphs_own_readers_are_sync_free():
    for fmt in ("paged", "csr"):
        report = check_decode_step("build_page_table", tiny(steps=1, consumer=fmt))
        assert report.safe, report.format()
        assert "0 syncs" in report.property(SYNC_FREE).detail


# -- reader writes every real row ----------------------------------------------------------------


def skip_row0(q, k_cache, v_cache, page_table, cache_seqlens, out, *, page_size, workspace):
    paged_decode_attention(
        q[1:], k_cache, v_cache, page_table[1:], cache_seqlens[1:], out[1:],
        page_size=page_size, workspace=workspace,
    )  # fmt: skip


def skip_short_rows(q, k_cache, v_cache, page_table, cache_seqlens, out, *, page_size, workspace):
    """Writes only rows holding at least one whole page (a loop over whole pages' outputs)."""
    full = torch.empty_like(out)
    paged_decode_attention(
        q, k_cache, v_cache, page_table, cache_seqlens, full, page_size=page_size,
        workspace=workspace,
    )  # fmt: skip
    out.copy_(torch.where((cache_seqlens >= page_size)[:, None, None], full, out))


def test_a_reader_that_skips_row_0_fails_naming_replay_bucket_and_row():
    report = check_decode_step("build_page_table", tiny(), consumer=skip_row0)
    prop = report.property(WRITES_ROWS)
    assert prop.status == "FAIL", report.format()
    text = str(prop.first_failure)
    assert "replay 0 (bucket" in text and ": row 0 (" in text and "unwritten" in text, text


def test_a_reader_that_skips_short_rows_fails():
    report = check_decode_step(
        "build_page_table", tiny(initial_len=(2, 12)), consumer=skip_short_rows
    )
    prop = report.property(WRITES_ROWS)
    assert prop.status == "FAIL", report.format()
    assert "unwritten" in str(prop.first_failure)


def test_every_real_row_written_by_pagegraphs_reader():
    report = check_decode_step("build_page_table", tiny(initial_len=(2, 12)))
    assert report.safe, report.format()
    assert "every real row written" in report.property(WRITES_ROWS).detail


# -- replay equals eager, bitwise ----------------------------------------------------------------


def _tiled_attend(
    q, k_cache, v_cache, page_table, cache_seqlens, out, *, page_size, workspace, block_n
):
    paged_decode_attention(
        q, k_cache, v_cache, page_table, cache_seqlens, out, page_size=page_size,
        workspace=workspace, block_n=block_n,
    )  # fmt: skip


#: the key tile from the longest row the host knows: 64 at capture (one-token rows), 32 once a
#: row is longer (the fp32 sums run in another order: other bits, within tolerance)
FROZEN_TILES = Reader(
    "tile from max_len", _tiled_attend, lambda host: {"block_n": 64 if host.max_len <= 32 else 32}
)
#: the same from the static capacity: what the graph froze is what an eager call computes
STATIC_TILES = Reader(
    "tile from capacity", _tiled_attend, lambda host: {"block_n": 64 if host.capacity <= 32 else 32}
)


def long_rows(**changes) -> CheckConfig:
    """Rows of several key tiles."""
    return tiny(initial_len=(60, 120), steps=2, **changes)


def test_a_key_tile_frozen_at_capture_fails_bitwise_when_declared():
    report = check_decode_step("build_page_table", long_rows(bitwise=True), consumer=FROZEN_TILES)
    assert report.property(OUTPUT_PROP).status == "pass", report.format()
    prop = report.property(BITWISE)
    assert prop.status == "FAIL", report.format()
    assert "ULP" in str(prop.first_failure)


def test_undeclared_it_is_advice_and_the_verdict_stands():
    report = check_decode_step("build_page_table", long_rows(), consumer=FROZEN_TILES)
    prop = report.property(BITWISE)
    assert prop.status == "advice", report.format()
    assert report.safe, report.format()


def test_a_static_key_tile_is_bitwise_equal():
    report = check_decode_step("build_page_table", long_rows(bitwise=True), consumer=STATIC_TILES)
    assert report.safe, report.format()
    assert "largest difference 0 ULP" in report.property(BITWISE).detail


# -- reader reads only its row -------------------------------------------------------------------


def _peek(out, k_cache, ids):
    """Load page ``ids`` (one a row) and add it times zero: a NaN page shows in the row."""
    seen = k_cache[ids.long()].float().sum(dim=(1, 2, 3))
    out.add_((seen * 0)[:, None, None].to(out.dtype))


def _one_past(page_table, cache_seqlens, page_size, clamp, rows=None):
    """Each row's entry one past its last page through the table's memory (row stride, no
    width check), or its last page with ``clamp``; ``rows``: the rows that read past (the
    others clamp)."""
    bs, stride = page_table.shape[0], page_table.stride(0)
    flat = page_table.as_strided((page_table.untyped_storage().nbytes() // 4,), (1,), 0)
    pages = (cache_seqlens.long() + page_size - 1) // page_size
    col = (cache_seqlens.long() - 1).clamp(min=0) // page_size + 1  # one past the last page
    last = torch.minimum(col, pages - 1).clamp(min=0)
    if clamp:
        col = last
    elif rows is not None:
        col = torch.where(torch.arange(bs, device=col.device) < rows, col, last)
    start = page_table.storage_offset()
    idx = (start + torch.arange(bs, device=col.device) * stride + col).clamp(max=flat.numel() - 1)
    return flat[idx]


def past_width(q, k_cache, v_cache, page_table, cache_seqlens, out, *, page_size, workspace):
    paged_decode_attention(
        q, k_cache, v_cache, page_table, cache_seqlens, out, page_size=page_size,
        workspace=workspace,
    )  # fmt: skip
    _peek(out, k_cache, _one_past(page_table, cache_seqlens, page_size, clamp=False))


def first_row_past_width(
    q, k_cache, v_cache, page_table, cache_seqlens, out, *, page_size, workspace
):
    """Reads one column past its width for row 0 only: a full row 0 reads what follows it."""
    paged_decode_attention(
        q, k_cache, v_cache, page_table, cache_seqlens, out, page_size=page_size,
        workspace=workspace,
    )  # fmt: skip
    _peek(out, k_cache, _one_past(page_table, cache_seqlens, page_size, clamp=False, rows=1))


def within_width(q, k_cache, v_cache, page_table, cache_seqlens, out, *, page_size, workspace):
    paged_decode_attention(
        q, k_cache, v_cache, page_table, cache_seqlens, out, page_size=page_size,
        workspace=workspace,
    )  # fmt: skip
    _peek(out, k_cache, _one_past(page_table, cache_seqlens, page_size, clamp=True))


def _csr_peek(q, k_cache, v_cache, kv_indptr, kv_indices, last, out, *, page_size, workspace, past):
    csr_decode_attention(
        q, k_cache, v_cache, kv_indptr, kv_indices, last, out, page_size=page_size,
        workspace=workspace,
    )  # fmt: skip
    end = kv_indptr[1:].long() - (0 if past else 1)
    _peek(out, k_cache, kv_indices[end.clamp(0, kv_indices.numel() - 1)])


def csr_past_span(*args, **kwargs):
    _csr_peek(*args, past=True, **kwargs)


def csr_within_span(*args, **kwargs):
    _csr_peek(*args, past=False, **kwargs)


def full_rows(**changes) -> CheckConfig:
    """Every row's pages fill the table's width (lengths past ``(width - 1) * page_size``)."""
    return tiny(initial_len=(116, 124), finish_rate=0.0, steps=2, **changes)


def test_a_read_one_column_past_the_width_fails():
    report = check_decode_step("build_page_table", full_rows(), consumer=past_width)
    prop = report.property(OWN_ROW)
    assert prop.status == "FAIL", report.format()
    assert "past its row's width" in str(prop.first_failure)


def test_a_read_past_the_width_of_a_row_before_the_last_fails():
    """Row 0's read past its width lands in the canary column after it (with every row full,
    contiguous rows would hand it row 1's live first page)."""
    report = check_decode_step("build_page_table", full_rows(), consumer=first_row_past_width)
    prop = report.property(OWN_ROW)
    assert prop.status == "FAIL", report.format()
    assert "row 0 " in str(prop.first_failure) and "past its row's width" in str(prop.first_failure)


def test_its_twin_reading_its_own_last_page_passes():
    report = check_decode_step("build_page_table", full_rows(), consumer=within_width)
    assert report.safe, report.format()
    assert "real rows finite" in report.property(OWN_ROW).detail


def test_a_csr_read_one_entry_past_the_span_fails():
    cfg = full_rows(consumer="csr")
    report = check_decode_step("build_page_table", cfg, consumer=csr_past_span)
    prop = report.property(OWN_ROW)
    assert prop.status == "FAIL", report.format()
    assert "past its span" in str(prop.first_failure)


def test_its_csr_twin_reading_its_last_entry_passes():
    cfg = full_rows(consumer="csr")
    report = check_decode_step("build_page_table", cfg, consumer=csr_within_span)
    assert report.safe, report.format()


def test_bitwise_is_a_consumer_key_of_a_scenario(tmp_path):
    from pagegraph.check.scenario import load_scenario

    path = tmp_path / "s.toml"
    path.write_text(
        "[graph]\nmax_bs = 4\nmax_context_len = 64\npage_size = 16\n\n[consumer]\n"
        'format = "paged"\nbitwise = true\n'
    )
    assert load_scenario(path).config.bitwise is True
    assert CheckConfig().bitwise is False
