"""Invariant: an emulated graph replays exactly what its capture recorded, never the body, so
on a CPU a builder that freezes a width, a grid or a host value at capture fails as it does on
a GPU, while an honest builder gets the same verdict as with eager replays.

The recorder's own tests come first (in-place, functional, view and allocation-only ops,
Triton launches, frozen host values), then the runner's use of it, then whole checks run both
ways (``GraphRunner(emulate=False)`` is the eager twin)."""

from __future__ import annotations

import functools
import gc
import threading
import weakref
from pathlib import Path

import pytest
import torch
import triton
import triton.language as tl

from pagegraph import GraphRunner, build_page_table, check_replay_safety
from pagegraph.check.checker import check_decode_step
from pagegraph.check.config import CheckConfig
from pagegraph.check.pipeline.step_bed import shrink_for_cpu
from pagegraph.check.scenario import ScenarioError, load_scenario
from pagegraph.consumers.paged_attention import BLOCK_N, default_num_splits
from pagegraph.detect.probes import AllocationCounter
from pagegraph.graph.emulate import EmulatedGraph, EmulationError
from pagegraph.kernels.contract import cdiv
from pagegraph.mutants.zoo import reset_caches

ROOT = Path(__file__).resolve().parent.parent
GRAPH_SAFE = "graph-safe (captured short, replayed long)"
pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="emulation is the CPU's")


def _seeded(n: int, seed: int, high: int = 100) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(1, high, (n,), generator=g)


# -- the recorder --------------------------------------------------------------------------------


def test_in_place_ops_replay_on_the_recorded_tensors():
    x, y = _seeded(8, 1), torch.zeros(8, dtype=torch.int64)
    g = EmulatedGraph()
    with g.capture():
        y.copy_(x)
        y.mul_(3)
    assert torch.equal(y, x * 3)
    x.copy_(_seeded(8, 2))
    assert not torch.equal(y, x * 3)  # nothing ran yet
    g.replay()
    assert torch.equal(y, x * 3)


def test_a_functional_ops_output_is_refreshed_for_the_ops_that_read_it():
    x, y = _seeded(8, 3), torch.zeros(8, dtype=torch.int64)
    g = EmulatedGraph()
    with g.capture():
        z = x + 5  # a tensor of the capture: later ops read it by identity
        y.copy_(z * 2)
    x.copy_(_seeded(8, 4))
    g.replay()
    assert torch.equal(z, x + 5)
    assert torch.equal(y, (x + 5) * 2)


def test_views_keep_aliasing_their_base_and_a_moved_base_is_refused():
    buf, x = torch.zeros(10, dtype=torch.int64), _seeded(4, 5)
    g = EmulatedGraph()
    with g.capture():
        view = buf[2:6]
        view.copy_(x)
    x.copy_(_seeded(4, 6))
    g.replay()
    assert torch.equal(buf[2:6], x) and buf[:2].eq(0).all() and buf[6:].eq(0).all()
    assert view.untyped_storage().data_ptr() == buf.untyped_storage().data_ptr()
    # Planted: the base given new storage behind the graph's back.
    buf.set_(torch.zeros(10, dtype=torch.int64))
    with pytest.raises(EmulationError, match="moved"):
        g.replay()


def test_host_values_and_data_dependent_shapes_stay_frozen():
    x, y = torch.tensor([3, 0, 7, 0, 1]), torch.zeros(5, dtype=torch.int64)
    g = EmulatedGraph()
    with g.capture():
        top = int(x.max())  # a host value: frozen as capture saw it
        y.copy_(x + top)
        nz = torch.nonzero(x)
    assert sorted(g.frozen) == ["aten._local_scalar_dense.default", "aten.nonzero.default"]
    x.copy_(torch.tensor([10, 20, 30, 40, 50]))
    g.replay()
    assert torch.equal(y, x + 7)  # not x + 50: the width of a host read is the capture's
    assert torch.equal(nz, torch.tensor([[0], [2], [4]]))  # the capture's, not recomputed
    # The twin: no host read, nothing frozen.
    g2 = EmulatedGraph()
    with g2.capture():
        y.copy_(x + x.max())
    assert g2.frozen == []
    x.copy_(torch.tensor([1, 2, 3, 4, 60]))
    g2.replay()
    assert torch.equal(y, x + 60)


def test_memory_allocated_at_capture_stays_alive_until_reset():
    x, y = _seeded(6, 7), torch.zeros(6, dtype=torch.int64)
    g = EmulatedGraph()
    with g.capture():
        tmp = torch.empty(6, dtype=torch.int64)
        tmp.copy_(x)
        y.copy_(tmp * 2)
    alive = weakref.ref(tmp)
    del tmp
    gc.collect()
    assert alive() is not None  # the graph's private pool holds it
    x.copy_(_seeded(6, 8))
    g.replay()
    assert torch.equal(y, x * 2)
    g.reset()
    gc.collect()
    assert alive() is None


def test_a_replay_is_not_seen_by_the_callers_dispatch_modes():
    x, y = _seeded(6, 9), torch.zeros(6, dtype=torch.int64)

    def body():
        y.copy_(x * 2 + 1)

    g = EmulatedGraph()
    g.record(body)
    with AllocationCounter() as replayed:
        g.replay()
    with AllocationCounter() as eager:  # the twin: the body itself allocates
        body()
    assert replayed.count == 0 and eager.count > 0
    assert torch.equal(y, x * 2 + 1)


@triton.jit
def _double(src_ptr, dst_ptr, n_ptr, scale, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    live = offs < tl.load(n_ptr)
    tl.store(dst_ptr + offs, tl.load(src_ptr + offs, mask=live) * scale, mask=live)


def _launch(src, dst, n, grid_from_host: bool):
    """``_double`` on ``n`` entries; the grid from the host's reading of ``n`` (the hazard)
    or from the static size (a callable grid, evaluated by the launch)."""
    if grid_from_host:
        _double[(cdiv(int(n.item()), 4),)](src, dst, n, 2, BLOCK=4)
    else:
        size = src.numel()
        _double[lambda meta: (cdiv(size, meta["BLOCK"]),)](src, dst, n, 2, BLOCK=4)


@pytest.mark.parametrize("grid_from_host", [True, False])
def test_triton_launches_replay_with_the_frozen_grid(grid_from_host):
    src, dst = _seeded(16, 10), torch.zeros(16, dtype=torch.int64)
    n = torch.tensor([4])
    g = EmulatedGraph()
    with g.capture():
        _launch(src, dst, n, grid_from_host)
    assert g.launches == 1 and torch.equal(dst[:4], src[:4] * 2) and dst[4:].eq(0).all()
    src.copy_(_seeded(16, 11))
    n.fill_(16)
    g.replay()
    if grid_from_host:  # planted: one program captured, one program replayed
        assert torch.equal(dst[:4], src[:4] * 2) and dst[4:].eq(0).all()
    else:
        assert torch.equal(dst, src * 2)


def test_a_capture_that_raises_leaves_no_graph():
    x = _seeded(4, 14)
    g = EmulatedGraph()
    with pytest.raises(RuntimeError, match="planted"), g.capture():
        x.add_(1)
        raise RuntimeError("planted")
    assert not g.captured and g.steps == 0
    with pytest.raises(EmulationError, match="before capture"):
        g.replay()
    with g.capture():  # the twin: the same graph captures again
        x.add_(1)
    assert g.captured and g.steps == 1


def test_launches_from_other_threads_are_not_recorded():
    """The launch hook is process-wide while capturing; only the capturing thread's launches
    belong to the graph (as only the capturing stream's work belongs to a CUDA graph)."""
    src, n = _seeded(16, 13), torch.tensor([16])
    mine, theirs = torch.zeros(16, dtype=torch.int64), torch.zeros(16, dtype=torch.int64)
    g = EmulatedGraph()
    with g.capture():
        other = threading.Thread(target=lambda: _double[(4,)](src, theirs, n, 2, BLOCK=4))
        other.start()
        other.join()
        _double[(4,)](src, mine, n, 2, BLOCK=4)
    assert g.launches == 1 and torch.equal(theirs, src * 2)
    mine.zero_()
    theirs.zero_()
    g.replay()
    assert torch.equal(mine, src * 2) and theirs.eq(0).all()


# -- the runner --------------------------------------------------------------------------------


def _runner(builder, **kw) -> GraphRunner:
    g = torch.Generator().manual_seed(12)
    r2t = torch.randint(1, 500, (9, 256), generator=g, dtype=torch.int32) * 16
    return GraphRunner(
        r2t, max_bs=8, max_context_len=256, page_size=16, builder=builder, buckets="pow2", **kw
    )


def test_a_cpu_runner_captures_emulated_graphs_and_replays_never_call_the_builder():
    calls = []

    def counted(*args, **kwargs):
        calls.append(args[3].shape[0])
        build_page_table(*args, **kwargs)

    lens, rows = [100, 17, 256], [1, 2, 3]
    emulated, eager = _runner(counted), _runner(counted, emulate=False)
    for runner in (emulated, eager):
        runner.capture()
    assert emulated.emulated and not eager.emulated and not emulated.use_graphs
    assert sorted(emulated.graphs) == [1, 2, 4, 8] and not eager.graphs
    before = len(calls)
    got, _ = emulated.replay(rows, lens)
    assert len(calls) == before  # the record ran, not the builder
    want, _ = eager.replay(rows, lens)
    assert len(calls) == before + 1  # the eager twin calls it
    assert torch.equal(got, want)
    emulated.close()


def test_emulation_can_be_turned_off_and_not_forced_where_it_cannot_run():
    assert not _runner(build_page_table, use_graphs=False).emulated
    with pytest.raises(ValueError, match="emulate=True"):
        _runner(build_page_table, use_graphs=False, emulate=True)


# -- whole checks, both ways ---------------------------------------------------------------------

SMALL = CheckConfig(max_bs=10, max_context_len=256, page_size=16, steps=12, buckets="pow2")


def _both(builder, cfg: CheckConfig, reset=reset_caches):
    """The check of ``builder`` with emulated replays, then with eager ones; ``reset()``
    forgets what the builder cached before each (each check starts cold)."""
    reset()
    emulated = check_replay_safety(builder, cfg)
    reset()
    eager = check_replay_safety(builder, cfg.replace(emulate=False))
    assert emulated.emulated and not eager.emulated
    assert "buckets captured (emulated)" in emulated.property("capture").detail
    return emulated, eager


def test_a_runner_factory_and_a_scenario_can_turn_emulation_off(tmp_path):
    factory = functools.partial(GraphRunner, emulate=False)
    eager = check_replay_safety("build_page_table", SMALL.replace(steps=2), runner_factory=factory)
    assert not eager.emulated and eager.safe, eager.format()
    text = (ROOT / "graphs" / "default.toml").read_text()
    path = tmp_path / "eager.toml"
    path.write_text(text.replace("[check]\n", "[check]\nemulate = false\n"))
    assert load_scenario(path).config.emulate is False
    assert load_scenario(ROOT / "graphs" / "default.toml").config.emulate is True
    path.write_text(text.replace("[check]\n", "[check]\nemulate = 1\n"))
    with pytest.raises(ScenarioError, match="emulate"):
        load_scenario(path)


def _failing(report) -> set[str]:
    return {p.name for p in report.properties if p.status == "FAIL"}


def host_max_width(req_to_token, req_pool_indices, seq_lens, page_table, page_size):
    """A plain-torch gather into ``page_table[:, :n]``, ``n`` read on the host from the
    longest length at every call: right eagerly, frozen by a capture."""
    n = min(cdiv(max(int(seq_lens.max()), 1), page_size), page_table.shape[1])
    bs = page_table.shape[0]
    cols = torch.arange(n)
    live = cols[None, :] < (seq_lens.long()[:, None] + page_size - 1) // page_size
    rows = req_pool_indices.long()
    slots = req_to_token[rows[:, None], (cols * page_size)[None, :]]
    ids = (slots // page_size).to(torch.int32)
    view = page_table[:bs, :n]
    view.copy_(torch.where(live, ids, view))


def test_a_width_frozen_at_capture_passes_eagerly_and_fails_only_emulated():
    # The builder's host read is a sync the cpu detector sees: off here, where what is judged
    # is what a capture freezes (tests/test_sync_cpu.py has the sync).
    emulated, eager = _both(host_max_width, SMALL.replace(detectors="none"))
    assert eager.verdict == "SAFE", eager.format()
    assert emulated.verdict == "UNSAFE", emulated.format()
    assert _failing(emulated) & {"correct", GRAPH_SAFE}, emulated.format()
    detail = emulated.property("capture").detail
    assert "op(s) frozen at capture" in detail and "_local_scalar_dense" in detail, detail


def _mybuilder():
    """The README's example builder (a copy in ``tests/data``) and a reset of its buffers."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "mybuilder", ROOT / "tests" / "data" / "mybuilder.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.build, module._work.clear


def _scenario(name: str, steps: int = 16) -> CheckConfig:
    return load_scenario(ROOT / "graphs" / f"{name}.toml").config.replace(steps=steps)


@pytest.mark.cpu_heavy
@pytest.mark.heavy
@pytest.mark.parametrize(
    "builder,scenario",
    [
        ("mybuilder", "default"),
        ("build_page_table", "default"),
        ("build_decode_metadata", "spec-metadata"),
        ("build_kv_indices", "csr"),
    ],
)
def test_honest_builders_get_the_same_verdict_both_ways(builder, scenario):
    fn, reset = _mybuilder() if builder == "mybuilder" else (builder, lambda: None)
    emulated, eager = _both(fn, _scenario(scenario), reset)
    assert emulated.verdict == eager.verdict == "SAFE", emulated.format()
    assert emulated.property("capture").detail.endswith("captured (emulated)")  # none frozen
    assert emulated.long_replays > 0  # replays longer than the capture were judged
    statuses = {p.name: p.status for p in eager.properties}
    # graph-safe compares a replay with an eager call: judged only where a graph was captured.
    assert statuses.pop(GRAPH_SAFE) == "skip"
    got = {p.name: p.status for p in emulated.properties}
    assert got.pop(GRAPH_SAFE) == "pass", emulated.format()
    assert got == statuses


@pytest.mark.cpu_heavy
@pytest.mark.heavy
@pytest.mark.parametrize(
    "mutant,scenario,eager_dies",
    [
        ("width_from_host_max", "default", False),
        ("width_frozen_per_batch_size", "default", True),
        ("stale_host_copy_grid", "default", True),
        ("launch_plan_cached_by_address", "default", True),
        ("csr_pages_frozen", "csr", True),
    ],
)
def test_mutants_that_freeze_at_capture_die_emulated(mutant, scenario, eager_dies):
    cfg = _scenario(scenario).replace(detectors="none")  # what a capture freezes, not syncs
    emulated, eager = _both(f"pagegraph.mutants.zoo:{mutant}", cfg)
    assert emulated.verdict == "UNSAFE", emulated.format()
    assert (eager.verdict == "UNSAFE") is eager_dies, eager.format()


# -- the decode step ---------------------------------------------------------------------------

STEP = CheckConfig(
    max_bs=4,
    max_context_len=128,
    page_size=16,
    steps=6,
    seed=3,
    consumer="paged",
    num_q_heads=4,
    num_kv_heads=2,
    head_dim=16,
)


@pytest.mark.parametrize("name", ["decode-step", "decode-step-csr"])
def test_the_shrunk_decode_step_keeps_two_split_k_splits(name):
    """The consumer's combine step merges partial results only with two splits or more, and
    the second split holds tokens only in rows longer than a tile."""
    small, note = shrink_for_cpu(load_scenario(ROOT / "graphs" / f"{name}.toml").config)
    assert note is not None  # shrunk
    tokens = small.width * small.page_size
    assert default_num_splits(tokens) >= 2 and tokens > BLOCK_N
    assert small.initial_len[1] > BLOCK_N  # the workload makes such rows


@pytest.mark.cpu_heavy  # 5-10 s under the interpreter: make test-heavy (CI runs it)
@pytest.mark.heavy
def test_the_decode_step_replays_emulated_graphs_and_a_frozen_width_fails_there_only():
    honest = check_decode_step("build_page_table", STEP)
    assert honest.emulated and honest.verdict == "SAFE", honest.format()
    assert honest.property("capture").detail.endswith("buckets captured (emulated)")
    frozen = "pagegraph.mutants.zoo:width_from_host_max"
    eager = check_decode_step(frozen, STEP, emulate=False)
    assert not eager.emulated and eager.verdict == "SAFE", eager.format()
    emulated = check_decode_step(frozen, STEP)
    assert emulated.verdict == "UNSAFE", emulated.format()
    assert "output correct through the consumer" in _failing(emulated), emulated.format()
    assert "frozen at capture" in emulated.property("capture").detail
