"""Progress lines for the jobs that can run for minutes: ``pagegraph check``, ``mutate``,
``make sglang``, ``bench``, ``profile``.

A ``Progress`` prints one complete line on stderr at most every ``every`` seconds (and once more
at the end when it printed any), with the time left estimated from the rate so far, by weight
where items differ in size; ``heartbeat()`` keeps printing while nothing is done.
(``pagegraph.jobs.check_estimate`` says before a check starts that it will take long.)
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

#: Seconds between two progress lines at most.
EVERY_S = 5.0


def format_seconds(seconds: float) -> str:
    """``42 s``, ``3 min 5 s``, ``2 h 10 min``."""
    seconds = max(0, int(round(seconds)))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60} min"


class Progress:
    """``done``/``total`` ``unit`` of a job labelled ``label``, its elapsed time and the time
    left at the rate so far, on ``stream`` (default stderr). ``clock`` is injectable (tests).
    Thread-safe: workers of a pool may call ``advance`` / ``update`` at once."""

    def __init__(
        self,
        label: str,
        total: int,
        unit: str = "",
        *,
        every: float = EVERY_S,
        stream: Any = None,
        clock: Any = time.monotonic,
    ) -> None:
        self.label, self.total, self.unit = label, total, unit
        self.every = every
        self.stream = stream
        self.clock = clock
        self.start = clock()
        self.done = 0
        self.detail = ""
        self._printed_at: float | None = None
        self._closed = False  # the end line printed
        self._first: tuple[float, float] | None = None  # (time, progress) at the first done item
        #: the items' total weight when they are weighed (``advance(weight=...)``), else None
        self.total_weight: float | None = None
        self.done_weight = 0.0
        self._lock = threading.Lock()

    @property
    def _progress(self) -> float:
        """What is done, in the unit of the estimate: weight when weighed, else items."""
        return self.done_weight if self.total_weight else float(self.done)

    def _left(self) -> float:
        if self.total_weight:
            return max(0.0, self.total_weight - self.done_weight)
        return float(self.total - self.done)

    def line(self) -> str:
        """The current progress line."""
        elapsed = self.clock() - self.start
        unit = f" {self.unit}" if self.unit else ""
        text = f"{self.label}: {self.done}/{self.total}{unit}, {format_seconds(elapsed)} elapsed"
        if self.done >= self.total:
            text += ", done"
        elif self.done > 0 and self._progress > 0:
            since, done_then = self._first or (self.start, 0.0)
            if self._progress > done_then:
                rate = (self.clock() - since) / (self._progress - done_then)
            else:
                rate = elapsed / self._progress
            text += f", about {format_seconds(rate * self._left())} left"
        else:
            text += ", time left not known yet"
        return text + (f" ({self.detail})" if self.detail else "")

    def update(self, done: int, detail: str | None = None, force: bool = False) -> None:
        """Set what is done; print the line if ``every`` seconds passed since the last one,
        at the end if a line was printed before, or when ``force``."""
        with self._lock:
            self.done = done
            self._note_first()
            if detail is not None:
                self.detail = detail
            self._maybe_print(force or self._ended())

    def advance(self, n: int = 1, detail: str | None = None, weight: float = 0.0) -> None:
        """``n`` more done, weighing ``weight`` (when ``total_weight`` is set)."""
        with self._lock:
            self.done += n
            self.done_weight += weight
            self._note_first()
            if detail is not None:
                self.detail = detail
            self._maybe_print(self._ended())

    def forgo(self, n: int, weight: float = 0.0) -> None:
        """``n`` planned items, weighing ``weight``, will not be done after all: the total
        and the time left shrink by them."""
        with self._lock:
            self.total -= n
            if self.total_weight:
                self.total_weight -= weight
            self._maybe_print(self._ended())

    def _note_first(self) -> None:
        if self._first is None and self.done > 0:
            self._first = (self.clock(), self._progress)

    def _ended(self) -> bool:
        """Whether the end line is due: all done, a line printed before, not this one yet."""
        return self.done >= self.total and self._printed_at is not None and not self._closed

    def tick(self) -> None:
        """Print the line if ``every`` seconds passed since the last one (a heartbeat)."""
        with self._lock:
            self._maybe_print(False)

    def _maybe_print(self, force: bool) -> None:
        now = self.clock()
        last = self._printed_at if self._printed_at is not None else self.start
        if self._closed or (not force and now - last < self.every):
            return
        self._printed_at = now
        self._closed = self.done >= self.total
        stream = self.stream if self.stream is not None else sys.stderr
        print(self.line(), file=stream, flush=True)

    @contextlib.contextmanager
    def heartbeat(self, period: float = 1.0) -> Iterator[Progress]:
        """While the body runs, a thread calls ``tick()`` every ``period`` seconds."""
        stop = threading.Event()

        def beat() -> None:
            while not stop.wait(period):
                self.tick()

        thread = threading.Thread(target=beat, name="pagegraph-progress", daemon=True)
        thread.start()
        try:
            yield self
        finally:
            stop.set()
            thread.join()
