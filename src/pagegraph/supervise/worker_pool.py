"""Warm worker processes for many isolated checks: ``pagegraph mutate``'s builders times scenarios.

A ``WorkerPool`` keeps ``workers`` children alive instead of a fresh child for each check, so
the imports, the CUDA context and the kernels' loading are paid once. Each worker runs a
one-check spec with the very code a fresh child runs (``isolate._child``) and is replaced when
it dies or its check may have left it unfit, so a check reads the same whichever way it ran;
memory-slot tasks go first whenever a slot is free, the others cheapest first
(docs/ARCHITECTURE.md, "Crashes, interruptions, resources").
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import select
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, cast

from ..check.config import CheckConfig
from ..check.reports.report import Report
from .isolate import (
    IsolatedError,
    Job,
    _ChildEnd,
    _collect_reports,
    _waiting_for_a_slot,
    _write_spec,
    child_env,
    supervise_child,
)

#: Properties whose failure means the check may have left its process unfit for the next
#: check: a failed capture can leave a stream capturing or the CUDA context broken (an
#: unjoined side stream, an illegal address), a raised replay the same. A failed "bounded
#: writes" or "row containment" is not among them: the checker sees those writes in its own
#: guarded allocation, freed with the check; a write that escapes it is seen by no property
#: (it crashes the process, or breaks its context, and both end the worker).
FRESH_PROCESS_AFTER = ("capture", "replays completed")

#: Exit codes of a child stopped by SIGINT / SIGTERM (``isolate._child``).
STOPPED_CODES = (130, 143)


@dataclasses.dataclass
class Task:
    """One check for the pool: ``key`` names it to the caller, ``cost`` orders the tasks
    (cheapest first; any consistent unit)."""

    key: object
    job: Job
    cost: float = 0.0
    #: a task with memory slots normally starts as soon as a slot is free (the big checks
    #: must not all wait for the end); with this set it waits its turn by cost like the
    #: others (a check that may be dropped once a cheaper one decides, ``WorkerPool.drop``)
    in_cost_order: bool = False
    #: seconds the check took in its worker, and that worker's process id (set by the pool)
    seconds: float = 0.0
    worker_pid: int | None = None


def needs_fresh_process(report: Report) -> bool:
    """Whether the worker that produced ``report`` must be replaced before its next check:
    it crashed, raised, or failed a property of ``FRESH_PROCESS_AFTER``."""
    if report.crash or (report.stopped and "raised" in report.stopped):
        return True
    return any(p.status == "FAIL" and p.name in FRESH_PROCESS_AFTER for p in report.properties)


def task_cost(cfg: CheckConfig) -> float:
    """A check's estimated cost, to order tasks: replays x batch rows x table width (pages),
    times 4 for a decode step (its attention and reference dominate)."""
    width = -(-cfg.max_context_len // cfg.page_size)
    return float(cfg.steps * cfg.max_bs * width * (4 if cfg.consumer else 1))


class _Worker:
    """One live worker process: its stdin for tasks, its stdout for answers, its stderr in
    a file (read from where the current check began)."""

    def __init__(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.err_path = folder / "stderr.txt"
        self._err = open(self.err_path, "wb")  # noqa: SIM115 - closed in close()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "pagegraph.supervise.worker_pool"],
            env=child_env(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._err,
        )
        self._buffer = b""

    @property
    def _stdin(self) -> IO[bytes]:
        assert self.proc.stdin is not None  # opened with a pipe
        return self.proc.stdin

    @property
    def _stdout(self) -> IO[bytes]:
        assert self.proc.stdout is not None  # opened with a pipe
        return self.proc.stdout

    def send(self, spec_path: Path) -> int:
        """Hand the worker a spec; returns the offset of its stderr where this check
        begins."""
        offset = self.err_path.stat().st_size
        self._stdin.write(f"{spec_path}\n".encode())
        self._stdin.flush()
        return offset

    def answer(self, timeout: float) -> str | None:
        """The worker's next answer line, or None if none came within ``timeout`` s (or it
        closed its stdout: it died, which ``proc.poll()`` tells)."""
        if b"\n" not in self._buffer:
            ready, _, _ = select.select([self._stdout], [], [], timeout)
            if ready:
                chunk = os.read(self._stdout.fileno(), 4096)
                if not chunk:  # it closed its stdout: it is ending
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        self.proc.wait(timeout=5)
                    return None
                self._buffer += chunk
        if b"\n" in self._buffer:
            line, self._buffer = self._buffer.split(b"\n", 1)
            return line.decode(errors="replace")
        return None

    def stderr_since(self, offset: int) -> str:
        with open(self.err_path, "rb") as f:
            f.seek(offset)
            return f.read().decode(errors="replace")

    def close(self) -> None:
        """Ask the worker to end (closing its stdin), and kill it if it does not."""
        with contextlib.suppress(OSError):
            self._stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._stdout.close()
        self._err.close()


def _wait_for_answer(
    worker: _Worker, limit: float | None, paused: Callable[[], bool] | None
) -> tuple[_ChildEnd, int | None]:
    """Wait for the worker's answer to its current task: ``(how it ended, the check's exit
    code)``; the code is None when the worker died or was killed (then ``returncode`` says
    how). The waiting is ``isolate.supervise_child``'s: a stop request is forwarded to the
    worker, the time limit stands still while ``paused()``, and it is killed past ``limit``."""
    died = object()

    def answered(timeout: float) -> object:
        line = worker.answer(timeout)
        if line is not None and line.startswith("done "):
            return int(line.split()[1])
        if line is None and worker.proc.poll() is not None:
            return died
        return None

    result, timed_out, interrupted = supervise_child(worker.proc, answered, limit, paused)
    if result is None or result is died:
        return _ChildEnd(worker.proc.returncode, timed_out, interrupted), None
    if result in STOPPED_CODES:
        interrupted = interrupted or KeyboardInterrupt()
    return _ChildEnd(None, False, interrupted), cast(int, result)  # "done RC": its code


class WorkerPool:
    """Run ``Task``s on ``workers`` warm worker processes; see the module docstring.

    ``timeout``: seconds one check may take (its worker is killed past it and the check
    reported as timed out). ``on_report(task, report)`` is called (from a pool thread, under
    the pool's lock) as each report is known.
    """

    def __init__(
        self,
        workers: int,
        tmp: Path,
        *,
        timeout: float | None = None,
        on_report: Callable[[Task, Report], object] | None = None,
    ) -> None:
        self.workers = max(1, workers)
        self.tmp = Path(tmp)
        self.timeout = timeout
        self.on_report = on_report
        #: processes started (the first ``workers`` plus every replacement)
        self.started = 0
        self._lock = threading.Condition()
        self._pending: list[Task] = []
        self._busy_slots: dict[tuple[str, ...], int] = {}
        self._reports: dict[object, Report] = {}
        self._error: BaseException | None = None
        self._counter = 0

    def run(self, tasks: list[Task]) -> dict[object, Report]:
        """Every task's report, by key. ``IsolatedError`` if a check could not run at all;
        ``KeyboardInterrupt`` (``.reports``: what was done) after a stop."""
        self._pending = sorted(tasks, key=lambda t: t.cost)
        threads = [
            threading.Thread(target=self._serve, args=(i,), daemon=True)
            for i in range(min(self.workers, len(tasks)))
        ]
        for t in threads:
            t.start()
        for t in threads:
            while t.is_alive():
                t.join(0.2)
        if self._error is not None:
            if isinstance(self._error, KeyboardInterrupt):
                self._error.reports = dict(self._reports)  # type: ignore[attr-defined]
            raise self._error
        return self._reports

    def drop(self, unwanted: Callable[[Task], bool]) -> list[Task]:
        """Take the pending tasks for which ``unwanted(task)`` is true out of the run (a
        task already running is left to finish); returns them. Safe to call from
        ``on_report``."""
        with self._lock:
            dropped = [t for t in self._pending if unwanted(t)]
            self._pending = [t for t in self._pending if not unwanted(t)]
            self._lock.notify_all()
            return dropped

    def _take(self) -> Task | None:
        """The next task for a free worker (None: nothing left, or the run stops): a task
        whose slot is free (``in_cost_order`` ones excepted), else the cheapest without
        slots or with a free one; waits while only tasks with every slot taken are left."""

        def slot_free(t: Task) -> bool:
            slots = t.job.memory_slots
            return self._busy_slots.get(slots, 0) < len(slots)

        with self._lock:
            while self._pending and self._error is None:
                free = [
                    t
                    for t in self._pending
                    if t.job.memory_slots and not t.in_cost_order and slot_free(t)
                ]
                plain = [
                    t
                    for t in self._pending
                    if not t.job.memory_slots or (t.in_cost_order and slot_free(t))
                ]
                task = free[0] if free else (plain[0] if plain else None)
                if task is not None:
                    self._pending.remove(task)
                    if task.job.memory_slots:
                        slots = task.job.memory_slots
                        self._busy_slots[slots] = self._busy_slots.get(slots, 0) + 1
                    return task
                self._lock.wait(0.5)
            return None

    def _done(self, task: Task, report: Report | None, error: BaseException | None) -> None:
        with self._lock:
            if task.job.memory_slots:
                self._busy_slots[task.job.memory_slots] -= 1
            if report is not None:
                self._reports[task.key] = report
                if self.on_report is not None:
                    self.on_report(task, report)
            if error is not None and self._error is None:
                self._error = error
            self._lock.notify_all()

    def _serve(self, index: int) -> None:
        """One pool thread: its worker process runs tasks until none is left."""
        worker: _Worker | None = None
        try:
            while (task := self._take()) is not None:
                if worker is None:
                    with self._lock:
                        self.started += 1
                        n = self.started
                    worker = _Worker(self.tmp / f"worker-{index}-{n}")
                try:
                    report, alive = self._run_task(worker, task)
                except BaseException as exc:  # noqa: BLE001 - handed to run()
                    self._done(task, getattr(exc, "report", None), exc)
                    break
                if not alive or needs_fresh_process(report):
                    worker.close()
                    worker = None
                self._done(task, report, None)
        finally:
            if worker is not None:
                worker.close()

    def _run_task(self, worker: _Worker, task: Task) -> tuple[Report, bool]:
        """Run one task on ``worker``: its report, and whether the worker is still alive."""
        with self._lock:
            self._counter += 1
            folder = self.tmp / f"task-{self._counter}"
        folder.mkdir(parents=True)
        spec_path = _write_spec([task.job], 0, folder)
        t0 = time.monotonic()
        task.worker_pid = worker.proc.pid
        offset = worker.send(spec_path)
        ended, code = _wait_for_answer(worker, self.timeout, lambda: _waiting_for_a_slot(folder))
        task.seconds = time.monotonic() - t0
        ended.stderr = worker.stderr_since(offset)
        ended.progress = (folder / "progress").read_bytes().decode(errors="replace").strip()
        reports: list[Report | None] = [None]
        _collect_reports([task.job], 0, folder, ended, reports, None)
        if ended.interrupted is not None:
            ended.interrupted.report = reports[0]  # type: ignore[attr-defined]  # for _serve
            raise ended.interrupted
        if reports[0] is None:
            raise IsolatedError(f"the check of {task.job.label or task.key} left no report")
        alive = code == 0 and worker.proc.poll() is None
        return reports[0], alive


# -- the worker --------------------------------------------------------------------------------


def _context_healthy() -> bool:
    """Whether this process can run another check: its CUDA context (if it made one)
    synchronises, and no stream is left capturing."""
    import torch

    is_initialized = torch.cuda.is_initialized  # torch's is unannotated
    if not (torch.cuda.is_available() and is_initialized()):  # type: ignore[no-untyped-call]
        return True
    try:
        if torch.cuda.is_current_stream_capturing():
            return False
        torch.cuda.synchronize()
    except Exception:  # noqa: BLE001 - any error: the context is not fit for another check
        return False
    return True


def _worker() -> int:
    """Run the spec paths read on stdin, one at a time, answering ``done RC`` for each;
    end at end of input, after a check that did not end normally, or when the process is no
    longer fit for another check. A builder's own prints go to /dev/null (the answers keep
    stdout to themselves)."""
    import gc

    from . import isolate

    answers = os.fdopen(os.dup(1), "w", buffering=1)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.close(devnull)
    for line in sys.stdin:
        spec_path = line.strip()
        if not spec_path:
            break
        code = isolate._child(spec_path)
        # The finished check's tensors and graphs caught in reference cycles, then their
        # cached blocks back to the device: a warm worker holds no more than a fresh one.
        gc.collect()
        isolate._free_cached_memory()
        healthy = _context_healthy()
        answers.write(f"done {code}\n")
        if code != 0 or not healthy:
            return code
    return 0


if __name__ == "__main__":
    sys.exit(_worker())
