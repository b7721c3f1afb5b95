"""Invariant: the verdict means replay safety. Advice (allocations by the builder at warm-up,
capture or in eager calls, compilations per bucket, error counters a builder does not take)
is reported with its figures and never flips the verdict unless ``strict`` promotes it; a
builder's capabilities decide which properties apply; the builder's first call is short, as an
engine's warm-up is; outputs an engine presets at allocation are checked as engines run them;
every failure names the row's inputs, what the expected value means and the replay's
out-of-contract rows; a crash is stated once, with its cause.

Each rule has a case where it must pass and one where it must fail."""

from __future__ import annotations

import os
import sys
import textwrap

import pytest
import torch

from pagegraph import build_page_table, check_replay_safety
from pagegraph.check.config import CheckConfig, ConfigError, validate_config
from pagegraph.graph.builder_names import signature_problem
from pagegraph.kernels.declarations import declare_builder
from pagegraph.kernels.decode_metadata import build_decode_metadata
from pagegraph.kinds import PAGE_TABLE
from pagegraph.kinds.builders import builder_capabilities
from pagegraph.supervise.crash_report import crash_cause, crash_report
from pagegraph.supervise.isolate import Job, run_isolated

from helpers import CPU_PASSES, assert_passed

SMALL = CheckConfig(max_bs=8, max_context_len=256, page_size=16, steps=12, buckets="pow2")
HOSTILE = SMALL.replace(overlong=0.5, negative=0.2, bad_index=0.2, zero_len=0.3, errors=True)


def status(report, name: str) -> str:
    return report.property(name).status


# -- plain torch builders --------------------------------------------------------------------


def torch_builder(
    req_to_token,
    req_pool_indices,
    seq_lens,
    page_table,
    page_size,
    *,
    swa_page_table=None,
    full_to_swa=None,
):
    """A correct, sync-free page-table builder in plain torch operators (they allocate): no
    ``errors`` parameter, as most real builders."""
    bs, width = page_table.shape
    cols = torch.arange(width, device=page_table.device)
    rows = req_to_token.index_select(0, req_pool_indices.long().clamp(0, len(req_to_token) - 1))
    slots = rows[:, : width * page_size : page_size][:, :width]
    pages = (seq_lens.long().clamp(min=0) + page_size - 1) // page_size
    live = cols[None, : slots.shape[1]] < pages[:, None]
    region = page_table[:, : slots.shape[1]]
    region.copy_(torch.where(live, (slots // page_size).to(page_table.dtype), region))
    if full_to_swa is not None:
        swa = full_to_swa[slots.long().clamp(0, len(full_to_swa) - 1)] // page_size
        sregion = swa_page_table[:, : slots.shape[1]]
        sregion.copy_(torch.where(live, swa.to(sregion.dtype), sregion))


def errors_ignored_builder(
    req_to_token, req_pool_indices, seq_lens, page_table, page_size, errors=None, **kw
):
    """Declares ``errors`` and never counts anything."""
    build_page_table(req_to_token, req_pool_indices, seq_lens, page_table, page_size, **kw)


_FROZEN: dict[int, int] = {}


def frozen_at_first_call_builder(
    req_to_token, req_pool_indices, seq_lens, page_table, page_size, **kw
):
    """Sizes its work once, at its very first call (one host read, then never again)."""
    key = page_table.data_ptr() >> 20
    if key not in _FROZEN:
        _FROZEN[key] = int(seq_lens.max())  # the first call's longest row, frozen
    capped = seq_lens.clamp(max=_FROZEN[key])
    build_page_table(req_to_token, req_pool_indices, capped, page_table, page_size, **kw)


def leaves_first_entries(
    req_to_token,
    req_pool_indices,
    seq_lens,
    page_size,
    *,
    cache_seqlens,
    cu_seqlens_k,
    page_table,
    draft_tokens=0,
    cu_seqlens_q=None,
    **kw,
):
    """pagegraph's decode metadata, but cu_seqlens_k[0] and cu_seqlens_q[0] left as they
    were (an engine sets them at allocation)."""
    keep_k = cu_seqlens_k[:1].clone()
    keep_q = cu_seqlens_q[:1].clone() if cu_seqlens_q is not None else None
    build_decode_metadata(
        req_to_token,
        req_pool_indices,
        seq_lens,
        page_size,
        cache_seqlens=cache_seqlens,
        cu_seqlens_k=cu_seqlens_k,
        page_table=page_table,
        draft_tokens=draft_tokens,
        cu_seqlens_q=cu_seqlens_q,
        **kw,
    )
    cu_seqlens_k[:1].copy_(keep_k)
    if keep_q is not None:
        cu_seqlens_q[:1].copy_(keep_q)


leaves_first_entries.pagegraph_outputs = "decode_metadata"


# -- advice never flips the verdict ------------------------------------------------------------


def test_allocating_torch_builder_is_safe_with_advice():
    report = check_replay_safety(torch_builder, SMALL)
    assert report.verdict == "SAFE", report.format()
    assert_passed(report, *CPU_PASSES)
    assert status(report, "no allocation in builder") == "advice"
    assert "allocation" in report.property("no allocation in builder").first_failure
    assert "advice" in report.format()


def test_strict_promotes_allocation_advice_to_a_failure():
    report = check_replay_safety(torch_builder, SMALL.replace(strict=("allocations",)))
    assert report.verdict == "UNSAFE"
    assert status(report, "no allocation in builder") == "FAIL"


def test_unknown_strict_name_is_refused():
    with pytest.raises(ConfigError, match="names no advice"):
        validate_config(SMALL.replace(strict=("speed",)))


def test_advice_status_survives_the_json_round_trip():
    from pagegraph.check.reports.report import Report

    report = check_replay_safety(torch_builder, SMALL)
    again = Report.from_dict(report.to_dict())
    assert again.verdict == "SAFE" and status(again, "no allocation in builder") == "advice"


# -- capabilities: error counters and SWA ------------------------------------------------------


def test_capabilities_come_from_the_signature_or_a_declaration():
    assert builder_capabilities(build_page_table).errors
    assert not builder_capabilities(torch_builder).errors
    assert builder_capabilities(torch_builder).swa

    def declared(*args, **kwargs):
        pass

    declare_builder(declared, errors=False)
    assert not builder_capabilities(declared).errors and builder_capabilities(declared).swa


def test_builder_without_errors_skips_the_counters_with_the_reason():
    report = check_replay_safety(torch_builder, HOSTILE)
    prop = report.property("error counters")
    assert prop.status == "skip" and "takes no errors=" in prop.detail
    assert report.verdict == "SAFE", report.format()
    assert_passed(report, *CPU_PASSES, "row containment")


def test_strict_error_counters_fails_a_builder_without_them():
    report = check_replay_safety(torch_builder, HOSTILE.replace(strict=("error-counters",)))
    assert status(report, "error counters") == "FAIL" and report.verdict == "UNSAFE"


def test_builder_that_declares_errors_and_ignores_them_fails():
    report = check_replay_safety(errors_ignored_builder, HOSTILE)
    assert status(report, "error counters") == "FAIL"


def test_builder_without_swa_outputs_is_refused_on_an_swa_scenario():
    def no_swa(req_to_token, req_pool_indices, seq_lens, page_table, page_size):
        pass

    assert "takes no swa_page_table" in signature_problem(no_swa, PAGE_TABLE, swa=True)
    assert signature_problem(no_swa, PAGE_TABLE, swa=False) is None
    with pytest.raises(ValueError, match="SWA"):
        check_replay_safety(no_swa, SMALL.replace(swa=True))


# -- the first call is short -------------------------------------------------------------------


def test_grid_frozen_at_the_first_call_fails_correct():
    _FROZEN.clear()
    report = check_replay_safety(frozen_at_first_call_builder, SMALL.replace(swa=False))
    assert status(report, "correct") == "FAIL", report.format()


def test_the_same_builder_without_freezing_is_safe():
    def unfrozen(req_to_token, req_pool_indices, seq_lens, page_table, page_size, **kw):
        build_page_table(req_to_token, req_pool_indices, seq_lens, page_table, page_size, **kw)

    report = check_replay_safety(unfrozen, SMALL)
    assert report.verdict == "SAFE", report.format()
    assert_passed(report, *CPU_PASSES)


# -- preset outputs ----------------------------------------------------------------------------

META = SMALL.replace(outputs="decode_metadata", draft_tokens=2)


def test_outputs_set_at_allocation_fail_without_the_preset():
    report = check_replay_safety(leaves_first_entries, META)
    assert report.verdict == "UNSAFE", report.format()


def test_outputs_set_at_allocation_pass_with_the_preset():
    cfg = META.replace(preset_outputs=("cu_seqlens_k[0]", "cu_seqlens_q[0]"))
    report = check_replay_safety(leaves_first_entries, cfg)
    assert report.verdict == "SAFE", report.format()
    assert_passed(report, *CPU_PASSES)


def test_preset_does_not_hide_a_wrong_first_entry():
    def writes_one(*args, cu_seqlens_k, **kw):
        build_decode_metadata(*args, cu_seqlens_k=cu_seqlens_k, **kw)
        cu_seqlens_k[:1].fill_(1)

    writes_one.pagegraph_outputs = "decode_metadata"
    cfg = META.replace(preset_outputs=("cu_seqlens_k[0]", "cu_seqlens_q[0]"))
    assert check_replay_safety(writes_one, cfg).verdict == "UNSAFE"


# -- injection levels and failure details ------------------------------------------------------


def test_engine_level_refuses_hostile_injections():
    with pytest.raises(ConfigError, match="hostile"):
        validate_config(SMALL.replace(injection_level="engine", negative=0.1))
    validate_config(SMALL.replace(injection_level="engine", overlong=0.1, zero_len=0.1))


def spill_builder(req_to_token, req_pool_indices, seq_lens, page_table, page_size, **kw):
    """Correct, then an overlong row also writes the first entry of the next row (inside the
    checker's allocation: its tables have a canary row below)."""
    build_page_table(req_to_token, req_pool_indices, seq_lens, page_table, page_size, **kw)
    bs, width = page_table.shape
    grown = page_table.as_strided((bs + 1, width), page_table.stride())
    over = seq_lens > width * page_size
    grown[1:, 0].copy_(torch.where(over, 7, grown[1:, 0]))


def test_containment_failure_lists_the_replays_out_of_contract_rows():
    report = check_replay_safety(spill_builder, HOSTILE)
    first = str(report.property("row containment").first_failure)
    assert "out-of-contract rows" in first and "seq_len" in first, first


def test_bounded_write_failure_says_what_the_poison_means_and_the_row_inputs():
    def one_page_too_many(req_to_token, req_pool_indices, seq_lens, page_table, page_size, **kw):
        build_page_table(
            req_to_token, req_pool_indices, seq_lens + page_size, page_table, page_size, **kw
        )

    report = check_replay_safety(one_page_too_many, SMALL)
    first = str(report.property("bounded writes").first_failure)
    assert "the poison" in first and "must stay untouched" in first, first
    assert "seq_len" in first and "req_pool_index" in first, first
    assert "first failure:" in report.format()


def test_eager_call_raising_is_reported_under_capture_with_the_builders_line():
    def raises_inside(*args, **kwargs):
        raise RuntimeError("Found dtype Long but expected Int")

    report = check_replay_safety(raises_inside, SMALL)
    prop = report.property("capture")
    assert prop.status == "FAIL" and "RuntimeError" in prop.detail
    assert f"{__file__}:" in prop.detail, prop.detail
    assert status(report, "sync-free builder call") == "incomplete"


# -- crashes -----------------------------------------------------------------------------------

FAULTHANDLER_TAIL = (
    'Fatal Python error: Aborted\n\nThread 0x01 (most recent call first):\n  File "x.py", '
    "line 3 in f\n\nExtension modules: numpy._core._multiarray_umath, torch._C (total: 2)\n"
)


def test_crash_cause_finds_the_cuda_error_not_the_module_list():
    stderr = "torch.AcceleratorError: CUDA error: an illegal memory access was encountered\n"
    assert crash_cause(stderr + FAULTHANDLER_TAIL).startswith(
        "CUDA error: an illegal memory access was encountered"
    )
    assert crash_cause(FAULTHANDLER_TAIL) == "Fatal Python error: Aborted"
    assert crash_cause("") == ""


def test_crash_is_stated_once():
    report = crash_report(
        Job("x", SMALL),
        None,
        "killed by SIGABRT",
        "replay 6",
        "CUDA error: an illegal memory access was encountered\n",
    )
    text = report.format()
    assert report.verdict == "UNSAFE"
    assert text.count("illegal memory access") == 1, text
    assert "replay 6" in report.crash


CRASHING_BUILDER = """
import os, sys
from pagegraph import build_page_table
CALLS = [0]
def build(req_to_token, req_pool_indices, seq_lens, page_table, page_size, **kw):
    CALLS[0] += 1
    if CALLS[0] == {n}:
        sys.stderr.write("CUDA error: an illegal memory access was encountered\\n")
        sys.stderr.flush()
        os.abort()
    build_page_table(req_to_token, req_pool_indices, seq_lens, page_table, page_size, **kw)
"""


@pytest.mark.heavy
@pytest.mark.skipif(
    torch.cuda.is_available(),
    reason="graph replays never call the Python "
    "builder: the planted crash needs eager replays (the CPU)",
)
def test_a_crash_during_replays_is_explained_by_a_serialised_rerun(tmp_path):
    # Eager replays call the builder once a replay, after the two eager calls and one warm-up
    # a bucket: its 12th call falls inside the replays. The re-run crashes at the same call.
    # (Emulated replays, the CPU's default, call it no more than CUDA graphs do.)
    path = tmp_path / "crashing.py"
    path.write_text(textwrap.dedent(CRASHING_BUILDER).replace("{n}", "12"))
    cfg = HOSTILE.replace(steps=10, emulate=False)
    (report,) = run_isolated([Job(f"{path}:build", cfg)])
    assert report.verdict == "UNSAFE"
    assert report.crash is not None and "CUDA error: an illegal memory access" in report.crash
    assert "serialised" in report.crash and "(bucket " in report.crash, report.crash
    assert report.format().count("illegal memory access") == 1


RAISING_BUILDER = """
from pagegraph import build_page_table
CALLS = [0]
def build(req_to_token, req_pool_indices, seq_lens, page_table, page_size, **kw):
    CALLS[0] += 1
    if CALLS[0] == 12:
        raise {error}("CUDA error: an illegal memory access was encountered\\nSearch for `cuda")
    build_page_table(req_to_token, req_pool_indices, seq_lens, page_table, page_size, **kw)
"""


@pytest.mark.heavy
@pytest.mark.skipif(
    torch.cuda.is_available(),
    reason="graph replays never call the Python builder: the planted error needs eager replays",
)
@pytest.mark.parametrize("error", ["RuntimeError", "ValueError"])
def test_a_replay_that_raised_a_cuda_error_is_explained_like_a_crash(tmp_path, error):
    """A CUDA error a replay raises (the child lives on, its context lost) is re-run
    serialised as a crash is, and the crash names the replay; any other error is a verdict
    as it stands. The message is asserted on: a ValueError's text says "CUDA error" too."""
    path = tmp_path / "raising.py"
    path.write_text(RAISING_BUILDER.replace("{error}", error))
    (report,) = run_isolated([Job(f"{path}:build", HOSTILE.replace(steps=10, emulate=False))])
    assert report.verdict == "UNSAFE"
    assert report.property("replays completed").status == "FAIL"
    if error == "RuntimeError":
        assert report.crash is not None and report.crash.startswith("replay "), report.crash
        assert "serialised, it came from replay " in report.crash and "(bucket " in report.crash
        assert "Search for" not in report.crash  # torch's advice is left out
    else:
        assert report.crash is None


@pytest.mark.skipif(sys.platform != "linux", reason="os.abort and signals as on Linux")
def test_crash_in_capture_is_not_rerun(tmp_path):
    path = tmp_path / "crashing.py"
    path.write_text(textwrap.dedent(CRASHING_BUILDER).replace("{n}", "3"))
    (report,) = run_isolated([Job(f"{path}:build", SMALL.replace(steps=4))])
    assert report.verdict == "UNSAFE" and "serialised" not in (report.crash or "")
    assert os.path.exists(path)


ONCE_CRASHING_BUILDER = """
import os, sys
from pagegraph import build_page_table
CALLS = [0]
def build(req_to_token, req_pool_indices, seq_lens, page_table, page_size, **kw):
    CALLS[0] += 1
    if CALLS[0] == 12 and not os.path.exists({marker!r}):
        open({marker!r}, "w").close()
        sys.stderr.write("CUDA error: an illegal memory access was encountered\\n")
        sys.stderr.flush()
        os.abort()
    build_page_table(req_to_token, req_pool_indices, seq_lens, page_table, page_size, **kw)
"""


@pytest.mark.cpu_heavy  # 5-10 s under the interpreter: make test-heavy (CI runs it)
@pytest.mark.heavy
@pytest.mark.skipif(
    torch.cuda.is_available(),
    reason="graph replays never call the Python "
    "builder: the planted crash needs eager replays (the CPU)",
)
def test_a_rerun_that_does_not_crash_names_no_replay(tmp_path):
    path = tmp_path / "once.py"
    path.write_text(ONCE_CRASHING_BUILDER.format(marker=str(tmp_path / "crashed")))
    (report,) = run_isolated([Job(f"{path}:build", HOSTILE.replace(steps=10, emulate=False))])
    assert report.verdict == "UNSAFE" and "illegal memory access" in report.crash
    assert "came from" not in report.crash, report.crash


def test_capture_failure_names_the_bucket_that_raised():
    calls = [0]

    def raises_at_four(req_to_token, req_pool_indices, seq_lens, page_table, page_size, **kw):
        calls[0] += 1  # the first two are the checker's eager calls, before the capture
        if page_table.shape[0] == 4 and calls[0] > 2:
            raise RuntimeError("boom at four")
        build_page_table(req_to_token, req_pool_indices, seq_lens, page_table, page_size, **kw)

    report = check_replay_safety(raises_at_four, SMALL.replace(max_bs=8))
    detail = report.property("capture").detail
    assert "bs=4 raised RuntimeError: boom at four" in detail, detail


def test_a_builder_loaded_from_a_file_runs_in_a_child(tmp_path):
    from pagegraph.graph.builder_names import resolve_builder
    from pagegraph.supervise.isolate import builder_spec

    path = tmp_path / "filebuilt.py"
    path.write_text("def build(*args, **kwargs):\n    pass\n")
    assert builder_spec(resolve_builder(f"{path}:build")) == f"{path}:build"


def test_strict_given_as_a_string_is_refused():
    with pytest.raises(ConfigError, match="not the string"):
        validate_config(SMALL.replace(strict="allocations"))


@pytest.mark.parametrize(
    "stopped, fault",
    [
        ("replay 6 raised AcceleratorError: CUDA error: an illegal memory access was encountered"
         "\nSearch for `cudaErrorIllegalAddress'", True),  # the loop's words
        ("replay 6 (bucket 16) raised RuntimeError: CUDA error: misaligned address", True),
        ("replay 6 (bucket 16) raised ValueError: CUDA error: an illegal memory access", False),
        ("replay 6 raised AcceleratorError: out of range", False),
        ("stopped at the first failure, after 6 replays", False),
        (None, False),
    ],
)  # fmt: skip
def test_a_device_fault_is_a_replay_that_raised_torchs_cuda_error(stopped, fault):
    from pagegraph.check.reports.report import Report
    from pagegraph.supervise.crash_report import device_fault

    report = Report("x", SMALL, "cuda", True)
    report.stopped = stopped
    assert device_fault(report) is fault
