""" "outputs unaliased" (``pagegraph.check.judges.aliasing``): outputs that share memory with each
other
or with an input fail at set-up, naming both buffers and the bytes they share; disjoint views
of one allocation pass; the corpus entries of aliasing (class f) hold their verdicts."""

from __future__ import annotations

import pytest
import torch

from pagegraph import GraphRunner, check_replay_safety
from pagegraph.check.config import CheckConfig
from pagegraph.check.judges.aliasing import byte_runs, find_overlaps, judge_aliasing, split_buffers
from pagegraph.check.reports.report import PropertyResult
from pagegraph.kinds import kind_of
from pagegraph.wild import entry

PROP = "outputs unaliased"

#: A decode step's metadata on small buckets (every output compared).
METADATA = CheckConfig(
    max_bs=4,
    max_context_len=256,
    page_size=16,
    buckets=[2, 4],
    steps=6,
    seed=3,
    initial_len=(1, 200),
)


def test_byte_runs_follow_the_strides_of_a_view():
    a = torch.zeros(4, 10, dtype=torch.int32)
    runs = byte_runs(a[:, 2:5]) - a.data_ptr()
    assert runs.tolist() == [[8 + 40 * r, 20 + 40 * r] for r in range(4)]
    assert (byte_runs(a) - a.data_ptr()).tolist() == [[0, 160]]  # contiguous: one run
    assert (byte_runs(a.t()[1]) - a.data_ptr()).tolist() == [
        [4 + 40 * r, 8 + 40 * r] for r in range(4)
    ]
    wide = torch.zeros(3, 1).expand(3, 6)  # a stride-0 dimension repeats, adds nothing
    assert (byte_runs(wide) - wide.data_ptr()).tolist() == [[0, 12]]


def test_disjoint_views_of_one_allocation_pass():
    """The pad-columns layout: two tables interleaved row by row in one allocation, and
    vectors in the rows of one ``[V, L]`` tensor, share a storage but no byte."""
    slab = torch.zeros(8, 2 * 6 + 3, dtype=torch.int32)
    tables = {"page_table": slab[:, :6], "swa_page_table": slab[:, 6:12]}
    vectors = torch.zeros(3, 10, dtype=torch.int32)
    named = {"cu_seqlens_k": vectors[1, 1:9], "cu_seqlens_q": vectors[2, 1:9]}
    assert find_overlaps({**tables, **named}, {"pad": slab[:, 12:]}) == []


def test_overlapping_outputs_name_both_buffers_and_the_common_bytes():
    flat = torch.zeros(32, dtype=torch.int32)
    found = find_overlaps({"cu_seqlens_k": flat[:9], "cu_seqlens_q": flat[5:14]}, {})
    assert len(found) == 1
    o = found[0]
    assert (o.first, o.second, o.relation, o.common) == (
        "cu_seqlens_k",
        "cu_seqlens_q",
        "two outputs",
        16,
    )
    assert (o.first_at, o.second_at) == ("cu_seqlens_k[5]", "cu_seqlens_q[0]")
    text = str(o)
    assert "cu_seqlens_k" in text and "cu_seqlens_q" in text and "16 bytes" in text
    # One column of two interleaved tables in common: the exact bytes, not the spans'.
    slab = torch.zeros(8, 12, dtype=torch.int32)
    (o,) = find_overlaps({"page_table": slab[:, :6], "swa_page_table": slab[:, 5:11]}, {})
    assert (o.common, o.first_at, o.second_at) == (
        8 * 4,
        "page_table[0, 5]",
        "swa_page_table[0, 0]",
    )


def test_inputs_may_share_memory_but_not_with_an_output():
    flat = torch.zeros(64, dtype=torch.int32)
    assert find_overlaps({"page_table": flat[:8]}, {"seq_lens": flat[8:], "all": flat[8:]}) == []
    (o,) = find_overlaps({"page_table": flat[:9]}, {"seq_lens": flat[8:16]})
    assert (o.relation, o.common) == ("an output and an input", 4)


def test_a_runner_writing_into_req_to_token_fails_at_set_up():
    """An engine that hands a view of ``req_to_token`` as the page table: the build overwrites
    what it reads."""
    r2t = torch.zeros(6, 64, dtype=torch.int32)
    runner = GraphRunner(
        r2t, max_bs=4, max_context_len=64, page_size=16, buckets=[4], page_table=r2t[1:5, :4]
    )
    outputs, inputs = split_buffers(runner.static_buffers(), kind_of(runner.builder))
    assert "page_table" in outputs and "req_to_token" in inputs and "seq_lens" in inputs
    prop = PropertyResult(PROP)
    judge_aliasing(prop, runner, kind_of(runner.builder))
    assert prop.status == "FAIL"
    assert str(prop.first_failure).startswith("page_table overlaps req_to_token (an output and")


def _shared_cu_seqlens(req_to_token, *, vectors, **kwargs) -> GraphRunner:
    """An engine that hands its decode-metadata builder one buffer as both cumulative-length
    outputs: the later write (cu_seqlens_q) overwrites what a reader of cu_seqlens_k reads."""
    vectors = dict(vectors, cu_seqlens_q=vectors["cu_seqlens_k"])
    return GraphRunner(req_to_token, vectors=vectors, **kwargs)


def test_metadata_outputs_handed_over_as_one_buffer_fail_outputs_unaliased_and_correct():
    report = check_replay_safety(
        "build_decode_metadata", METADATA, runner_factory=_shared_cu_seqlens
    )
    prop = report.property(PROP)
    assert prop.status == "FAIL", prop.full_detail()
    assert "cu_seqlens_k overlaps cu_seqlens_q (two outputs)" in str(prop.first_failure)
    assert report.property("correct").status == "FAIL"
    assert report.verdict == "UNSAFE"


def test_the_checkers_own_buffers_pass_with_pad_columns():
    cfg = METADATA.replace(swa=True, table_pad_cols=3, swa_table_pad_cols=5, errors=True)
    report = check_replay_safety("build_decode_metadata", cfg)
    prop = report.property(PROP)
    assert prop.status == "pass" and "no byte in common" in prop.detail
    assert report.safe, report.verdict


@pytest.mark.parametrize("key", ["vllm-34874", "vllm-48659", "sglang-36658"])
def test_entry_twins(key):
    bug = entry(key)
    buggy = bug.check("buggy")
    assert buggy.property(bug.prop).status == "FAIL", buggy.property(bug.prop).full_detail()
    assert buggy.verdict == "UNSAFE"
    fixed = bug.check("fixed")
    assert fixed.safe, [(p.name, p.full_detail()) for p in fixed.properties if not p.passed]


def test_the_second_group_on_the_first_groups_buffer_is_named_as_the_cause():
    """vLLM #34874: "outputs unaliased" names the two tables; "correct" fails too, on the
    second group's own buffer that nothing wrote."""
    report = entry("vllm-34874").check("buggy")
    assert "page_table overlaps swa_page_table" in str(report.property(PROP).first_failure)
    assert report.property("correct").status == "FAIL"
