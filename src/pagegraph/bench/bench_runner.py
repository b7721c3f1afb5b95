"""Running the suite: ``run_bench`` and the ``pagegraph bench`` command line.

(Not to be confused with ``pagegraph.graph.runner``, the ``GraphRunner`` under test: this module
runs the benchmark sections.) ``run_bench`` measures the floors, runs the chosen sections in
order (``SECTIONS``), computes the targets, and writes ``bench.json``, ``bench.md`` and the
sweep PNGs. ``add_arguments`` / ``run`` are what ``pagegraph.cli`` plugs in; ``main`` is
``python -m pagegraph.bench``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from ..detect.ranges import phase
from ..runtime.progress import Progress
from .bench_report import format_markdown, plot, targets
from .bench_settings import Settings, bench_environment, error, make_settings, recover
from .checker_rate import bench_checker
from .configs import CONFIG_NAMES, TUNE_CONFIGS, BenchConfig, get_config, smoke_config
from .decode_bench import bench_decode_config, decode_summary
from .floors import DEFAULT_L2_BYTES, measure_bandwidth, measure_launch_floor
from .replay_overhead import bench_replay_overhead
from .rows import bench_config
from .sweeps import run_sweeps, sweep_kernel_params

#: Sections of a run, in the order they run. ``builders``: a row per (config, builder);
#: ``replay``: runner replay vs bare graph replay; ``metadata``: decode metadata per config;
#: ``sweeps``: device time vs batch size and context (GPU only, and the plots); ``checker``:
#: checked replays per second (last: the CUPTI detector subscribes to the process).
SECTIONS = ("builders", "replay", "metadata", "sweeps", "checker")


def run_bench(
    out_dir: str | Path = "profiles/bench",
    configs: Sequence[str] | None = None,
    quick: bool = False,
    plots: bool = True,
    sweeps: bool = True,
    only: Sequence[str] | None = None,
) -> dict[str, Any]:
    """Run the suite and write ``bench.json``, ``bench.md`` and (with a GPU) the two sweep
    PNGs into ``out_dir``; returns the result dict and prints the markdown.

    The result holds ``env``, ``sections`` (those run), ``rows`` (builders), ``targets`` /
    ``targets_warm``, ``decode_metadata`` (rows) and ``decode_metadata_summary``,
    ``replay_overhead``, ``checker`` (rows), ``sweeps``, ``notes`` and ``plots``; a section
    not run leaves its key empty.

    ``configs``: names from ``CONFIG_NAMES`` (default all), for the builder and metadata
    sections. ``quick``: fewer calls and replays, three points per sweep, fewer checked
    replays. ``sweeps=False`` drops the sweeps; ``only``: run just these ``SECTIONS``.
    Without CUDA: a tiny smoke run under the interpreter.
    """
    sections = _chosen_sections(only, sweeps)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    cuda = torch.cuda.is_available()
    chosen = [get_config(n) for n in (configs or CONFIG_NAMES)]
    env = bench_environment(cuda)
    s = make_settings(cuda, quick, env.get("l2_bytes") or DEFAULT_L2_BYTES)
    notes: list[str] = []
    _measure_floors(env, s, cuda and ("builders" in sections or "sweeps" in sections), notes)
    if not cuda:
        chosen = [smoke_config(c) for c in chosen]
    notes += _run_notes(cuda, quick, only, sections)
    env.update(
        graph_builds=s.builds if cuda else None,
        graph_replays=s.replays if cuda else None,
        eager_calls=s.eager_calls,
        replay_calls=s.replay_calls if cuda else None,
        quick=quick,
    )
    result: dict[str, Any] = {"env": env, "sections": sections}
    measured = _run_sections(sections, chosen, s, env, quick, (out if plots else None), notes)
    rows, decode, replay = measured["rows"], measured["decode"], measured["replay"]
    lf = env["launch_floor_us"]
    result.update(
        rows=rows,
        targets=targets(rows, lf, decode=decode, replay=replay) if cuda else [],
        targets_warm=(
            targets(rows, lf, "device_warm_us", decode=decode, replay=replay) if cuda else []
        ),
        decode_metadata=decode,
        decode_metadata_summary=decode_summary(decode),
        replay_overhead=replay,
        checker=measured["checker"],
        sweeps=measured["sweeps"],
        notes=notes,
        plots=measured["plots"],
    )
    _write_outputs(result, out)
    return result


def _chosen_sections(only: Sequence[str] | None, sweeps: bool) -> list[str]:
    """The ``SECTIONS`` to run, in order; ``ValueError`` for a name that is not one."""
    unknown = sorted(set(only or ()) - set(SECTIONS))
    if unknown:
        raise ValueError(f"unknown bench section(s) {unknown}: use {', '.join(SECTIONS)}")
    return [x for x in SECTIONS if (not only or x in only) and (sweeps or x != "sweeps")]


def _measure_floors(env: dict[str, Any], s: Settings, wanted: bool, notes: list[str]) -> None:
    """Set ``env``'s bandwidth and launch floor (``None`` unless ``wanted`` and measured; a
    failed measurement adds a note and leaves the device usable)."""
    env["bandwidth_bytes_per_s"] = None
    env["launch_floor_us"] = None
    if not wanted:
        return
    try:
        with phase("bench"):
            env["bandwidth_bytes_per_s"] = s.bandwidth = measure_bandwidth()
    except Exception as exc:  # noqa: BLE001
        notes.append(f"bandwidth not measured ({error(exc)}): floor_us is n/a")
        recover(True)
    try:
        with phase("bench"):
            env["launch_floor_us"] = measure_launch_floor(s.builds, s.replays)
    except Exception as exc:  # noqa: BLE001
        notes.append(f"launch floor not measured: {error(exc)}")
        recover(True)


def _run_notes(
    cuda: bool, quick: bool, only: Sequence[str] | None, sections: list[str]
) -> list[str]:
    """The report's notes on what kind of run this is."""
    notes = []
    if not cuda:
        notes.append(
            "CPU smoke run (Triton interpreter): device fields are None; run on a GPU for "
            "device times, floors, replay times and sweeps."
        )
    if quick:
        notes.append("quick run: fewer calls and replays, three points per sweep")
    if only:
        notes.append(f"sections run: {', '.join(sections)} (--only)")
    return notes


def _run_sections(
    sections: list[str],
    chosen: list[BenchConfig],
    s: Settings,
    env: dict[str, Any],
    quick: bool,
    plot_dir: Path | None,
    notes: list[str],
) -> dict[str, Any]:
    """Run the chosen sections in order: ``rows``, ``replay``, ``decode``, ``sweeps`` (and
    their ``plots``, drawn into ``plot_dir`` unless it is ``None``) and ``checker``, each
    empty (``None`` for ``replay``) when its section is not run."""
    cuda = s.cuda
    measured: dict[str, Any] = {"rows": [], "replay": None, "decode": [], "sweeps": {}, "plots": []}
    measured["checker"] = []
    total = (
        len(chosen) * (("builders" in sections) + ("metadata" in sections))
        + ("replay" in sections)
        + (cuda and "sweeps" in sections)
        + ("checker" in sections)
    )
    # Each item's "[bench] ..." line, and a line with the time left at least every 5 s.
    progress = Progress("pagegraph bench", total, "items")
    with progress.heartbeat():
        if "builders" in sections:
            for cfg in chosen:
                _progress(f"{cfg.name} ...", progress)
                measured["rows"] += bench_config(cfg, s, env, env["launch_floor_us"])
        if "replay" in sections:
            _progress("runner replay vs bare graph replay ...", progress)
            measured["replay"] = bench_replay_overhead(s)
        if "metadata" in sections:
            for cfg in chosen:
                _progress(f"decode metadata {cfg.name} ...", progress)
                measured["decode"] += bench_decode_config(cfg, s)
        if cuda and "sweeps" in sections:
            _progress("sweeps ...", progress)
            measured["sweeps"] = run_sweeps(s, quick)
            if plot_dir is not None:
                measured["plots"] = _plot_sweeps(measured["sweeps"], plot_dir, env, notes)
        if "checker" in sections:
            _progress("checker throughput ...", progress)
            measured["checker"] = bench_checker(cuda, quick)
        progress.update(total)
    return measured


def _plot_sweeps(
    sweeps: dict[str, Any], out: Path, env: dict[str, Any], notes: list[str]
) -> list[str]:
    """Draw each sweep that has series into ``out``; the PNGs' names (a failure: a note)."""
    plot_names: list[str] = []
    for key, sweep in sweeps.items():
        if "series" not in sweep:
            continue
        name = f"{key}.png"
        err = plot(sweep, out / name, env["device"], env["launch_floor_us"])
        if err:
            notes.append(err)
        else:
            plot_names.append(name)
    return plot_names


def _write_outputs(result: dict[str, Any], out: Path) -> None:
    """Write ``bench.json`` and ``bench.md`` and print the markdown."""
    markdown = format_markdown(result)
    (out / "bench.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
    (out / "bench.md").write_text(markdown)
    print(markdown)


def _progress(what: str, progress: Progress | None = None) -> None:
    """Say what starts now; the item before it is done (``progress`` advances)."""
    if progress is not None:
        if progress.detail:
            progress.advance()
        progress.detail = what.removesuffix(" ...")
    print(f"[bench] {what}", file=sys.stderr, flush=True)


def failures(result: dict[str, Any]) -> list[str]:
    """What went wrong in a ``run_bench`` result, one line each: a row with an error or an
    inexact output in any section, a checker run that was not SAFE (skipped runs aside)."""
    bad = []
    for r in result.get("rows", []):
        if r["error"] or False in (r["exact"], r["graph_exact"], r["replay_exact"]):
            bad.append(f"{r['config']} {r['builder']}: {r['error'] or r['mismatch'] or 'inexact'}")
    for r in result.get("decode_metadata", []):
        if r["error"] or False in (r["exact"], r["graph_exact"]):
            why = r["error"] or r["mismatch"] or "inexact after a graph replay"
            bad.append(f"{r['config']} {r['variant']}: {why}")
    replay = result.get("replay_overhead")
    if replay and (replay["error"] or replay["exact"] is False):
        bad.append(f"replay overhead: {replay['error'] or 'inexact'}")
    for r in result.get("checker", []):
        if r["skipped"]:
            continue
        if r["error"] or r["verdict"] != "SAFE":
            where = f"{r['detectors']}, workload process {r.get('workload_process', 'off')}"
            bad.append(f"checker ({where}): {r['error'] or r['verdict']}")
    return bad


def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Arguments of ``pagegraph bench``."""
    parser.description = parser.description or (
        "Benchmark suite: the page-table builders against the two floors they cannot beat, "
        "replay overhead, decode metadata and the checker's rate, into the output folder."
    )
    parser.add_argument("--out", default="profiles/bench", help="output folder")
    parser.add_argument(
        "--configs",
        nargs="+",
        metavar="NAME",
        choices=CONFIG_NAMES,
        help=f"configs to run (default all: {', '.join(CONFIG_NAMES)})",
    )
    parser.add_argument(
        "--quick", action="store_true", help="fewer calls and replays, 3 points per sweep"
    )
    parser.add_argument("--no-plots", action="store_true", help="do not write the PNGs")
    parser.add_argument("--no-sweeps", action="store_true", help="skip the plot sweeps")
    parser.add_argument(
        "--only",
        nargs="+",
        metavar="SECTION",
        choices=SECTIONS,
        help=f"run only these sections (of {', '.join(SECTIONS)})",
    )
    parser.add_argument(
        "--tune",
        action="store_true",
        help="sweep BLOCK_PAGES x TARGET_PROGRAMS x NUM_WARPS instead (tune.json, tune.md); "
        f"default configs {', '.join(TUNE_CONFIGS)}",
    )
    return parser


def run(args: argparse.Namespace) -> int:
    """``pagegraph bench``: 0 when every row ran and was exact, 1 otherwise."""
    if getattr(args, "tune", False):
        result = sweep_kernel_params(args.configs, out_dir=args.out)
        bad = [r for r in result["rows"] if r["error"] or r["exact"] is False]
        return 1 if bad else 0
    result = run_bench(
        out_dir=args.out,
        configs=args.configs,
        quick=args.quick,
        plots=not args.no_plots,
        sweeps=not getattr(args, "no_sweeps", False),
        only=getattr(args, "only", None),
    )
    bad = failures(result)
    for line in bad:
        print(f"pagegraph bench: {line}", file=sys.stderr)
    return 1 if bad else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pagegraph.bench",
        description="Benchmark suite: the page-table builders against the two floors they "
        "cannot beat.",
    )
    add_arguments(parser)
    return run(parser.parse_args(argv))
