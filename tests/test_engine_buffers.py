"""An engine's own buffers, as it allocated them: the runner uses an output vector handed
over as given and never replaces it, a check judges the engine's buffer its runner factory
made (mirrored into the checker's poisoned views around each replay), a buffer too small for
the padded batch or a factory that raises fails "capture" with why, and a request pool
smaller than the largest bucket pads past its rows."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pagegraph.check.checker import check_replay_safety
from pagegraph.check.config import CheckConfig, validate_config
from pagegraph.check.scenario import load_scenario
from pagegraph.graph.runner import GraphRunner
from pagegraph.kernels.contract import POISON, cdiv
from pagegraph.kernels.declarations import declare_runner_factory
from pagegraph.kernels.kv_indices import build_kv_indices
from pagegraph.workload.decode import DecodeWorkload
from pagegraph.workload.pool import KVPool

PS, MAX_BS, CTX = 16, 8, 160


def _prop(report, name: str):
    return next(p for p in report.properties if p.name == name)


def _csr_config(**kw) -> CheckConfig:
    """A small CSR check: buckets up to 8, the padded rows past a batch of 5 or 6 in bucket 8."""
    base = dict(
        max_bs=MAX_BS,
        max_context_len=CTX,
        page_size=PS,
        steps=12,
        buckets=[1, 2, 4, MAX_BS],
        seed=3,
        initial_len=(1, 120),
        overlong=0.0,
        negative=0.0,
        bad_index=0.0,
        zero_len=0.0,
    )
    return CheckConfig(**{**base, **kw})


def _engine_factory(indptr_entries: int, made: list):
    """A runner factory that allocates its own ``kv_indptr`` of ``indptr_entries`` int32
    entries, as an engine does, and records what it made in ``made``."""

    def factory(req_to_token: torch.Tensor, **kwargs) -> GraphRunner:
        own = torch.zeros(indptr_entries, dtype=torch.int32, device=req_to_token.device)
        made.append(own)
        runner = GraphRunner(req_to_token, kv_indptr=own, **kwargs)
        made.append(runner)
        return runner

    declare_runner_factory(factory, engine_buffers=("kv_indptr",))
    return factory


def _r2t(max_reqs: int = 4) -> torch.Tensor:
    """``[max_reqs + 1, CTX]`` int32: row r's token t at slot ``(r * CTX + t)``."""
    rows = torch.arange(max_reqs + 1, dtype=torch.int32)[:, None] * CTX
    return rows + torch.arange(CTX, dtype=torch.int32)[None, :]


# -- 1. a vector given both ways, an engine's buffer used as given --------------------------------


def test_a_vector_given_by_keyword_and_in_vectors_as_two_tensors_is_refused_naming_it():
    a = torch.zeros(MAX_BS + 1, dtype=torch.int32)
    b = torch.zeros(MAX_BS + 1, dtype=torch.int32)
    with pytest.raises(ValueError, match=r"kv_indptr is given twice.*kv_indptr=.*vectors="):
        GraphRunner(
            _r2t(),
            max_bs=MAX_BS,
            max_context_len=CTX,
            page_size=PS,
            builder=build_kv_indices,
            kv_indptr=a,
            vectors={"kv_indptr": b},
        )


def test_the_same_tensor_given_both_ways_is_used():
    a = torch.zeros(MAX_BS + 1, dtype=torch.int32)
    runner = GraphRunner(
        _r2t(),
        max_bs=MAX_BS,
        max_context_len=CTX,
        page_size=PS,
        builder=build_kv_indices,
        kv_indptr=a,
        vectors={"kv_indptr": a},
    )
    assert runner.kv_indptr is not None and runner.kv_indptr.data_ptr() == a.data_ptr()


def test_an_engine_vector_is_the_one_the_builder_writes():
    """The engine's ``kv_indptr``, longer than the padded batch needs (sized by its pool),
    is the buffer the replays write: rows ``:bucket + 1`` hold the exact CSR offsets of the
    staged (padded) lengths, and the entries past them keep what the engine put there."""
    dev = "cuda" if torch.cuda.is_available() else "cpu"  # where the kernels run
    own = torch.full((MAX_BS + 6,), -7, dtype=torch.int32, device=dev)
    runner = GraphRunner(
        _r2t().to(dev),
        max_bs=MAX_BS,
        max_context_len=CTX,
        page_size=PS,
        builder=build_kv_indices,
        buckets=[2, 4, MAX_BS],
        kv_indptr=own,
        emulate=False,
    )
    assert runner.kv_indptr is not None
    assert runner.kv_indptr.data_ptr() == own.data_ptr()
    assert runner.static_buffers()["kv_indptr"] is runner.kv_indptr
    runner.capture()
    lens = [33, 1, 160]
    runner.replay([1, 2, 3], lens)  # bucket 4: one padded row of length 1 (sglang)
    staged = runner.seq_lens[:4].tolist()
    assert staged[:3] == lens
    pages = [cdiv(n, PS) for n in staged]
    expected = np.concatenate([[0], np.cumsum(pages)]).astype(np.int32)
    np.testing.assert_array_equal(own[:5].cpu().numpy(), expected)
    assert (own[MAX_BS + 1 :] == -7).all()  # past the runner's rows: the engine's own


# -- 2. a buffer too small for the padded batch -------------------------------------------------


def test_a_vector_too_small_names_itself_its_shape_and_the_size_needed():
    small = torch.zeros(5, dtype=torch.int32)  # a pool of 4 requests' max_reqs + 1
    with pytest.raises(ValueError) as info:
        GraphRunner(
            _r2t(),
            max_bs=MAX_BS,
            max_context_len=CTX,
            page_size=PS,
            builder=build_kv_indices,
            kv_indptr=small,
        )
    msg = str(info.value)
    assert "kv_indptr" in msg and "(5,)" in msg and f">= {MAX_BS + 1} entries" in msg, msg
    assert f"{MAX_BS + 1} entries needed, 5 given" in msg, msg


def test_an_engine_indptr_sized_by_its_pool_fails_capture_in_a_check():
    made: list = []
    cfg = _csr_config(max_reqs=4)  # kv_indptr of max_reqs + 1 = 5, the padded batch needs 9
    report = check_replay_safety(
        build_kv_indices, cfg, runner_factory=_engine_factory(5, made), device="cpu"
    )
    capture = _prop(report, "capture")
    assert capture.status == "FAIL", report.format()
    assert "runner factory raised ValueError" in capture.detail
    assert "kv_indptr" in capture.detail and "(5,)" in capture.detail
    assert f"{MAX_BS + 1} entries needed, 5 given" in capture.detail
    assert __file__ in capture.detail  # the factory's line that raised
    assert report.verdict == "UNSAFE"
    assert report.replays == 0


@pytest.mark.parametrize("entries", [MAX_BS + 1, MAX_BS + 5])
def test_an_engine_indptr_sized_for_the_padded_batch_is_safe_and_written(entries):
    made: list = []
    report = check_replay_safety(
        build_kv_indices, _csr_config(), runner_factory=_engine_factory(entries, made)
    )
    assert report.verdict == "SAFE", report.format()
    assert _prop(report, "correct").status == "pass"
    own, runner = made
    assert runner.kv_indptr.data_ptr() == own.data_ptr()  # the engine's, not the checker's
    # The last replay's offsets stay in the engine's buffer: no poison in the live rows.
    bucket = runner.last_bucket
    live = own[: bucket + 1]
    assert int(live[0]) == 0 and not (live == POISON).any()
    assert (live[1:] >= live[:-1]).all()


def test_a_factory_forwarding_the_checkers_vectors_over_its_own_fails_capture():
    """Without an ``engine_buffers`` declaration the checker hands the factory its ``kv_indptr``
    in ``vectors=``; a factory passing its own by keyword too gives the runner two: refused,
    never one silently replacing the other."""

    def factory(req_to_token: torch.Tensor, **kwargs) -> GraphRunner:
        own = torch.zeros(MAX_BS + 1, dtype=torch.int32, device=req_to_token.device)
        return GraphRunner(req_to_token, kv_indptr=own, **kwargs)

    report = check_replay_safety(build_kv_indices, _csr_config(), runner_factory=factory)
    capture = _prop(report, "capture")
    assert capture.status == "FAIL", report.format()
    assert "kv_indptr is given twice" in capture.detail


# -- 3. a runner factory that raises ------------------------------------------------------------


def test_a_raising_runner_factory_fails_capture_and_the_check_returns_its_report():
    def factory(req_to_token: torch.Tensor, **kwargs) -> GraphRunner:
        raise RuntimeError("engine refused the layout")

    report = check_replay_safety(
        "build_page_table",
        CheckConfig(max_bs=4, max_context_len=64, page_size=16, steps=4, buckets=[1, 2, 4]),
        runner_factory=factory,
    )
    capture = _prop(report, "capture")
    assert capture.status == "FAIL"
    assert "RuntimeError: engine refused the layout" in capture.detail
    assert f"{__file__}:" in capture.detail
    assert report.verdict == "UNSAFE"
    assert report.stopped == capture.detail
    rest = [p for p in report.properties if p.name != "capture"]
    assert all(p.status != "pass" for p in rest)  # nothing else was shown


# -- 4. a request pool smaller than the largest bucket ------------------------------------------


def test_a_pool_smaller_than_the_largest_bucket_is_a_valid_config():
    validate_config(CheckConfig(max_bs=8, max_reqs=6), strict=True)
    with pytest.raises(ValueError, match="max_reqs"):
        validate_config(CheckConfig(max_bs=8, max_reqs=0), strict=True)


def test_a_scenario_declares_a_pool_smaller_than_its_largest_bucket(tmp_path):
    f = tmp_path / "small-pool.toml"
    f.write_text(
        "[graph]\nmax_bs = 8\nmax_context_len = 160\npage_size = 16\n[pool]\nmax_reqs = 6\n"
    )
    cfg = load_scenario(f).config
    assert (cfg.max_bs, cfg.max_reqs) == (8, 6)


def test_a_workload_never_has_more_real_rows_than_its_pool():
    pool = KVPool(max_reqs=6, max_context_len=CTX, page_size=PS)
    sizes = [s.bs for s in DecodeWorkload(pool, max_bs=MAX_BS, steps=80, seed=2)]
    assert max(sizes) == 6  # the pool full, the bucket of 8 padded past it
    assert min(sizes) >= 1


@pytest.mark.parametrize("padding", ["sglang", "dummy-row"])
def test_a_pool_smaller_than_the_largest_bucket_is_safe_padded_past_its_rows(padding):
    cfg = CheckConfig(
        max_bs=MAX_BS,
        max_reqs=6,
        max_context_len=CTX,
        page_size=PS,
        steps=30,
        buckets=[1, 2, 4, MAX_BS],
        seed=4,
        padding=padding,
        initial_len=(1, 120),
    )
    report = check_replay_safety("build_page_table", cfg)
    assert report.verdict == "SAFE", report.format()
    assert report.buckets[MAX_BS].replays > 0  # batches of 5 or 6 padded to 8
