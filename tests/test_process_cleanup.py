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

from pagegraph.check.isolate import child_env
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


def wait_until(predicate, what: str):
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    pytest.fail(f"gave up waiting ({TIMEOUT_S:.0f} s) for {what}")


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
        cmd = [sys.executable, "-m", "pagegraph", "check", "default", "--builder",
               f"{builder}:build", "--isolate", "--replays", "100000", *extra]  # fmt: skip
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)  # fmt: skip
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
    (child,) = [p for p in descendants(proc.pid) if "pagegraph.check.isolate" in _cmdline(p)]
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
    parent = subprocess.Popen([sys.executable, "-c", code], env=child_env(),
                              stdout=subprocess.PIPE, text=True)  # fmt: skip
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
    done = subprocess.run(lifetime.script_command(str(script), "x"), env=child_env(),
                          capture_output=True, text=True)  # fmt: skip
    assert (done.returncode, done.stdout) == (3, "__main__ ['x']\n")


def test_reproducers_run_as_children_that_end_with_the_job(tmp_path):
    from pagegraph.jobs.sglang_job import run_reproducer

    script = tmp_path / "repro.py"
    script.write_text("import sys\nsys.exit(1 if __name__ == '__main__' else 0)\n")
    assert run_reproducer(str(script)) == {"exit_code": 1, "state": "bug present (exit 1)"}
