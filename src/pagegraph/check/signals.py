"""Stopping a running check cleanly: a signal asks for a stop, the replay loop sees it between
two replays, and the check raises ``CheckInterrupted`` with the report of what it checked.

The request is one process-wide flag, set from a signal handler (nothing else is safe there:
the handler may run inside a CUPTI callback, where an exception would be lost)."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterable, Iterator

from .reports.report import Report


class _StopRequest:
    """A stop asked for by a signal handler, seen by the replay loop between two replays."""

    signum: int | None = None


_STOP = _StopRequest()


def request_stop(signum: int = signal.SIGINT) -> None:
    """Ask a running check to stop after its current replay (safe from a signal handler)."""
    _STOP.signum = signum


def stop_requested() -> int | None:
    """The signal a stop was requested with, or None."""
    return _STOP.signum


@contextlib.contextmanager
def stop_on_signals(
    signals: Iterable[int] = (signal.SIGINT, signal.SIGTERM),
) -> Iterator[None]:
    """While the body runs, SIGINT and SIGTERM request a stop instead of raising wherever the
    interpreter happens to be (inside a CUPTI callback, say, where an exception would be
    lost): the check stops between two replays, reports what it checked, and raises
    ``CheckInterrupted``. Handlers are restored and the request cleared on exit."""
    previous = {
        sig: signal.signal(sig, lambda signum, frame: request_stop(signum)) for sig in signals
    }
    _STOP.signum = None
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        _STOP.signum = None


class CheckInterrupted(KeyboardInterrupt):
    """The run was interrupted (Ctrl-C, or SIGTERM where the caller turns it into this);
    ``report`` holds everything checked so far, marked incomplete."""

    def __init__(self, report: Report, signum: int = signal.SIGINT):
        super().__init__(f"interrupted by signal {signum}")
        self.report = report
        self.signum = signum
