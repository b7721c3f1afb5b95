"""Invariant: a user's decode-step reader is judged as a user's builder is, from the command
line and from Python: by name, in a child process, its host launch arguments computed as an
engine computes them (at capture, the capture's lengths), and a reader that cannot run is one
line and exit 2 before anything runs."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from pagegraph.check.checker import check_replay_safety
from pagegraph.check.plan import plan_check, resolve_reader
from pagegraph.check.scenario import load_scenario, scenario_path
from pagegraph.consumers.reader import Reader

READER = textwrap.dedent(
    """
    import torch
    from pagegraph.consumers import paged_decode_attention
    from pagegraph.consumers.reader import Reader

    def attend(q, k, v, table, lens, out, *, page_size, workspace, max_seqlen_k):
        # the kernel visits keys below the host max_seqlen_k only
        paged_decode_attention(q, k, v, table, torch.clamp(lens, max=max_seqlen_k), out,
                               page_size=page_size, workspace=workspace)

    frozen = Reader("frozen", attend, launch_args=lambda h: {"max_seqlen_k": h.max_len})
    worst = Reader("worst", attend, launch_args=lambda h: {"max_seqlen_k": h.capacity})
    not_a_reader = 3
    """
)


@pytest.fixture
def reader_file(tmp_path):
    path = tmp_path / "myreader.py"
    path.write_text(READER)
    return path


def _small_step():
    cfg = load_scenario(scenario_path("decode-step")).config
    return cfg.replace(steps=4, timing_iters=0)


@pytest.mark.cpu_heavy  # a decode step: long under the Triton interpreter
def test_a_launch_argument_frozen_at_capture_fails_and_the_worst_case_passes(reader_file):
    cfg = _small_step()
    frozen = check_replay_safety("build_page_table", cfg, reader=f"{reader_file}:frozen")
    assert frozen.property("output correct through the consumer").status == "FAIL"
    worst = check_replay_safety("build_page_table", cfg, reader=f"{reader_file}:worst")
    assert worst.safe, worst.format()


def test_a_reader_by_name_is_kept_in_the_plan_for_a_child(reader_file):
    spec = f"{reader_file}:frozen"
    plan, _ = plan_check("build_page_table", _small_step(), reader=spec)
    assert plan.reader == spec and plan.to_dict()["reader"] == spec
    assert isinstance(resolve_reader(plan.reader), Reader)


def test_readers_load_through_their_own_loader_in_a_readers_words(reader_file):
    from pagegraph.clients.engine_readers import ReaderLoadError, load_reader, reader_spec_for_child
    from pagegraph.graph.builder_names import resolve_builder
    from pagegraph.kernels.registry import BuilderLoadError

    assert isinstance(load_reader(f"{reader_file}:frozen"), Reader)
    assert isinstance(load_reader(f"{reader_file}:attend"), Reader)  # an attention call
    for spec, words in [
        (f"{reader_file}:nope", r"cannot load reader .* \(its readers: attend, frozen, worst\)"),
        (str(reader_file), "names a file but no reader: use .*:READER"),
        ("nope", "unknown reader 'nope': use one of sglang:triton_decode, .*'module:reader'"),
        ("vllm:nope", "reader 'vllm:nope' is no engine reader"),
        (f"{reader_file}:not_a_reader", r"\(int 3\) is neither a Reader nor an attention call"),
    ]:
        with pytest.raises(ReaderLoadError, match=words) as refused:
            load_reader(spec)
        assert "builder" not in str(refused.value) and "\n" not in str(refused.value)
    # A builder's loader keeps a builder's words.
    with pytest.raises(BuilderLoadError, match=r"cannot load builder .* \(its functions: attend\)"):
        resolve_builder(f"{reader_file}:nope")
    assert reader_spec_for_child("vllm:triton_attn") == "vllm:triton_attn"


@pytest.mark.parametrize(
    "name, scenario, message",
    [
        ("nope", "decode-step", "cannot load reader"),
        ("not_a_reader", "decode-step", "neither a Reader nor an attention call"),
        ("frozen", "default", "a reader needs a decode-step scenario"),
    ],
)
def test_a_reader_that_cannot_run_is_one_line_and_exit_2(reader_file, name, scenario, message):
    out = subprocess.run(
        [sys.executable, "-m", "pagegraph", "check", scenario, "--reader", f"{reader_file}:{name}"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], out.stderr


@pytest.mark.cpu_heavy
def test_the_command_runs_a_users_reader_in_a_child_and_exits_1_when_it_fails(reader_file):
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pagegraph",
            "check",
            "decode-step",
            "--replays",
            "3",
            "--reader",
            f"{reader_file}:frozen",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 1, out.stdout + out.stderr
    assert "output correct through the consumer | builder + consumer | FAIL" in out.stdout
