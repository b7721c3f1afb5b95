"""The report: targets, the Markdown of ``bench.md`` and ``tune.md``, and the sweep plots.

``targets`` turns the rows into the H200 targets (each with its measured value and whether it is
met); ``format_markdown`` writes the whole result of ``run_bench`` as Markdown (environment,
one table per config, speed-ups, the decode-metadata, replay-overhead and checker sections,
targets, sweeps); ``plot`` draws one sweep as a PNG. Nothing here measures anything.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from .bench_settings import error
from .configs import SMOKE_BS, SMOKE_CONTEXT, tokens
from .decode_bench import (
    DIFF_TARGET_US,
    EAGER_ROUND_CALLS,
    FUSED_RATIO_TARGET,
    UNFUSED_RATIO_TARGET,
    decode_summary,
)
from .floors import COPY_BYTES
from .replay_overhead import REPLAY_OVERHEAD_TARGET
from .rows import GRAPH_SAFE


def plot(sweep: dict[str, Any], path: Path, gpu: str, launch_floor: float | None) -> str | None:
    """Write one PNG; returns an error message instead of raising."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import matplotlib.ticker  # noqa: F401 - matplotlib.ticker below
    except Exception as exc:  # noqa: BLE001
        return f"matplotlib unavailable: {exc}"
    try:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        xs = sweep["x"]
        for builder, ys in sweep["series"].items():
            pts = [(x, y) for x, y in zip(xs, ys) if y is not None]
            if pts:
                ax.plot(*zip(*pts), marker="o", label=builder)
        if launch_floor:
            ax.axhline(launch_floor, color="grey", linestyle="--", label="launch floor")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
        ax.set_xticks(xs)
        if sweep["x_name"] == "max_context_len":
            ax.set_xticklabels([tokens(x) for x in xs])
            ax.set_xlabel("max context (tokens), bs 64, page size 64, lengths uniform 1..ctx")
        else:
            ax.set_xticklabels([str(x) for x in xs])
            ax.set_xlabel("batch size, context 128K, page size 64, lengths uniform 1..128K")
        ax.set_ylabel("device time per build (us, log)")
        ax.set_title(f"{sweep['name'].replace('_', ' ')} on {gpu}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        plt.close(fig)
    except Exception as exc:  # noqa: BLE001
        return f"plot {path.name}: {error(exc)}"
    return None


def _f(v: Any, digits: int = 2, none: str = "n/a") -> str:
    if v is None:
        return none
    if isinstance(v, bool):
        return "yes" if v else "NO"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


def _row_for(rows: list[dict[str, Any]], config: str, builder: str) -> dict[str, Any] | None:
    for row in rows:
        if row["config"] == config and row["builder"] == builder:
            return row
    return None


def _speedup(
    rows: list[dict[str, Any]], config: str, other: str, key: str = "device_us"
) -> float | None:
    ours = _row_for(rows, config, "build_page_table")
    theirs = _row_for(rows, config, other)
    if not ours or not theirs or not ours.get(key) or not theirs.get(key):
        return None
    ratio: float = theirs[key] / ours[key]
    return ratio


def targets(
    rows: list[dict[str, Any]],
    launch_floor: float | None,
    key: str = "device_us",
    *,
    decode: list[dict[str, Any]] | None = None,
    replay: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """The H200 targets, each with its measured value and whether it is met (``None``: not
    measured), on device times ``key`` (``device_us``: inputs rotated out of L2;
    ``device_warm_us``: the same inputs every build). A target on an inexact row is never
    met. The builder targets come from ``rows`` (none when it is empty), the decode-metadata
    targets from ``decode`` (its rows) and the runner-overhead target from ``replay``; the
    eager and overhead targets are wall times, the same for either ``key``."""
    out: list[dict[str, Any]] = []
    if rows:
        out += _builder_targets(rows, launch_floor, key)
    if decode:
        out += decode_targets(decode, key)
    if replay is not None:
        out.append(replay_target(replay))
    return out


def _builder_targets(
    rows: list[dict[str, Any]], launch_floor: float | None, key: str
) -> list[dict[str, Any]]:
    out = []

    def ours(config: str) -> dict[str, Any] | None:
        return _row_for(rows, config, "build_page_table")

    def add(target: str, value: Any, met: Any, unit: str, config: str | None) -> None:
        row = ours(config) if config else None
        if met and row is not None and row["exact"] is False:
            met = False
            target += " (inexact output)"
        out.append({"target": target, "measured": value, "unit": unit, "met": met})

    for config, limit in (("decode-large", 4.0), ("skewed", 2.0), ("ps1", 9.0), ("swa", 7.0)):
        row = ours(config)
        v = row.get(key) if row else None
        add(
            f"{config} device time <= {limit} us",
            v,
            None if v is None else v <= limit,
            "us",
            config,
        )
    for config in ("decode-small", "decode-mid"):
        row = ours(config)
        v = None
        if row and row.get(key) is not None and launch_floor is not None:
            v = row[key] - launch_floor
        add(
            f"{config} within 0.2 us of the launch floor",
            v,
            None if v is None else v <= 0.2,
            "us above floor",
            config,
        )
    v = _speedup(rows, "long-1m", "block_grid", key)
    add("long-1m >= 2x faster than block_grid", v, None if v is None else v >= 2.0, "x", "long-1m")
    for config in ("decode-large", "skewed", "long-1m", "ps1"):
        v = _speedup(rows, config, "static_width_gather", key)
        add(
            f"{config} >= 3x faster than static_width_gather",
            v,
            None if v is None else v >= 3.0,
            "x",
            config,
        )
    for field_name, what in (
        ("eager_us", "build_page_table"),
        ("eager_prepared_us", "PreparedBuild call"),
    ):
        eager = [
            (r[field_name], r["config"])
            for r in rows
            if r["builder"] == "build_page_table" and r.get(field_name) is not None
        ]
        worst, where = max(eager) if eager else (None, None)
        out.append(
            {
                "target": f"{what} eager wall time <= 12 us"
                + (f" (worst: {where})" if where else ""),
                "measured": worst,
                "unit": "us",
                "met": None if worst is None else worst <= 12.0,
            }
        )
    return out


def decode_targets(decode: list[dict[str, Any]], key: str = "device_us") -> list[dict[str, Any]]:
    """Targets of the decode-metadata rows (``pagegraph.bench.decode_bench``): the worst device-time
    difference to ``build_page_table`` over configs and draft settings (within 1 us), the
    worst eager ratio ``build_decode_metadata`` / ``build_page_table`` (at most 1.2x) and the
    smallest eager ratio unfused chain / ``build_decode_metadata`` (at least 3x). Never met
    while any config's outputs are inexact."""
    summary = decode_summary(decode)
    inexact = [s["config"] for s in summary if not s["exact"]]
    warm = key == "device_warm_us"
    diff_keys = ("diff_warm_us", "diff_draft_warm_us") if warm else ("diff_us", "diff_draft_us")
    out = []

    def add(
        target: str, pairs: list[Any], pick: Any, limit: float, at_most: bool, unit: str
    ) -> None:
        value, where = pick(pairs) if pairs else (None, None)
        met = None if value is None else (value <= limit if at_most else value >= limit)
        if where:
            target += f" (worst: {where})"
        if met and inexact:
            met = False
            target += f" (inexact output: {', '.join(inexact)})"
        out.append({"target": target, "measured": value, "unit": unit, "met": met})

    diffs = [(s[k], s["config"]) for s in summary for k in diff_keys if s[k] is not None]
    add(
        f"build_decode_metadata device time within {DIFF_TARGET_US:g} us of build_page_table",
        diffs,
        max,
        DIFF_TARGET_US,
        True,
        "us above build_page_table",
    )
    fused = [(s["fused_over_bpt"], s["config"]) for s in summary if s["fused_over_bpt"]]
    add(
        f"build_decode_metadata eager wall time <= {FUSED_RATIO_TARGET:g}x build_page_table's",
        fused,
        max,
        FUSED_RATIO_TARGET,
        True,
        "x",
    )
    unfused = [(s["unfused_over_fused"], s["config"]) for s in summary if s["unfused_over_fused"]]
    add(
        f"unfused chain eager wall time >= {UNFUSED_RATIO_TARGET:g}x build_decode_metadata's",
        unfused,
        min,
        UNFUSED_RATIO_TARGET,
        False,
        "x",
    )
    return out


def replay_target(replay: dict[str, Any]) -> dict[str, Any]:
    """The runner-overhead target: ``GraphRunner.replay()`` host time at most
    ``REPLAY_OVERHEAD_TARGET`` times a bare ``CUDAGraph.replay()``'s."""
    v = replay.get("ratio")
    target = (
        f"runner replay / bare graph replay <= {REPLAY_OVERHEAD_TARGET:g}x ({replay['config']})"
    )
    met = None if v is None else v <= REPLAY_OVERHEAD_TARGET
    if met and replay.get("exact") is False:
        met = False
        target += " (inexact output)"
    return {"target": target, "measured": v, "unit": "x", "met": met}


def format_markdown(result: dict[str, Any]) -> str:
    """``bench.md``: the whole ``run_bench`` result (see ``pagegraph.bench.bench_runner``)."""
    env = result["env"]
    rows = result["rows"]
    cuda = env.get("cuda_available")
    lines = ["# pagegraph bench", ""]
    lines += _environment_markdown(env, cuda)
    for note in result.get("notes", []):
        lines.append(f"> {note}")
    if result.get("notes"):
        lines.append("")
    configs = _config_names(rows)
    for config in configs:
        lines += _config_markdown(rows, config)
    if rows:
        lines += _speedup_markdown(rows, configs)
    if result.get("decode_metadata"):
        lines += format_decode_markdown(result["decode_metadata"], cuda)
    if result.get("replay_overhead"):
        lines += format_replay_markdown(result["replay_overhead"])
    if result.get("checker"):
        lines += format_checker_markdown(result["checker"], cuda)
    lines += _targets_markdown(result, cuda)
    lines += _sweeps_markdown(result.get("sweeps") or {}, cuda)
    for png in result.get("plots", []):
        lines.append(f"![{png}]({png})")
    return "\n".join(lines).rstrip() + "\n"


def _environment_markdown(env: dict[str, Any], cuda: bool) -> list[str]:
    """The smoke-run warning (without CUDA), the environment table and how things are timed."""
    lines = []
    if not cuda:
        lines += [
            "**No CUDA device: this is a smoke run under the Triton interpreter** with tiny "
            f"shapes (bs {SMOKE_BS}, context {SMOKE_CONTEXT}, page sizes / 4). Device times, "
            "floors and replay times need a GPU and are not reported (n/a); the eager times "
            "below are the interpreter's and say nothing about a GPU.",
            "",
        ]
    lines += ["## Environment", "", "| key | value |", "|---|---|"]
    for key in ("device", "date", "torch", "triton", "cuda", "python", "sm_count", "l2_bytes"):
        lines.append(f"| {key} | {_f(env.get(key))} |")
    lines.append("")
    if cuda:
        return lines + _gpu_method_notes(env)
    return lines + [
        f"- Eager: interpreter wall time of one call, median of {env.get('eager_calls')}.",
        "- exact: the output checked once against `expected_tables` on the live entries "
        "(replay: through `GraphRunner`, eagerly).",
        "",
    ]


def _gpu_method_notes(env: dict[str, Any]) -> list[str]:
    """The bullet list that says how each GPU figure of the tables is taken."""
    bw = env.get("bandwidth_bytes_per_s")
    builds, replays = env.get("graph_builds"), env.get("graph_replays")
    return [
        f"- Device-to-device bandwidth: {_f(bw / 1e9 if bw else None, 0)} GB/s (read + "
        f"write, a {COPY_BYTES // 2**30} GiB copy_, median of event-timed copies).",
        f"- Launch floor: {_f(env.get('launch_floor_us'))} us per graph node (an empty "
        f"one-program Triton kernel, {builds} per graph).",
        f"- Device time: a CUDA graph of {builds} builds, median of {replays} event-timed "
        f"replays, / {builds}. `device us`: the builds of one graph cycle over several "
        "`req_to_token` tables with the same requests on other pages, so page starts come "
        "from DRAM, as after a forward pass has flushed L2. `L2-warm us`: every build "
        "reads the same inputs, as a back-to-back microbenchmark sees them.",
        f"- Eager: host wall time of one call, median of {env.get('eager_calls')}; in "
        "square brackets the same build through a `PreparedBuild` (`prepare_build`: checks "
        "done once, per call only the address checks and the launch). Replay: "
        "host wall time of one `GraphRunner.replay()` including staging, median of "
        f"{env.get('replay_calls')}, from device tensors and (in brackets) from host lists.",
        "- host_max_gather cannot be captured correctly (its `.item()` freezes the width at "
        "capture): eager time only.",
        "",
    ]


def _config_names(rows: list[dict[str, Any]]) -> list[str]:
    """The configs of ``rows``, in the order they first appear."""
    configs: list[str] = []
    for row in rows:
        if row["config"] not in configs:
            configs.append(row["config"])
    return configs


def _config_markdown(rows: list[dict[str, Any]], config: str) -> list[str]:
    """One config's section: its shape, then a line per builder, then its errors."""
    first = next(r for r in rows if r["config"] == config)
    mb = first["bytes"] / 1e6 if first["bytes"] is not None else None
    lines = [
        f"## {config}",
        "",
        f"bs {first['bs']}, page size {first['page_size']}, max context "
        f"{tokens(first['max_context_len'])} (width {first['width']} pages), lengths "
        f"{first['lengths']}, SWA {'on' if first['swa'] else 'off'}; live pages "
        f"{_f(first['live_pages'])}, floor bytes {_f(first['bytes'])} ({_f(mb, 2)} MB"
        f"{', fits in L2' if first['l2_resident'] else ''}; device time cycles over "
        f"{_f(first.get('input_sets'))} input tables).",
        "",
        "| builder | device us | L2-warm us | floor us | % of floor | eager us | replay us "
        "| exact |",
        "|---|---:|---:|---:|---:|---:|---:|:---:|",
    ]
    errors = []
    for row in (r for r in rows if r["config"] == config):
        lines.append(_builder_line(row))
        if row["error"] or row["mismatch"]:
            errors.append(f"- {row['builder']}: {row['error'] or row['mismatch']}")
    lines.append("")
    if errors:
        lines += ["Errors:", "", *errors, ""]
    return lines


def _builder_line(row: dict[str, Any]) -> str:
    """A builder's line of its config's table."""
    pct = row["fraction_of_floor"] * 100 if row["fraction_of_floor"] is not None else None
    replay = _f(row["replay_us"])
    if row["replay_host_us"] is not None:
        replay += f" ({_f(row['replay_host_us'])})"
    if row["builder"] != "build_page_table":
        replay = "-"
    device = _f(row["device_us"], 2)
    if row["builder"] not in GRAPH_SAFE:
        device = "n/a (no graph)"
    exact = _f(row["exact"])
    eager = _f(row["eager_us"], 1)
    if row.get("eager_prepared_us") is not None:
        eager += f" [{_f(row['eager_prepared_us'], 1)}]"
    if row["graph_exact"] is False or row["replay_exact"] is False:
        exact += " (graph: NO)"
    return (
        f"| {row['builder']} | {device} | {_f(row.get('device_warm_us'), 2)} | "
        f"{_f(row['floor_us'], 3)} | {_f(pct, 1)} | "
        f"{eager} | {replay} | {exact} |"
    )


def _speedup_markdown(rows: list[dict[str, Any]], configs: list[str]) -> list[str]:
    """``build_page_table``'s device-time speed-up over the two baselines, per config."""
    lines = [
        "## build_page_table speed-up (device time)",
        "",
        "| config | vs static_width_gather | vs block_grid |",
        "|---|---:|---:|",
    ]
    for config in configs:
        a = _speedup(rows, config, "static_width_gather")
        b = _speedup(rows, config, "block_grid")
        lines.append(f"| {config} | {_f(a, 2)}{'x' if a else ''} | {_f(b, 2)}{'x' if b else ''} |")
    lines.append("")
    return lines


def _targets_markdown(result: dict[str, Any], cuda: bool) -> list[str]:
    """The targets, rotated and L2-warm (without CUDA: a line saying they were not checked)."""
    lines = ["## Targets (H200)", ""]
    if not cuda:
        return lines + ["Not checked: the targets are device and GPU wall times.", ""]
    for title, key in (
        ("inputs rotated out of L2 (`device_us`)", "targets"),
        ("same inputs every build, L2-warm (`device_warm_us`)", "targets_warm"),
    ):
        lines += [f"### {title}", "", "| target | measured | met |", "|---|---:|:---:|"]
        for t in result.get(key, []):
            measured = _f(t["measured"], 2)
            if t["measured"] is not None:
                measured += f" {t['unit']}"
            met = "n/a" if t["met"] is None else ("yes" if t["met"] else "no")
            lines.append(f"| {t['target']} | {measured} | {met} |")
        lines.append("")
    return lines


def _sweeps_markdown(sweeps: dict[str, Any], cuda: bool) -> list[str]:
    """A table per sweep (device us per build against its x), with its errors."""
    if not sweeps:
        return [] if cuda else ["## Sweeps", "", "Not run: device-time sweeps need a GPU.", ""]
    lines = ["## Sweeps", ""]
    for sweep in sweeps.values():
        if "series" not in sweep:
            lines += [f"- {sweep['name']}: {sweep.get('error')}", ""]
            continue
        lines += _sweep_table(sweep)
    return lines


def _sweep_table(sweep: dict[str, Any]) -> list[str]:
    xs = sweep["x"]
    label = tokens if sweep["x_name"] == "max_context_len" else str
    lines = [
        f"### {sweep['name']} (device us per build)",
        "",
        f"| builder | {' | '.join(label(x) for x in xs)} |",
        f"|---|{'---:|' * len(xs)}",
    ]
    for builder, ys in sweep["series"].items():
        cells = []
        for y, ok in zip(ys, sweep["exact"][builder]):
            cells.append(_f(y, 2) + (" (inexact)" if ok is False else ""))
        lines.append(f"| {builder} | {' | '.join(cells)} |")
    lines.append("")
    for err in sweep["errors"]:
        lines.append(f"- error: {err}")
    if sweep["errors"]:
        lines.append("")
    return lines


def _pair(a: float | None, b: float | None, digits: int = 2) -> str:
    """``"a / b"`` (rotated / L2-warm), ``n/a`` for a missing one, ``n/a`` when both are."""
    if a is None and b is None:
        return "n/a"
    return f"{_f(a, digits)} / {_f(b, digits)}"


def _x(v: float | None) -> str:
    return f"{_f(v, 2)}x" if v is not None else "n/a"


def format_decode_markdown(decode: list[dict[str, Any]], cuda: bool) -> list[str]:
    """The "Decode metadata" section: device times next to ``build_page_table``'s, eager
    times and their ratios, per config."""
    summary = {s["config"]: s for s in decode_summary(decode)}
    lines = [
        "## Decode metadata",
        "",
        "`build_decode_metadata` (lengths, both prefix sums and the page tables in one launch, "
        "`cu_seqlens_q` written) next to `build_page_table` alone and to the unfused chain "
        "`unfused_decode_metadata` (clamp, add, cumsum, fill, arange, `build_page_table`). "
        "Every output is checked once against `reference_decode_metadata` (`torch.equal`, "
        "whole buffers) before any timing, and again after a graph replay.",
        "",
    ]
    if cuda:
        lines += [
            "Device us per call, inputs rotated out of L2 / L2-warm (as the builder rows); "
            f"`- bpt`: minus `build_page_table` (target: within {DIFF_TARGET_US:g} us); "
            "`draft 4`: `draft_tokens=4`.",
            "",
            "| config | build_page_table | build_decode_metadata | - bpt | draft 4 | - bpt "
            "| unfused chain | unfused / fused | exact |",
            "|---|---:|---:|---:|---:|---:|---:|---:|:---:|",
        ]
        for config, s in summary.items():
            by = {r["variant"]: r for r in decode if r["config"] == config}

            def cell(v: str, by: dict[str, Any] = by) -> str:
                row = by.get(v) or {}
                return _pair(row.get("device_us"), row.get("device_warm_us"))

            lines.append(
                f"| {config} | {cell('build_page_table')} | {cell('build_decode_metadata')} | "
                f"{_pair(s['diff_us'], s['diff_warm_us'])} | "
                f"{cell('build_decode_metadata+draft4')} | "
                f"{_pair(s['diff_draft_us'], s['diff_draft_warm_us'])} | "
                f"{cell('unfused_decode_metadata')} | {_x(s['unfused_over_fused_device'])} | "
                f"{_f(s['exact'])} |"
            )
        lines.append("")
    lines += [
        "Eager host us per call (median of the calls, every variant of a config timed in "
        f"alternating rounds of {EAGER_ROUND_CALLS} calls with the queue drained between rounds"
        + ("" if cuda else "; the interpreter's")
        + "); the ratios are medians over the rounds of each round's ratio of medians, so a "
        "host whose speed drifts between rounds moves both sides of each pair (the ratio of "
        "the medians where a round failed and each variant was timed alone); targets: "
        f"fused / bpt <= {FUSED_RATIO_TARGET:g}x, unfused / fused >= {UNFUSED_RATIO_TARGET:g}x.",
        "",
        "| config | build_page_table | build_decode_metadata | PreparedDecodeMetadata "
        "| unfused chain | fused / bpt | prepared / bpt | unfused / fused | exact |",
        "|---|---:|---:|---:|---:|---:|---:|---:|:---:|",
    ]
    errors = []
    for config, s in summary.items():
        by = {r["variant"]: r for r in decode if r["config"] == config}

        def eager(v: str, by: dict[str, Any] = by) -> str:
            return _f((by.get(v) or {}).get("eager_us"), 1)

        lines.append(
            f"| {config} | {eager('build_page_table')} | {eager('build_decode_metadata')} | "
            f"{eager('PreparedDecodeMetadata')} | {eager('unfused_decode_metadata')} | "
            f"{_x(s['fused_over_bpt'])} | {_x(s['prepared_over_bpt'])} | "
            f"{_x(s['unfused_over_fused'])} | {_f(s['exact'])} |"
        )
        for r in by.values():
            if r["error"] or r["mismatch"]:
                errors.append(f"- {config} {r['variant']}: {r['error'] or r['mismatch']}")
    lines.append("")
    if errors:
        lines += ["Errors:", "", *errors, ""]
    return lines


def format_replay_markdown(replay: dict[str, Any]) -> list[str]:
    """The runner-overhead section: ``GraphRunner.replay()`` against a bare graph replay."""
    lines = [
        "## Runner replay vs bare graph replay",
        "",
        "Host wall time per call, median of "
        f"{_f(replay.get('calls'))} calls each, taken in alternating rounds with the queue "
        "drained between rounds: `runner.replay()` from device tensors (bucket lookup, "
        "address check, staging, padding, graph replay) and the same bucket's "
        f"`CUDAGraph.replay()` alone (target: runner / bare <= {REPLAY_OVERHEAD_TARGET:g}x).",
        "",
        "| config | bs | bucket | runner.replay() us | graph.replay() us | runner / bare | exact |",
        "|---|---:|---:|---:|---:|---:|:---:|",
        f"| {replay['config']} | {replay['bs']} | {_f(replay.get('bucket'))} | "
        f"{_f(replay.get('runner_replay_us'))} | {_f(replay.get('bare_replay_us'))} | "
        f"{_x(replay.get('ratio'))} | {_f(replay.get('exact'))} |",
        "",
    ]
    if replay.get("skipped"):
        lines += [f"Not timed: {replay['skipped']}.", ""]
    if replay.get("error"):
        lines += [f"Error: {replay['error']}", ""]
    return lines


def format_checker_markdown(checker: list[dict[str, Any]], cuda: bool) -> list[str]:
    """The "Checked replays per second" section: the checker's steady-state rate."""
    lines = [
        "## Checked replays per second",
        "",
        '`check_replay_safety("build_page_table", ...)` on the scenario, every replay '
        "verified; `replays/s` is the report's steady-state rate (start-up and capture "
        "excluded), `wall s` the whole call; `workload process` says where the workload's "
        "host models ran (`off`: in the checker's process, `on`: in child processes, one a "
        "stream); the last three columns are the mean host time of one replay's phases: the "
        "workload step, `runner.replay()`, the checker's own work."
        + ("" if cuda else " CPU: eager replays under the interpreter, a smoke run only."),
        "",
        "| scenario | detectors | workload process | replays | checked replays/s | verdict "
        "| wall s | workload us | replay us | checker us |",
        "|---|---|---|---:|---:|---|---:|---:|---:|---:|",
    ]
    notes = []
    for r in checker:
        if r.get("skipped"):
            lines.append(
                f"| {r['scenario']} | {r['detectors']} | {r.get('workload_process', 'off')} "
                "| - | - | skipped | - | - | - | - |"
            )
            notes.append(f"- {r['detectors']} skipped: {r['skipped']}")
            continue
        verdict = _f(r.get("verdict"))
        if r.get("stopped"):
            verdict += f" (stopped: {r['stopped']})"
        lines.append(
            f"| {r['scenario']} | {r['detectors']} | {r.get('workload_process', 'off')} | "
            f"{_f(r.get('replays'))} | "
            f"{_f(r.get('replays_per_s'), 0)} | {verdict} | {_f(r.get('wall_s'), 1)} | "
            f"{_f(r.get('workload_us'), 0)} | {_f(r.get('replay_us'), 1)} | "
            f"{_f(r.get('checker_us'), 0)} |"
        )
        if r.get("error"):
            notes.append(f"- {r['detectors']}: {r['error']}")
    lines.append("")
    if notes:
        lines += [*notes, ""]
    return lines


def format_tune_markdown(result: dict[str, Any]) -> str:
    """``tune.md``: the ``sweep_kernel_params`` result, one line per parameter combination."""
    rows = result["rows"]
    configs = [c["name"] for c in result["configs"]]
    d = result["defaults"]
    cuda = result["env"].get("cuda_available")
    lines = [
        "# pagegraph kernel-parameter sweep",
        "",
        f"{result['env'].get('device')}, torch {result['env'].get('torch')}, triton "
        f"{result['env'].get('triton')}, {result['env'].get('date')}; device us per build "
        f"(graph of {result['graph_builds']}, median of {result['graph_replays']} replays); "
        f"C = programs per row; current defaults BLOCK {d['block']}, TARGET {d['target']}, "
        f"warps {d['num_warps']} (marked *), UNROLL {result.get('unroll', 1)} throughout; "
        f"fastest per config in bold; took "
        f"{result['elapsed_s']:.0f} s.",
        "",
    ]
    if not cuda:
        lines += [
            "**No CUDA device: interpreter smoke run, exactness only (device times n/a).**",
            "",
        ]
    best: dict[str, float] = {}
    for r in rows:
        if r["device_us"] is not None and r["exact"]:
            best[r["config"]] = min(best.get(r["config"], math.inf), r["device_us"])
    lines += [
        f"| BLOCK | TARGET | warps | {' | '.join(configs)} |",
        f"|---:|---:|---:|{'---:|' * len(configs)}",
    ]
    combos: list[tuple[Any, ...]] = []
    for r in rows:
        key = (r["block"], r["target"], r["num_warps"])
        if key not in combos:
            combos.append(key)
    errors = []
    for key in combos:
        cells = []
        for name in configs:
            r = next(
                (
                    x
                    for x in rows
                    if (x["block"], x["target"], x["num_warps"]) == key and x["config"] == name
                ),
                None,
            )
            if r is None:
                cells.append("")
                continue
            cell = _f(r["device_us"], 2)
            if r["device_us"] is not None and r["device_us"] == best.get(name):
                cell = f"**{cell}**"
            if r["exact"] is False:
                cell += " (inexact)"
            cell += f" C={r['programs_per_row']}"
            cells.append(cell)
            if r["error"]:
                errors.append(f"- {name} {key}: {r['error']}")
        mark = "*" if key == (d["block"], d["target"], d["num_warps"]) else ""
        lines.append(f"| {key[0]}{mark} | {key[1]} | {key[2]} | {' | '.join(cells)} |")
    lines.append("")
    if errors:
        lines += ["Errors:", "", *errors[:50], ""]
    return "\n".join(lines)
