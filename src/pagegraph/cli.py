"""The ``pagegraph`` command line (also ``python -m pagegraph``): it parses arguments and
dispatches to the jobs (``pagegraph.jobs``, ``pagegraph.bench``, ``pagegraph.detect.trace``);
the texts users read are ``DESCRIPTION`` and ``CHECK_DESCRIPTION`` below.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import sys
import threading
from pathlib import Path
from typing import Any

from .check.config import ADVICE, WORKLOAD_PROCESS_MODES
from .check.scenario import DEFAULT_SCENARIO
from .runtime.environment import PAGEGRAPH_VERSION

__all__ = ["DEFAULT_SCENARIO", "build_parser", "main", "run", "run_check"]  # noqa: F822 - lazy


def __getattr__(name: str) -> Any:
    # The check job lives in pagegraph.jobs.check_job (the checker, the kernels, Triton): run_check
    # stays importable from here, loaded at first use, so that another command does not pay
    # for it.
    if name in ("run_check", "run_kernel_table"):
        from .jobs import check_job

        return getattr(check_job, name)
    raise AttributeError(f"module 'pagegraph.cli' has no attribute {name!r}")


DESCRIPTION = """\
pagegraph judges whether an attention-metadata builder (a page table, or a decode step's
lengths, prefix sums and page tables) is safe to replay inside CUDA graphs: it captures the
builder over padded batch buckets, replays an engine-like workload while lengths, indices and
layouts change, checks every replay exactly against an independent model, and watches for
host syncs, allocations and moved buffers.

  pagegraph check [SCENARIO ...]   judge a builder's replay safety on scenarios
  pagegraph mutate [SCENARIO ...]  the checker against the mutant zoo: the kill table
  pagegraph kernel-table           pagegraph's kernel against the reference, default shapes
  pagegraph bench                  the benchmark suite (what `make bench` runs)
  pagegraph profile [SCENARIO]     an Nsight Systems (or torch.profiler) trace, analysed
  pagegraph trace FILE             analyse a trace; --forbid-sync fails on syncs in ranges
  pagegraph sync-table             which sync detector catches which planted sync
  pagegraph wild [ENTRY ...]       public engines' bugs reproduced: buggy UNSAFE, fixed SAFE
"""

CHECK_DESCRIPTION = """\
Capture the builder into CUDA graphs over the scenario's batch buckets, replay the
scenario's workload and judge every replay. The verdict is SAFE when no safety property
failed and none is incomplete: correct, bounded writes, row containment, sync-free builder
and replay path, no allocation in replay, static buffers unmoved, no memory growth, capture
and replays completed, staged inputs, error counters (for a builder that takes errors=).
Advice (compilations per bucket, allocations at warm-up or capture, a builder without error
counters) is reported with its figures but never changes the verdict, unless --strict
promotes it.

A SCENARIO is a shipped scenario's name (default, sglang-h200, swa-hybrid, ...) or a path to
a TOML file; with none, `default` runs.

exit codes: 0 every scenario SAFE; 1 a scenario UNSAFE or incomplete (the report names the
first failing replay of each failed property); 2 bad usage: a bad option, scenario file or
builder, or a scenario that does not fit the device's memory (nothing runs then); 130 after
Ctrl-C and 143 after SIGTERM (the reports then hold everything checked so far, marked
incomplete).
"""


#: The commands whose options ``build_parser(command)`` can build alone.
COMMANDS = ("check", "mutate", "kernel-table", "bench", "profile", "trace", "sync-table", "wild")

# -- entry point --------------------------------------------------------------------------------


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The command line's parser; with ``command``, only that command's options are filled
    in (the others keep their one-line help), so that parsing it imports only its job."""
    parser = argparse.ArgumentParser(
        prog="pagegraph",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"pagegraph {PAGEGRAPH_VERSION}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser(
        "check",
        help="judge a builder's graph-replay safety on scenarios",
        description=CHECK_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_check_arguments(p)

    def wanted(name: str) -> bool:
        return command is None or command == name

    m = sub.add_parser("mutate", help="kill table of the mutant zoo")
    if wanted("mutate"):
        from .jobs import mutate

        mutate.add_arguments(m)
    sub.add_parser(
        "kernel-table",
        help="pagegraph's kernel against the reference over default shapes",
        description="Build page tables with pagegraph's kernel over a default set of shapes "
        "on this machine's device (the Triton interpreter on a CPU), compare each exactly with "
        "the reference and time the eager call. Exit 1 on any mismatch.",
    )

    b = sub.add_parser("bench", help="benchmark suite")
    if wanted("bench"):
        from . import bench

        bench.add_arguments(b)
        b.add_argument(
            "--consumer-floor",
            action="store_true",
            help="instead of the suite: paged decode attention (both formats) against the DRAM "
            "floor measured in the same process, sglang-h200 shapes, into --out as "
            "consumer-floor.md/.json (CUDA only: exit 2 without)",
        )
    prof = sub.add_parser("profile", help="Nsight Systems profile of a scenario")
    if wanted("profile"):
        from .jobs import profile

        profile.add_arguments(prof)
    t = sub.add_parser("trace", help="analyse an nsys SQLite or torch trace")
    if wanted("trace"):
        from .detect import trace

        trace.add_arguments(t)
    s = sub.add_parser(
        "sync-table",
        help="which detector catches which planted sync",
        description="Run each planted sync (an .item(), a blocking copy, a synchronize, ...) "
        "under each sync detector available here and print which caught it.",
    )
    s.add_argument("--json", dest="json_path", metavar="PATH", help="also write the rows there")
    w = sub.add_parser(
        "wild",
        help="public engines' CUDA-graph metadata bugs: each buggy twin UNSAFE, fixed SAFE",
        description="Run the corpus of bugs from the wild (pagegraph.wild): for each entry, its "
        "buggy builder, reader or runner must be UNSAFE through the entry's property and its "
        "fixed twin SAFE. Exit 0 when every entry that can run here held, 1 otherwise, 2 on "
        "bad usage.",
    )
    if wanted("wild"):
        from .jobs import wild_job

        wild_job.add_arguments(w)
    return parser


def _add_check_arguments(p: argparse.ArgumentParser) -> None:
    """The ``check`` command's arguments."""
    p.add_argument(
        "scenarios",
        nargs="*",
        default=[DEFAULT_SCENARIO],
        metavar="SCENARIO",
        help=f"a shipped scenario's name or a TOML file (default: {DEFAULT_SCENARIO})",
    )
    p.add_argument("--replays", type=int, help="replays per scenario (default: its steps)")
    p.add_argument(
        "--builder",
        help="the builder to judge instead of the scenario's: a built-in name "
        "(build_page_table, build_decode_metadata, ...), package.module:function or "
        "path/to/file.py:function",
    )
    p.add_argument(
        "--reader",
        help="the decode step's reader to judge with the builder (a scenario with a [consumer]):"
        " package.module:name or path/to/file.py:name naming a pagegraph.consumers.reader."
        "Reader or an attention call with paged_decode_attention's signature; it runs in a "
        "child process",
    )
    p.add_argument(
        "--detectors",
        help="sync detectors: auto (default: torch and cupti on CUDA, cpu without), none, "
        "torch, cupti, cpu, or a list (torch,cupti)",
    )
    p.add_argument(
        "--strict",
        action="append",
        metavar="ADVICE",
        default=None,
        help="treat this advice as a failure (repeatable; 'all' for every advice): "
        + ", ".join(ADVICE),
    )
    p.add_argument(
        "--workload-process",
        choices=WORKLOAD_PROCESS_MODES,
        help="run the workload's host models in child processes (default: the scenario's "
        "[check] workload_process, auto: for CUDA runs of 1000+ replays)",
    )
    p.add_argument(
        "--json",
        dest="json_path",
        metavar="PATH",
        help="write the machine-readable report there (its folder must exist)",
    )
    p.add_argument(
        "--markdown",
        dest="markdown_path",
        metavar="PATH",
        help="write a Markdown report there, with a PNG of replay latency per bucket beside "
        "it (its folder must exist)",
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
    iso.add_argument(
        "--no-isolate",
        dest="isolate",
        action="store_false",
        help="check in this process, even a module:function builder",
    )


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    # The command is the first word that is not an option (the top level's options take no
    # value): only its options are built, and only its job imported.
    command = next((a for a in argv if not a.startswith("-")), None)
    parser = build_parser(command if command in COMMANDS else None)
    args = parser.parse_args(argv)
    if args.command == "check":
        from .jobs.check_job import run_check

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
            strict=args.strict,
            reader=args.reader,
        )
    if args.command == "mutate":
        from .jobs import mutate

        return mutate.run(args)
    if args.command == "kernel-table":
        from .jobs.check_job import run_kernel_table

        return run_kernel_table()
    if args.command == "wild":
        from .jobs import wild_job

        return wild_job.main(args)
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

    if args.command == "bench" and args.consumer_floor:
        from .bench import consumer_floor

        return consumer_floor.run(args.out)
    module = {"bench": bench, "profile": profile, "trace": trace}[args.command]
    rc: int = module.run(args)
    return rc


#: Set in a process that a CUDA tool is injected into (Nsight Systems, compute-sanitizer, a
#: CUPTI profiler): such a tool writes its results from library destructors, which the quick
#: exit below skips.
_INJECTION_VARIABLES = ("CUDA_INJECTION64_PATH", "LD_PRELOAD")


def run() -> None:
    """The ``pagegraph`` command's process entry (its console script and ``python -m
    pagegraph``): ``main``, then an exit without the interpreter's teardown where nothing
    needs it.

    After ``import torch`` and a CUDA context, Python's finalisation (freeing every module,
    destroying the context) keeps the process alive well after the verdict is printed. The
    quick exit runs the ``atexit`` handlers (the workload's child processes, worker pools),
    flushes the standard streams and ends the process. It is skipped, and the exit is the
    usual one, when another non-daemon thread is alive (it may still have work to finish) or
    a CUDA tool is injected. ``main`` itself returns its code, for callers in Python."""
    code = main()
    if any(not t.daemon for t in threading.enumerate() if t is not threading.main_thread()):
        sys.exit(code)
    if any(os.environ.get(name) for name in _INJECTION_VARIABLES):
        sys.exit(code)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe or stream: nothing more can be shown
            pass
    os._exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    run()
