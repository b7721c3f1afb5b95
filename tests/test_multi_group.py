"""Invariant: vLLM's KV-cache groups (``[layout] kv_groups``) are checked group by group, each
with its own block size and width, and a ring group's positions past its width are in the
contract, mapped onto the ring's blocks in turn.

The ring's oracle and pagegraph's ring mapping agree on positions past the width; the shipped
group scenarios load and are SAFE with pagegraph's builders; planted wrong groups fail
"correct" (the generic mapping on the ring, masking the ring to PAD, another group's block
size or the wrong ring width), naming the group; a slot-mapping builder that cannot tell
groups apart is refused on a scenario with a ring.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from pagegraph.check.checker import check_replay_safety
from pagegraph.check.config import ConfigError, validate_config
from pagegraph.check.scenario import ScenarioError, load_scenario
from pagegraph.kernels.group_slot_mappings import compute_group_slot_mappings, ring_slot_mappings
from pagegraph.kernels.slot_mapping import PAD_SLOT_ID
from pagegraph.kernels.vllm_reference import (
    reference_group_slot_mapping,
    reference_ring_slot_mapping,
    reference_slot_mapping,
)
from pagegraph.kinds.kv_group_layout import KVGroup, parse_groups

ROOT = Path(__file__).resolve().parents[1]
SLOTS = ROOT / "graphs" / "vllm-slot-mapping-groups.toml"
BLOCKS = ROOT / "graphs" / "vllm-block-table-groups.toml"
RING = KVGroup(2, "ring", "ring", 8, 2)


def small(path: Path, **changes):
    return load_scenario(path).config.replace(**{"steps": 8, **changes})


# -- the ring's oracle -----------------------------------------------------------------------


def test_ring_oracle_maps_positions_past_the_width_onto_the_ring():
    """Row 0 (slot 1, ring blocks 10 and 11, 8 tokens each) at positions 3, 8, 16, 29 and
    1000: columns 0, 1, 0, 1, 1; a padded row (-1) and the tail get PAD_SLOT_ID."""
    table = torch.tensor([[5, 6], [10, 11], [20, 21]], dtype=torch.int32)
    idx = torch.tensor([1, -1], dtype=torch.int32)
    qsl = torch.tensor([0, 5, 6], dtype=torch.int32)
    pos = torch.tensor([3, 8, 16, 29, 1000, 0], dtype=torch.int64)
    want = [10 * 8 + 3, 11 * 8 + 0, 10 * 8 + 0, 11 * 8 + 5, 11 * 8 + 0, -1, -1, -1]
    for fn in (reference_ring_slot_mapping, ring_slot_mappings):
        out = torch.full((8,), -7, dtype=torch.int64)
        fn(table, idx, qsl, pos, out, 8)
        assert out.tolist() == want, fn.__name__
    out = torch.full((8,), -7, dtype=torch.int64)
    reference_group_slot_mapping(table, idx, qsl, pos, out, 8, group=RING)
    assert out.tolist() == want


@pytest.mark.parametrize("seed", range(4))
def test_ring_mapping_matches_its_oracle(seed):
    gen = torch.Generator().manual_seed(seed)
    width, ps, rows = 1 + seed % 3, 4, 6
    table = torch.randint(1, 1 << 20, (9, width), generator=gen, dtype=torch.int32)
    idx = torch.randint(-1, 9, (rows,), generator=gen, dtype=torch.int32)
    qsl = torch.cumsum(torch.randint(0, 4, (rows + 1,), generator=gen), 0).to(torch.int32)
    qsl[0] = 0
    pos = torch.randint(-2, 400, (int(qsl[-1]) + 3,), generator=gen)
    got = torch.full((int(qsl[-1]) + 5,), -7, dtype=torch.int64)
    want = got.clone()
    ring_slot_mappings(table, idx, qsl, pos, got, ps)
    reference_ring_slot_mapping(table, idx, qsl, pos, want, ps)
    assert torch.equal(got, want)


def test_group_oracle_without_a_ring_is_the_single_group_oracle():
    table = torch.arange(1, 25, dtype=torch.int32).view(3, 8)
    idx = torch.tensor([2, 0], dtype=torch.int32)
    qsl = torch.tensor([0, 2, 3], dtype=torch.int32)
    pos = torch.tensor([5, 30, 63], dtype=torch.int64)
    a = torch.full((5,), -7, dtype=torch.int64)
    b = a.clone()
    reference_slot_mapping(table, idx, qsl, pos, a, 8)
    reference_group_slot_mapping(table, idx, qsl, pos, b, 8, group=None)
    assert torch.equal(a, b)


# -- scenarios -------------------------------------------------------------------------------


def test_group_scenarios_load():
    groups = parse_groups(load_scenario(SLOTS).config)
    assert [(g.name, g.kind, g.block_size, g.width) for g in groups] == [
        ("full", "full", 16, 64),
        ("swa", "sliding", 32, 32),
        ("ring", "ring", 8, 2),
    ]
    assert [g.width for g in parse_groups(load_scenario(BLOCKS).config)] == [64, 32, 4]


@pytest.mark.parametrize(
    "groups, problem",
    [
        (({"name": "r", "kind": "ring", "block_size": 4},), "needs its width"),
        (({"kind": "cross"},), "kind must be one of"),
        (({"name": "a"}, {"name": "a"}), "names must differ"),
        (({"block": 4},), "unknown keys"),
    ],
)
def test_bad_groups_are_refused(groups, problem):
    cfg = load_scenario(SLOTS).config.replace(kv_groups=groups)
    with pytest.raises(ConfigError, match=problem):
        validate_config(cfg)


def test_groups_with_a_table_width_are_refused(tmp_path):
    text = SLOTS.read_text().replace(
        'index_dtype = "int32"', 'index_dtype = "int32"\ntable_width = 8'
    )
    path = tmp_path / "both.toml"
    path.write_text(text)
    with pytest.raises(ScenarioError, match="layout.kv_groups"):
        load_scenario(path)


# -- checks over the groups ------------------------------------------------------------------


def test_pagegraph_builders_are_safe_on_every_group():
    report = check_replay_safety("compute_group_slot_mappings", small(SLOTS))
    assert report.safe, report.format()
    assert report.replays == 3 * 8  # each group replays the workload
    report = check_replay_safety("gather_block_tables", small(BLOCKS))
    assert report.safe, report.format()


def _generic(mapper):
    """A slot-mapping builder that takes group= and maps every group with ``mapper``."""

    def build(
        block_table, idx_mapping, query_start_loc, positions, slot_mapping, page_size, *, group=None
    ):
        mapper(block_table, idx_mapping, query_start_loc, positions, slot_mapping, page_size, group)

    build.pagegraph_outputs = "slot_mapping"
    return build


def _clamped(bt, idx, qsl, pos, out, ps, group):
    """pagegraph's generic mapping on the ring too (positions clamped into the row)."""
    compute_group_slot_mappings(bt, idx, qsl, pos, out, ps)


def _masked_to_pad(bt, idx, qsl, pos, out, ps, group):
    """#54296's guard alone: the ring's positions past its width get PAD_SLOT_ID."""
    compute_group_slot_mappings(bt, idx, qsl, pos, out, ps)
    if group is not None and group.ring:
        past = torch.zeros_like(out, dtype=torch.bool)
        n = min(out.shape[0], pos.shape[0])
        past[:n] = pos[:n] >= bt.shape[1] * ps
        out.masked_fill_(past & (out >= 0), PAD_SLOT_ID)


def _ring_of_one(bt, idx, qsl, pos, out, ps, group):
    """The ring mapped modulo another width: one block (the kpool tail's) instead of two."""
    ring = bt[:, :1] if group is not None and group.ring else bt
    (ring_slot_mappings if group is not None and group.ring else compute_group_slot_mappings)(
        ring, idx, qsl, pos, out, ps
    )


_first_block_size: dict[str, int] = {}


def _first_groups_block_size(bt, idx, qsl, pos, out, ps, group):
    """Every group mapped with the block size of the first group the builder saw."""
    size = _first_block_size.setdefault("size", ps)
    compute_group_slot_mappings(bt, idx, qsl, pos, out, size, group=group)


@pytest.mark.parametrize(
    "mapper, group",
    [
        (_clamped, "ring"),
        (_masked_to_pad, "ring"),
        (_ring_of_one, "ring"),
        (_first_groups_block_size, "swa"),
    ],
)
def test_a_wrong_group_fails_correct(mapper, group):
    _first_block_size.clear()
    report = check_replay_safety(_generic(mapper), small(SLOTS))
    correct = report.property("correct")
    assert correct.status == "FAIL", report.format()
    assert f"group '{group}'" in correct.detail
    assert report.property("sync-free builder call").status == "pass"


def test_a_builder_without_group_is_refused_where_a_ring_is():
    def build(block_table, idx_mapping, query_start_loc, positions, slot_mapping, page_size):
        compute_group_slot_mappings(
            block_table, idx_mapping, query_start_loc, positions, slot_mapping, page_size
        )

    build.pagegraph_outputs = "slot_mapping"
    with pytest.raises(ValueError, match="takes no group="):
        check_replay_safety(build, small(SLOTS))
    # Where no group is a ring, a generic builder is checked on every group.
    cfg = small(SLOTS, kv_groups=({"name": "a"}, {"name": "b", "block_size": 32}))
    assert check_replay_safety(build, cfg).safe
