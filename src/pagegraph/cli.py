"""The ``pagegraph`` command line (also ``python -m pagegraph``).

    pagegraph check [SCENARIO ...]   capture, replay, verify every replay, detect syncs
    pagegraph kernel-table           the kernel against the reference over default shapes
    pagegraph bench                  the benchmark suite (what ``make bench`` runs)
    pagegraph profile [SCENARIO]     an Nsight Systems (or torch.profiler) trace, analysed
    pagegraph trace FILE             analyse a trace; --forbid-sync fails on syncs in ranges
    pagegraph sync-table             which detector catches which planted sync

Exit codes of ``check``: 0 safe, 1 unsafe (the first failing replay is shown), 2 bad usage or a
bad scenario file (nothing is run then).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

DEFAULT_SCENARIO = "graphs/default.toml"


# -- check ------------------------------------------------------------------------------------


def _progress(label: str):
    last = [0.0]

    def show(done: int, total: int) -> None:
        now = time.monotonic()
        if done != total and now - last[0] < 0.5:
            return
        last[0] = now
        width = 30
        filled = width * done // total
        bar = "#" * filled + "-" * (width - filled)
        end = "\n" if done == total else ""
        print(f"\r{label} [{bar}] {done}/{total}", end=end, file=sys.stderr, flush=True)

    return show


def _parse_detectors(value: str | None):
    if value is None:
        return None
    if value in ("auto", "none"):
        return "auto" if value == "auto" else ()
    names = tuple(v.strip() for v in value.split(",") if v.strip())
    for n in names:
        if n not in ("torch", "cupti"):
            raise ValueError(f"unknown detector {n!r}: use auto, none, torch, cupti or torch,cupti")
    return names


def run_check(
    scenarios: list[str],
    *,
    replays: int | None = None,
    builder: str | None = None,
    detectors: str | None = None,
    json_path: str | None = None,
    markdown_path: str | None = None,
    quiet: bool = False,
) -> int:
    from .builders import resolve_builder
    from .checker import check_replay_safety
    from .environment import environment
    from .scenario import ScenarioError, load_scenario

    # Load and validate everything first: a bad file must not leave a half-run.
    try:
        loaded = [load_scenario(p) for p in scenarios]
        dets = _parse_detectors(detectors)
        fns = [resolve_builder(builder or s.builder) for s in loaded]
    except (ScenarioError, ValueError) as exc:
        print(f"pagegraph check: {exc}", file=sys.stderr)
        return 2
    if replays is not None and replays < 1:
        print("pagegraph check: --replays must be >= 1", file=sys.stderr)
        return 2

    from .sync import DetectorUnavailable

    results = []
    exit_code = 0
    for scenario, fn in zip(loaded, fns):
        cfg = scenario.config
        if replays is not None:
            cfg = cfg.replace(steps=replays)
        if dets is not None:
            cfg = cfg.replace(detectors=dets)
        progress = None if quiet or cfg.steps < 200 else _progress(scenario.name)
        try:
            report = check_replay_safety(fn, cfg, progress=progress)
        except DetectorUnavailable as exc:
            print(f"pagegraph check: {scenario.path}: {exc}", file=sys.stderr)
            return 2
        results.append((scenario, report))
        if not quiet:
            print(f"## {scenario.name} ({scenario.path})")
            if scenario.description:
                print(scenario.description)
            print()
            print(report.format())
            print()
        if not report.safe:
            exit_code = 1
    safe = sum(r.safe for _, r in results)
    print(f"pagegraph check: {safe}/{len(results)} scenario(s) safe")
    if json_path:
        doc = {
            "environment": environment(),
            "scenarios": [{"name": s.name, "path": s.path, **r.to_dict()} for s, r in results],
        }
        Path(json_path).parent.mkdir(parents=True, exist_ok=True)
        Path(json_path).write_text(json.dumps(doc, indent=2, default=str))
    if markdown_path:
        write_markdown_report(markdown_path, results)
    return exit_code


def write_markdown_report(path: str, results) -> None:
    """A markdown report with, where matplotlib is present, a PNG of replay latency per
    bucket beside it (``PATH`` with suffix ``.png``)."""
    from .environment import environment

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    env = environment()
    lines = ["# pagegraph check", "", f"{env['date']} on {env['device']}", ""]
    for scenario, report in results:
        lines += [f"## {scenario.name}", "", scenario.description, "", report.format(), ""]
    png = path.with_suffix(".png")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 4))
        for scenario, report in results:
            stats = sorted(report.buckets.values(), key=lambda b: b.bucket)
            ax.plot(
                [b.bucket for b in stats],
                [b.median_replay_us for b in stats],
                marker="o",
                label=scenario.name,
            )
        ax.set_xlabel("batch bucket")
        ax.set_ylabel("replay() wall time, median (us)")
        ax.set_xscale("log", base=2)
        ax.grid(True, alpha=0.3)
        ax.legend()
        ax.set_title(f"replay latency per bucket ({env['device']})")
        fig.tight_layout()
        fig.savefig(png, dpi=120)
        plt.close(fig)
        lines += [f"![replay latency per bucket]({png.name})", ""]
    except ImportError:
        lines += ["(matplotlib not installed: no plot)", ""]
    path.write_text("\n".join(lines))


def run_check_for_profile(scenario: str, replays: int | None = None) -> int:
    """``check`` as ``pagegraph profile`` runs it in-process (torch detector only: CUPTI has
    one subscriber per process, and a profiler is it)."""
    return run_check([scenario], replays=replays, detectors="torch", quiet=False)


# -- kernel-table -------------------------------------------------------------------------------


def run_kernel_table() -> int:
    """The kernel against the reference over a default set of shapes, on whatever device is
    present (the Triton interpreter on a CPU). Exit 1 on any mismatch."""
    import torch

    from .checker import POISON, expected_tables
    from .environment import environment
    from .kernel import build_page_table

    cuda = torch.cuda.is_available()
    dev = "cuda" if cuda else "cpu"
    shapes = (
        [
            (8, 4096, 64, False),
            (64, 32768, 64, False),
            (256, 131072, 64, False),
            (256, 32768, 1, False),
            (128, 65536, 16, True),
            (256, 131072, 256, False),
            (17, 3000, 3, True),
        ]
        if cuda
        else [(4, 256, 16, False), (7, 300, 3, True), (17, 128, 1, False), (3, 1024, 64, True)]
    )
    print(f"kernel vs reference on {environment()['device']}")
    print("| bs | max context | page size | SWA | exact | eager us |")
    print("|---:|---:|---:|:---:|:---:|---:|")
    gen = torch.Generator().manual_seed(0)
    failures = 0
    for bs, ctx, ps, swa in shapes:
        width = -(-ctx // ps)
        num_slots = (bs + 1) * width * ps + 1
        r2t = torch.randint(0, num_slots, (bs + 1, ctx), generator=gen, dtype=torch.int32).to(dev)
        rpi = torch.randperm(bs + 1, generator=gen)[:bs].to(dev)
        sl = torch.randint(0, ctx + 2 * ps, (bs,), generator=gen).to(dev)
        f2s = torch.randint(0, num_slots, (num_slots + 1,), generator=gen).to(dev) if swa else None
        pt = torch.full((bs, width), POISON, dtype=torch.int32, device=dev)
        kw = {}
        if swa:
            kw = {"swa_page_table": torch.full_like(pt, POISON), "full_to_swa": f2s}
        build_page_table(r2t, rpi, sl, pt, ps, **kw)  # warm-up / compile
        t0 = time.perf_counter()
        reps = 20 if cuda else 1
        for _ in range(reps):
            build_page_table(r2t, rpi, sl, pt, ps, **kw)
        if cuda:
            torch.cuda.synchronize()
        us = (time.perf_counter() - t0) / reps * 1e6
        want, want_swa = expected_tables(r2t, rpi, sl, width, ps, f2s)
        exact = torch.equal(pt, want) and (not swa or torch.equal(kw["swa_page_table"], want_swa))
        failures += not exact
        print(
            f"| {bs} | {ctx} | {ps} | {'yes' if swa else 'no'} | "
            f"{'yes' if exact else 'NO'} | {us:.1f} |"
        )
    if not cuda:
        print("(CPU: Triton interpreter; times are the interpreter's, not a GPU's)")
    return 1 if failures else 0


# -- entry point --------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pagegraph", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("check", help="judge graph-replay safety of scenarios")
    p.add_argument("scenarios", nargs="*", default=[DEFAULT_SCENARIO], metavar="SCENARIO")
    p.add_argument("--replays", type=int, help="replays per scenario (default: its steps)")
    p.add_argument("--builder", help="built-in builder name or module:function")
    p.add_argument("--detectors", help="auto (default), none, torch, cupti or torch,cupti")
    p.add_argument("--json", dest="json_path", metavar="PATH", help="machine-readable report")
    p.add_argument(
        "--markdown",
        dest="markdown_path",
        metavar="PATH",
        help="markdown report (+ PNG plot of replay latency per bucket)",
    )
    p.add_argument("--quiet", action="store_true", help="only the summary line")

    sub.add_parser("kernel-table", help="kernel vs reference over default shapes")

    from . import bench, profile, trace

    bench.add_arguments(sub.add_parser("bench", help="benchmark suite"))
    profile.add_arguments(sub.add_parser("profile", help="Nsight Systems profile of a scenario"))
    trace.add_arguments(sub.add_parser("trace", help="analyse an nsys SQLite or torch trace"))
    s = sub.add_parser("sync-table", help="which detector catches which planted sync")
    s.add_argument("--json", dest="json_path", metavar="PATH")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "check":
        return run_check(
            args.scenarios,
            replays=args.replays,
            builder=args.builder,
            detectors=args.detectors,
            json_path=args.json_path,
            markdown_path=args.markdown_path,
            quiet=args.quiet,
        )
    if args.command == "kernel-table":
        return run_kernel_table()
    if args.command == "sync-table":
        from .sync import detector_matrix, format_detector_matrix

        rows = detector_matrix()
        print(format_detector_matrix(rows))
        if args.json_path:
            Path(args.json_path).write_text(json.dumps(rows, indent=2, default=str))
        return 0
    from . import bench, profile, trace

    module = {"bench": bench, "profile": profile, "trace": trace}[args.command]
    return module.run(args)


if __name__ == "__main__":
    sys.exit(main())
