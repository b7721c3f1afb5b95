"""Invariant: no pagegraph child process outlives its parent, however the parent ends (SIGINT,
SIGTERM, SIGKILL: a CI time-out or the OOM killer), and a child told SIGTERM stops even in
the middle of a builder call that takes long, its parent reporting it.

A real ``pagegraph check --isolate`` runs a file builder that is slow on purpose (it sleeps in
every call, so a replay lasts long past the child's stop grace) and touches a marker file once
called; the test then signals the parent (or the child) and looks in ``/proc`` for the
processes it had started. The waits are bounded by a test time-out, never asserted as speed.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from pagegraph.supervise.isolate import child_env
from pagegraph.workload import lifetime

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")

#: Seconds any wait of these tests may take before the test fails (a bound, not a speed).
TIMEOUT_S = 60.0

SLOW_BUILDER = """
import os, time
from pathlib import Path
from pagegraph import build_page_table

def build(req_to_token, req_pool_indices, seq_lens, page_table, page_size, *,
          swa_page_table=None, full_to_swa=None, errors=None):
    Path(os.environ["PAGEGRAPH_TEST_MARKER"]).touch()
    time.sleep(float(os.environ.get("PAGEGRAPH_TEST_SLEEP", "0.05")))
    build_page_table(req_to_token, req_pool_indices, seq_lens, page_table, page_size,
                     swa_page_table=swa_page_table, full_to_swa=full_to_swa, errors=errors)
"""


def _parents() -> dict[int, int]:
    """Every live process's parent pid, from ``/proc/PID/stat`` (zombies left out)."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses
        fields = stat[stat.rindex(")") + 2 :].split()
        if fields[0] != "Z":
            found[int(entry)] = int(fields[1])
    return found


def descendants(pid: int) -> set[int]:
    """The live processes below ``pid``."""
    parents = _parents()
    out, frontier = set(), {pid}
    while frontier:
        frontier = {p for p, pp in parents.items() if pp in frontier} - out
        out |= frontier
    return out


def alive(pids) -> set[int]:
    """Those of ``pids`` still running (not zombies)."""
    parents = _parents()
    return {p for p in pids if p in parents}


def wait_until(predicate, what: str, timeout: float = TIMEOUT_S):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    pytest.fail(f"gave up waiting ({timeout:.0f} s) for {what}")


@pytest.fixture
def slow_check(tmp_path):
    """Start ``pagegraph check default --isolate`` of the slow builder; returns the parent
    ``Popen`` and a function waiting for the child to be inside a builder call."""
    builder = tmp_path / "slow.py"
    builder.write_text(textwrap.dedent(SLOW_BUILDER))
    marker = tmp_path / "called"
    started = []

    def start(*extra: str, sleep: float = 0.05):
        env = dict(child_env(), PAGEGRAPH_TEST_MARKER=str(marker), PAGEGRAPH_TEST_SLEEP=str(sleep))
        cmd = [
            sys.executable,
            "-m",
            "pagegraph",
            "check",
            "default",
            "--builder",
            f"{builder}:build",
            "--isolate",
            "--replays",
            "100000",
            *extra,
        ]
        proc = subprocess.Popen(
            cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        started.append(proc)
        wait_until(lambda: marker.exists() or proc.poll() is not None, "the builder's first call")
        assert proc.poll() is None, proc.communicate()
        return proc

    yield start
    for proc in started:  # whatever a failed test left: ours, by pid
        for pid in descendants(proc.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


@pytest.mark.parametrize(
    ("signum", "code"),
    [(signal.SIGINT, 130), (signal.SIGTERM, 143), (signal.SIGKILL, -signal.SIGKILL)],
)
def test_children_end_with_the_parent(slow_check, signum, code):
    # A builder call lasting far longer than the stop grace: the child cannot stop between
    # two replays in time, it must end itself (or be ended by the kernel with its parent).
    proc = slow_check(sleep=30.0)
    children = descendants(proc.pid)
    assert children, "the check started no child process"
    proc.send_signal(signum)
    out, err = proc.communicate(timeout=TIMEOUT_S)
    assert proc.returncode == code, err
    wait_until(lambda: not alive(children), f"children {sorted(alive(children))} to end")
    if signum != signal.SIGKILL:
        assert "interrupted by" in out


def test_workload_children_end_with_a_killed_parent(slow_check):
    # The check's child starts the workload's generator processes in turn: SIGKILL to the
    # top leaves none of the three generations running.
    proc = slow_check("--workload-process", "on")
    wait_until(lambda: len(descendants(proc.pid)) >= 2, "the workload's child processes")
    children = descendants(proc.pid)
    proc.kill()
    proc.communicate(timeout=TIMEOUT_S)
    wait_until(lambda: not alive(children), f"children {sorted(alive(children))} to end")


def test_a_child_told_sigterm_stops_and_the_parent_reports_it(slow_check):
    proc = slow_check(sleep=30.0)
    (child,) = [p for p in descendants(proc.pid) if "pagegraph.supervise.isolate" in _cmdline(p)]
    os.kill(child, signal.SIGTERM)
    out, err = proc.communicate(timeout=TIMEOUT_S)
    assert proc.returncode == 1, err  # the scenario UNSAFE: its check did not finish
    assert "the check process was stopped by SIGTERM during" in out
    assert "verdict: UNSAFE" in out


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def test_die_with_parent_ends_an_orphan(tmp_path):
    # A grandchild armed with die_with_parent, whose parent is then SIGKILLed.
    code = textwrap.dedent(
        """
        import subprocess, sys, time
        child = subprocess.Popen([sys.executable, "-c",
            "import time; from pagegraph.workload.lifetime import die_with_parent;"
            "die_with_parent(); print('armed', flush=True); time.sleep(600)"],
            stdout=subprocess.PIPE, text=True)
        child.stdout.readline()
        print(child.pid, flush=True)
        time.sleep(600)
        """
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", code], env=child_env(), stdout=subprocess.PIPE, text=True
    )
    try:
        grandchild = int(parent.stdout.readline())
        assert alive([grandchild])
        parent.kill()
        parent.wait()
        wait_until(lambda: not alive([grandchild]), "the orphaned grandchild to end")
    finally:
        parent.kill()
        parent.communicate()


def test_script_command_runs_a_script_as_main(tmp_path):
    script = tmp_path / "s.py"
    script.write_text("import sys\nprint(__name__, sys.argv[1:])\nsys.exit(3)\n")
    done = subprocess.run(
        lifetime.script_command(str(script), "x"), env=child_env(), capture_output=True, text=True
    )
    assert (done.returncode, done.stdout) == (3, "__main__ ['x']\n")


#: Seconds a child whose parent was SIGKILLed may take to end: the kernel's parent-death
#: signal ends it at once, the watchdog within ``lifetime.WATCH_S`` (a bound, not a speed).
ORPHAN_END_S = 5.0

LONG_REPRODUCER = """
import os, time
from pathlib import Path
Path({pid_file!r}).write_text(str(os.getpid()))
time.sleep(600)
"""


def test_reproducers_run_as_children_that_end_with_the_job(tmp_path):
    from pagegraph.jobs.sglang_job import run_reproducer

    script = tmp_path / "repro.py"
    script.write_text("import sys\nsys.exit(1 if __name__ == '__main__' else 0)\n")
    assert run_reproducer(str(script)) == {"exit_code": 1, "state": "bug present (exit 1)"}

    # A job running a reproducer that lasts long is SIGKILLed (a CI time-out): the
    # reproducer, its child, ends with it instead of sleeping on.
    pid_file = tmp_path / "repro.pid"
    long_script = tmp_path / "long_repro.py"
    long_script.write_text(textwrap.dedent(LONG_REPRODUCER.format(pid_file=str(pid_file))))
    code = "import sys; from pagegraph.jobs.sglang_job import run_reproducer as r; r(sys.argv[1])"
    job = subprocess.Popen([sys.executable, "-c", code, str(long_script)], env=child_env())
    reproducer = None
    try:
        wait_until(
            lambda: pid_file.exists() and pid_file.read_text() or job.poll() is not None,
            "the reproducer to start",
        )
        assert job.poll() is None, f"the job ended with code {job.returncode}"
        reproducer = int(pid_file.read_text())
        assert _parents().get(reproducer) == job.pid, "the reproducer is not the job's child"
        job.kill()
        job.wait(timeout=TIMEOUT_S)
        wait_until(
            lambda: not alive([reproducer]),
            f"the reproducer {reproducer} to end",
            timeout=ORPHAN_END_S,
        )
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
        if reproducer is not None and alive([reproducer]):
            os.kill(reproducer, signal.SIGKILL)


# -- die_with_parent's fallbacks, and warm workers ---------------------------------------------

#: A grandchild armed with the watchdog alone: the kernel's parent-death signal switched off
#: (as where prctl is missing), and its exit recorded (``os._exit`` is how the watchdog ends
#: the process: the code and the thread that called it go to the marker file).
WATCHDOG_ONLY = """
import os, sys, threading, time
from pagegraph.workload import lifetime

marker = sys.argv[1]
real_exit = os._exit

def recorded_exit(code):
    with open(marker, "w") as f:
        f.write(f"{code} {threading.current_thread().name}")
    real_exit(code)

os._exit = recorded_exit
lifetime._set_pdeathsig = lambda signum: False
lifetime.WATCH_S = 0.05
armed = lifetime.die_with_parent()
print("armed" if not armed else "prctl armed", flush=True)
time.sleep(600)
"""


def test_the_watchdog_alone_ends_an_orphan(tmp_path):
    script = tmp_path / "watchdog_only.py"
    script.write_text(textwrap.dedent(WATCHDOG_ONLY))
    marker = tmp_path / "exit"
    code = textwrap.dedent(
        f"""
        import subprocess, sys, time
        child = subprocess.Popen([sys.executable, {str(script)!r}, {str(marker)!r}],
                                 stdout=subprocess.PIPE, text=True)
        print(child.stdout.readline().strip(), child.pid, flush=True)
        time.sleep(600)
        """
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", code], env=child_env(), stdout=subprocess.PIPE, text=True
    )
    grandchild = None
    try:
        state, pid = parent.stdout.readline().split()
        grandchild = int(pid)
        assert state == "armed", "the kernel's signal was set: not the watchdog alone"
        assert alive([grandchild])
        parent.kill()
        parent.wait()
        wait_until(lambda: not alive([grandchild]), "the orphan to end", timeout=ORPHAN_END_S)
        assert marker.read_text() == "1 pagegraph-parent-watchdog"
    finally:
        parent.kill()
        parent.communicate()
        if grandchild is not None and alive([grandchild]):
            os.kill(grandchild, signal.SIGKILL)


def test_a_child_whose_parent_is_already_gone_ends_at_once():
    # The parent ended while the child started: the pid it passed is no longer the child's
    # parent by the time die_with_parent runs.
    gone = subprocess.Popen([sys.executable, "-c", ""])
    gone.wait()
    code = (
        "import sys; from pagegraph.workload.lifetime import die_with_parent; "
        "die_with_parent(int(sys.argv[1])); print('survived', flush=True)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(gone.pid)],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert (done.returncode, done.stdout, done.stderr) == (1, "", "")
    # Its parent alive (the default: the parent now), the same call returns.
    done = subprocess.run(
        [sys.executable, "-c", code, str(os.getpid())],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert (done.returncode, done.stdout) == (0, "survived\n"), done.stderr


def _pool_state(pool: Path, parent: int) -> str:
    """The pool's processes and each worker's stderr and progress (their last lines)."""
    lines = [f"processes under the parent: {sorted(descendants(parent))}"]
    # A task folder without a spec is one whose planning failed in the pool's thread.
    folders = sorted(p for p in pool.iterdir() if p.is_dir()) if pool.is_dir() else []
    lines += [f"{f.name}: {sorted(c.name for c in f.iterdir()) or '(empty)'}" for f in folders]
    for path in sorted(pool.rglob("*")):
        if path.is_file() and path.name in ("stderr.txt", "progress"):
            tail = path.read_bytes().decode(errors="replace").strip().splitlines()[-3:]
            lines.append(f"{path.relative_to(pool)}: {' | '.join(tail) or '(empty)'}")
    return "; ".join(lines)


#: A builder that records which worker called it (a file named by its pid) and then sleeps
#: past any bound of the test: a worker is inside a check when its parent is killed.
POOL_BUILDER = """
import os, time
from pathlib import Path

def build(req_to_token, req_pool_indices, seq_lens, page_table, page_size, **kwargs):
    Path(os.environ["PAGEGRAPH_TEST_CALLED"], str(os.getpid())).touch()
    time.sleep(600)
"""

POOL_PARENT = """
import sys
from pathlib import Path
from pagegraph.check.config import CheckConfig
from pagegraph.supervise.isolate import Job
from pagegraph.supervise.worker_pool import Task, WorkerPool

builder, tmp = sys.argv[1], Path(sys.argv[2])
cfg = CheckConfig(max_bs=4, max_context_len=64, page_size=16, steps=2, buckets="pow2")
tasks = [Task(i, Job(builder, cfg.replace(seed=i))) for i in range(2)]
WorkerPool(2, tmp).run(tasks)
"""


@pytest.mark.heavy
@pytest.mark.cpu_heavy
def test_a_warm_pools_workers_end_with_a_killed_parent(tmp_path, monkeypatch):
    builder = tmp_path / "pool_builder.py"
    builder.write_text(textwrap.dedent(POOL_BUILDER))
    called = tmp_path / "called"
    called.mkdir()
    monkeypatch.setenv("PAGEGRAPH_TEST_CALLED", str(called))
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(POOL_PARENT),
            f"{builder}:build",
            str(tmp_path / "pool"),
        ],
        env=child_env(),
    )
    workers: set[int] = set()
    try:
        # Both workers inside their check's first builder call.
        # Two workers start torch and plan a check each: minutes on a loaded 2-core machine.
        try:
            wait_until(
                lambda: len(list(called.iterdir())) >= 2 or parent.poll() is not None,
                "both workers' first builder call",
                timeout=300,
            )
        except pytest.fail.Exception as exc:  # say where the workers were, for a rare stall
            calls = sorted(p.name for p in called.iterdir())
            state = _pool_state(tmp_path / "pool", parent.pid)
            raise AssertionError(f"{exc}; builder calls by pid: {calls}; {state}") from None
        assert parent.poll() is None, f"the pool's parent ended with code {parent.returncode}"
        workers = {int(p.name) for p in called.iterdir()}
        assert workers <= descendants(parent.pid) and len(workers) == 2
        assert all("pagegraph.supervise.worker_pool" in _cmdline(p) for p in workers)
        parent.kill()
        parent.wait(timeout=TIMEOUT_S)
        wait_until(
            lambda: not alive(workers),
            f"workers {sorted(alive(workers))} to end",
            timeout=ORPHAN_END_S,
        )
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
        for pid in alive(workers):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
