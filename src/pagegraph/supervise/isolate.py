"""Checks in a child process, so a builder that kills its process or its CUDA context (an
illegal address, a device-side assert, a segfault, ``os.abort()``, a hang) cannot take the run
down. ``run_isolated`` plans each check here, runs a list of them in one child that writes
partial reports and notes its phase as it goes, and reports the check a dead child was running
UNSAFE, with the cause and the last phase reached (docs/ARCHITECTURE.md, "Crashes,
interruptions, resources").
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar, cast

from ..check.config import CheckConfig
from ..check.plan import CheckPlan, plan_check
from ..check.reports.report import Report
from ..check.signals import request_stop, stop_requested
from ..kinds.seams import Builder
from ..workload.lifetime import die_with_parent, escalate_stop
from .crash_report import (
    CUDA_ERROR,
    crash_cause,
    crash_report,
    death,
    device_fault,
    explain_fault,
    report_from_dict,
)

#: Seconds a child may run one check before it is killed as hung (None: no limit).
DEFAULT_TIMEOUT = None
#: Size of the file in which a child notes its phase (rewritten in place, never grown).
PROGRESS_BYTES = 2048
#: Seconds a child has to end after the parent forwarded a stop to it, before it is killed
#: (the child itself ends within ``lifetime.STOP_GRACE_S`` of the signal).
FORWARDED_STOP_S = 10.0

_T = TypeVar("_T")


class IsolatedError(RuntimeError):
    """A child could not run a check at all (bad builder, bad config): not a verdict."""


def write_json_atomic(path: str | Path, doc: object) -> None:
    """Write JSON so that a reader never sees a half-written file: a temporary file in the
    same folder, flushed, then renamed over the target."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        # mkstemp makes the file private (0600); a report gets the umask's permissions, as
        # any file the user writes.
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        with os.fdopen(fd, "w") as f:
            json.dump(doc, f, indent=2, default=str)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def child_env() -> dict[str, str]:
    # From a source checkout (PYTHONPATH=src, nothing installed) the child python must still
    # find this very pagegraph.
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])  # the folder that holds pagegraph/
    parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if root not in parts:
        env["PYTHONPATH"] = os.pathsep.join([root, *parts])
    env["PYTHONUNBUFFERED"] = "1"
    return env


def builder_spec(builder: str | Builder) -> str:
    """A builder as a string a child process can resolve: a built-in name, or
    ``module:function`` for a function importable at module level."""
    from ..graph.builder_names import builder_name
    from ..kernels.registry import FILE_MODULE_PREFIX, builder_spec_for_child
    from ..kinds.builders import is_builtin

    if isinstance(builder, str):
        return builder_spec_for_child(builder)
    name = builder_name(builder)
    if is_builtin(name):
        return name
    module, qualname = getattr(builder, "__module__", None), getattr(builder, "__qualname__", "")
    if module and module.startswith(FILE_MODULE_PREFIX) and "." not in qualname:
        return f"{builder.__code__.co_filename}:{qualname}"  # loaded from a file by path
    if not module or "<" in qualname or "." in qualname:
        raise IsolatedError(
            f"builder {builder!r} is not importable at module level: give it as "
            "'module:function' to run it in a child process"
        )
    return f"{module}:{qualname}"


@dataclasses.dataclass
class Job:
    """One check for a child: a builder spec and a config (plus checker options)."""

    builder: str
    config: CheckConfig
    label: str = ""
    stop_on_failure: bool = False
    #: replay with launches serialised (``CUDA_LAUNCH_BLOCKING=1``, a device sync after
    #: each replay) and each replay's bucket and out-of-contract rows noted: the re-run that
    #: names the replay a crash came from
    explain: bool = False
    #: lock files, one per slot: the child holds one of them (``memory_slot``) while this
    #: check runs, so that checks sharing the slots never run more at once than there are
    #: slots (``pagegraph mutate``: the checks too big to run on every worker at once)
    memory_slots: tuple[str, ...] = ()
    #: the decode step's reader, ``module:name`` (a decode-step config only)
    reader: str | None = None
    #: the check as planned (``pagegraph.check.plan.plan_check``), run as given; None:
    #: ``run_isolated`` plans it from the fields above
    plan: CheckPlan | None = None

    @classmethod
    def planned(cls, plan: CheckPlan, label: str = "", **options: Any) -> Job:
        """The job that runs ``plan`` as given (its caller planned it: nothing is planned
        again); ``options``: the other fields (``stop_on_failure``, ...)."""
        return cls(plan.builder, plan.config, label, reader=plan.reader, plan=plan, **options)


def _explain_crash(job: Job, tmp: Path, k: int) -> str | None:
    """Re-run job ``k``, whose child died of a CUDA error during its replays (or whose replay
    raised one), with launches serialised and every replay described, and say which replay
    the error came from and what it held; None when the re-run could not tell (it did not
    fail, ran out of time). A stop asked for during the re-run is raised as
    ``KeyboardInterrupt``."""
    retry = dataclasses.replace(job, explain=True, stop_on_failure=False)
    sub = tmp / f"explain-{k}"
    sub.mkdir()
    spec_path = _write_spec([retry], 0, sub)
    env = child_env()
    env["CUDA_LAUNCH_BLOCKING"] = "1"
    err_path = sub / "stderr.txt"
    with open(err_path, "w") as err:
        cmd = [sys.executable, "-m", "pagegraph.supervise.isolate", str(spec_path)]
        proc = subprocess.Popen(cmd, env=env, stderr=err, stdout=subprocess.DEVNULL)
        ended = _wait_for_child(proc, 600)
    if ended.interrupted is not None:
        raise ended.interrupted
    if ended.timed_out:
        return None
    progress = (sub / "progress").read_bytes().decode(errors="replace").strip().split("\t")
    result = sub / "result-0.json"
    doc = json.loads(result.read_text()) if result.exists() else None
    stopped: str | None = (doc or {}).get("report", {}).get("stopped") if doc else None
    if stopped and "raised" in stopped:
        return stopped  # the error surfaced as an exception at the replay that caused it
    if ended.returncode == 0 or (doc is not None and doc.get("final")):
        return None  # the serialised re-run did not crash: it cannot tell
    if len(progress) > 1 and progress[1].startswith("replay"):
        error = crash_cause(err_path.read_text(errors="replace"))
        return f"{progress[1]}" + (f": {error}" if error else "")
    return None


def run_isolated(
    jobs: list[Job],
    *,
    timeout: float | None = DEFAULT_TIMEOUT,
    on_report: Callable[[int, Report], object] | None = None,
    on_phase: Callable[[int, str], object] | None = None,
) -> list[Report]:
    """Run every job in child processes (one at a time, in order); one report per job.

    ``timeout``: seconds a single check may take before it is killed. ``on_report(i,
    report)`` is called as each job's report is known; ``on_phase(i, phase)`` about five
    times a second with the phase the child noted last (``"capture"``, ``"replay 17"``, ...:
    progress for the caller to show). Ctrl-C in the parent reaches the
    child too (same process group): the child writes its partial report and exits, and the
    parent raises ``KeyboardInterrupt`` with ``.reports`` holding what was done.
    """
    jobs = [_planned(j) for j in jobs]  # every one refused or planned before any child
    reports: list[Report | None] = [None] * len(jobs)
    next_job = 0
    with tempfile.TemporaryDirectory(prefix="pagegraph-isolate-") as tmp_name:
        tmp = Path(tmp_name)
        while next_job < len(jobs):
            spec_path = _write_spec(jobs, next_job, tmp)
            cmd = [sys.executable, "-m", "pagegraph.supervise.isolate", str(spec_path)]
            err_path = tmp / f"stderr-{next_job}.txt"
            limit = None if timeout is None else timeout * (len(jobs) - next_job)
            with open(err_path, "w") as err:
                proc = subprocess.Popen(cmd, env=child_env(), stderr=err, stdout=subprocess.DEVNULL)
                ended = _wait_for_child(
                    proc, limit, paused=_slot_wait_of(tmp), watch=_phase_watch(tmp, on_phase)
                )
            ended.stderr = err_path.read_text(errors="replace")
            ended.progress = (tmp / "progress").read_bytes().decode(errors="replace").strip()
            next_job = _collect_reports(jobs, next_job, tmp, ended, reports, on_report)
            if ended.interrupted is not None:
                done = [r for r in reports if r is not None]
                ended.interrupted.reports = done  # type: ignore[attr-defined]  # for the caller
                raise ended.interrupted
    return [r for r in reports if r is not None]


def _slot_wait_of(tmp: Path) -> Callable[[], bool]:
    """``_waiting_for_a_slot`` of the child whose folder is ``tmp``."""

    def waiting() -> bool:
        return _waiting_for_a_slot(tmp)

    return waiting


def _phase_watch(
    tmp: Path, on_phase: Callable[[int, str], object] | None
) -> Callable[[], None] | None:
    """The watch that tells ``on_phase`` the child's phase (``_tell_phase``); None without
    ``on_phase``."""
    if on_phase is None:
        return None
    told = on_phase

    def watch() -> None:
        _tell_phase(tmp, told)

    return watch


def _tell_phase(tmp: Path, on_phase: Callable[[int, str], object]) -> None:
    """Call ``on_phase(job, phase)`` with what the child's progress note says, if anything."""
    try:
        text = (tmp / "progress").read_bytes().decode(errors="replace").strip()
    except OSError:
        return
    job, _, phase = text.partition("\t")
    if job.isdigit() and phase:
        on_phase(int(job), phase)


def _waiting_for_a_slot(tmp: Path) -> bool:
    """Whether the child's progress note says it waits for a memory slot."""
    try:
        return WAITING_FOR_A_SLOT.encode() in (tmp / "progress").read_bytes()
    except OSError:
        return False


def _planned(job: Job) -> Job:
    """``job`` with its plan: the one it carries, else planned here, in the parent
    (``pagegraph.check.plan``; the builder put on the config, whose presets of another kind
    are dropped): the child runs the plan as given. ``IsolatedError`` when the check cannot
    run (a builder that cannot be loaded, a config that does not fit it), before any child
    starts."""
    if job.plan is not None:
        return job
    try:
        plan, _ = plan_check(job.builder, job.config, spec=job.builder, reader=job.reader)
    except ValueError as exc:
        raise IsolatedError(f"{exc}") from None
    return dataclasses.replace(job, plan=plan)


def _write_spec(jobs: list[Job], first: int, tmp: Path) -> Path:
    """The spec of a child running ``jobs[first:]``, each with its plan (``_planned``), and
    its progress file, blank."""
    spec = {
        "jobs": [
            {
                "plan": cast(CheckPlan, _planned(j).plan).to_dict(),
                "stop_on_failure": j.stop_on_failure,
                "explain": j.explain,
                "memory_slots": list(j.memory_slots),
                "result": str(tmp / f"result-{k}.json"),
            }
            for k, j in enumerate(jobs)
            if k >= first
        ],
        "progress": str(tmp / "progress"),
        "first": first,
        "parent": os.getpid(),
    }
    spec_path = tmp / f"spec-{first}.json"
    spec_path.write_text(json.dumps(spec, default=str))
    (tmp / "progress").write_bytes(b" " * PROGRESS_BYTES)
    return spec_path


@dataclasses.dataclass
class _ChildEnd:
    """How a child ended: its exit status, killed for its time limit or stopped by a signal
    to the parent (the ``KeyboardInterrupt`` to raise once its reports are read)."""

    returncode: int | None
    timed_out: bool = False
    interrupted: KeyboardInterrupt | None = None
    stderr: str = ""
    #: the job index and the last phase the child noted, tab-separated
    progress: str = ""


def supervise_child(
    proc: subprocess.Popen[bytes],
    step: Callable[[float], _T | None],
    limit: float | None,
    paused: Callable[[], bool] | None = None,
    watch: Callable[[], object] | None = None,
) -> tuple[_T | None, bool, KeyboardInterrupt | None]:
    """Wait for a child process until ``step(timeout)`` (a wait of at most ``timeout``
    seconds on it) returns something other than None: forward a stop request to the child,
    and kill it past ``limit`` seconds (or ``FORWARDED_STOP_S`` after a forwarded stop).
    While ``paused()`` is true (the child waits for a memory slot) the limit's clock stands
    still; ``watch()`` is called at every poll (a fifth of a second).

    Returns ``(what step returned, or None when the child was killed; killed for its time
    limit; the KeyboardInterrupt to raise once its reports are read)``. Fresh children
    (``_wait_for_child``) and warm workers (``pagegraph.supervise.worker_pool``) share it."""
    interrupted: KeyboardInterrupt | None = None
    deadline = None if limit is None else time.monotonic() + limit
    forwarded = False
    while True:
        polled = time.monotonic()
        try:
            result = step(0.2)
        except KeyboardInterrupt as exc:  # no stop_on_signals in the caller
            interrupted = interrupted or exc
            request_stop(getattr(exc, "signum", signal.SIGINT))
            result = None
        if result is not None:
            return result, False, interrupted
        if watch is not None:
            watch()
        if deadline is not None and not forwarded and paused is not None and paused():
            deadline += time.monotonic() - polled
        signum = stop_requested()
        if signum is not None and not forwarded:
            # Ctrl-C reaches the whole process group, SIGTERM only us: make sure the child
            # stops too, and let it write its partial report.
            forwarded = True
            interrupted = interrupted or KeyboardInterrupt()
            interrupted.signum = signum  # type: ignore[attr-defined]  # read by the caller
            deadline = time.monotonic() + FORWARDED_STOP_S
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signum)
        if deadline is not None and time.monotonic() > deadline:
            proc.kill()
            proc.wait()
            return None, not forwarded, interrupted


def _wait_for_child(
    proc: subprocess.Popen[bytes],
    limit: float | None,
    paused: Callable[[], bool] | None = None,
    watch: Callable[[], object] | None = None,
) -> _ChildEnd:
    """Wait for a fresh child to exit (``supervise_child``): how it ended."""

    def exited(timeout: float) -> bool | None:
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None
        return True

    _, timed_out, interrupted = supervise_child(proc, exited, limit, paused, watch)
    return _ChildEnd(proc.returncode, timed_out, interrupted)


def _collect_reports(
    jobs: list[Job],
    first: int,
    tmp: Path,
    ended: _ChildEnd,
    reports: list[Report | None],
    on_report: Callable[[int, Report], object] | None,
) -> int:
    """The reports of the jobs a child ran from ``first``, into ``reports``; returns the next
    job to run (after the one it died in, if it died)."""
    progress = ended.progress.split("\t")
    next_job = first
    # Which jobs finished: each wrote a final report (marked "final").
    for k in range(first, len(jobs)):
        path = tmp / f"result-{k}.json"
        doc = json.loads(path.read_text()) if path.exists() else None
        if doc is not None and doc.get("final"):
            if doc.get("error"):
                raise IsolatedError(doc["error"])
            report = reports[k] = report_from_dict(doc["report"])
            if device_fault(report):
                explain_fault(report, _explain_crash(jobs[k], tmp, k))
            if on_report is not None:
                on_report(k, report)
            next_job = k + 1
            continue
        if ended.interrupted is not None:
            if doc is not None:
                reports[k] = report_from_dict(doc["report"])
            break
        # The child died in job k (or was stopped there): report it, go on after it.
        cause = death(ended.returncode, ended.timed_out)
        phase = progress[1] if len(progress) > 1 and progress[0] == str(k) else ""
        explained = None
        if phase.startswith("replay") and CUDA_ERROR.search(ended.stderr or ""):
            explained = _explain_crash(jobs[k], tmp, k)
        crashed = reports[k] = crash_report(
            jobs[k], doc["report"] if doc else None, cause, phase, ended.stderr or "", explained
        )
        if on_report is not None:
            on_report(k, crashed)
        next_job = k + 1
        break
    return next_job


# -- the child ---------------------------------------------------------------------------------


def _run_check(
    builder: Builder,
    plan: CheckPlan,
    job: dict[str, Any],
    note: Callable[[str], None],
    keep: Callable[[Report], None],
) -> Report:
    """One job's planned check (``pagegraph.check.checker.run_plan``), its partial reports to
    ``keep``; ``CheckInterrupted`` on a stop during its replays (a stop after them lets it
    finish: its verdict is whole)."""
    from ..check.checker import run_plan

    return run_plan(
        plan,
        builder,
        on_phase=note,
        on_chunk=keep,
        stop_on_failure=job["stop_on_failure"],
        explain_replays=job.get("explain", False) and plan.pipeline == "tables",
    )


def _free_cached_memory() -> None:
    """Give the caching allocator's free blocks back to the device (the next check, here or
    in another process, may need them); a broken CUDA context is left to the parent."""
    import torch

    is_initialized = torch.cuda.is_initialized  # torch's is unannotated
    if torch.cuda.is_available() and is_initialized():  # type: ignore[no-untyped-call]
        with contextlib.suppress(Exception):
            torch.cuda.empty_cache()


#: The phase a child notes while it waits for a memory slot: the parent's time limit stands
#: still meanwhile (``_wait_for_child``).
WAITING_FOR_A_SLOT = "waiting for a slot"


class SlotWaitStopped(Exception):
    """A stop was asked for while waiting for a memory slot."""


@contextlib.contextmanager
def memory_slot(
    paths: list[str] | tuple[str, ...],
    on_wait: Callable[[], object] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> Iterator[str | None]:
    """Hold one of the lock files ``paths`` (an exclusive ``flock``) for the ``with`` block,
    waiting until one is free; no paths: nothing to hold. ``on_wait()`` is called once if
    every slot was taken; ``SlotWaitStopped`` is raised when ``should_stop()`` turns true
    while waiting. The lock goes with the process, so a child that dies frees its slot."""
    if not paths:
        yield None
        return
    waited = False
    while True:
        for path in paths:
            f = open(path, "a")  # noqa: SIM115 - closed below, or on the way out
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                f.close()
                continue
            try:
                yield path
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)
                f.close()
            return
        if should_stop is not None and should_stop():
            raise SlotWaitStopped()
        if not waited and on_wait is not None:
            on_wait()
        waited = True
        time.sleep(0.05)


class _ResultWriter:
    """A child's report file for the check it runs: partial reports at most every 0.2 s (at
    once on a failure), the partial report kept last written on demand (``flush``, from the
    stop escalation's thread), the final document. A lock keeps a flush from overwriting a
    final document written meanwhile."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.path: str | None = None
        self.unwritten: Report | None = None
        self.last = 0.0

    def start(self, path: str) -> None:
        with self.lock:
            self.path, self.unwritten, self.last = path, None, 0.0

    def keep(self, report: Report) -> None:
        """A partial report (``check_replay_safety``'s ``on_chunk``)."""
        now = time.monotonic()
        with self.lock:
            self.unwritten = report
            if now - self.last > 0.2 or any(p.status == "FAIL" for p in report.properties):
                self.last = now
                self.unwritten = None
                write_json_atomic(
                    cast(str, self.path), {"final": False, "report": report.to_dict()}
                )

    def flush(self) -> None:
        with self.lock:
            if self.unwritten is not None:
                report, self.unwritten = self.unwritten, None
                write_json_atomic(
                    cast(str, self.path), {"final": False, "report": report.to_dict()}
                )

    def write(self, doc: dict[str, object]) -> None:
        with self.lock:
            self.unwritten = None
            write_json_atomic(cast(str, self.path), doc)


def _stop_code(signum: int | None) -> int:
    """A stopped child's exit code: 130 for SIGINT, 143 for SIGTERM."""
    return 130 if signum == signal.SIGINT else 143


def _child(spec_path: str) -> int:
    import faulthandler
    import mmap

    faulthandler.enable()  # a segfault leaves a traceback on stderr for the parent
    spec = json.loads(Path(spec_path).read_text())
    # Nobody reads this child's reports once its parent is gone, however the parent ended.
    die_with_parent(spec.get("parent"))
    with open(spec["progress"], "r+b") as f:
        progress = mmap.mmap(f.fileno(), PROGRESS_BYTES)
    from ..check.signals import CheckInterrupted, stop_on_signals
    from ..detect.sync import DetectorUnavailable
    from ..graph.builder_names import resolve_builder

    stop = stop_on_signals()  # SIGINT/SIGTERM: stop between two replays, keep the report
    stop.__enter__()
    writer = _ResultWriter()
    # A stop the check cannot see soon (a long capture, an interpreted kernel): the child
    # writes the report it kept last and ends itself a moment after the signal.
    escalation = escalate_stop(writer.flush)  # held: a context manager collected exits
    escalation.__enter__()
    for k, job in enumerate(spec["jobs"], start=spec["first"]):
        result = job["result"]
        writer.start(result)

        def note(phase: str, k: int = k) -> None:
            # Rewritten in place in a mapped page (no system call): the parent reads it
            # after a crash, when the page has reached the file.
            text = f"{k}\t{phase}".encode()[: PROGRESS_BYTES - 1]
            progress[:PROGRESS_BYTES] = text.ljust(PROGRESS_BYTES)

        note("setup")
        try:
            plan = CheckPlan.from_dict(job["plan"])  # planned by the parent: not validated
            builder = resolve_builder(plan.builder)
        except Exception as exc:  # noqa: BLE001 - told to the parent as a usage error
            writer.write({"final": True, "error": f"{exc}"})
            return 2

        try:
            with memory_slot(
                job.get("memory_slots", ()),
                on_wait=lambda: note(WAITING_FOR_A_SLOT),
                should_stop=lambda: stop_requested() is not None,
            ):
                note("setup")  # the slot is held: the parent's clock runs again
                try:
                    report = _run_check(builder, plan, job, note, writer.keep)
                finally:
                    _free_cached_memory()  # before the slot goes to another check
        except CheckInterrupted as exc:
            writer.write({"final": False, "report": exc.report.to_dict()})
            return _stop_code(exc.signum)
        except SlotWaitStopped:  # stopped before the check began: nothing to report
            return _stop_code(stop_requested())
        except (DetectorUnavailable, ValueError) as exc:  # usage: a detector, a config value
            writer.write({"final": True, "error": f"{type(exc).__name__}: {exc}"})
            return 2
        # Anything else escaping the check (out of memory while setting up, say) ends this
        # child with a traceback on stderr: the parent reports the job as crashed with it.
        writer.write({"final": True, "report": report.to_dict()})
        if stop_requested() is not None:  # the finished check stands; no other one starts
            return _stop_code(stop_requested())
    return 0


if __name__ == "__main__":
    sys.exit(_child(sys.argv[1]))
