"""Invariant: "graph-safe (captured short, replayed long)" fails exactly when a replay's
outputs differ from an eager call of the builder on the same inputs
(``pagegraph.check.judges.graph_safety``): a builder wrong in eager mode too fails "correct" alone,
a
builder whose host-side decision is frozen at capture fails "graph-safe"; where nothing was
captured the property is a skip, never a pass."""

from __future__ import annotations

import pytest
import torch

from pagegraph.check.checker import check_replay_safety
from pagegraph.check.config import CheckConfig
from pagegraph.kernels.contract import interpreter_active
from pagegraph.kernels.page_table import build_page_table

GRAPH_SAFE = "graph-safe (captured short, replayed long)"
SMALL = CheckConfig(
    max_bs=6,
    max_context_len=256,
    page_size=16,
    steps=24,
    seed=5,
    detectors="none",
    near_capacity=0.3,
)

_widths: dict[int, int] = {}


def frozen_at_capture(req_to_token, req_pool_indices, seq_lens, page_table, page_size, **kw):
    """Sizes its width from the longest length, read on the host, except while a graph is
    being captured, where a read is illegal and it reuses the width of its last call (the
    warm-up's, with every length 1): right in every eager call, frozen in a graph."""
    key = page_table.data_ptr()
    if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        n = _widths[key]
    else:
        longest = int(seq_lens.max().item()) if seq_lens.numel() else 0
        n = max(1, min(-(-max(longest, 0) // page_size), page_table.shape[1]))
        _widths[key] = n
    build_page_table(req_to_token, req_pool_indices, seq_lens, page_table[:, :n], page_size, **kw)


#: The CPU checks run pagegraph's Triton kernel on host tensors, which only the interpreter can
#: (a GPU machine runs the CUDA twins below).
needs_interpreter = pytest.mark.skipif(
    not interpreter_active(), reason="CPU tensors need the Triton interpreter"
)


def wrong_row(req_to_token, req_pool_indices, seq_lens, page_table, page_size, **kw):
    """Each row built from the next row's request: wrong in eager calls and replays alike."""
    build_page_table(req_to_token, req_pool_indices.roll(1), seq_lens, page_table, page_size, **kw)


@needs_interpreter
def test_without_a_capture_graph_safe_is_a_skip_not_a_pass():
    report = check_replay_safety(
        build_page_table, SMALL.replace(steps=6, emulate=False), device="cpu"
    )
    assert not report.captured
    prop = report.property(GRAPH_SAFE)
    assert prop.status == "skip", report.format()
    assert "nothing was captured" in prop.detail


@needs_interpreter
def test_emulated_graphs_judge_graph_safe_both_ways():
    """On the CPU an emulated capture freezes what the builder decided on the host: the
    frozen builder fails graph-safe, the wrong-row one fails correct and passes it."""
    _widths.clear()
    cfg = SMALL.replace(detectors="none")  # what the capture froze, not the builder's syncs
    report = check_replay_safety(frozen_at_capture, cfg, device="cpu")
    assert report.captured and report.property(GRAPH_SAFE).status == "FAIL", report.format()
    report = check_replay_safety(wrong_row, cfg, device="cpu")
    assert report.property(GRAPH_SAFE).status == "pass", report.format()
    assert report.property("correct").status == "FAIL"


def test_a_builder_reading_the_wrong_row_fails_correct_not_graph_safe():
    report = check_replay_safety(wrong_row, SMALL)
    assert report.property("correct").status == "FAIL", report.format()
    assert report.property(GRAPH_SAFE).status != "FAIL", report.format()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_gpu_a_capture_frozen_builder_fails_graph_safe_and_wrong_row_passes_it():
    _widths.clear()
    report = check_replay_safety(frozen_at_capture, SMALL)
    prop = report.property(GRAPH_SAFE)
    assert prop.status == "FAIL", report.format()
    assert "differ from an eager call" in str(prop.first_failure)
    report = check_replay_safety(wrong_row, SMALL)
    assert report.property(GRAPH_SAFE).status == "pass", report.format()
    assert report.property("correct").status == "FAIL"
    report = check_replay_safety(build_page_table, SMALL)
    assert report.property(GRAPH_SAFE).status == "pass", report.format()
    assert "compared with an eager call" in report.property(GRAPH_SAFE).detail
