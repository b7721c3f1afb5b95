"""Invariant: every shipped scenario loads, and every broken one fails on load with a message
naming the file, the key and the problem (exit code 2 from the command line, nothing run)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pagegraph.cli import main
from pagegraph.scenario import ScenarioError, load_scenario

GRAPHS = sorted(Path(__file__).resolve().parent.parent.joinpath("graphs").glob("*.toml"))
REQUIRED = {
    "default",
    "sglang-h200",
    "sglang-spec",
    "vllm-512",
    "swa-hybrid",
    "long-context-1m",
    "big-pool",
}

GOOD = """
[graph]
max_bs = 8
max_context_len = 256
page_size = 16
"""


def test_all_required_scenarios_ship():
    assert REQUIRED <= {p.stem for p in GRAPHS}


@pytest.mark.parametrize("path", GRAPHS, ids=lambda p: p.stem)
def test_shipped_scenarios_load(path):
    s = load_scenario(path)
    assert s.name == path.stem and s.description
    assert s.config.max_bs >= 1 and s.builder


def test_big_pool_passes_2_31():
    c = load_scenario(next(p for p in GRAPHS if p.stem == "big-pool")).config
    assert c.max_reqs * c.max_context_len > 2**31 and c.row_order == "high-first"


def test_minimal_file_defaults(tmp_path):
    f = tmp_path / "mini.toml"
    f.write_text(GOOD)
    s = load_scenario(f)
    assert s.name == "mini" and s.builder == "build_page_table" and s.config.buckets == "sglang"


BROKEN = [
    ("unknown top-level key", "colour = 1\n" + GOOD, "colour", "unknown top-level key"),
    ("unknown table", GOOD + "[graphs]\nx = 1\n", "[graphs]", "unknown table"),
    (
        "unknown key",
        GOOD.replace("page_size = 16", "page_size = 16\npagesize = 3"),
        "graph.pagesize",
        "unknown key",
    ),
    ("wrong type", GOOD.replace("max_bs = 8", 'max_bs = "8"'), "graph.max_bs", "integer"),
    ("bool for int", GOOD.replace("max_bs = 8", "max_bs = true"), "graph.max_bs", "integer"),
    ("page size 0", GOOD.replace("page_size = 16", "page_size = 0"), "graph.page_size", "1..1024"),
    ("bucket above max_bs", GOOD + "buckets = [1, 2, 16]\n", "graph.buckets", "above max_bs"),
    ("bad preset", GOOD + 'buckets = "tgi"\n', "graph.buckets", "unknown preset"),
    ("bad padding", GOOD + 'padding = "zero"\n', "graph.padding", "unknown policy"),
    (
        "missing required",
        "[graph]\nmax_bs = 4\npage_size = 4\n",
        "graph.max_context_len",
        "missing",
    ),
    ("no graph table", 'name = "x"\n', "[graph]", "missing table"),
    ("rate above 1", GOOD + "[workload]\nfinish_rate = 1.5\n", "workload.finish_rate", "[0, 1]"),
    ("zero steps", GOOD + "[workload]\nsteps = 0\n", "workload.steps", ">= 1"),
    (
        "window without swa",
        GOOD + "[workload]\nswa_window = 64\n",
        "workload.swa_window",
        "graph.swa",
    ),
    (
        "bad initial_len",
        GOOD + "[workload]\ninitial_len = [9, 3]\n",
        "workload.initial_len",
        "lo <= hi",
    ),
    ("draft tokens", GOOD + "[workload]\ndraft_tokens = 99\n", "workload.draft_tokens", "0..64"),
    ("max_reqs below max_bs", GOOD + "[pool]\nmax_reqs = 2\n", "pool.max_reqs", ">= graph.max_bs"),
    (
        "bad detector",
        GOOD + '[check]\ndetectors = ["nsys"]\n',
        "check.detectors",
        "unknown detector",
    ),
    ("not toml", "[graph\nmax_bs=", None, "not valid TOML"),
]


@pytest.mark.parametrize("text,key,problem", [b[1:] for b in BROKEN], ids=[b[0] for b in BROKEN])
def test_broken_files_fail_clearly(tmp_path, capsys, text, key, problem):
    f = tmp_path / "broken.toml"
    f.write_text(text)
    with pytest.raises(ScenarioError) as info:
        load_scenario(f)
    msg = str(info.value)
    assert str(f) in msg and problem in msg
    if key:
        assert key in msg
    # The command line exits 2 and runs nothing, even with a good scenario listed first.
    good = tmp_path / "good.toml"
    good.write_text(GOOD)
    assert main(["check", str(good), str(f)]) == 2
    out = capsys.readouterr()
    assert problem in out.err and "## good" not in out.out


def test_missing_file(tmp_path):
    with pytest.raises(ScenarioError, match="no such file"):
        load_scenario(tmp_path / "nope.toml")
