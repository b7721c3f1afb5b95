"""Invariant: the consumer-floor benchmark counts the KV bytes a decode call must read, keeps
every timed graph out of the L2 cache, reports each case against a floor measured in the same
process, and refuses to run without CUDA (exit 2, one line) instead of writing empty figures.

On a CPU: the byte count, the rotation, the case plan, the report's text, the correctness
check of a case (Triton interpreter, tiny shapes) and the exit without CUDA. On a GPU: two
small cases measured end to end.
"""

from __future__ import annotations

import json

import pytest
import torch

from pagegraph.bench import consumer_floor as cf
from pagegraph.cli import main
from pagegraph.graph.buckets import Buckets

CUDA = torch.cuda.is_available()
SGLANG = Buckets("sglang", 256).sizes


def test_kv_bytes_counts_k_and_v_of_every_token():
    # 4096 + 100 tokens (a negative length reads nothing) x 8 heads x 128 x K,V x 2 bytes.
    assert cf.kv_bytes([4096, 100, -3], 8, 128, 2) == 4196 * 8 * 128 * 2 * 2
    assert cf.kv_bytes([], 8, 128, 2) == 0


def test_rotation_keeps_a_replay_past_the_l2():
    l2 = 50 * 10**6
    assert cf.rotation_sets(40 * 2**30, l2) == 1
    small = 16 * 2**20
    sets = cf.rotation_sets(small, l2)
    assert sets * small >= cf.L2_ROTATION * l2 and (sets - 1) * small < cf.L2_ROTATION * l2
    assert cf.rotation_sets(1, l2, calls=20) == 20  # never more copies than calls
    assert cf.rotation_sets(0, l2) == 1


def test_plan_takes_the_scenario_buckets_and_skips_what_does_not_fit():
    cases, notes = cf.plan_cases(64, SGLANG, 50 * 10**6, None)
    assert [(c.bs, c.context) for c in cases] == [(b, c) for b in cf.BATCHES for c in cf.CONTEXTS]
    assert notes == []
    big = next(c for c in cases if (c.bs, c.context) == (160, 65536))
    assert big.sets == 1 and big.width == 1024 and big.nbytes == 160 * 65536 * 4096
    cases, notes = cf.plan_cases(64, [1, 2, 4], 50 * 10**6, 8 * 2**30)
    assert {c.bs for c in cases} == {1}
    assert any("batch 16 skipped: not a bucket" in n for n in notes)
    cases, notes = cf.plan_cases(64, SGLANG, 50 * 10**6, 12 * 2**30, batches=(64,))
    assert [c.context for c in cases] == [4096, 16384]
    assert any("context 65536 skipped" in n and "GiB" in n for n in notes)


def fake_result() -> dict:
    row = {
        "bs": 16,
        "context": 4096,
        "sets": 4,
        "kv_bytes": 16 * 4096 * 4096,
        "checked": True,
        "error": None,
        "floor_us": 100.0,
        "paged_us": 125.0,
        "csr_us": None,
        "floor_bytes_per_s": 2.7e12,
        "paged_bytes_per_s": 2.16e12,
        "csr_bytes_per_s": None,
    }
    env = {
        "date": "2026-01-02T03:04:05+00:00",
        "device": "NVIDIA H200",
        "commit": "abc1234",
        "torch": "2.x",
        "triton": "3.x",
        "cuda": "12.x",
        "copy_bytes_per_s": 3.9e12,
    }
    shape = {
        "scenario": "sglang-h200",
        "page_size": 64,
        "num_q_heads": 32,
        "num_kv_heads": 8,
        "head_dim": 128,
        "dtype": "torch.bfloat16",
        "calls": 20,
        "replays": 30,
        "l2_bytes": 50 * 10**6,
        "l2_rotation": 4,
        "peak_bytes_per_s": 4.8e12,
    }
    return {"env": env, "shape": shape, "rows": [cf.derive(row)], "notes": ["a note"]}


def test_report_names_machine_commit_floor_and_peak():
    result = fake_result()
    row = result["rows"][0]
    assert row["paged_over_floor"] == pytest.approx(1.25) and row["csr_over_floor"] is None
    assert row["paged_of_peak"] == pytest.approx(0.45)
    text = cf.format_markdown(result)
    assert "NVIDIA H200" in text and "abc1234" in text and "2026-01-02" in text
    assert "4.8 TB/s" in text and "reference only" in text and "measured here" in text
    assert "| 16 | 4096 | 256 | 4 | 100.0 | 125.0 | - | 2700 | 2160 | - | 1.25 | - |" in text
    assert "- a note" in text


def test_check_of_a_case_passes_and_catches_a_wrong_format():
    """The two formats agree on the same pages and row 0 matches dense attention; CSR given
    a wrong last-page length no longer agrees."""
    case = cf.Case(bs=2, context=100, sets=2, page_size=64)
    pool = cf._Pool.make(case.pages + 1, 64, "cpu" if not CUDA else "cuda")
    t = cf._case_inputs(case, pool, torch.Generator().manual_seed(0))
    calls = cf._calls(case, pool, t)
    assert cf._check(case, pool, t, calls) is None
    t["metadata"]["csr"][0]["kv_last_page_len"].fill_(64)
    assert "differ" in cf._check(case, pool, t, calls)


@pytest.mark.skipif(CUDA, reason="the CPU path")
def test_without_cuda_it_exits_2_with_one_line(tmp_path, capsys):
    assert main(["bench", "--consumer-floor", "--out", str(tmp_path / "out")]) == 2
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and "needs CUDA" in err[0]
    assert not (tmp_path / "out").exists()


@pytest.mark.skipif(not CUDA, reason="needs a GPU")
def test_gpu_small_cases_end_to_end(tmp_path):
    result = cf.bench_consumer_floor(tmp_path, batches=(1, 16), contexts=(4096,))
    assert [r["bs"] for r in result["rows"]] == [1, 16]
    for r in result["rows"]:
        assert r["error"] is None and r["checked"], r
        assert r["floor_us"] > 0 and r["paged_us"] > 0 and r["csr_us"] > 0
    doc = json.loads((tmp_path / "consumer-floor.json").read_text())
    assert doc["env"]["device"] == torch.cuda.get_device_name()
    assert "| 16 | 4096 |" in (tmp_path / "consumer-floor.md").read_text()
