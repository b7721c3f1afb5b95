"""Child processes that end with their parent, and stop promptly when told to.

Nobody reads what a child of pagegraph produces once its parent is gone (an isolated check, the
workload's generators, the reproducers of ``make sglang``), so ``die_with_parent`` ends a child
with its parent however the parent ended, ``escalate_stop`` ends a child that a clean-stop
request cannot reach in time (a long capture, an interpreted kernel) after writing its partial
report, and ``script_command`` runs a script under the first (docs/ARCHITECTURE.md, "Crashes,
interruptions, resources").
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import runpy
import signal
import sys
import threading
from collections.abc import Callable, Iterable, Iterator

#: Seconds between two checks of ``os.getppid()`` by the watchdog.
WATCH_S = 0.5
#: Seconds a child told to stop has to stop cleanly before it ends itself.
STOP_GRACE_S = 1.0

_PR_SET_PDEATHSIG = 1


def _set_pdeathsig(signum: int) -> bool:
    """Ask the kernel to send ``signum`` to this process when its parent ends (Linux)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return bool(libc.prctl(_PR_SET_PDEATHSIG, int(signum), 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


def die_with_parent(parent: int | None = None, signum: int = signal.SIGKILL) -> bool:
    """End this process when ``parent`` ends (default: ``os.getppid()`` now; a parent passes
    its pid where the child may start after it died): the kernel's parent-death signal
    ``signum`` where there is one, else (and as well) a watchdog thread that ends the process
    with ``os._exit(1)`` once ``os.getppid()`` is no longer ``parent``. Returns whether the
    kernel's signal is set."""
    if parent is None:
        parent = os.getppid()
    armed = _set_pdeathsig(signum)
    # The parent may have ended before prctl ran: the child then has a new parent already.
    if os.getppid() != parent:
        os._exit(1)

    def watch() -> None:
        while True:
            threading.Event().wait(WATCH_S)
            if os.getppid() != parent:
                os._exit(1)

    threading.Thread(target=watch, name="pagegraph-parent-watchdog", daemon=True).start()
    return armed


@contextlib.contextmanager
def escalate_stop(
    flush: Callable[[], object] | None = None,
    grace: float = STOP_GRACE_S,
    signals: Iterable[int] = (signal.SIGINT, signal.SIGTERM),
) -> Iterator[None]:
    """While the body runs (in the main thread, with Python handlers set for ``signals``,
    e.g. by ``stop_on_signals``), a stop signal not obeyed within ``grace`` seconds ends the
    process: ``flush()`` first (its errors ignored), then ``os._exit(128 + signum)``. The
    handlers themselves are the caller's: they ask for the clean stop."""
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    previous = signal.set_wakeup_fd(write_fd)
    wanted = {int(s) for s in signals}

    def watch() -> None:
        with os.fdopen(read_fd, "rb", buffering=0) as pipe:
            while True:
                data = pipe.read(64)
                if not data:  # the body ended: the write end is closed
                    return
                hit = [b for b in data if b in wanted]
                if hit:
                    break
        threading.Event().wait(grace)
        if flush is not None:
            with contextlib.suppress(Exception):
                flush()
        os._exit(128 + hit[0])

    threading.Thread(target=watch, name="pagegraph-stop-escalation", daemon=True).start()
    try:
        yield
    finally:
        signal.set_wakeup_fd(previous)
        os.close(write_fd)  # the watcher reads the end of the pipe and returns


def run_script(argv: list[str]) -> None:
    """``[PARENT_PID, SCRIPT, ARGS...]``: run SCRIPT as ``__main__`` under
    ``die_with_parent``."""
    parent, script, *args = argv
    die_with_parent(int(parent))
    sys.argv = [script, *args]
    runpy.run_path(script, run_name="__main__")


def script_command(script: str, *args: str) -> list[str]:
    """The command that runs the Python ``script`` with ``args`` as a child of this process
    that ends with it (``python -c``: ``-m`` would warn that the module is imported twice)."""
    code = "import sys; from pagegraph.workload.lifetime import run_script as r; r(sys.argv[1:])"
    return [sys.executable, "-c", code, str(os.getpid()), str(script), *args]
