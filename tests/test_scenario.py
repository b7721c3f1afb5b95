"""Invariant: every shipped scenario loads, and every broken one fails on load with a message
naming the file, the key and the problem (exit code 2 from the command line, nothing run)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pagegraph.check.scenario import ScenarioError, load_scenario
from pagegraph.cli import main

GRAPHS = sorted(Path(__file__).resolve().parent.parent.joinpath("graphs").glob("*.toml"))
REQUIRED = {
    "default",
    "sglang-h200",
    "sglang-spec",
    "vllm-512",
    "swa-hybrid",
    "long-context-1m",
    "big-pool",
    "dummy-overlong",
    "spec-metadata",
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
    ("no request rows", GOOD + "[pool]\nmax_reqs = 0\n", "pool.max_reqs", ">= 1"),
    (
        "bad detector",
        GOOD + '[check]\ndetectors = ["nsys"]\n',
        "check.detectors",
        "unknown detector",
    ),
    ("not toml", "[graph\nmax_bs=", None, "not valid TOML"),
    ("bad layout key", GOOD + "[layout]\npad = 3\n", "layout.pad", "unknown key"),
    (
        "bad r2t dtype",
        GOOD + '[layout]\nreq_to_token_dtype = "int16"\n',
        "layout.req_to_token_dtype",
        "'int32' or 'int64'",
    ),
    (
        "f2s dtype without swa",
        GOOD + '[layout]\nfull_to_swa_dtype = "int32"\n',
        "layout.full_to_swa_dtype",
        "graph.swa",
    ),
    ("zero width", GOOD + "[layout]\ntable_width = 0\n", "layout.table_width", ">= 1"),
    (
        "negative pad",
        GOOD + "[layout]\ntable_pad_cols = -1\n",
        "layout.table_pad_cols",
        ">= 0",
    ),
    (
        "index dtype twice",
        GOOD.replace("page_size = 16", 'page_size = 16\nindex_dtype = "int64"')
        + '[layout]\nindex_dtype = "int64"\n',
        "layout.index_dtype",
        "keep one",
    ),
    ("overlong rate", GOOD + "[workload]\noverlong = 2\n", "workload.overlong", "[0, 1]"),
    ("bad staging", GOOD + '[check]\nstaging = "pci"\n', "check.staging", "'mixed'"),
    ("zero chunk", GOOD + "[check]\nchunk = 0\n", "check.chunk", ">= 1"),
    (
        "bad detector string",
        GOOD + '[check]\ndetectors = "torch,gdb"\n',
        "check.detectors",
        "unknown detector",
    ),
    ("bad outputs", GOOD + '[check]\noutputs = "kv"\n', "check.outputs", "outputs"),
    (
        "bad workload_process",
        GOOD + '[check]\nworkload_process = "yes"\n',
        "check.workload_process",
        "'auto', 'on' or 'off'",
    ),
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


SHIPPED = {p.stem: load_scenario(p).config for p in GRAPHS}


@pytest.mark.parametrize(
    "option,shipped_by",
    [
        ("table_pad_cols", lambda c: c.table_pad_cols > 0),
        ("table_width", lambda c: c.table_width is not None),
        ("req_to_token_extra_cols", lambda c: c.r2t_extra_cols > 0),
        ("req_to_token_offset", lambda c: c.r2t_offset > 0),
        ("req_to_token_dtype int64", lambda c: c.r2t_dtype == "int64"),
        ("req_to_token_dtype int32", lambda c: c.r2t_dtype == "int32"),
        ("full_to_swa_dtype int32", lambda c: c.swa and c.full_to_swa_dtype == "int32"),
        ("full_to_swa_dtype int64", lambda c: c.swa and c.full_to_swa_dtype == "int64"),
        ("index_dtype int64", lambda c: c.index_dtype == "int64"),
        ("overlong", lambda c: c.overlong > 0),
        ("negative", lambda c: c.negative > 0),
        ("zero_len", lambda c: c.zero_len > 0),
        ("bad_index", lambda c: c.bad_index > 0),
        ("padding overlong", lambda c: c.padding == "overlong"),
        ("errors", lambda c: c.errors),
    ],
)
def test_every_layout_and_injection_option_is_shipped(option, shipped_by):
    assert any(shipped_by(c) for c in SHIPPED.values()), f"no shipped scenario uses {option}"


def test_containment_is_covered_on_the_cpu_and_on_a_gpu_scenario():
    ooc = lambda c: c.overlong or c.negative or c.bad_index  # noqa: E731
    assert ooc(SHIPPED["default"])
    assert any(ooc(c) for name, c in SHIPPED.items() if name != "default")


def test_new_keys_load(tmp_path):
    f = tmp_path / "full.toml"
    f.write_text(
        GOOD.replace("page_size = 16", 'page_size = 16\nswa = true\npadding = "overlong"')
        + "[layout]\ntable_width = 9\ntable_pad_cols = 4\nreq_to_token_extra_cols = 3\n"
        'req_to_token_offset = 5\nreq_to_token_dtype = "int64"\nfull_to_swa_dtype = "int32"\n'
        'index_dtype = "int64"\n[workload]\noverlong = 0.1\nnegative = 0.1\nzero_len = 0.2\n'
        'bad_index = 0.05\n[check]\ndetectors = "torch,cupti"\nstaging = "host"\nchunk = 9\n'
        'outputs = "page_table"\n'
    )
    c = load_scenario(f).config
    assert (c.table_width, c.table_pad_cols, c.r2t_extra_cols, c.r2t_offset) == (9, 4, 3, 5)
    assert (c.r2t_dtype, c.full_to_swa_dtype, c.index_dtype) == ("int64", "int32", "int64")
    assert (c.overlong, c.negative, c.zero_len, c.bad_index) == (0.1, 0.1, 0.2, 0.05)
    assert c.detectors == ("torch", "cupti") and c.staging == "host" and c.chunk == 9
    assert c.padding == "overlong" and c.outputs == "page_table"


def test_missing_file(tmp_path):
    with pytest.raises(ScenarioError, match="no such file"):
        load_scenario(tmp_path / "nope.toml")
