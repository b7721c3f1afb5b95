"""Invariant: the check judges vLLM's two kinds under vLLM's own contract.

``block_table`` (built eagerly before the graph, padded rows cleared to the null block 0) and
``slot_mapping`` (in the graph, padded rows marked by index -1, the tail filled with
PAD_SLOT_ID) run through the same pipeline as every kind: pagegraph's builders, the plain
controls and vLLM 0.34.0's own kernels are SAFE on small versions of the shipped vLLM
scenarios; every mutant of the two kinds fails the property it is meant to; a runner whose
graph does not read the eagerly built tables fails "correct"; a kind's padding is enforced.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from pagegraph.check.checker import check_replay_safety
from pagegraph.check.scenario import load_scenario
from pagegraph.clients.vllm import vllm_unavailable_reason
from pagegraph.graph.runner import GraphRunner
from pagegraph.kinds import BLOCK_TABLE, SLOT_MAPPING, kind_of
from pagegraph.mutants.zoo import MUTANTS, reset_caches

ROOT = Path(__file__).resolve().parents[1]
VLLM_MISSING = vllm_unavailable_reason()
PASSING = (
    "capture",
    "replays completed",
    "staged inputs",
    "correct",
    "bounded writes",
    "static buffers unmoved",
    "no allocation in replay",
)


#: Replays of every check here: a mutant runs the very workload its control passes.
STEPS = 16


def small(name: str, **changes):
    """A shipped vLLM scenario shrunk for the Triton interpreter."""
    cfg = load_scenario(ROOT / "graphs" / f"{name}.toml").config
    base = dict(steps=STEPS, max_bs=8, max_context_len=512, initial_len=(1, 400))
    return cfg.replace(**{**base, **changes})


def statuses(report) -> dict[str, str]:
    return {p.name: p.status for p in report.properties}


def assert_passes(report, names=PASSING) -> None:
    got = statuses(report)
    assert all(got[n] == "pass" for n in names), report.format()
    assert report.verdict == "SAFE", report.format()


SCENARIOS = {
    BLOCK_TABLE: ("vllm-block-table", "vllm-block-table-long"),
    SLOT_MAPPING: ("vllm-slot-mapping", "vllm-slot-mapping-spec"),
}
#: Engine state past vLLM's host guarantees (``num_blocks_overrun``): outside vLLM's contract.
HOSTILE = "vllm-block-table-hostile"


@pytest.mark.parametrize(
    "builder,scenario",
    [
        (b, s)
        for b in ("gather_block_tables", "plain_block_table")
        for s in (*SCENARIOS[BLOCK_TABLE], HOSTILE)
    ]
    + [
        (b, s)
        for b in ("compute_slot_mappings", "plain_slot_mapping")
        for s in SCENARIOS[SLOT_MAPPING]
    ],
)
def test_pagegraphs_builders_and_controls_are_safe(builder, scenario):
    from pagegraph.mutants.zoo import CONTROLS

    report = check_replay_safety(CONTROLS[builder], small(scenario))
    assert_passes(report)


@pytest.mark.skipif(VLLM_MISSING is not None, reason=f"vLLM's kernel files: {VLLM_MISSING}")
@pytest.mark.parametrize(
    "client,scenario",
    [("vllm_gather_block_tables", s) for s in SCENARIOS[BLOCK_TABLE]]
    + [("vllm_compute_slot_mappings", s) for s in SCENARIOS[SLOT_MAPPING]],
)
def test_vllms_kernels_are_safe_under_their_own_contract(client, scenario):
    assert_passes(check_replay_safety(client, small(scenario)))


@pytest.mark.skipif(VLLM_MISSING is not None, reason=f"vLLM's kernel files: {VLLM_MISSING}")
def test_vllms_gather_writes_past_a_row_when_num_blocks_passes_the_width():
    # Outside vLLM's contract (its host never lets num_blocks pass a row's capacity): the
    # kernel trusts the count, and the rows it spills into show it.
    report = check_replay_safety("vllm_gather_block_tables", small(HOSTILE))
    prop = report.property("row containment")
    assert prop.status == "FAIL", report.format()
    assert "num_blocks past the width (engine state)" in str(prop.first_failure)
    assert statuses(report)["correct"] == "pass"  # in-contract replays stay exact


def test_block_table_padded_rows_are_checked_cleared():
    report = check_replay_safety("gather_block_tables", small("vllm-block-table"))
    assert report.replays == STEPS and any(b.replays for b in report.buckets.values())
    assert_passes(report)


# Each mutant of the two kinds, the small scenario that shows it, and the property it fails.
KILLS = {
    "pad_rows_not_cleared": ("vllm-block-table", "correct"),
    "pad_rows_cleared_to_stale_count": ("vllm-block-table", "correct"),
    "copies_whole_row": ("vllm-block-table", "bounded writes"),
    "num_reqs_frozen": ("vllm-block-table", "correct"),
    "num_blocks_by_batch_row": ("vllm-block-table", "correct"),
    "rows_to_max_bs": ("vllm-block-table", "bounded writes"),
    "num_blocks_unclamped": (HOSTILE, "row containment"),
    "no_tail": ("vllm-slot-mapping", "correct"),
    "tail_from_rows": ("vllm-slot-mapping-spec", "correct"),
    "pad_row_unguarded": ("vllm-slot-mapping", "correct"),
    "block_by_width": ("vllm-slot-mapping", "correct"),
}


#: The mutants whose bug is in the padded rows (``n <= row < bucket``): their first failure
#: must name an entry of one.
PADDED_ROW_BUGS = ("pad_rows_not_cleared", "pad_rows_cleared_to_stale_count", "pad_row_unguarded")


def counting_runner(sizes: list[int]):
    """A ``GraphRunner`` class that appends each replay's batch size ``n`` to ``sizes``
    (replay ``i`` is the runner's ``i``-th ``replay`` call)."""

    class CountingRunner(GraphRunner):
        def replay(self, req_pool_indices, seq_lens):
            sizes.append(len(seq_lens))
            return super().replay(req_pool_indices, seq_lens)

    return CountingRunner


@pytest.mark.parametrize("name", sorted(KILLS))
def test_each_mutant_fails_its_property(name):
    scenario, prop = KILLS[name]
    reset_caches()
    mutant = MUTANTS[name].builder
    assert kind_of(mutant) in SCENARIOS
    cfg = small(scenario)  # the config its controls pass
    sizes: list[int] = []
    report = check_replay_safety(mutant, cfg, runner_factory=counting_runner(sizes))
    assert statuses(report)[prop] == "FAIL", report.format()
    if name in PADDED_ROW_BUGS:
        failure = report.property(prop).first_failure
        n, bucket = sizes[failure.replay], failure.bucket
        if failure.vector:  # slot_mapping: row i owns tokens [i * q, (i + 1) * q)
            q = cfg.draft_tokens + 1
            row, text = failure.row // q, f"{failure.table}[{failure.row}]"
            assert failure.row < bucket * q, str(failure)
        else:
            row, text = failure.row, f"{failure.table}[{failure.row}, {failure.col}]"
        assert n <= row < bucket, f"row {row} of {n} real in bucket {bucket}: {failure}"
        assert str(failure).startswith(f"replay {failure.replay} (bucket {bucket}): {text} ")


def test_every_mutant_of_the_two_kinds_is_in_the_table():
    ours = {n for n, m in MUTANTS.items() if kind_of(m.builder) in SCENARIOS}
    assert ours == set(KILLS)
    assert set(PADDED_ROW_BUGS) <= ours
    # each mutant's scenario is one its controls pass (test_pagegraphs_builders_...)
    controlled = {*SCENARIOS[BLOCK_TABLE], *SCENARIOS[SLOT_MAPPING], HOSTILE}
    assert {scenario for scenario, _ in KILLS.values()} <= controlled


class UnreadRunner(GraphRunner):
    """A runner whose graph never reads the tables: what it holds is an earlier batch's."""

    def graph_reads(self, bs: int) -> None:
        pass


def test_a_graph_that_does_not_read_the_eager_tables_fails_correct():
    report = check_replay_safety(
        "gather_block_tables", small("vllm-block-table", steps=12), runner_factory=UnreadRunner
    )
    prop = report.property("correct")
    assert prop.status == "FAIL", report.format()
    assert "the graph read" in str(prop.first_failure)


def test_a_kinds_padding_and_engine_state_are_usage_errors():
    with pytest.raises(ValueError, match="defined for padding vllm-graph"):
        check_replay_safety("compute_slot_mappings", small("vllm-slot-mapping", padding="vllm"))
    r2t = torch.zeros((9, 64), dtype=torch.int32)
    with pytest.raises(ValueError, match="pass engine="):
        GraphRunner(r2t, max_bs=8, max_context_len=64, page_size=16, builder="gather_block_tables")


def test_a_broken_num_blocks_is_hostile_and_for_block_table_builders_only():
    from pagegraph.check.config import CheckConfig, ConfigError

    with pytest.raises(ConfigError, match="num_blocks_overrun.*hostile injection"):
        check_replay_safety(
            "gather_block_tables", small(HOSTILE, injection_level="engine", negative=0.0)
        )
    with pytest.raises(ValueError, match="only a block_table builder reads"):
        check_replay_safety("build_page_table", CheckConfig(steps=2, num_blocks_overrun=0.5))
    assert small(HOSTILE).hostile_injections() == ("negative", "num_blocks_overrun")
    assert small("vllm-block-table").hostile_injections() == ()


def test_the_model_holds_rows_of_broken_engine_state_out_of_contract():
    import numpy as np

    from pagegraph.check.judges.batch_model import BatchModel

    model = BatchModel(
        sizes=[4],
        max_bs=4,
        pad_seq_len=0,
        pad_req_pool_index=None,
        initial_req_pool_indices=np.zeros(4, np.int64),
        len_limit=64,
        r2t_rows=8,
        capture_pages=1,
        page_size=16,
    )
    clean = model.stage(0, [1, 2, 3], [10, 20, 30])
    assert not clean.out_of_contract and "engine state" not in model.describe_rows(clean)
    broken = model.stage(1, [1, 2, 3], [10, 20, 30], np.array([False, True, False]))
    assert broken.out_of_contract and broken.ooc_rows.tolist() == [False, True, False, False]
    assert "num_blocks past the width (engine state): row(s) 1 (req_pool_index 2)" in (
        model.describe_rows(broken)
    )
