"""Invariant: a decode step's reader is run as an engine runs it. Host launch arguments are
computed at capture and frozen in the graph (emulated on a CPU), and a planned reader's run
reads only what the current plan wrote into its workspace.

Planted readers: one whose ``max_seqlen_k`` comes from the batch at hand (frozen at capture
with one-token lengths: wrong once requests grow), beside its twin that passes the static
capacity; a work-list reader whose run processes every slot of its padded grid (slots past the
plan's count hold an earlier plan's items), beside its twin that masks them. A plain consumer
keeps its verdicts, the new property passing with a note that there is nothing to check.
"""

from __future__ import annotations

import re

import pytest
import torch

from pagegraph.check.checker import check_decode_step
from pagegraph.check.config import CheckConfig
from pagegraph.consumers import paged_decode_attention
from pagegraph.consumers.reader import HostBatch, Reader, as_reader
from pagegraph.graph.plan_workspace import PlanWorkspace, _poisons
from pagegraph.kernels.contract import POISON
from pagegraph.wild.range_attention import split_attention

PLAN_PROP = "reader reads only what the current plan wrote"
#: Eager replays (``emulate=False``) exist only without CUDA, where graphs are emulated.
cpu_only = pytest.mark.skipif(torch.cuda.is_available(), reason="eager replays: CPU only")
OUTPUT_PROP = "output correct through the consumer"


def tiny(**changes) -> CheckConfig:
    """A config the Triton interpreter runs in seconds; rows grow far past one token."""
    base = dict(
        max_bs=4,
        max_context_len=128,
        page_size=16,
        steps=6,
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


def statuses(report) -> dict[str, str]:
    return {p.name: p.status for p in report.properties}


# -- readers with a host launch argument ---------------------------------------------------------


def _seqlen_k_buffer(max_bs, width, page_size, device):
    return {"seqlen_k": torch.zeros(max_bs, dtype=torch.int32, device=device)}


def varlen(
    q, k_cache, v_cache, page_table, cache_seqlens, out, *, page_size, workspace, max_seqlen_k, plan
):
    """Attends to ``min(length, max_seqlen_k)`` tokens a row (a launch over that many keys)."""
    lens = plan["seqlen_k"][: q.shape[0]]
    torch.clamp(cache_seqlens, max=max_seqlen_k, out=lens)
    return paged_decode_attention(
        q, k_cache, v_cache, page_table, lens, out, page_size=page_size, workspace=workspace
    )


FROM_BATCH = Reader(
    "max_seqlen_k from the batch",
    varlen,
    lambda host: {"max_seqlen_k": host.max_len},
    workspace=_seqlen_k_buffer,
)
CAPACITY = Reader(
    "max_seqlen_k = capacity",
    varlen,
    lambda host: {"max_seqlen_k": host.capacity},
    workspace=_seqlen_k_buffer,
)


def test_a_launch_argument_from_the_batch_is_frozen_at_capture_and_fails():
    report = check_decode_step("build_page_table", tiny(), consumer=FROM_BATCH)
    assert report.verdict == "UNSAFE", report.format()
    assert report.property(OUTPUT_PROP).status == "FAIL", report.format()
    assert "replay 0" in report.property(OUTPUT_PROP).first_failure


def test_its_twin_with_the_static_capacity_is_safe():
    report = check_decode_step("build_page_table", tiny(), consumer=CAPACITY)
    assert report.safe, report.format()
    assert "nothing to check" in report.property(PLAN_PROP).detail


@cpu_only
def test_the_same_reader_run_eagerly_is_correct_so_the_graph_froze_it():
    report = check_decode_step(
        "build_page_table", tiny(steps=3), consumer=FROM_BATCH, emulate=False
    )
    assert report.property(OUTPUT_PROP).status == "pass", report.format()


def test_launch_arguments_see_one_token_rows_at_capture_and_nothing_at_replay():
    seen: list[HostBatch] = []

    def spy(host: HostBatch) -> dict:
        seen.append(host)
        return {}

    reader = Reader("spy", paged_decode_attention, spy)
    check_decode_step("build_page_table", tiny(steps=4), consumer=reader)
    # warm-up and capture, a call each per bucket: nothing at replay (the graph replays);
    # then the eager calls of "replay equals eager, bitwise" (advice here: steps 0 and 3 of
    # four), on the step's lengths
    captured, eager = seen[:4], seen[4:]
    assert [h.bucket for h in captured] == [4, 2, 4, 2]
    assert all(set(h.lens) == {1} and len(h.lens) == h.bucket for h in captured)
    assert len(eager) == 2 and all(h.max_len > 1 for h in eager)
    assert seen[0].capacity == 128 and seen[0].max_len == 1


@cpu_only
def test_launch_arguments_see_each_batch_where_the_step_runs_eagerly():
    seen: list[HostBatch] = []
    reader = Reader("spy", paged_decode_attention, lambda host: seen.append(host) or {})
    check_decode_step("build_page_table", tiny(steps=2), consumer=reader, emulate=False)
    replayed = seen[4:]  # after warm-up and capture: the replays' calls
    assert replayed and all(h.max_len > 1 for h in replayed)


# -- planned readers ---------------------------------------------------------------------------


def _work_list(max_bs, width, page_size, device):
    return {
        "rows": torch.zeros(max_bs, dtype=torch.int32, device=device),
        "count": torch.zeros(1, dtype=torch.int32, device=device),
    }


def plan_rows(host: HostBatch, ws) -> None:
    """One work item a real row, then the count; slots past it keep what they held."""
    n = len(host.lens)
    ws["rows"][:n].copy_(torch.arange(n, dtype=torch.int32))
    ws["count"].fill_(n)


def _run_items(q, k_cache, v_cache, page_table, cache_seqlens, out, page_size, ws, masked):
    """Each slot of the static grid attends for its row; outputs are summed into rows."""
    bs, slots = q.shape[0], ws["rows"].shape[0]
    rows = ws["rows"].long().clamp(0, bs - 1)
    valid = torch.ones(slots, dtype=torch.bool, device=q.device)
    if masked:
        valid = torch.arange(slots, device=q.device) < ws["count"].long()
    o = split_attention(
        q[rows],
        k_cache,
        v_cache,
        page_table[rows],
        cache_seqlens[rows],
        page_size=page_size,
        splits=2,
        split_tokens=64,
    )
    o = torch.where(valid[:, None, None], o, 0.0)
    acc = torch.zeros((bs, *o.shape[1:]), device=q.device).index_add_(0, rows, o)
    return out.copy_(acc)


def run_every_slot(
    q, k_cache, v_cache, page_table, cache_seqlens, out, *, page_size, workspace, plan
):
    return _run_items(
        q, k_cache, v_cache, page_table, cache_seqlens, out, page_size, plan, masked=False
    )


def run_counted_slots(
    q, k_cache, v_cache, page_table, cache_seqlens, out, *, page_size, workspace, plan
):
    return _run_items(
        q, k_cache, v_cache, page_table, cache_seqlens, out, page_size, plan, masked=True
    )


UNMASKED = Reader("every slot", run_every_slot, plan=plan_rows, workspace=_work_list)
MASKED = Reader("slots below the count", run_counted_slots, plan=plan_rows, workspace=_work_list)


def test_a_run_over_slots_the_plan_did_not_write_fails_the_plan_property():
    report = check_decode_step("build_page_table", tiny(), consumer=UNMASKED)
    assert report.verdict == "UNSAFE", report.format()
    prop = report.property(PLAN_PROP)
    assert prop.status == "FAIL", report.format()
    assert "the current plan did not write" in prop.first_failure


def test_a_run_masked_by_the_plans_count_passes_every_property():
    report = check_decode_step("build_page_table", tiny(), consumer=MASKED)
    assert report.safe, report.format()
    detail = report.property(PLAN_PROP).detail
    # a plan a step and one at capture; a replay more wherever a plan left entries unwritten
    assert detail.startswith("7 plans"), detail
    assert int(re.search(r"(\d+) replays re-run", detail).group(1)) >= 1, detail


FRESH_PROP = "reader reads only workspace a plan wrote"


def _wide_work_list(max_bs, width, page_size, device):
    """Twice the slots a batch needs: no plan writes the second half."""
    return {
        k: torch.cat([t, t]) if k == "rows" else t
        for k, t in _work_list(max_bs, width, page_size, device).items()
    }


WIDE_UNMASKED = Reader("every slot", run_every_slot, plan=plan_rows, workspace=_wide_work_list)
WIDE_MASKED = Reader(
    "slots below the count", run_counted_slots, plan=plan_rows, workspace=_wide_work_list
)


def test_a_run_over_slots_no_plan_wrote_fails_at_once_and_names_the_earlier_plan_later():
    report = check_decode_step("build_page_table", tiny(), consumer=WIDE_UNMASKED)
    fresh, stale = report.property(FRESH_PROP), report.property(PLAN_PROP)
    assert fresh.status == "FAIL", report.format()
    assert "no plan has written since allocation" in fresh.first_failure
    assert stale.status == "FAIL", report.format()
    assert re.search(r"stale: left by (replay \d+ \(bucket \d+, \d+ real rows\)|the capture)",
                     stale.first_failure), stale.first_failure  # fmt: skip


def test_its_masked_twin_passes_both_workspace_properties():
    report = check_decode_step("build_page_table", tiny(), consumer=WIDE_MASKED)
    assert report.safe, report.format()
    assert "no plan had written" in report.property(FRESH_PROP).detail


def test_a_plain_consumer_passes_the_plan_property_with_nothing_to_check():
    report = check_decode_step("build_page_table", tiny(steps=2))
    assert report.safe, report.format()
    assert report.property(PLAN_PROP).status == "pass"
    assert "no plan()" in report.property(PLAN_PROP).detail


# -- the workspace's bookkeeping -----------------------------------------------------------------


def _space(plan, tensors) -> PlanWorkspace:
    return PlanWorkspace(
        Reader("r", paged_decode_attention, plan=plan, workspace=lambda *a: tensors),
        4,
        2,
        16,
        "cpu",
    )


def _host(*lens) -> HostBatch:
    return HostBatch(tuple(lens), 4, 16, 2)


def test_an_entry_written_with_the_poison_itself_counts_as_written():
    def plan(host, ws):
        ws["ints"][0] = POISON  # the first poison: seen by the second call
        ws["ints"][1] = ~POISON  # the second poison: seen by the first
        ws["flags"][0] = True

    space = _space(
        plan, {"ints": torch.zeros(4, dtype=torch.int32), "flags": torch.zeros(3, dtype=torch.bool)}
    )
    space.plan(_host(5))
    assert space.written["ints"].tolist() == [True, True, False, False]
    assert space.written["flags"].tolist() == [True, False, False]
    # unwritten entries keep what the allocation (an earlier plan) held, not a poison
    assert space.tensors["ints"].tolist() == [POISON, ~POISON, 0, 0]
    assert space.tensors["flags"].tolist() == [True, False, False]


def test_a_smaller_plan_leaves_the_earlier_plans_entries_and_refills_only_those():
    space = _space(plan_rows, _work_list(4, 2, 16, "cpu"))
    space.plan(_host(9, 9, 9, 9))
    space.plan(_host(9))
    rows = space.tensors["rows"]
    assert rows.tolist() == [0, 1, 2, 3] and space.tensors["count"].tolist() == [1]
    assert space.written["rows"].tolist() == [True, False, False, False]
    saved = space.refill_unwritten(torch.Generator().manual_seed(0))
    assert set(saved) == {"rows"}  # count was written
    assert rows[0] == 0 and (rows[1:] != torch.tensor([1, 2, 3])).all(), rows
    space.restore(saved)
    assert rows.tolist() == [0, 1, 2, 3]
    assert space.left_by() == "the plan for bucket 4"  # the larger plan left rows[1:]


def test_entries_no_plan_wrote_are_refilled_apart_from_an_earlier_plans():
    space = _space(plan_rows, _wide_work_list(4, 2, 16, "cpu"))
    space.plan(_host(9, 9), "plan A")
    space.plan(_host(9), "plan B")
    rows = space.tensors["rows"]
    stale = space.refill_unwritten(torch.Generator().manual_seed(0))
    assert rows[0] == 0 and rows[1] != 1 and rows[2:].tolist() == [0] * 6, rows
    space.restore(stale)
    fresh = space.refill_unwritten(torch.Generator().manual_seed(0), stale=False)
    assert rows[:2].tolist() == [0, 1] and (rows[2:] != 0).all(), rows
    space.restore(fresh)
    assert space.left_by() == "plan A"


def test_a_plan_that_replaces_a_workspace_tensor_is_refused():
    def plan(host, ws):
        ws["rows"] = torch.ones(4, dtype=torch.int32)

    space = _space(plan, {"rows": torch.zeros(4, dtype=torch.int32)})
    with pytest.raises(ValueError, match="write them in place"):
        space.plan(_host(3))


def test_poisons_differ_and_fit_their_dtype():
    for dtype in (
        torch.int8,
        torch.int32,
        torch.int64,
        torch.float16,
        torch.bfloat16,
        torch.float32,
        torch.bool,
    ):
        a, b = _poisons(dtype)
        t = torch.tensor([a, b]).to(dtype)
        assert t[0] != t[1] and torch.isfinite(t.float()).all(), dtype


def test_a_plan_needs_a_workspace_and_a_plain_call_has_no_launch_arguments():
    with pytest.raises(ValueError, match="needs a workspace"):
        Reader("r", paged_decode_attention, plan=plan_rows)
    plain = as_reader(paged_decode_attention)
    assert not plain.planned and plain.arguments(_host(3)) == {}
    assert MASKED.planned
