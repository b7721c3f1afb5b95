"""An SWA table with a row stride of its own (``swa_table_pad_cols``): the bed lays it out as
an engine that allocates it apart would, a correct builder stays SAFE whichever table is the
wider, and a builder that writes the SWA rows with the page table's stride fails "correct"."""

from __future__ import annotations

import pytest
import torch

from pagegraph.check.checker import check_replay_safety
from pagegraph.check.config import CheckConfig, validate_config
from pagegraph.check.pipeline.buffers import allocate_check_buffers, table_row_strides
from pagegraph.clients.sglang import sglang_unavailable_reason
from pagegraph.kernels.page_table import build_page_table
from pagegraph.kinds import PAGE_TABLE


def _cfg(pad: int, swa_pad: int | None) -> CheckConfig:
    return CheckConfig(
        max_bs=8,
        max_context_len=640,
        page_size=16,
        steps=20,
        buckets=[1, 2, 4, 8],
        swa=True,
        table_pad_cols=pad,
        swa_table_pad_cols=swa_pad,
        seed=3,
        initial_len=(1, 500),
        swa_window=128,
        swa_churn=0.3,
    )


def _status(report, name: str) -> str:
    return next(p.status for p in report.properties if p.name == name)


def test_each_table_view_has_its_own_row_stride_inside_one_poisoned_allocation():
    cfg = _cfg(3, 9)
    assert table_row_strides(cfg) == (43, 49)
    buffers = allocate_check_buffers(cfg, PAGE_TABLE, torch.device("cpu"))
    assert buffers.tables.shape == (2, 10, 49)
    assert [v.stride() for v in buffers.views] == [(43, 1), (49, 1)]
    for t, view in enumerate(buffers.views):
        view.fill_(t + 1)  # every entry of the view, and nothing else of its slab
        slab = buffers.tables[t].reshape(-1)
        assert int((slab == t + 1).sum()) == 8 * 40
        assert view.data_ptr() == slab.data_ptr() + buffers.row_strides[t] * 4  # canary row
    assert table_row_strides(_cfg(4, None)) == (44, 44)


@pytest.mark.parametrize("pad, swa_pad", [(3, 9), (9, 0), (0, 5)])
def test_a_correct_builder_is_safe_whichever_table_is_wider(pad, swa_pad):
    report = check_replay_safety(build_page_table, _cfg(pad, swa_pad))
    assert report.verdict == "SAFE", report.format()


def _swa_with_page_table_stride(
    req_to_token,
    req_pool_indices,
    seq_lens,
    page_table,
    page_size,
    *,
    swa_page_table=None,
    full_to_swa=None,
):
    """Writes the SWA rows with the page table's row stride (SGLang's trtllm_mha bug)."""
    if swa_page_table is not None:
        swa_page_table = torch.as_strided(swa_page_table, swa_page_table.shape, page_table.stride())
    build_page_table(
        req_to_token,
        req_pool_indices,
        seq_lens,
        page_table,
        page_size,
        swa_page_table=swa_page_table,
        full_to_swa=full_to_swa,
    )


def test_swa_rows_written_with_the_page_tables_stride_fail_correct():
    report = check_replay_safety(_swa_with_page_table_stride, _cfg(0, 5))
    assert _status(report, "correct") == "FAIL"
    failure = str(next(p for p in report.properties if p.name == "correct").first_failure)
    assert "swa_page_table[" in failure
    # With both strides equal the same builder is right: the layout is what shows the bug.
    assert check_replay_safety(_swa_with_page_table_stride, _cfg(2, 2)).verdict == "SAFE"


@pytest.mark.skipif(sglang_unavailable_reason() is not None, reason="sglang is not installed")
def test_sglangs_page_table_builder_fails_on_an_swa_table_of_its_own_stride():
    report = check_replay_safety("sglang_trtllm_mha_page_table", _cfg(0, 5))
    assert _status(report, "correct") == "FAIL"
    failure = str(next(p for p in report.properties if p.name == "correct").first_failure)
    assert "swa_page_table[" in failure


def test_swa_table_pad_cols_is_validated():
    with pytest.raises(ValueError, match="swa_table_pad_cols.*needs swa = true"):
        validate_config(_cfg(0, 3).replace(swa=False))
    with pytest.raises(ValueError, match="swa_table_pad_cols.*>= 0"):
        validate_config(_cfg(0, -1))
