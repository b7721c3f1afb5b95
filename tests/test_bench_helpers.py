"""Invariant: the benchmark measures what it says. Rotated tables hold the same requests on
other pages (the kernel's answers on them are exact), the rotation count divides the graph's
builds, and the floor counts one sector and one write per live page. The block-grid baseline
is exact; the decode-metadata, replay-overhead and checker sections compare what they claim
to compare, derive their ratios and targets right, and run end to end (a smoke run without a
GPU)."""

from __future__ import annotations

import json

import pytest
import torch

from pagegraph import bench
from pagegraph.bench import (
    bench_report,
    checker_rate,
    decode_bench,
    floors,
    inputs,
    replay_overhead,
)
from pagegraph.check.scenario import load_scenario
from pagegraph.kernels.baselines import block_grid
from pagegraph.kernels.contract import POISON
from pagegraph.kernels.page_table import build_page_table
from pagegraph.kernels.table_reference import expected_tables
from pagegraph.runtime import timing


def test_rotation_count_divides_builds_and_covers_l2():
    for nbytes in (1, 10_000, 9_000_000, 40_000_000, 10**9):
        k = inputs.rotation_count(nbytes, table_bytes=1 << 20, l2_bytes=60 << 20, builds=20)
        assert 20 % k == 0
        assert k == 20 or k * nbytes >= 4 * (60 << 20)


def test_rotated_tables_are_page_permutations():
    cfg = bench.smoke_config(bench.get_config("decode-large"))
    # The kernel takes CPU tensors only under the interpreter: on a GPU machine, the GPU.
    inp = bench.make_inputs(cfg, "cuda" if torch.cuda.is_available() else "cpu")
    inputs.rotate_out_of_l2(inp, 60 << 20, 20)
    assert len(inp.rotated) == 19
    ps = cfg.page_size
    base_pages = inp.req_to_token // ps
    for table in inp.rotated:
        assert torch.equal(table % ps, inp.req_to_token % ps), "offsets inside a page kept"
        pages = table // ps
        # One page id maps to one page id: the same request structure on other pages.
        pairs = set(zip(base_pages.flatten().tolist(), pages.flatten().tolist()))
        assert len({a for a, _ in pairs}) == len(pairs) == len({b for _, b in pairs})
        assert (0, 0) in pairs or 0 not in base_pages, "page 0 (padding) stays page 0"
        want, _ = expected_tables(table, inp.req_pool_indices, inp.seq_lens, cfg.width, ps)
        got = torch.full_like(want, POISON)
        build_page_table(table, inp.req_pool_indices, inp.seq_lens, got, ps)
        assert torch.equal(got, want)


def test_floor_bytes():
    assert floors.floor_bytes(10, page_size=64) == 10 * (32 + 4)
    assert floors.floor_bytes(10, page_size=1) == 10 * (4 + 4)
    assert floors.floor_bytes(10, page_size=16, swa=True) == 10 * (32 + 4 + 32 + 4)


def test_block_grid_baseline_is_exact_and_registered():
    from pagegraph.graph.builder_names import resolve_builder
    from pagegraph.kinds import PAGE_TABLE

    assert resolve_builder("block_grid") is PAGE_TABLE.builders["block_grid"] is block_grid
    for name in ("skewed", "swa"):
        cfg = bench.smoke_config(bench.get_config(name))
        inp = bench.make_inputs(cfg, "cuda" if torch.cuda.is_available() else "cpu")
        page_table, swa_page_table, kwargs = bench.make_outputs(inp)
        block_grid(
            inp.req_to_token,
            inp.req_pool_indices,
            inp.seq_lens,
            page_table,
            cfg.page_size,
            **kwargs,
        )
        assert bench.Check(inp).compare(page_table, swa_page_table) is None


def test_first_difference_names_the_first_differing_entry():
    want = {"a": torch.arange(6).view(2, 3), "b": torch.zeros(4, dtype=torch.int32)}
    got = {k: v.clone() for k, v in want.items()}
    assert decode_bench.first_difference(got, want) is None
    got["a"][1, 2] = 99
    got["a"][1, 0] = 98
    want_text = "a: 2 entries differ; first [1, 0] got 98 want 3"
    assert decode_bench.first_difference(got, want) == want_text
    assert decode_bench.first_difference(got, want, ["b"]) is None
    got["b"] = torch.zeros(5, dtype=torch.int32)
    assert decode_bench.first_difference(got, want, ["b"]) == "b: shape (5,), want (4,)"


def _decode_rows(config: str, times: dict) -> list[dict]:
    """Metadata rows of one config: ``times[variant] = (device_us, warm_us, eager_us)``."""
    cfg = bench.get_config(config)
    rows = []
    for name, _, draft, _ in decode_bench.DECODE_VARIANTS:
        row = decode_bench.decode_row(cfg, name, draft)
        row["device_us"], row["device_warm_us"], row["eager_us"] = times.get(name, (None,) * 3)
        row["exact"] = True
        rows.append(row)
    return rows


def test_decode_summary_and_targets():
    rows = _decode_rows(
        "decode-mid",
        {
            "build_page_table": (2.0, 1.5, 10.0),
            "build_decode_metadata": (2.5, 2.0, 11.0),
            "build_decode_metadata+draft4": (2.75, 2.25, 11.0),
            "PreparedDecodeMetadata": (None, None, 8.0),
            "unfused_decode_metadata": (6.0, 5.0, 44.0),
        },
    )
    rows += _decode_rows(
        "skewed",
        {
            "build_page_table": (2.0, 2.0, 10.0),
            "build_decode_metadata": (3.5, 2.5, 13.0),
            "unfused_decode_metadata": (None, None, 26.0),
        },
    )
    mid, skewed = decode_bench.decode_summary(rows)
    assert (mid["diff_us"], mid["diff_warm_us"]) == (0.5, 0.5)
    assert (mid["diff_draft_us"], mid["diff_draft_warm_us"]) == (0.75, 0.75)
    assert mid["fused_over_bpt"] == 1.1 and mid["prepared_over_bpt"] == 0.8
    assert mid["unfused_over_fused"] == 4.0 and mid["unfused_over_fused_device"] == 2.4
    assert skewed["diff_draft_us"] is None and skewed["unfused_over_fused_device"] is None
    assert mid["exact"] and skewed["exact"]

    rotated = {t["target"].split(" (")[0]: t for t in bench_report.decode_targets(rows)}
    diff = rotated["build_decode_metadata device time within 1 us of build_page_table"]
    assert (diff["measured"], diff["met"]) == (1.5, False) and "worst: skewed" in diff["target"]
    warm = bench_report.decode_targets(rows, "device_warm_us")[0]
    assert (warm["measured"], warm["met"]) == (0.75, True)
    fused = rotated["build_decode_metadata eager wall time <= 1.2x build_page_table's"]
    assert (fused["measured"], fused["met"]) == (1.3, False)
    unfused = rotated["unfused chain eager wall time >= 3x build_decode_metadata's"]
    assert (unfused["measured"], unfused["met"]) == (2.0, False)

    rows[1]["exact"] = False  # an inexact output: no target on it is met
    assert not decode_bench.decode_summary(rows)[0]["exact"]
    warm = bench_report.decode_targets(rows, "device_warm_us")[0]
    assert warm["met"] is False and "inexact output: decode-mid" in warm["target"]


def test_replay_target_and_failures():
    row = replay_overhead.overhead_row("decode-mid", 64)
    assert bench_report.replay_target(row)["met"] is None
    row.update(runner_replay_us=30.0, bare_replay_us=12.0, ratio=2.5, exact=True)
    assert bench_report.replay_target(row)["met"] is False
    row["ratio"] = 1.5
    assert bench_report.replay_target(row)["met"] is True
    row["exact"] = False
    assert bench_report.replay_target(row)["met"] is False

    checker = [
        dict(checker_rate.checker_row("s", "graphs/s.toml", "none", 8), verdict="SAFE"),
        dict(checker_rate.checker_row("s", "graphs/s.toml", "cupti", 8), skipped="no CUPTI"),
    ]
    result = {"rows": [], "decode_metadata": [], "replay_overhead": None, "checker": checker}
    assert bench.failures(result) == []
    checker[0]["verdict"] = "UNSAFE"
    result["replay_overhead"] = row
    assert bench.failures(result) == [
        "replay overhead: inexact",
        "checker (none, workload process off): UNSAFE",
    ]


def test_interleaved_wall_times_alternate_rounds():
    order = []
    times = replay_overhead.interleaved_wall_us(
        {"a": lambda: order.append("a"), "b": lambda: order.append("b")},
        5,
        round_calls=2,
        warmup=1,
        cuda=False,
    )
    assert set(times) == {"a", "b"} and all(t >= 0 for t in times.values())
    # warm-up of each, then rounds of 2, 2 and 1 calls, the two alternating
    assert "".join(order) == "ab" + "aabb" + "aabb" + "ab"


def test_interleaved_rounds_give_paired_ratios():
    """Each round's median per function; the paired ratio is the median of the per-round
    ratios, so a host that slows down for some rounds does not move it."""
    per_round: dict = {}
    times = replay_overhead.interleaved_wall_us(
        {"a": lambda: None, "b": lambda: None},
        6,
        round_calls=2,
        warmup=0,
        cuda=False,
        per_round=per_round,
    )
    assert set(per_round) == {"a", "b"} and [len(v) for v in per_round.values()] == [3, 3]
    assert all(t >= 0 for t in times.values())
    # a = 1.1 b in every round while the host's speed changes fourfold between rounds
    b = [10.0, 40.0, 12.0, 39.0, 11.0]
    a = [1.1 * x for x in b]
    assert timing.paired_ratio(a, b) == pytest.approx(1.1)
    assert a[0] / b[1] < 1.0 < a[1] / b[0]  # pairs across rounds could say anything
    assert timing.paired_ratio(a, b[:-1]) is None
    assert timing.paired_ratio(None, b) is None
    assert timing.paired_ratio(a, [0.0] * 5) is None


class ReplayedGraph:
    """A captured graph's stand-in: ``replay()`` runs ``fn`` (one call of the graph's body)."""

    def __init__(self, fn):
        self.fn, self.replays = fn, 0

    def replay(self):
        self.replays += 1
        self.fn()


def test_device_time_is_the_median_event_timed_replay_over_the_calls(monkeypatch):
    """``device_time_us``: a graph of ``builds`` calls, its warm-up replays untimed, then the
    median of ``replays`` replays between two marks of the event clock, over ``builds``."""
    now = [0.0]
    cost = iter([1000.0] * timing.WARMUP_REPLAYS + [2.0, 9.0, 3.0])  # ms; the warm-up slow

    class Clock:
        begun: list[int] = []

        def begin(self, replays):
            self.begun.append(replays)

        def mark(self):
            return now[0]

        def end(self):
            pass

        @staticmethod
        def elapsed_ms(a, b):
            return b - a

    graph = ReplayedGraph(lambda: now.__setitem__(0, now[0] + next(cost)))
    monkeypatch.setattr(timing, "capture", lambda fn, builds, reset=None: graph)
    monkeypatch.setattr(timing, "EventClock", Clock)
    us, got = timing.device_time_us(lambda: None, builds=20, replays=3)
    assert got is graph and graph.replays == timing.WARMUP_REPLAYS + 3
    assert us == pytest.approx(3.0 * 1e3 / 20) and Clock.begun == [3]


def test_the_timed_graph_is_checked_on_poisoned_outputs(monkeypatch):
    """``rows.time_exact_graph`` (the builders' and the decode metadata's rows): the L2-warm
    and the rotated device times, the input sets, and ``graph_exact`` from one more replay of
    the rotated graph on poisoned outputs. A planted graph that leaves its outputs unwritten
    is flagged; one that raises is the row's error."""
    from pagegraph.bench import rows
    from pagegraph.bench.bench_settings import Settings

    out, want = torch.zeros(4, dtype=torch.int32), torch.arange(4, dtype=torch.int32)

    def fake_device_time_us(fn, builds, replays, reset=None):
        return (1.0 if reset is None else 2.0), ReplayedGraph(fn)

    monkeypatch.setattr(rows, "device_time_us", fake_device_time_us)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *args: None)
    s = Settings(True, 20, 5, 3, 3, None, 0)

    def timed(write):
        row: dict = {}
        rotation = inputs.Rotation(write, [want, want], (), {})
        failed = rows.time_exact_graph(
            lambda: write(want),
            rotation,
            s,
            lambda: out.fill_(POISON),
            lambda: None if torch.equal(out, want) else "out differs",
            row,
        )
        return failed, row

    failed, row = timed(lambda table: out.copy_(table))
    assert failed is None
    assert row == {"device_warm_us": 1.0, "device_us": 2.0, "input_sets": 2, "graph_exact": True}
    failed, row = timed(lambda table: None)
    assert failed == "graph: out differs" and row["graph_exact"] is False

    def broken(fn, builds, replays, reset=None):
        raise RuntimeError("capture failed")

    monkeypatch.setattr(rows, "device_time_us", broken)
    failed, row = timed(lambda table: out.copy_(table))
    assert failed.startswith("device time: RuntimeError: capture failed") and row == {}


def test_decode_summary_prefers_paired_rounds():
    rows = _decode_rows(
        "decode-mid",
        {
            "build_page_table": (2.0, 1.5, 10.0),
            "build_decode_metadata": (2.5, 2.0, 14.0),
            "unfused_decode_metadata": (6.0, 5.0, 44.0),
        },
    )
    by = {r["variant"]: r for r in rows}
    by["build_page_table"]["eager_round_us"] = [10.0, 20.0, 30.0]
    by["build_decode_metadata"]["eager_round_us"] = [11.0, 22.0, 36.0]
    (mid,) = decode_bench.decode_summary(rows)
    assert mid["fused_over_bpt"] == pytest.approx(1.1)  # not 14 / 10
    # without rounds on both sides: the ratio of the medians
    assert mid["unfused_over_fused"] == pytest.approx(44.0 / 14.0)


def test_checker_helpers(tmp_path, monkeypatch):
    assert checker_rate.finite_or_none(float("nan")) is None
    assert checker_rate.finite_or_none(12.5) == 12.5
    # The scenarios are found from the repository root whatever the working directory.
    monkeypatch.chdir(tmp_path)
    found = checker_rate.find_scenario(checker_rate.CHECKER_SCENARIO)
    assert found.is_file() and found.name == "sglang-h200.toml"
    with pytest.raises(FileNotFoundError):
        checker_rate.find_scenario("graphs/no-such-scenario.toml")
    cfg = load_scenario(found).config.replace(
        steps=checker_rate.CHECKER_REPLAYS, detectors=checker_rate.CHECKER_RUNS[1][1]
    )
    assert cfg.steps == 5000 and cfg.detectors == ("cupti",)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU smoke path (a GPU runs 5000)")
def test_checker_section_smoke():
    rows = checker_rate.bench_checker(cuda=False)
    assert [r["detectors"] for r in rows] == ["none", "cupti"]
    none, cupti = rows
    assert none["error"] is None and none["verdict"] == "SAFE", none
    assert none["replays"] == checker_rate.SMOKE_CHECKER_REPLAYS and none["wall_s"] > 0
    assert cupti["skipped"] or cupti["verdict"] == "SAFE"


def test_sections_run_and_report(tmp_path):
    """The replay-overhead and decode-metadata sections end to end: exact everywhere, their
    keys in bench.json and their tables in bench.md (smoke shapes without a GPU)."""
    result = bench.run_bench(
        tmp_path, configs=["decode-small", "swa"], quick=True, only=["replay", "metadata"]
    )
    assert result["sections"] == ["replay", "metadata"]
    assert result["rows"] == [] and result["checker"] == [] and result["sweeps"] == {}
    assert bench.failures(result) == []
    variants = [name for name, _, _, _ in decode_bench.DECODE_VARIANTS]
    assert [r["variant"] for r in result["decode_metadata"]] == variants * 2
    assert all(r["exact"] for r in result["decode_metadata"])
    # Every variant's eager time, taken in the shared alternating rounds.
    assert all(r["eager_us"] > 0 for r in result["decode_metadata"])
    assert [s["config"] for s in result["decode_metadata_summary"]] == ["decode-small", "swa"]
    assert result["replay_overhead"]["exact"] is True
    saved = json.loads((tmp_path / "bench.json").read_text())
    for key in ("decode_metadata", "decode_metadata_summary", "replay_overhead", "checker"):
        assert key in saved
    md = (tmp_path / "bench.md").read_text()
    assert "## Decode metadata" in md and "## Runner replay vs bare graph replay" in md
    if torch.cuda.is_available():
        assert result["replay_overhead"]["ratio"] is not None
        assert all(
            r["device_us"] is not None
            for r in result["decode_metadata"]
            if r["variant"] != "PreparedDecodeMetadata"
        )
