"""Record a check run and prove its replays sync-free: ``pagegraph profile`` / ``make profile``.

With Nsight Systems on PATH the run is ``pagegraph check SCENARIO --detectors torch`` under
``nsys profile`` (CUDA and NVTX, no CPU sampling; CUPTI takes one subscriber a process and nsys
is it), exported to SQLite; without it, the same check under torch.profiler with
``record_function`` ranges and sync events. Either way the trace goes through
``pagegraph.detect.trace`` with ``--forbid-sync 'replay/*'`` and a Markdown report lands beside it.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import os
import shlex
import shutil
import subprocess
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..detect import trace as _trace
from ..supervise.isolate import child_env
from .check_job import run_check_for_profile

__all__ = [
    "DEFAULT_SCENARIO",
    "FORBID",
    "add_arguments",
    "check_command",
    "main",
    "nsys_command",
    "nsys_export_command",
    "profile",
    "run",
]

DEFAULT_SCENARIO = "default"
#: Ranges that must hold no host sync and no device-to-host copy.
FORBID = ("replay/*",)


def check_command(
    scenario: str | os.PathLike[str], replays: int | None = None, python: str | None = None
) -> list[str]:
    """``python -m pagegraph check SCENARIO --detectors torch [--replays N]``."""
    cmd = [python or sys.executable, "-m", "pagegraph", "check", str(scenario)]
    cmd += ["--detectors", "torch"]
    if replays is not None:
        cmd += ["--replays", str(int(replays))]
    return cmd


def nsys_command(
    scenario: str | os.PathLike[str],
    out_base: str | os.PathLike[str],
    *,
    replays: int | None = None,
    python: str | None = None,
    nsys: str = "nsys",
) -> list[str]:
    """The ``nsys profile`` command line; nsys writes ``OUT_BASE.nsys-rep``."""
    return [
        nsys,
        "profile",
        "-t",
        "cuda,nvtx",
        "--sample=none",
        "--cpuctxsw=none",
        # One record per kernel node of a replayed graph, each with the launch's correlation
        # id: that is what lets the analyzer put graph work inside its replay range.
        "--cuda-graph-trace=node",
        "--force-overwrite=true",
        "-o",
        str(out_base),
        *check_command(scenario, replays, python),
    ]


def nsys_export_command(
    report: str | os.PathLike[str], sqlite_path: str | os.PathLike[str], *, nsys: str = "nsys"
) -> list[str]:
    return [
        nsys,
        "export",
        "--type",
        "sqlite",
        "--force-overwrite=true",
        "-o",
        str(sqlite_path),
        str(report),
    ]


def _record_nsys(
    nsys: str, scenario: Any, out: Path, name: str, replays: Any
) -> tuple[int, Path, str]:
    base = out / name
    cmd = nsys_command(scenario, base, replays=replays, nsys=nsys)
    shown = shlex.join(cmd)
    print(f"pagegraph profile: {shown}", flush=True)
    # nsys exits with the profiled program's status: that is the check's verdict.
    # PAGEGRAPH_NVTX: the check loads nvtx even if nsys injected itself some other way than
    # through NVTX_INJECTION64_PATH (pagegraph.detect.ranges).
    env = {**child_env(), "PAGEGRAPH_NVTX": "1"}
    check_rc = subprocess.run(cmd, env=env, check=False).returncode
    report = base.with_name(base.name + ".nsys-rep")
    if not report.exists():
        raise _trace.TraceError(f"nsys wrote no report {report} (exit code {check_rc})")
    sqlite_path = base.with_name(base.name + ".sqlite")
    export = nsys_export_command(report, sqlite_path, nsys=nsys)
    print(f"pagegraph profile: {shlex.join(export)}", flush=True)
    done = subprocess.run(export, check=False)
    if done.returncode != 0 or not sqlite_path.exists():
        raise _trace.TraceError(f"'{shlex.join(export)}' failed (exit code {done.returncode})")
    return check_rc, sqlite_path, shown


def _in_process_command(scenario: Any, replays: Any) -> str:
    return "in-process under torch.profiler: " + shlex.join(
        ["pagegraph", *check_command(scenario, replays)[3:]]
    )


def _run_check_hook() -> Callable[[str, int | None], int]:
    """The in-process check, ``(scenario, replays) -> exit code`` (a hook: the tests put a
    fake check here)."""
    return run_check_for_profile


def _set_record_function(enabled: bool) -> bool:
    """Switch record_function ranges; returns the previous setting."""
    from ..detect import ranges

    get = getattr(ranges, "record_function_enabled", None)
    previous = bool(get()) if get is not None else False
    ranges.set_record_function(enabled)
    return previous


def _record_torch(scenario: Any, out: Path, name: str, replays: Any) -> tuple[int, Path, str]:
    import torch
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    kwargs: dict[str, Any] = {}
    try:
        kwargs["experimental_config"] = torch._C._profiler._ExperimentalConfig(
            enable_cuda_sync_events=True
        )
    except (AttributeError, TypeError, RuntimeError):
        pass  # an older torch: the trace still has cudaStreamSynchronize and copy kinds
    run_check = _run_check_hook()
    previous = _set_record_function(True)
    try:
        with torch_profile(activities=activities, **kwargs) as prof:
            try:
                check_rc = int(run_check(str(scenario), replays))
            except Exception:  # the check crashed: still keep (and analyze) what it traced
                traceback.print_exc()
                check_rc = 1
    finally:
        _set_record_function(previous)
    json_path = out / f"{name}.json"
    prof.export_chrome_trace(str(json_path))
    shown = _in_process_command(scenario, replays)
    return check_rc, json_path, shown


def _write_timeline(trace: _trace.Trace, png: Path) -> str:
    """The timeline image of a replay window of ``trace`` at ``png``
    (``detect.trace_timeline``); the Markdown that shows it, or says why there is none."""
    from ..detect.trace_timeline import timeline_layout, write_timeline_image

    try:
        layout = timeline_layout(trace)
    except ValueError as exc:  # no replay range: the verdict says so too
        return f"(no timeline: {exc})"
    if write_timeline_image(png, layout) is None:
        print("pagegraph profile: matplotlib not installed: no timeline image", file=sys.stderr)
        return "(matplotlib not installed: no timeline image)"
    inside = [m for m in layout.markers if m.in_replay]
    note = (
        f"{len(inside)} host sync(s) or device-to-host copies inside replay ranges (marked "
        f"large): " + ", ".join(f"{m.call} in {m.range}" for m in inside[:5])
        if inside
        else "No host sync or device-to-host copy inside the replay ranges shown."
    )
    return f"![replay timeline]({png.name})\n\n{note}"


def _gpu_name(summary: _trace.TraceSummary | None) -> str:
    if summary is not None and summary.device:
        return summary.device
    try:
        import torch

        if torch.cuda.is_available():
            return torch.cuda.get_device_name(0)
    except Exception:  # a broken CUDA install must not lose the report
        pass
    return "none (CPU only)"


def _report(
    *,
    name: str,
    scenario: Any,
    recorder: str,
    command: str,
    check_rc: int,
    trace_path: Path | None,
    summary: _trace.TraceSummary | None,
    result: _trace.CheckResult | None,
    error: str | None,
    exit_code: int,
    timeline: str = "",
) -> str:
    now = _dt.datetime.now().astimezone().isoformat(timespec="seconds")
    lines = [
        f"# pagegraph profile: {name}",
        "",
        f"- scenario: `{scenario}`",
        f"- command: `{command}`",
        f"- recorder: {recorder}",
        f"- date: {now}",
        f"- GPU: {_gpu_name(summary)}",
        f"- trace: `{trace_path}`" if trace_path else "- trace: none",
        f"- check exit code: {check_rc}",
        f"- forbidden: {', '.join(f'`{p}`' for p in FORBID)}",
        "",
    ]
    if summary is not None:
        lines += ["## Ranges", "", _trace.format_markdown(summary).rstrip(), ""]
    if timeline:
        lines += ["## Timeline of a replay window", "", timeline, ""]
    lines += ["## Verdict", ""]
    if error:
        lines.append(f"CANNOT CHECK: {error}")
    elif result is not None:
        lines += result.format_text().splitlines()
    if check_rc != 0:
        lines.append(f"The check itself failed (exit code {check_rc}).")
    lines += ["", f"Exit code: {exit_code}", ""]
    return "\n".join(lines)


def profile(
    scenario: str | os.PathLike[str] = DEFAULT_SCENARIO,
    out_dir: str | os.PathLike[str] = "profiles",
    name: str | None = None,
    replays: int | None = None,
) -> int:
    """Record ``pagegraph check SCENARIO`` and check its replay ranges for host syncs.

    Writes ``OUT_DIR/NAME.md`` (and the trace beside it). Returns the analyzer's exit code
    (0 clean, 1 a sync or D2H copy inside ``replay/*``, 2 no usable trace, no replay range in
    it, or replay ranges with no CUDA activity, as on a machine without a GPU); a failed
    check run turns a clean or blind result into its own nonzero code.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    name = name or Path(scenario).stem
    nsys = shutil.which("nsys")
    summary = result = trace_path = error = None
    timeline = ""
    check_rc = 0
    if nsys is not None:
        recorder = f"Nsight Systems ({nsys})"
        command = shlex.join(nsys_command(scenario, out / name, replays=replays, nsys=nsys))
    else:
        print(
            "pagegraph profile: nsys is not on PATH, so no NVTX/CUPTI capture; recording a "
            "torch.profiler trace instead (record_function ranges, CUDA sync events)",
            flush=True,
        )
        recorder = "torch.profiler (nsys not on PATH)"
        command = _in_process_command(scenario, replays)
    try:
        if nsys is not None:
            check_rc, trace_path, command = _record_nsys(nsys, scenario, out, name, replays)
        else:
            check_rc, trace_path, command = _record_torch(scenario, out, name, replays)
        trace = _trace.load_trace(trace_path)
        summary = _trace.summarize(trace)
        timeline = _write_timeline(trace, out / f"{name}-timeline.png")
        result = _trace.check(summary, list(FORBID))
        code = result.exit_code
    except _trace.TraceError as e:
        error, code = str(e), 2
    if code != 1 and check_rc != 0:  # a failed check outranks a clean or blind trace
        code = check_rc if 0 < check_rc < 256 else 1
    md = out / f"{name}.md"
    md.write_text(
        _report(
            name=name,
            scenario=scenario,
            recorder=recorder,
            command=command,
            check_rc=check_rc,
            trace_path=trace_path,
            summary=summary,
            result=result,
            error=error,
            exit_code=code,
            timeline=timeline,
        )
    )
    if summary is not None:
        print(_trace.format_markdown(summary), end="")
    if error:
        print(f"pagegraph profile: error: {error}", file=sys.stderr)
    elif result is not None:
        print(result.format_text())
    if check_rc != 0:
        print(f"pagegraph profile: the check itself failed (exit code {check_rc})", file=sys.stderr)
    print(f"pagegraph profile: wrote {md}")
    return code


def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.description = parser.description or (
        "Record a check of the scenario under Nsight Systems (nsys on PATH; otherwise "
        "torch.profiler) and analyse the trace: syncs and device-to-host copies per NVTX range."
    )
    parser.add_argument(
        "scenario",
        nargs="?",
        default=DEFAULT_SCENARIO,
        metavar="SCENARIO",
        help=f"a shipped scenario's name or a TOML file (default: {DEFAULT_SCENARIO})",
    )
    parser.add_argument("--out", default="profiles", help="output folder (default profiles)")
    parser.add_argument("--name", default=None, help="file stem (default: the scenario's)")
    parser.add_argument(
        "--replays", type=int, default=None, help="replays of the check (default: its steps)"
    )
    return parser


#: What ``pagegraph profile`` says on a machine without CUDA (exit 2, nothing recorded).
NEEDS_GPU = (
    "pagegraph profile needs a CUDA GPU (and Nsight Systems, nsys, on PATH for NVTX ranges): "
    "it traces the CUDA calls and syncs of a check's replays, and none run on this CPU; "
    "`pagegraph check SCENARIO` runs the check itself here"
)


def run(args: argparse.Namespace) -> int:
    import torch

    if not torch.cuda.is_available():
        print(NEEDS_GPU, file=sys.stderr)
        return 2
    return profile(args.scenario, out_dir=args.out, name=args.name, replays=args.replays)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="pagegraph profile",
        description="Record a check run (nsys, else torch.profiler) and check its replays.",
    )
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
