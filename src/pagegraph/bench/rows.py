"""The "builders" section: one row per (config, builder), the core of the bench.

Per row: exactness against ``expected_tables`` first (an inexact builder is still timed, but
flagged), then device time per build in a CUDA graph (rotated out of L2, and L2-warm), the
bandwidth floor it is set against, and eager host time per call. For ``build_page_table``
also a ``PreparedBuild`` call and one ``GraphRunner.replay()`` (from device tensors and from
host lists). Every measurement fails on its own, into the row's ``error``: a broken builder
never stops the run.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from ..detect.ranges import phase
from ..graph.runner import GraphRunner
from ..kernels.baselines import block_grid
from ..kernels.page_table import build_page_table, prepare_build
from ..kernels.reference import host_max_gather, static_width_gather
from ..runtime.timing import device_time_us, sync, wall_time_us
from .bench_settings import Settings, error, recover
from .configs import BenchConfig
from .floors import floor_bytes, live_pages
from .inputs import (
    BenchInputs,
    Check,
    Rotation,
    make_inputs,
    make_outputs,
    poison,
    rotate_out_of_l2,
)

#: Builders benchmarked, in table order.
BUILDERS: dict[str, Callable[..., object]] = {
    "build_page_table": build_page_table,
    "block_grid": block_grid,
    "static_width_gather": static_width_gather,
    "host_max_gather": host_max_gather,
}
#: Builders whose captured graph is correct (host_max_gather freezes its width at capture).
GRAPH_SAFE = ("build_page_table", "block_grid", "static_width_gather")


def base_row(
    cfg: BenchConfig, builder: str, env: dict[str, Any], launch_floor: float | None
) -> dict[str, Any]:
    """A builder row with every field present, the measured ones ``None``."""
    return {
        "gpu": env.get("device"),
        "torch": env.get("torch"),
        "triton": env.get("triton"),
        "date": env.get("date"),
        "config": cfg.name,
        "bs": cfg.bs,
        "page_size": cfg.page_size,
        "max_context_len": cfg.max_context_len,
        "width": cfg.width,
        "lengths": cfg.describe_lengths(),
        "swa": cfg.swa,
        "builder": builder,
        "device_us": None,
        "floor_us": None,
        "fraction_of_floor": None,
        "launch_floor_us": launch_floor,
        "eager_us": None,
        "eager_prepared_us": None,
        "replay_us": None,
        "replay_host_us": None,
        "live_pages": None,
        "bytes": None,
        "l2_resident": None,
        "input_sets": None,
        "device_warm_us": None,
        "exact": None,
        "graph_exact": None,
        "replay_exact": None,
        "mismatch": None,
        "error": None,
    }


def single_bucket_runner(inp: BenchInputs) -> GraphRunner:
    """A ``GraphRunner`` over ``inp``'s tables with one bucket, the config's batch size."""
    cfg = inp.config
    return GraphRunner(
        inp.req_to_token,
        max_bs=cfg.bs,
        max_context_len=cfg.max_context_len,
        page_size=cfg.page_size,
        buckets=[cfg.bs],
        full_to_swa=inp.full_to_swa,
    )


def _runner_replays(
    inp: BenchInputs, check: Check, s: Settings, row: dict[str, Any], errors: list[Any]
) -> None:
    runner = single_bucket_runner(inp)
    try:
        runner.capture()
        rpi_list, len_list = list(inp.rows), list(inp.lengths)
        poison(runner.page_table, runner.swa_page_table)
        pt, swa = runner.replay(rpi_list, len_list)
        sync(s.cuda)
        mismatch = check.compare(pt, swa)
        row["replay_exact"] = mismatch is None
        if mismatch:
            errors.append(f"replay: {mismatch}")
        if not s.cuda:
            return  # eager replays of the interpreter: no wall time worth reporting
        rpi_dev, len_dev = inp.req_pool_indices, inp.seq_lens
        row["replay_us"] = wall_time_us(
            lambda: runner.replay(rpi_dev, len_dev), s.replay_calls, cuda=True
        )
        row["replay_host_us"] = wall_time_us(
            lambda: runner.replay(rpi_list, len_list), s.replay_calls, cuda=True
        )
    finally:
        runner.close()


def time_exact_graph(
    call: Callable[[], object],
    rotation: Rotation,
    s: Settings,
    poison_outputs: Callable[[], None],
    compare: Callable[[], str | None],
    row: dict[str, Any],
) -> str | None:
    """One builder's device time on ``s``'s graphs, into ``row``: ``device_warm_us`` (a graph
    of ``call``, the same inputs every call, as a back-to-back microbenchmark sees: L2-warm),
    ``device_us`` (a graph of ``rotation``, cycling over ``input_sets`` tables out of the L2)
    and ``graph_exact``: the rotated graph replayed once more on poisoned outputs
    (``poison_outputs``), whose last call reads the input's own table, so that ``compare``
    (``None`` when they are exact) finds the reference's outputs. Returns the row's error,
    ``None`` without; the device is recovered either way (``recover``)."""
    graph: torch.cuda.CUDAGraph | None = None
    try:
        row["device_warm_us"], graph = device_time_us(call, s.builds, s.replays)
        graph = None
        row["device_us"], graph = device_time_us(rotation, s.builds, s.replays, rotation.reset)
        row["input_sets"] = len(rotation.tables)
        poison_outputs()
        graph.replay()
        torch.cuda.synchronize()
        mismatch = compare()
        row["graph_exact"] = mismatch is None
        return f"graph: {mismatch}" if mismatch else None
    except Exception as exc:  # noqa: BLE001 - the row says so; the run goes on
        return f"device time: {error(exc)}"
    finally:
        graph = None
        recover(s.cuda)


def eager_calls(s: Settings) -> int:
    """Timed eager calls: the run's setting on a GPU, at least 3 under the interpreter."""
    return s.eager_calls if s.cuda else max(3, s.eager_calls)


def eager_warmup(s: Settings) -> int:
    """Untimed calls before an eager timing (the interpreter needs few: it has no cache)."""
    return 10 if s.cuda else 2


def bench_builder(
    name: str, inp: BenchInputs, check: Check, s: Settings, row: dict[str, Any]
) -> None:
    """Fill ``row`` for one builder; each measurement fails on its own, into ``row["error"]``."""
    cfg = inp.config
    fn = BUILDERS[name]
    page_table, swa_page_table, kwargs = make_outputs(inp)
    r2t, rpi, lens, ps = inp.req_to_token, inp.req_pool_indices, inp.seq_lens, cfg.page_size

    def call() -> None:
        fn(r2t, rpi, lens, page_table, ps, **kwargs)

    errors: list[str] = []
    try:  # exactness first: an inexact builder is still timed, but flagged
        poison(page_table, swa_page_table)
        call()
        sync(s.cuda)
        mismatch = check.compare(page_table, swa_page_table)
        row["exact"] = mismatch is None
        row["mismatch"] = mismatch
    except Exception as exc:  # noqa: BLE001
        errors.append(f"check: {error(exc)}")

    if s.cuda and name in GRAPH_SAFE and not errors:
        # Cycle over the rotated tables, so each build in the graph reads page starts the
        # previous one did not leave in L2; the last build uses the original table.
        rotation = Rotation(fn, [*inp.rotated, r2t], (rpi, lens, page_table, ps), kwargs)
        failed = time_exact_graph(
            call,
            rotation,
            s,
            lambda: poison(page_table, swa_page_table),
            lambda: check.compare(page_table, swa_page_table),
            row,
        )
        errors += [failed] if failed else []
        us = row["device_us"]
        if row["floor_us"] is not None and us is not None and us > 0:
            row["fraction_of_floor"] = row["floor_us"] / us

    try:
        row["eager_us"] = wall_time_us(call, eager_calls(s), eager_warmup(s), cuda=s.cuda)
    except Exception as exc:  # noqa: BLE001
        errors.append(f"eager: {error(exc)}")
        recover(s.cuda)

    if name == "build_page_table":
        try:  # the same call with the checks done once (pagegraph.prepare_build)
            prepared = prepare_build(r2t, rpi, lens, page_table, ps, **kwargs)
            row["eager_prepared_us"] = wall_time_us(
                prepared, eager_calls(s), eager_warmup(s), cuda=s.cuda
            )
            poison(page_table, swa_page_table)
            prepared()
            sync(s.cuda)
            mismatch = check.compare(page_table, swa_page_table)
            if mismatch:
                errors.append(f"prepared: {mismatch}")
        except Exception as exc:  # noqa: BLE001
            errors.append(f"prepared: {error(exc)}")
            recover(s.cuda)
        try:
            _runner_replays(inp, check, s, row, errors)
        except Exception as exc:  # noqa: BLE001
            errors.append(f"replay: {error(exc)}")
            recover(s.cuda)
    if errors:
        row["error"] = "; ".join(errors)


def bench_config(
    cfg: BenchConfig,
    s: Settings,
    env: dict[str, Any],
    launch_floor: float | None,
    builders: Sequence[str] = tuple(BUILDERS),
) -> list[dict[str, Any]]:
    """One row per builder for ``cfg``; a failure is recorded in its row, never raised."""
    rows = [base_row(cfg, b, env, launch_floor) for b in builders]
    device = "cuda" if s.cuda else "cpu"
    inp = check = None
    try:
        with phase("bench", cfg.bs):
            inp = make_inputs(cfg, device)
            check = Check(inp)
    except Exception as exc:  # noqa: BLE001
        for row in rows:
            row["error"] = f"inputs: {error(exc)}"
        recover(s.cuda)
        return rows
    pages = live_pages(inp.lengths, cfg.page_size, cfg.width)
    nbytes = floor_bytes(pages, cfg.page_size, inp.req_to_token.element_size(), cfg.swa)
    if s.cuda:
        rotate_out_of_l2(inp, s.l2_bytes, s.builds)
    for row in rows:
        row["live_pages"] = pages
        row["bytes"] = nbytes
        row["l2_resident"] = nbytes < s.l2_bytes
        if s.bandwidth:
            row["floor_us"] = nbytes / s.bandwidth * 1e6
    for row in rows:
        with phase("bench", cfg.bs):
            try:
                bench_builder(row["builder"], inp, check, s, row)
            except Exception as exc:  # noqa: BLE001
                row["error"] = error(exc)
    del inp, check
    recover(s.cuda)
    return rows
