"""Invariant: the ``pagegraph`` process entry (``pagegraph.cli.run``) ends with ``main``'s exit
code, after every ``atexit`` handler and with all its output shown; it skips the interpreter's
teardown only when no other non-daemon thread is alive and no CUDA tool is injected, and
takes the usual exit otherwise."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# A process whose ``main`` returns 3 after printing without a newline; it registers an atexit
# handler, and ``os._exit`` (the quick exit's last step) leaves a mark before it ends the process.
SCRIPT = """
import atexit, os, sys, threading, time
from pathlib import Path
import pagegraph.cli as cli

out = Path(sys.argv[1])
real_exit = os._exit

def marked_exit(code):
    (out / "quick").write_text(str(code))
    real_exit(code)

os._exit = marked_exit
atexit.register(lambda: (out / "atexit").write_text("ran"))

def main():
    if sys.argv[2] == "thread":
        def late():
            time.sleep(0.3)
            (out / "thread").write_text("finished")
        threading.Thread(target=late).start()
    print("the last words", end="")
    return 3

cli.main = main
cli.run()
"""


def _run(tmp_path: Path, mode: str, **env) -> subprocess.CompletedProcess:
    script = tmp_path / "entry.py"
    script.write_text(SCRIPT)
    # TRITON_INTERPRET set: importing pagegraph then asks nothing of CUDA (an injection
    # variable naming no tool must not reach a driver).
    environment = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "TRITON_INTERPRET": "1", **env}
    for name in ("CUDA_INJECTION64_PATH", "LD_PRELOAD"):
        if name not in env:
            environment.pop(name, None)
    return subprocess.run(
        [sys.executable, str(script), str(tmp_path), mode],
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_quick_exit_keeps_the_code_the_output_and_the_atexit_handlers(tmp_path):
    done = _run(tmp_path, "plain")
    assert done.returncode == 3, done.stderr
    assert done.stdout == "the last words"
    assert (tmp_path / "atexit").read_text() == "ran"
    assert (tmp_path / "quick").read_text() == "3"


def test_a_live_non_daemon_thread_gets_the_usual_exit(tmp_path):
    done = _run(tmp_path, "thread")
    assert done.returncode == 3, done.stderr
    assert (tmp_path / "thread").read_text() == "finished"
    assert not (tmp_path / "quick").exists()


@pytest.mark.parametrize("variable", ["CUDA_INJECTION64_PATH", "LD_PRELOAD"])
def test_an_injected_cuda_tool_gets_the_usual_exit(tmp_path, variable):
    # An empty LD_PRELOAD entry is ignored by the loader; any non-empty value counts here.
    value = " " if variable == "LD_PRELOAD" else str(tmp_path / "no-such-tool.so")
    done = _run(tmp_path, "plain", **{variable: value})
    assert done.returncode == 3, done.stderr
    assert done.stdout == "the last words"
    assert (tmp_path / "atexit").read_text() == "ran"
    assert not (tmp_path / "quick").exists()
