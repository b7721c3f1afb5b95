"""The ``pagegraph`` command line (also ``python -m pagegraph``).

    pagegraph check [SCENARIO ...]   capture, replay, verify every replay, detect syncs
    pagegraph mutate [SCENARIO ...]  the checker against the mutant zoo: the kill table
    pagegraph kernel-table           the kernel against the reference over default shapes
    pagegraph bench                  the benchmark suite (what ``make bench`` runs)
    pagegraph profile [SCENARIO]     an Nsight Systems (or torch.profiler) trace, analysed
    pagegraph trace FILE             analyse a trace; --forbid-sync fails on syncs in ranges
    pagegraph sync-table             which detector catches which planted sync

Exit codes of ``check``: 0 safe, 1 unsafe or incomplete (the first failing replay is shown),
2 bad usage, a bad scenario file or one that does not fit the GPU (nothing is run then), 130
after Ctrl-C and 143 after SIGTERM (the reports then hold everything checked so far, marked
incomplete).

This module only parses arguments and dispatches: the jobs are ``pagegraph.check_job``
(``check``, ``kernel-table``), ``pagegraph.mutate``, ``pagegraph.bench``,
``pagegraph.profile`` and ``pagegraph.trace``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .check.checker import WORKLOAD_PROCESS_MODES

# The check job lives in pagegraph.check_job; run_check stays importable from here.
from .jobs.check_job import run_check, run_kernel_table

__all__ = ["DEFAULT_SCENARIO", "build_parser", "main", "run_check"]

DEFAULT_SCENARIO = "graphs/default.toml"


# -- entry point --------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pagegraph", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("check", help="judge graph-replay safety of scenarios")
    p.add_argument("scenarios", nargs="*", default=[DEFAULT_SCENARIO], metavar="SCENARIO")
    p.add_argument("--replays", type=int, help="replays per scenario (default: its steps)")
    p.add_argument("--builder", help="built-in builder name or module:function")
    p.add_argument("--detectors", help="auto (default), none, torch, cupti or torch,cupti")
    p.add_argument(
        "--workload-process",
        choices=WORKLOAD_PROCESS_MODES,
        help="run the workload's host models in child processes (default: the scenario's "
        "[check] workload_process, auto: for CUDA runs of 1000+ replays)",
    )
    p.add_argument("--json", dest="json_path", metavar="PATH", help="machine-readable report")
    p.add_argument(
        "--markdown",
        dest="markdown_path",
        metavar="PATH",
        help="markdown report (+ PNG plot of replay latency per bucket)",
    )
    p.add_argument("--quiet", action="store_true", help="only the summary line")
    iso = p.add_mutually_exclusive_group()
    iso.add_argument(
        "--isolate",
        dest="isolate",
        action="store_true",
        default=None,
        help="run each scenario in a child process, so a crashing builder cannot take the run "
        "down (the default for a module:function builder)",
    )
    iso.add_argument("--no-isolate", dest="isolate", action="store_false")

    from .jobs import mutate

    mutate.add_arguments(sub.add_parser("mutate", help="kill table of the mutant zoo"))
    sub.add_parser("kernel-table", help="kernel vs reference over default shapes")

    from . import bench
    from .detect import trace
    from .jobs import profile

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
            workload_process=args.workload_process,
            json_path=args.json_path,
            markdown_path=args.markdown_path,
            quiet=args.quiet,
            isolate=args.isolate,
        )
    if args.command == "mutate":
        from .jobs import mutate

        return mutate.run(args)
    if args.command == "kernel-table":
        return run_kernel_table()
    if args.command == "sync-table":
        from .jobs.sync_table import detector_matrix, format_detector_matrix

        rows = detector_matrix()
        print(format_detector_matrix(rows))
        if args.json_path:
            Path(args.json_path).write_text(json.dumps(rows, indent=2, default=str))
        return 0
    from . import bench
    from .detect import trace
    from .jobs import profile

    module = {"bench": bench, "profile": profile, "trace": trace}[args.command]
    return module.run(args)


if __name__ == "__main__":
    sys.exit(main())
