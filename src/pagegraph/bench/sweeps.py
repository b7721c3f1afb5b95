"""The "sweeps" section (device time against batch size and against context, for the plots)
and the kernel-parameter sweep (``pagegraph bench --tune``).

Both time builds the way the builder rows do: a CUDA graph of builds cycling over tables
rotated out of L2 (``inputs.Rotation``), each builder checked exactly first.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from ..detect.ranges import phase
from ..kernels import page_table as _kernel
from ..kernels.contract import cdiv
from ..kernels.page_table import build_page_table
from ..runtime.timing import device_time_us, sync
from .bench_report import format_tune_markdown
from .bench_settings import Settings, bench_environment, error, recover
from .configs import TUNE_CONFIGS, BenchConfig, K, get_config, smoke_config, tokens
from .floors import DEFAULT_L2_BYTES
from .inputs import Check, Rotation, make_inputs, make_outputs, rotate_out_of_l2
from .rows import BUILDERS

#: Sweeps for the plots: (bs values at 128K context) and (context values at bs 64).
SWEEP_BS = (1, 8, 32, 64, 128, 256, 512)
SWEEP_CONTEXT = (2 * K, 8 * K, 32 * K, 128 * K, 512 * K, 1024 * K)
SWEEP_BUILDERS = ("build_page_table", "block_grid", "static_width_gather")


def _sweep(
    name: str,
    x_name: str,
    configs: list[tuple[int, BenchConfig]],
    fixed: dict[str, Any],
    s: Settings,
) -> dict[str, Any]:
    series: dict[str, list[Any]] = {b: [] for b in SWEEP_BUILDERS}
    exact: dict[str, list[Any]] = {b: [] for b in SWEEP_BUILDERS}
    errors: list[str] = []
    for x, cfg in configs:
        inp = check = None
        try:
            inp = make_inputs(cfg, "cuda")
            check = Check(inp)
        except Exception as exc:  # noqa: BLE001
            errors.append(f"{x_name}={x}: inputs: {error(exc)}")
            for b in SWEEP_BUILDERS:
                series[b].append(None)
                exact[b].append(None)
            recover(True)
            continue
        rotate_out_of_l2(inp, s.l2_bytes, s.builds)  # as for the config rows
        tables = [*inp.rotated, inp.req_to_token]
        for b in SWEEP_BUILDERS:
            fn = BUILDERS[b]
            page_table, swa_page_table, kwargs = make_outputs(inp)
            rest = (inp.req_pool_indices, inp.seq_lens, page_table, cfg.page_size)
            rotation = Rotation(fn, tables, rest, kwargs)
            graph = None
            try:
                fn(inp.req_to_token, *rest, **kwargs)
                torch.cuda.synchronize()
                exact[b].append(check.compare(page_table, swa_page_table) is None)
                us, graph = device_time_us(rotation, s.builds, s.replays, rotation.reset)
                series[b].append(us)
            except Exception as exc:  # noqa: BLE001
                errors.append(f"{x_name}={x} {b}: {error(exc)}")
                series[b].append(None)
                if len(exact[b]) < len(series[b]):
                    exact[b].append(None)
            finally:
                del graph
                recover(True)
        del inp, check
        recover(True)
    return {
        "name": name,
        "x_name": x_name,
        "x": [x for x, _ in configs],
        "fixed": fixed,
        "series": series,
        "exact": exact,
        "errors": errors,
    }


def run_sweeps(s: Settings, quick: bool = False) -> dict[str, Any]:
    """``{"device_time_vs_bs": sweep, "device_time_vs_context": sweep}`` (CUDA only): each
    sweep has ``x``, ``series[builder]`` (device us per build, ``None`` where it failed),
    ``exact[builder]`` and ``errors``; a sweep that could not run holds ``error`` instead."""
    bs_values = (1, 64, 512) if quick else SWEEP_BS
    ctx_values = (2 * K, 128 * K, 1024 * K) if quick else SWEEP_CONTEXT
    by_bs = [
        (bs, BenchConfig(f"sweep-bs{bs}", bs, 64, 128 * K, ("uniform", 1, 128 * K)))
        for bs in bs_values
    ]
    by_ctx = [
        (ctx, BenchConfig(f"sweep-ctx{tokens(ctx)}", 64, 64, ctx, ("uniform", 1, ctx)))
        for ctx in ctx_values
    ]
    sweeps = {}
    for key, x_name, configs, fixed in (
        (
            "device_time_vs_bs",
            "bs",
            by_bs,
            {"page_size": 64, "max_context_len": 128 * K, "lengths": "uniform 1..128K"},
        ),
        (
            "device_time_vs_context",
            "max_context_len",
            by_ctx,
            {"bs": 64, "page_size": 64, "lengths": "uniform 1..max_context_len"},
        ),
    ):
        with phase("bench"):
            try:
                sweeps[key] = _sweep(key, x_name, configs, fixed, s)
            except Exception as exc:  # noqa: BLE001
                sweeps[key] = {"name": key, "x_name": x_name, "error": error(exc)}
    return sweeps


# -- tune -------------------------------------------------------------------------------------


def sweep_kernel_params(
    config_names: Sequence[str] | None = None,
    blocks: Sequence[int] = (64, 128, 256, 512),
    targets: Sequence[int] = (1024, 2048, 4096, 8192),
    num_warps: Sequence[int] = (4, 8),
    *,
    out_dir: str | Path = "profiles/bench",
    builds: int = 10,
    replays: int = 10,
) -> dict[str, Any]:
    """Device time of ``build_page_table`` per config for every (``BLOCK_PAGES``,
    ``TARGET_PROGRAMS``, ``NUM_WARPS``) combination; writes ``tune.json`` and ``tune.md``.

    The kernel module's globals are patched and restored afterwards (``programs_per_row``
    reads them, so the programs per row follow the block being tried), and its fast-launch
    cache (``page_table.launch_cache``) is cleared at every change. ``UNROLL`` stays at the
    kernel's value. Each combination is checked exactly.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    cuda = torch.cuda.is_available()
    env = bench_environment(cuda)
    names = list(config_names or TUNE_CONFIGS)
    cfgs = [get_config(n) for n in names]
    if not cuda:
        cfgs = [smoke_config(c) for c in cfgs]
    device = "cuda" if cuda else "cpu"
    prepared: dict[str, tuple[Any, ...]] = {}
    results: list[dict[str, Any]] = []
    input_errors: dict[str, str] = {}
    for cfg in cfgs:
        try:
            inp = make_inputs(cfg, device)
            if cuda:
                rotate_out_of_l2(inp, env.get("l2_bytes") or DEFAULT_L2_BYTES, builds)
            prepared[cfg.name] = (inp, Check(inp))
        except Exception as exc:  # noqa: BLE001
            input_errors[cfg.name] = error(exc)
            recover(cuda)

    saved = (_kernel.BLOCK_PAGES, _kernel.TARGET_PROGRAMS, _kernel.NUM_WARPS)
    t_start = time.perf_counter()
    try:
        for block in blocks:
            for target in targets:
                for warps in num_warps:
                    _kernel.BLOCK_PAGES = block
                    _kernel.TARGET_PROGRAMS = target
                    _kernel.NUM_WARPS = warps
                    _kernel.launch_cache.clear()
                    for cfg in cfgs:
                        results.append(
                            _tune_one(
                                cfg,
                                prepared,
                                input_errors,
                                block,
                                target,
                                warps,
                                cuda,
                                builds,
                                replays,
                            )
                        )
    finally:
        _kernel.BLOCK_PAGES, _kernel.TARGET_PROGRAMS, _kernel.NUM_WARPS = saved
        _kernel.launch_cache.clear()
    elapsed = time.perf_counter() - t_start
    prepared.clear()
    recover(cuda)

    result = {
        "env": env,
        "configs": [asdict(c) for c in cfgs],
        "defaults": {"block": saved[0], "target": saved[1], "num_warps": saved[2]},
        "unroll": _kernel.UNROLL,
        "graph_builds": builds,
        "graph_replays": replays,
        "elapsed_s": elapsed,
        "rows": results,
    }
    markdown = format_tune_markdown(result)
    (out / "tune.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
    (out / "tune.md").write_text(markdown)
    print(markdown)
    return result


def _tune_one(
    cfg: Any,
    prepared: Any,
    input_errors: Any,
    block: Any,
    target: Any,
    warps: Any,
    cuda: Any,
    builds: Any,
    replays: Any,
) -> dict[str, Any]:
    row = {
        "config": cfg.name,
        "block": block,
        "target": target,
        "num_warps": warps,
        "programs_per_row": None,
        "device_us": None,
        "exact": None,
        "error": input_errors.get(cfg.name),
    }
    if cfg.name not in prepared:
        return row
    inp, check = prepared[cfg.name]
    max_pages = min(cfg.width, cdiv(inp.req_to_token.shape[1], cfg.page_size))
    row["programs_per_row"] = _kernel.programs_per_row(cfg.bs, max_pages)
    page_table, swa_page_table, kwargs = make_outputs(inp)
    args = (inp.req_to_token, inp.req_pool_indices, inp.seq_lens, page_table, cfg.page_size)
    graph = None
    try:
        build_page_table(*args, **kwargs)
        sync(cuda)
        mismatch = check.compare(page_table, swa_page_table)
        row["exact"] = mismatch is None
        if mismatch:
            row["error"] = mismatch
        if cuda:
            rotation = Rotation(build_page_table, [*inp.rotated, args[0]], args[1:], kwargs)
            us, graph = device_time_us(rotation, builds, replays, rotation.reset)
            row["device_us"] = us
    except Exception as exc:  # noqa: BLE001
        row["error"] = error(exc)
    finally:
        del graph
        recover(cuda)
    return row
