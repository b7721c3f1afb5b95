"""Invariant: a decode-step scenario names its engine's padding convention, and the reader is
judged on the padded rows under it: no read outside the KV pool (their own outputs finite,
where the null block holds data), and no write into the pages no request holds.

``[consumer] null_block``: "nan" (the default; page 0 NaN, padded rows' own outputs not
judged, "padded rows read inside the KV pool" skipped with its reason) or "finite" (page 0
data, as vLLM's null block 0; the guard page before it and the sentinel NaN). Planted: a
builder that pads zero-length rows' tables with -1 under a reader that reads one block of
every row (the read goes to the guard page), the same reader over tables padded with the null
block (SAFE), and readers that write the null block or the guard page.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from pagegraph.check.checker import check_decode_step
from pagegraph.check.config import CheckConfig
from pagegraph.check.judges.padded_rows import READS, WRITES
from pagegraph.check.judges.step_judges import (
    NullBlockUntouched,
    PaddedReadsInPool,
    StepBatch,
    StepReplays,
    StepSeen,
)
from pagegraph.check.pipeline.step_bed import step_properties
from pagegraph.check.reports.step_report import STEP_PROPERTIES
from pagegraph.check.scenario import ScenarioError, load_scenario
from pagegraph.consumers import paged_decode_attention
from pagegraph.graph.step_graphs import GUARD_NAME, NULL_BLOCK_NAME
from pagegraph.kernels.page_table import build_page_table


def tiny(**changes) -> CheckConfig:
    """Every batch of 1..3 rows padded to the one bucket of 4, vLLM's zero-length padding."""
    base = dict(
        max_bs=4,
        buckets=[4],
        max_context_len=64,
        page_size=16,
        steps=6,
        seed=3,
        consumer="paged",
        num_q_heads=2,
        num_kv_heads=1,
        head_dim=16,
        padding="vllm",
        timing_iters=0,
        null_block="finite",
    )
    return CheckConfig(**{**base, **changes})


def statuses(report) -> dict[str, str]:
    return {p.name: p.status for p in report.properties}


# -- planted builders and readers ---------------------------------------------------------------


def _padding_builder(fill: int):
    def build(req_to_token, req_pool_indices, seq_lens, page_table, page_size) -> None:
        build_page_table(req_to_token, req_pool_indices, seq_lens, page_table, page_size)
        page_table.masked_fill_((seq_lens <= 0)[:, None], fill)

    return build


pads_minus_one = _padding_builder(-1)
pads_null_block = _padding_builder(0)


def one_block_always(q, k_cache, v_cache, page_table, cache_seqlens, out, *, page_size, workspace):
    """A zero-length row still reads one token of its first block."""
    lens = cache_seqlens.clamp(min=1)
    return paged_decode_attention(
        q, k_cache, v_cache, page_table, lens, out, page_size=page_size, workspace=workspace
    )


def null_block_writer(q, k_cache, v_cache, page_table, cache_seqlens, out, *, page_size, workspace):
    """Correct, then writes into page 0."""
    paged_decode_attention(
        q,
        k_cache,
        v_cache,
        page_table,
        cache_seqlens,
        out,
        page_size=page_size,
        workspace=workspace,
    )
    k_cache[0, 0].add_(1)
    return out


def guard_writer(q, k_cache, v_cache, page_table, cache_seqlens, out, *, page_size, workspace):
    """Correct, then writes one page before page 0, as pointer arithmetic on block -1 does."""
    paged_decode_attention(
        q,
        k_cache,
        v_cache,
        page_table,
        cache_seqlens,
        out,
        page_size=page_size,
        workspace=workspace,
    )
    before = v_cache.as_strided(
        v_cache.shape[1:], v_cache.stride()[1:], v_cache.storage_offset() - v_cache.stride(0)
    )
    before[0].fill_(0)
    return out


# -- the scenario key ---------------------------------------------------------------------------


def _scenario(tmp_path, null_block: str):
    path = tmp_path / "s.toml"
    path.write_text(
        "[graph]\nmax_bs = 4\nmax_context_len = 64\npage_size = 16\n\n[consumer]\n"
        f'format = "paged"\nnull_block = "{null_block}"\n'
    )
    return load_scenario(path)


def test_null_block_is_a_consumer_key_checked_on_load(tmp_path):
    assert _scenario(tmp_path, "finite").config.null_block == "finite"
    with pytest.raises(ScenarioError, match=r"consumer\.null_block: must be 'nan' or 'finite'"):
        _scenario(tmp_path, "zero")
    assert CheckConfig().null_block == "nan"


def test_both_properties_are_in_the_step_table():
    for name in (READS, WRITES):
        covers, fails_on = STEP_PROPERTIES[name]
        assert covers and fails_on


# -- the judges on planted replays ------------------------------------------------------------


def _run(null_block: str = "finite"):
    table = torch.full((4, 4), -1, dtype=torch.int32)
    graphs = SimpleNamespace(
        null_block=null_block,
        page_table=table,
        seq_lens=torch.zeros(4, dtype=torch.int32),
        req_pool_indices=torch.zeros(4, dtype=torch.int32),
    )
    return SimpleNamespace(
        props=step_properties(), graphs=graphs, cfg=SimpleNamespace(padding="vllm")
    )


def _replays(pads: torch.Tensor | None, changed: tuple[str, ...] = ()) -> StepReplays:
    real = torch.zeros((2, 2, 4), dtype=torch.bfloat16)
    return StepReplays(real, real, real, True, pad_c=pads, reserved_changed=changed)


BATCH = StepBatch(7, 4, [0, 1], [9, 9], [([1], 9)] * 2, torch.tensor([1], dtype=torch.int32))


def test_reads_judge_fails_on_a_nan_padded_row_only_where_the_null_block_holds_data():
    pads = torch.ones((2, 2, 4), dtype=torch.bfloat16)
    run = _run()
    PaddedReadsInPool().observe(StepSeen(run, BATCH, _replays(pads)))
    assert run.props[READS].status == "pass"
    pads[1, 0, 3] = float("nan")
    PaddedReadsInPool().observe(StepSeen(run, BATCH, _replays(pads)))
    failure = run.props[READS].first_failure
    assert run.props[READS].status == "FAIL"
    assert "replay 7 (bucket 4): padded row 3 (seq_len 0" in failure
    assert "table entries [-1, -1, -1, -1]" in failure and "1 padded row(s)" in failure
    nan_run = _run("nan")
    PaddedReadsInPool().observe(StepSeen(nan_run, BATCH, _replays(pads)))
    assert nan_run.props[READS].status == "pass"  # not judged: note_convention skips it


def test_writes_judge_fails_on_a_changed_reserved_page():
    run = _run()
    NullBlockUntouched().observe(StepSeen(run, BATCH, _replays(None)))
    assert run.props[WRITES].status == "pass"
    NullBlockUntouched().observe(StepSeen(run, BATCH, _replays(None, (NULL_BLOCK_NAME,))))
    assert run.props[WRITES].status == "FAIL"
    assert "replay 7 (bucket 4, 2 real rows): page 0 (the null block)" in (
        run.props[WRITES].first_failure
    )


# -- end to end, on the CPU's emulated graphs ---------------------------------------------------


def test_a_correct_pair_passes_both_with_a_finite_null_block():
    report = check_decode_step("build_page_table", tiny())
    s = statuses(report)
    assert report.verdict == "SAFE", report.format()
    assert s[READS] == "pass" and s[WRITES] == "pass", report.format()
    assert "every padded row's output finite" in report.property(READS).detail
    assert "page 0 (the null block, data) unchanged" in report.property(WRITES).detail


def test_the_default_nan_null_block_skips_the_reads_and_says_why():
    report = check_decode_step("build_page_table", tiny(null_block="nan"))
    assert report.verdict == "SAFE", report.format()
    reads = report.property(READS)
    assert reads.status == "skip" and "null_block = 'nan'" in reads.detail
    assert report.property(WRITES).status == "pass"
    assert "page 0 not judged" in report.property(WRITES).detail


def test_a_minus_one_block_read_by_a_padded_row_fails():
    report = check_decode_step(pads_minus_one, tiny(), consumer=one_block_always)
    assert statuses(report)[READS] == "FAIL", report.format()
    assert "table entries [-1, -1, -1, -1]" in str(report.property(READS).first_failure)
    # Real rows are unaffected: only the padded rows' own outputs show it.
    assert statuses(report)["output correct through the consumer"] == "pass"
    assert statuses(report)["padded rows contained"] == "pass"


@pytest.mark.cpu_heavy  # a decode step: long under the Triton interpreter
def test_the_same_reader_over_null_block_padding_is_safe():
    report = check_decode_step(pads_null_block, tiny(), consumer=one_block_always)
    assert report.verdict == "SAFE", report.format()
    # With the NaN null block the padded rows read NaN but are not judged on it.
    report = check_decode_step(pads_null_block, tiny(null_block="nan"), consumer=one_block_always)
    assert report.verdict == "SAFE", report.format()


@pytest.mark.cpu_heavy  # a decode step: long under the Triton interpreter
def test_a_write_into_the_null_block_fails_where_it_holds_data():
    report = check_decode_step("build_page_table", tiny(), consumer=null_block_writer)
    assert statuses(report)[WRITES] == "FAIL", report.format()
    assert NULL_BLOCK_NAME in str(report.property(WRITES).first_failure)
    # Where page 0 holds NaN it is padding's own page: not judged.
    report = check_decode_step(
        "build_page_table", tiny(null_block="nan"), consumer=null_block_writer
    )
    assert statuses(report)[WRITES] == "pass", report.format()


@pytest.mark.parametrize("null_block", ["nan", "finite"])
def test_a_write_into_the_guard_page_fails_in_either_convention(null_block):
    report = check_decode_step(
        "build_page_table", tiny(null_block=null_block), consumer=guard_writer
    )
    assert statuses(report)[WRITES] == "FAIL", report.format()
    assert f"{GUARD_NAME} of the KV cache changed during capture" in str(
        report.property(WRITES).first_failure
    )


def masked_read(q, k_cache, v_cache, page_table, cache_seqlens, out, *, page_size, workspace):
    """Correct, then loads every entry of each row's table (stale ones too) by torch indexing,
    masked by a multiplication by zero."""
    paged_decode_attention(
        q,
        k_cache,
        v_cache,
        page_table,
        cache_seqlens,
        out,
        page_size=page_size,
        workspace=workspace,
    )
    loaded = k_cache[page_table[: out.shape[0]].long()].float()
    out.add_((loaded.sum(dim=(1, 2, 3)) * 0)[:, None, :].to(out.dtype))
    return out


def test_stale_entries_still_name_a_nan_page_where_page_0_holds_data():
    """The NaN-tail replays name the guard page (-1): torch's indexing wraps it round to the
    sentinel, NaN too, so a masked read of stale entries still shows."""
    report = check_decode_step("build_page_table", tiny(), consumer=masked_read)
    assert statuses(report)["output correct through the consumer"] == "FAIL", report.format()
    assert "non-finite" in str(report.property("output correct through the consumer").first_failure)
