"""The model of a trace that every reader produces, in integer nanoseconds."""

from __future__ import annotations

from dataclasses import dataclass, field

from .sync_calls import api_base_name

__all__ = [
    "D2H_COPY",
    "SYNC_API",
    "SYNC_EVENT",
    "TOTAL",
    "UNATTRIBUTED",
    "ApiCall",
    "GpuActivity",
    "Range",
    "Trace",
    "TraceError",
]

UNATTRIBUTED = "<unattributed>"
TOTAL = "<total>"

# Hazard kinds, as they appear in RangeStats.hazards and Violation.kind.
SYNC_API = "sync_api"
SYNC_EVENT = "sync_event"
D2H_COPY = "d2h_copy"


class TraceError(ValueError):
    """The file is not a trace this module can read (the CLI exits with code 2)."""


@dataclass(frozen=True)
class Range:
    """One occurrence of an NVTX (or record_function) range."""

    name: str
    start: int
    end: int
    #: Thread the range was opened on; None when the range is not bound to a thread
    #: (NVTX start/end ranges), which then takes API calls from every thread.
    thread: object | None
    domain: str | None = None


@dataclass(frozen=True)
class ApiCall:
    """One host-side CUDA runtime or driver call."""

    name: str  # as recorded, e.g. ``cudaStreamSynchronize_v3020``
    start: int
    end: int
    thread: object
    correlation: int | None
    process: object | None = None

    @property
    def base_name(self) -> str:
        return api_base_name(self.name)


@dataclass(frozen=True)
class GpuActivity:
    """One record of GPU-side activity: a kernel, a copy, a memset or a synchronization."""

    kind: str  # "kernel" | "memcpy" | "memset" | "sync"
    #: "DtoH", "HtoD", ... for copies; "stream_sync", "event_sync", "context_sync",
    #: "stream_wait_event", ... for synchronizations; "" for kernels and memsets.
    subkind: str
    name: str
    start: int
    end: int
    correlation: int | None
    process: object | None = None
    in_graph: bool = False


@dataclass
class Trace:
    path: str
    format: str  # "nsys-sqlite" | "torch-json"
    ranges: list[Range] = field(default_factory=list)
    api_calls: list[ApiCall] = field(default_factory=list)
    gpu: list[GpuActivity] = field(default_factory=list)
    device: str | None = None
    warnings: list[str] = field(default_factory=list)

    @property
    def sync_events(self) -> list[GpuActivity]:
        return [a for a in self.gpu if a.kind == "sync"]

    def bounds(self) -> tuple[int, int]:
        """(first start, last end) over every event, (0, 0) for an empty trace."""
        events: list[Range | ApiCall | GpuActivity] = [*self.ranges, *self.api_calls, *self.gpu]
        starts = [e.start for e in events]
        ends = [e.end for e in events]
        return (min(starts), max(ends)) if starts else (0, 0)
