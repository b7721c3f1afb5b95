"""Invariant: a reader's workspace is bounded. Each workspace tensor is handed to the reader as
the head of a longer allocation whose trailing canary holds a poison; a plan, a capture, a
replay or an eager call that writes past a tensor's end changes it, and the decode step fails
"reader stays inside its workspace", naming the tensor, the step and bucket, the call and how
far past the end it wrote.

Planted reader: a run-time split count larger than the capture's (FA3's AoT scheduler, vLLM
#20301) writing split partials past the split buffers' split axis. Twins that pass: the split
count clamped to the capture's, and the buffers sized for an upper bound passed at capture
and run time (the fix upstream). On a GPU the same run goes through real CUDA graphs.
"""

from __future__ import annotations

import pytest
import torch

from pagegraph.check.checker import check_decode_step
from pagegraph.check.config import CheckConfig
from pagegraph.check.judges.reader_judges import WORKSPACE
from pagegraph.check.reports.step_report import STEP_PROPERTIES
from pagegraph.consumers import paged_decode_attention
from pagegraph.consumers.reader import HostBatch, Reader
from pagegraph.graph.plan_workspace import CANARY_MIN_ENTRIES, PlanWorkspace, canary_entries
from pagegraph.wild.entries import vllm_20301 as fa3

#: Each test runs a decode step: long under the Triton interpreter (make test-heavy there).
pytestmark = pytest.mark.cpu_heavy


def tiny(**changes) -> CheckConfig:
    base = dict(
        max_bs=4,
        max_context_len=256,
        page_size=16,
        steps=3,
        seed=20301,
        consumer="paged",
        num_q_heads=4,
        num_kv_heads=2,
        head_dim=16,
        buckets=[2, 4],
        initial_len=(150, 250),
        timing_iters=0,
        finish_rate=0.0,
    )
    return CheckConfig(**{**base, **changes})


def _plan_capture_splits(host: HostBatch, workspace: dict[str, torch.Tensor]) -> None:
    """The heuristic's count clamped to what the split buffers were sized for."""
    held = workspace["out_accum"].shape[0]
    workspace["num_splits"].fill_(min(fa3.heuristic_splits(host), held))


OVERRUN = Reader(
    "run-time splits past the capture's",
    fa3.fa3_aot_run,
    plan=fa3.plan_uncapped,
    workspace=fa3.workspace_at_capture_splits,
)
CLAMPED = Reader(
    "run-time splits clamped to the capture's",
    fa3.fa3_aot_run,
    plan=_plan_capture_splits,
    workspace=fa3.workspace_at_capture_splits,
)
UPPER_BOUND = Reader(
    "splits sized for the upper bound",
    fa3.fa3_aot_run,
    plan=fa3.plan_capped,
    workspace=fa3.workspace_for_upper_bound,
)


def test_the_property_is_in_the_step_table():
    assert WORKSPACE in STEP_PROPERTIES


def _space(workspace) -> PlanWorkspace:
    reader = Reader("r", paged_decode_attention, plan=lambda host, ws: None, workspace=workspace)
    return PlanWorkspace(reader, 4, 8, 16, torch.device("cpu"))


def test_a_workspace_tensor_is_the_head_of_an_allocation_with_a_poisoned_canary():
    space = _space(lambda *a: {"acc": torch.arange(12.0).reshape(3, 4)})
    acc = space.tensors["acc"]
    assert acc.shape == (3, 4) and acc.flatten().tolist() == [float(i) for i in range(12)]
    assert acc.untyped_storage().nbytes() == (12 + canary_entries(12)) * 4
    assert canary_entries(12) == CANARY_MIN_ENTRIES
    assert space.check_canaries("nothing") == []


def test_a_write_past_the_end_is_named_with_how_far_and_the_canary_is_restored():
    space = _space(
        lambda *a: {"acc": torch.zeros(3, 4), "count": torch.zeros(1, dtype=torch.int32)}
    )
    acc = space.tensors["acc"]
    ptr = acc.as_strided((40,), (1,), acc.storage_offset())
    ptr[14:17] = 1.0  # entries 3 to 5 past the end
    (hit,) = space.check_canaries("replay")
    assert (hit.tensor, hit.first, hit.past, hit.during) == (
        "acc",
        3,
        5,
        "graph replay 1 of the step",
    )
    assert "'acc'" in hit.describe() and "5 entries (20 bytes)" in hit.describe()
    assert space.check_canaries("replay") == []  # the poison is back
    assert space.take_overruns() == [hit] and space.take_overruns() == []


def test_a_plan_writing_past_the_end_is_seen_after_the_plan():
    def plan(host, ws):
        t = ws["items"]
        t.as_strided((t.numel() + 2,), (1,), t.storage_offset())[-1] = 7

    reader = Reader(
        "r", paged_decode_attention, plan=plan, workspace=lambda *a: {"items": torch.zeros(8)}
    )
    space = PlanWorkspace(reader, 4, 8, 16, torch.device("cpu"))
    space.plan(HostBatch((1, 1), 2, 16, 8))
    (hit,) = space.take_overruns()
    assert (hit.tensor, hit.during, hit.past) == ("items", "the plan", 2)


def test_run_time_splits_past_the_capture_fail_naming_tensor_replay_and_reach():
    report = check_decode_step("build_page_table", tiny(), consumer=OVERRUN)
    prop = report.property(WORKSPACE)
    assert prop.status == "FAIL", report.format()
    text = prop.full_detail()
    assert "replay 0 (bucket" in text and "written past its end during graph replay 1" in text
    assert "'out_accum'" in text or "'m_accum'" in text
    assert "bytes) past its last entry" in text
    # the canary absorbed the writes: the output stays right, only this property fails
    assert report.property("output correct through the consumer").status == "pass"


@pytest.mark.parametrize("reader", [CLAMPED, UPPER_BOUND], ids=["clamped", "upper-bound"])
def test_splits_within_the_capture_pass(reader):
    report = check_decode_step("build_page_table", tiny(), consumer=reader)
    assert report.safe, report.format()
    assert "none changed" in report.property(WORKSPACE).detail


def test_a_reader_without_a_workspace_passes_trivially():
    report = check_decode_step("build_page_table", tiny(steps=1))
    assert report.property(WORKSPACE).status == "pass"
    assert "no workspace" in report.property(WORKSPACE).detail


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: real CUDA graphs")
def test_on_a_gpu_the_overrun_fails_through_real_graphs_and_the_fix_passes():
    cfg = tiny(max_context_len=512, steps=4)
    bad = check_decode_step("build_page_table", cfg, consumer=OVERRUN, device="cuda")
    assert bad.property(WORKSPACE).status == "FAIL", bad.format()
    good = check_decode_step("build_page_table", cfg, consumer=UPPER_BOUND, device="cuda")
    assert good.safe, good.format()
