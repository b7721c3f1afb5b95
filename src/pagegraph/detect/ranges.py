"""NVTX ranges for every pagegraph phase, and a thread-local stack of the open ones.

Every phase of the bed runs inside a named range (``replay/bs=8``), emitted to NVTX in the
``"pagegraph"`` domain, so Nsight Systems shows it, and pushed on a stack that the in-process
sync detectors read at each offending call: both name the same range. A push and pop cost a
dict lookup and two NVTX calls (no-ops with no profiler attached); ``set_record_function``
adds torch.profiler ranges (docs/ARCHITECTURE.md, "Sync detectors, ranges and traces").
"""

from __future__ import annotations

import os
import threading
import time
from types import TracebackType
from typing import Any

__all__ = [
    "DEFAULT_COLOR",
    "PHASES",
    "PHASE_COLORS",
    "current_range",
    "measure_range_cost",
    "phase",
    "pop",
    "push",
    "range_name",
    "range_stack",
    "record_function_enabled",
    "set_record_function",
]

DOMAIN = "pagegraph"

#: The phases of the test bed, in the order a run goes through them.
PHASES = ("workload", "warmup", "capture", "stage", "replay", "verify", "build", "bench")

#: One ARGB colour per phase, distinct enough to tell apart on an Nsight timeline.
PHASE_COLORS = {
    "workload": 0xFF6D4C41,  # brown
    "warmup": 0xFFFFA000,  # amber
    "capture": 0xFFD32F2F,  # red
    "stage": 0xFF00ACC1,  # cyan
    "replay": 0xFF43A047,  # green
    "verify": 0xFF8E24AA,  # purple
    "build": 0xFF1E88E5,  # blue
    "bench": 0xFFFDD835,  # yellow
}
DEFAULT_COLOR = 0xFF9E9E9E  # grey, for any other range name

_local = threading.local()
_record_function = False

# The NVTX domain is looked up on first use, not at import: importing pagegraph must not
# fail (or pay for NVTX initialisation) where the nvtx package is missing or broken.
_UNRESOLVED = object()
_domain: Any = _UNRESOLVED
_attributes: dict[str, Any] = {}


#: The variables through which a tool (Nsight Systems, Nsight Compute) injects itself into
#: NVTX: without one, every NVTX call is a no-op, and importing nvtx (its native library)
#: costs a few tenths of a second of start-up for nothing. ``PAGEGRAPH_NVTX=1`` loads it
#: anyway (a tool injected some other way).
NVTX_INJECTION_VARS = ("NVTX_INJECTION64_PATH", "NVTX_INJECTION32_PATH", "PAGEGRAPH_NVTX")


def nvtx_tool_attached() -> bool:
    """Whether a tool listens to NVTX in this process (see ``NVTX_INJECTION_VARS``)."""
    return any(os.environ.get(v) for v in NVTX_INJECTION_VARS)


def _get_domain() -> Any:
    global _domain
    if _domain is _UNRESOLVED:
        if not nvtx_tool_attached():
            _domain = None  # no tool: the ranges are only tracked (current_range)
            return _domain
        try:
            import nvtx

            # A disabled domain (no tool attached) comes back as nvtx's dummy domain, whose
            # push/pop are no-ops: that is the cheap path when nobody is profiling.
            _domain = nvtx.get_domain(DOMAIN)
        except Exception:  # ImportError, or a broken native library
            _domain = None
    return _domain


def _get_attributes(full_name: str) -> Any:
    attrs = _attributes.get(full_name, _UNRESOLVED)
    if attrs is _UNRESOLVED:
        domain = _get_domain()
        color = PHASE_COLORS.get(full_name.split("/", 1)[0], DEFAULT_COLOR)
        attrs = None if domain is None else domain.get_event_attributes(full_name, color)
        _attributes[full_name] = attrs
    return attrs


def _stack() -> list[tuple[str, Any]]:
    try:
        stack: list[tuple[str, Any]] = _local.stack
    except AttributeError:
        stack = _local.stack = []
    return stack


def range_name(name: str, bs: int | None = None) -> str:
    """The full name of a range: ``"replay/bs=8"`` for ``("replay", 8)``, else ``name``."""
    return name if bs is None else f"{name}/bs={bs}"


def push(name: str, bs: int | None = None) -> str:
    """Open a range (hot-path form of :func:`phase`); returns its full name.

    Every ``push`` must be matched by a :func:`pop` on the same thread.
    """
    full_name = name if bs is None else f"{name}/bs={bs}"
    attrs = _get_attributes(full_name)
    if attrs is not None:
        _domain.push_range(attrs)
    rf: Any = None
    if _record_function:
        import torch.profiler

        rf = torch.profiler.record_function(full_name)
        rf.__enter__()
    _stack().append((full_name, rf))
    return full_name


def pop() -> str:
    """Close the innermost range opened on this thread; returns its full name."""
    stack = _stack()
    if not stack:
        raise RuntimeError("pagegraph.detect.ranges.pop() without a matching push() on this thread")
    full_name, rf = stack.pop()
    if rf is not None:
        rf.__exit__(None, None, None)
    if _attributes.get(full_name) is not None:
        _domain.pop_range()
    return full_name


class phase:
    """Context manager for one range: ``with phase("replay", bs=8): graph.replay()``.

    The range is closed even when the body raises. An exception that escapes a range is
    tagged with ``pagegraph_range`` (the innermost range it escaped from), so code that
    handles it after the stack has unwound can still say where it happened.
    """

    __slots__ = ("name",)

    def __init__(self, name: str, bs: int | None = None) -> None:
        self.name = name if bs is None else f"{name}/bs={bs}"

    def __enter__(self) -> str:
        # push() would rebuild the full name; this path reuses the one built in __init__.
        return push(self.name)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        pop()
        if exc is not None and not hasattr(exc, "pagegraph_range"):
            try:
                exc.pagegraph_range = self.name  # type: ignore[attr-defined]
            except (AttributeError, TypeError):  # exception types without a __dict__
                pass


def current_range() -> str | None:
    """Full name of the innermost range open on this thread, or ``None``."""
    stack = _stack()
    return stack[-1][0] if stack else None


def range_stack() -> tuple[str, ...]:
    """Full names of the ranges open on this thread, outermost first."""
    return tuple(entry[0] for entry in _stack())


def set_record_function(enabled: bool) -> None:
    """Also open a ``torch.profiler.record_function`` for each range (default off).

    Applies to ranges opened after the call; open ones close the way they were opened.
    """
    global _record_function
    _record_function = bool(enabled)


def record_function_enabled() -> bool:
    return _record_function


def measure_range_cost(n: int = 100_000) -> float:
    """Seconds per ``push`` + ``pop`` pair, averaged over ``n`` pairs on this thread.

    Measures the configuration in force (NVTX attached or not, record_function on or off).
    With a profiler attached this emits ``n`` ranges named ``range_cost``.
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    push("range_cost")  # builds and caches the attributes outside the timed loop
    pop()
    start = time.perf_counter_ns()
    for _ in range(n):
        push("range_cost")
        pop()
    elapsed = time.perf_counter_ns() - start
    return max(elapsed, 1) / n / 1e9
