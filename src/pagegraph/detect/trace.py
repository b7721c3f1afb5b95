"""Which ranges of a trace synchronize with the host, and how: ``pagegraph trace FILE``.

Reads either recorder the project uses and turns it into one model, in integer nanoseconds:

* an Nsight Systems SQLite export (``nsys export --type sqlite``), whose NVTX ranges are the
  ``nvtx`` annotations pagegraph puts around every ``replay()``;
* a torch.profiler Chrome/Perfetto JSON trace (``prof.export_chrome_trace``, optionally
  gzipped), whose ``record_function`` ranges (``user_annotation`` events) play the same role.

Attribution rules, the same for both:

* a host API call belongs to every range of its thread whose ``[start, end]`` holds the call's
  start, so nested ranges all see it; an NVTX start/end range is not bound to a thread and
  takes calls from any thread;
* GPU work (kernels, copies, memsets, synchronization records) belongs to the API call with
  its correlation id, and through it to that call's ranges. GPU work no call claims is counted
  under ``<unattributed>``, never guessed into a range by time: a guess could hide a sync in
  the wrong range or invent one.

The invariant checked by ``--forbid-sync PATTERN`` is that no range matching the glob holds a
host-blocking synchronization (a sync API call or a blocking sync record) or a device-to-host
copy. A check that cannot see any matching range fails with exit code 2 instead of passing.
"""

from __future__ import annotations

import argparse
import bisect
import decimal
import fnmatch
import gzip
import json
import re
import shutil
import sqlite3
import subprocess
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from os import PathLike
from pathlib import Path

__all__ = [
    "ApiCall",
    "CheckResult",
    "GpuActivity",
    "Range",
    "RangeStats",
    "Trace",
    "TraceError",
    "TraceSummary",
    "Violation",
    "add_arguments",
    "analyze",
    "api_base_name",
    "check",
    "find_violations",
    "format_markdown",
    "is_d2h_copy",
    "is_graph_launch",
    "is_host_blocking_sync",
    "is_sync_api",
    "load_trace",
    "main",
    "run",
    "summarize",
]

UNATTRIBUTED = "<unattributed>"
TOTAL = "<total>"

SQLITE_MAGIC = b"SQLite format 3\x00"
GZIP_MAGIC = b"\x1f\x8b"
NSYS_REPORT_SUFFIXES = (".nsys-rep", ".qdrep")

# Hazard kinds, as they appear in RangeStats.hazards and Violation.kind.
SYNC_API = "sync_api"
SYNC_EVENT = "sync_event"
D2H_COPY = "d2h_copy"


class TraceError(ValueError):
    """The file is not a trace this module can read (the CLI exits with code 2)."""


# --------------------------------------------------------------------------------------------
# The model shared by both readers.


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
        starts = [e.start for e in (*self.ranges, *self.api_calls, *self.gpu)]
        ends = [e.end for e in (*self.ranges, *self.api_calls, *self.gpu)]
        return (min(starts), max(ends)) if starts else (0, 0)


# --------------------------------------------------------------------------------------------
# Classification of API calls and activities.

_API_SUFFIX = re.compile(r"(?:_v\d+|_ptsz|_ptds)+$")
_SYNC_API_NAMES = frozenset(
    name.lower()
    for name in (
        "cudaDeviceSynchronize",
        "cudaStreamSynchronize",
        "cudaEventSynchronize",
        "cudaThreadSynchronize",
        "cuCtxSynchronize",
        "cuStreamSynchronize",
        "cuEventSynchronize",
        # Freeing device or pinned memory waits for the whole device to go idle.
        "cudaFree",
        "cudaFreeHost",
        "cudaFreeArray",
        "cuMemFree",
        "cuMemFreeHost",
    )
)
_GRAPH_LAUNCH_NAMES = frozenset(("cudagraphlaunch", "cugraphlaunch"))


def api_base_name(name: str) -> str:
    """``cudaStreamSynchronize_v3020`` -> ``cudaStreamSynchronize`` (also ``_v2``, ``_ptsz``)."""
    return _API_SUFFIX.sub("", name.strip())


def is_graph_launch(name: str) -> bool:
    return api_base_name(name).lower() in _GRAPH_LAUNCH_NAMES


def is_sync_api(name: str) -> bool:
    """True for API calls that block the host until device work finishes.

    Explicit synchronizations, blocking copies (``cudaMemcpy*``/``cuMemcpy*`` without
    ``Async``) and frees. ``cudaMemcpyAsync`` is not listed: it blocks only as a
    device-to-host copy, which is counted as such from the copy it launched.
    """
    base = api_base_name(name).lower()
    if base in _SYNC_API_NAMES:
        return True
    return base.startswith(("cudamemcpy", "cumemcpy")) and "async" not in base


def _is_d2h_async_api(name: str) -> bool:
    base = api_base_name(name).lower()
    return base.startswith("cumemcpydtoh") and "async" in base


def is_d2h_copy(activity: GpuActivity) -> bool:
    return activity.kind == "memcpy" and activity.subkind in ("DtoH", "AtoH")


def is_host_blocking_sync(activity: GpuActivity) -> bool:
    """Sync records where the host waits. A stream waiting on an event is a device-side
    dependency (legal in graphs, used by every side-stream warm-up), so it does not count."""
    return activity.kind == "sync" and activity.subkind != "stream_wait_event"


def _is_query_api(name: str | None) -> bool:
    return bool(name) and re.fullmatch(r"cu(?:da)?(?:Event|Stream)Query", name) is not None


_MEM_LETTER = {"device": "D", "host": "H", "pinned": "H", "pageable": "H", "array": "A"}


def _copy_kind(text: str) -> str:
    """Short copy kind ("DtoH", "HtoD", "DtoD", "PtoP", ...) from an enum name or a label.

    Accepts ``CUDA_MEMCPY_OPER_DTOH``, ``Device-to-Host``, ``Memcpy DtoH (Device -> Pinned)``
    and ``Device -> Pageable``; anything else comes back unchanged.
    """
    t = text.strip()
    m = re.fullmatch(r"CUDA_MEMCPY_OPER_(UVM_)?([A-Z])TO([A-Z])", t.upper())
    if m:
        # Unified-memory migrations are the driver's business, not a host read: kept apart.
        core = f"{m.group(2)}to{m.group(3)}"
        return f"UVM {core}" if m.group(1) else core
    m = re.search(r"Memcpy\s+([A-Za-z])to([A-Za-z])\b", t)
    if m:
        return f"{m.group(1).upper()}to{m.group(2).upper()}"
    m = re.search(r"([A-Za-z]+)\s*(?:-to-|->)\s*([A-Za-z]+)", t)
    if m:
        src, dst = m.group(1).lower(), m.group(2).lower()
        if src == "peer":
            return "PtoP"
        if src in _MEM_LETTER and dst in _MEM_LETTER:
            return f"{_MEM_LETTER[src]}to{_MEM_LETTER[dst]}"
    return t


def _sync_kind(text: str) -> str:
    """One spelling for CUPTI's sync types, whether from nsys's enum or Kineto's names."""
    flat = re.sub(r"[^a-z]", "", text.lower().removeprefix("cupti_activity_synchronization_type_"))
    if "wait" in flat:
        return "stream_wait_event"
    if "stream" in flat:
        return "stream_sync"
    if "event" in flat:
        return "event_sync"
    if "context" in flat or "ctx" in flat or "device" in flat:
        return "context_sync"
    return flat or "unknown"


# --------------------------------------------------------------------------------------------
# Reading files.


def load_trace(path: str | PathLike) -> Trace:
    """Read an Nsight Systems SQLite export or a torch.profiler JSON trace (format by content)."""
    p = Path(path)
    if p.suffix.lower() in NSYS_REPORT_SUFFIXES:
        return _load_sqlite(_export_nsys_report(p))
    try:
        with open(p, "rb") as f:
            head = f.read(len(SQLITE_MAGIC))
    except OSError as e:
        raise TraceError(f"{p}: cannot read: {e.strerror or e}") from e
    if not head:
        raise TraceError(f"{p}: empty file, not a trace")
    if head.startswith(SQLITE_MAGIC):
        return _load_sqlite(p)
    if head.startswith(GZIP_MAGIC):
        try:
            with gzip.open(p, "rb") as f:
                raw = f.read()
        except (OSError, EOFError) as e:
            raise TraceError(f"{p}: corrupt gzip file: {e}") from e
        if raw.startswith(SQLITE_MAGIC):
            raise TraceError(f"{p}: a gzipped SQLite file; gunzip it first")
        return _load_json(p, raw)
    if head.lstrip(b"\xef\xbb\xbf \t\r\n")[:1] in (b"{", b"["):
        with open(p, "rb") as f:
            return _load_json(p, f.read())
    raise TraceError(
        f"{p}: unsupported file: neither an Nsight Systems SQLite export "
        "(nsys export --type sqlite) nor a torch.profiler JSON trace"
    )


def _export_nsys_report(rep: Path) -> Path:
    out = rep.with_suffix(".sqlite")
    hint = f"nsys export --type sqlite -o {out} {rep}"
    nsys = shutil.which("nsys")
    if nsys is None:
        raise TraceError(
            f"{rep}: an Nsight Systems report; export it to SQLite first: {hint}"
            " (nsys is not on PATH here, so it cannot be done automatically)"
        )
    cmd = [nsys, "export", "--type", "sqlite", "--force-overwrite=true", "-o", str(out), str(rep)]
    print(f"pagegraph trace: exporting {rep} -> {out}", file=sys.stderr)
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0 or not out.exists():
        detail = (done.stderr or done.stdout).strip()[-2000:]
        raise TraceError(f"{rep}: '{hint}' failed ({done.returncode}): {detail}")
    return out


# Nsight Systems -----------------------------------------------------------------------------

_NSYS_KNOWN_TABLES = ("StringIds", "NVTX_EVENTS", "TARGET_INFO_GPU", "ThreadNames")
_NSYS_TABLE_PREFIXES = ("CUPTI_ACTIVITY_KIND_", "ENUM_", "NVTX_", "TARGET_INFO_", "META_DATA_")


class _Db:
    def __init__(self, con: sqlite3.Connection):
        self.con = con
        self.tables = {
            name
            for (name,) in con.execute(
                "SELECT name FROM sqlite_master WHERE type IN ('table', 'view')"
            )
        }
        self._columns: dict[str, set[str]] = {}

    def columns(self, table: str) -> set[str]:
        if table not in self._columns:
            rows = self.con.execute(f'PRAGMA table_info("{table}")').fetchall()
            self._columns[table] = {row[1] for row in rows}
        return self._columns[table]

    def select(self, table: str, wanted: tuple[str, ...]) -> list[dict]:
        """Rows of ``table`` as dicts over ``wanted``; a column the table lacks reads None."""
        have = [c for c in wanted if c in self.columns(table)]
        if not have:
            return []
        sql = "SELECT " + ", ".join(f'"{c}"' for c in have) + f' FROM "{table}"'
        return [
            {**dict.fromkeys(wanted), **dict(zip(have, row, strict=True))}
            for row in self.con.execute(sql)
        ]

    def enum(self, table: str) -> dict[int, tuple[str, str]]:
        """``id -> (name, label)`` of one of nsys's ENUM_* tables, empty when absent."""
        if table not in self.tables:
            return {}
        return {
            int(r["id"]): (str(r["name"] or ""), str(r["label"] or r["name"] or ""))
            for r in self.select(table, ("id", "name", "label"))
            if r["id"] is not None
        }


def _load_sqlite(path: Path) -> Trace:
    try:
        con = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    except sqlite3.Error as e:
        raise TraceError(f"{path}: cannot open SQLite file: {e}") from e
    try:
        return _read_nsys(_Db(con), path)
    except sqlite3.DatabaseError as e:
        raise TraceError(f"{path}: corrupt or unreadable SQLite file: {e}") from e
    finally:
        con.close()


def _pid_of(global_id) -> object | None:
    # nsys packs hardware id, VM id, pid and tid into globalTid (24 bits for the tid);
    # globalPid is the same with tid 0, so both reduce to one process key.
    return global_id >> 24 if isinstance(global_id, int) else None


def _read_nsys(db: _Db, path: Path) -> Trace:
    if not any(t in db.tables for t in _NSYS_KNOWN_TABLES) and not any(
        t.startswith(_NSYS_TABLE_PREFIXES) for t in db.tables
    ):
        raise TraceError(
            f"{path}: a SQLite file, but not an Nsight Systems export "
            "(no StringIds, NVTX_EVENTS or CUPTI_ACTIVITY_KIND_* tables)"
        )
    trace = Trace(path=str(path), format="nsys-sqlite")
    strings: dict[int, str] = {}
    if "StringIds" in db.tables:
        strings = {int(r["id"]): str(r["value"]) for r in db.select("StringIds", ("id", "value"))}

    def text(value) -> str | None:
        if isinstance(value, int):
            return strings.get(value)
        return value if isinstance(value, str) else None

    for table in ("CUPTI_ACTIVITY_KIND_RUNTIME", "CUPTI_ACTIVITY_KIND_DRIVER"):
        if table not in db.tables:
            continue
        for r in db.select(table, ("start", "end", "globalTid", "correlationId", "nameId")):
            if r["start"] is None:
                continue
            name = text(r["nameId"]) or f"<nameId {r['nameId']}>"
            trace.api_calls.append(
                ApiCall(
                    name=name,
                    start=int(r["start"]),
                    end=int(r["end"] if r["end"] is not None else r["start"]),
                    thread=r["globalTid"],
                    correlation=r["correlationId"],
                    process=_pid_of(r["globalTid"]),
                )
            )

    gpu_cols = ("start", "end", "correlationId", "globalPid", "graphNodeId")

    def activity(r, kind: str, subkind: str, name: str) -> GpuActivity:
        return GpuActivity(
            kind=kind,
            subkind=subkind,
            name=name,
            start=int(r["start"]),
            end=int(r["end"] if r["end"] is not None else r["start"]),
            correlation=r["correlationId"],
            process=_pid_of(r["globalPid"]),
            in_graph=bool(r["graphNodeId"]),
        )

    if "CUPTI_ACTIVITY_KIND_KERNEL" in db.tables:
        cols = (*gpu_cols, "shortName", "demangledName")
        for r in db.select("CUPTI_ACTIVITY_KIND_KERNEL", cols):
            if r["start"] is not None:
                name = text(r["shortName"]) or text(r["demangledName"]) or "<kernel>"
                trace.gpu.append(activity(r, "kernel", "", name))

    if "CUPTI_ACTIVITY_KIND_MEMCPY" in db.tables:
        opers = db.enum("ENUM_CUDA_MEMCPY_OPER")
        mem_kinds = db.enum("ENUM_CUDA_MEM_KIND")
        if not opers:
            trace.warnings.append(
                "no ENUM_CUDA_MEMCPY_OPER table: copy kinds unknown, device-to-host copies "
                "cannot be told apart"
            )
        cols = (*gpu_cols, "copyKind", "srcKind", "dstKind")
        for r in db.select("CUPTI_ACTIVITY_KIND_MEMCPY", cols):
            if r["start"] is None:
                continue
            oper = opers.get(r["copyKind"]) if r["copyKind"] is not None else None
            if oper:
                subkind = _copy_kind(oper[0])
                if subkind == oper[0]:
                    subkind = _copy_kind(oper[1])
            else:
                subkind = f"copyKind={r['copyKind']}"
            name = f"Memcpy {subkind}"
            src, dst = mem_kinds.get(r["srcKind"]), mem_kinds.get(r["dstKind"])
            if src and dst:
                name += f" ({src[1]} -> {dst[1]})"
            trace.gpu.append(activity(r, "memcpy", subkind, name))

    if "CUPTI_ACTIVITY_KIND_MEMSET" in db.tables:
        for r in db.select("CUPTI_ACTIVITY_KIND_MEMSET", gpu_cols):
            if r["start"] is not None:
                trace.gpu.append(activity(r, "memset", "", "Memset"))

    if "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION" in db.tables:
        sync_types = db.enum("ENUM_CUPTI_SYNC_TYPE")
        if not sync_types:
            trace.warnings.append(
                "no ENUM_CUPTI_SYNC_TYPE table: every sync record is taken as host-blocking"
            )
        for r in db.select("CUPTI_ACTIVITY_KIND_SYNCHRONIZATION", (*gpu_cols, "syncType")):
            if r["start"] is None:
                continue
            st = sync_types.get(r["syncType"]) if r["syncType"] is not None else None
            subkind = _sync_kind(st[0] or st[1]) if st else f"syncType={r['syncType']}"
            name = st[1] if st else subkind
            trace.gpu.append(activity(r, "sync", subkind, name))

    if "NVTX_EVENTS" in db.tables:
        _read_nvtx(db, trace, text)

    if "TARGET_INFO_GPU" in db.tables and "name" in db.columns("TARGET_INFO_GPU"):
        names = sorted({str(r["name"]) for r in db.select("TARGET_INFO_GPU", ("name",))})
        trace.device = ", ".join(n for n in names if n) or None
    return trace


def _read_nvtx(db: _Db, trace: Trace, text) -> None:
    push_pop, start_end, domain_create = {59}, {60}, {75}
    kinds = db.enum("ENUM_NSYS_EVENT_TYPE")
    if kinds:
        found = {
            key: {i for i, (name, _) in kinds.items() if key in name.lower()}
            for key in ("pushpoprange", "startendrange", "domaincreate")
        }
        push_pop = found["pushpoprange"] or push_pop
        start_end = found["startendrange"] or start_end
        domain_create = found["domaincreate"] or domain_create
    cols = ("start", "end", "eventType", "text", "textId", "domainId", "globalTid")
    rows = db.select("NVTX_EVENTS", cols)
    domains = {
        r["domainId"]: text(r["text"]) or text(r["textId"])
        for r in rows
        if r["eventType"] in domain_create
    }
    open_rows = []
    for r in rows:
        if r["start"] is None or r["eventType"] not in push_pop | start_end:
            continue
        if r["end"] is None:
            open_rows.append(r)
            continue
        trace.ranges.append(_nvtx_range(r, r["end"], push_pop, domains, text))
    if open_rows:
        # A range never closed (the process died inside it, or the capture stopped first)
        # still holds everything up to the end of the trace.
        _, last = trace.bounds()
        for r in open_rows:
            trace.ranges.append(_nvtx_range(r, max(last, r["start"]), push_pop, domains, text))
        trace.warnings.append(f"{len(open_rows)} NVTX range(s) never closed: taken to trace end")


def _nvtx_range(r, end, push_pop, domains, text) -> Range:
    return Range(
        name=text(r["text"]) or text(r["textId"]) or "<unnamed>",
        start=int(r["start"]),
        end=int(end),
        thread=r["globalTid"] if r["eventType"] in push_pop else None,
        domain=domains.get(r["domainId"]) if r["domainId"] else None,
    )


# torch.profiler -----------------------------------------------------------------------------

_TORCH_API_CATS = frozenset(("cuda_runtime", "cuda_driver", "runtime", "driver"))
_TORCH_KERNEL_CATS = frozenset(("kernel",))
_TORCH_MEMCPY_CATS = frozenset(("gpu_memcpy", "memcpy"))
_TORCH_MEMSET_CATS = frozenset(("gpu_memset", "memset"))
_TORCH_SYNC_CATS = frozenset(("cuda_sync",))
_TORCH_RANGE_CATS = frozenset(("user_annotation",))


def _us_to_ns(value) -> int | None:
    if isinstance(value, bool) or not isinstance(value, (int, float, decimal.Decimal)):
        return None
    return int((decimal.Decimal(value) * 1000).to_integral_value(decimal.ROUND_HALF_EVEN))


def _load_json(path: Path, raw: bytes) -> Trace:
    try:
        # Decimals keep the nanosecond digits of microsecond timestamps exact.
        data = json.loads(raw.decode("utf-8-sig"), parse_float=decimal.Decimal)
    except UnicodeDecodeError as e:
        raise TraceError(f"{path}: not UTF-8 text, not a JSON trace: {e}") from e
    except json.JSONDecodeError as e:
        raise TraceError(f"{path}: invalid or truncated JSON: {e}") from e
    if isinstance(data, dict):
        events = data.get("traceEvents")
        if not isinstance(events, list):
            raise TraceError(
                f"{path}: JSON, but not a Chrome/Perfetto trace (no 'traceEvents' list)"
            )
    elif isinstance(data, list) and all(isinstance(e, dict) and "ph" in e for e in data):
        events = data
    else:
        raise TraceError(f"{path}: JSON, but not a Chrome/Perfetto trace")

    trace = Trace(path=str(path), format="torch-json")
    if isinstance(data, dict):
        props = data.get("deviceProperties")
        if isinstance(props, list):
            names = sorted({str(d.get("name")) for d in props if isinstance(d, dict)} - {"None"})
            trace.device = ", ".join(names) or None
    skipped = 0
    for ev in events:
        if not isinstance(ev, dict) or ev.get("ph") != "X":
            continue
        cat = str(ev.get("cat", "")).lower()
        start, dur = _us_to_ns(ev.get("ts")), _us_to_ns(ev.get("dur", 0))
        if start is None or dur is None:
            skipped += 1
            continue
        end = start + max(dur, 0)
        name = str(ev.get("name", ""))
        args = ev.get("args") if isinstance(ev.get("args"), dict) else {}
        corr = args.get("correlation")
        corr = corr if isinstance(corr, int) and not isinstance(corr, bool) else None
        thread = (ev.get("pid"), ev.get("tid"))
        if cat in _TORCH_RANGE_CATS:
            trace.ranges.append(Range(name, start, end, thread))
        elif cat in _TORCH_API_CATS:
            trace.api_calls.append(ApiCall(name, start, end, thread, corr))
        elif cat in _TORCH_KERNEL_CATS:
            in_graph = args.get("graph node id") not in (None, 0)
            trace.gpu.append(GpuActivity("kernel", "", name, start, end, corr, in_graph=in_graph))
        elif cat in _TORCH_MEMCPY_CATS:
            trace.gpu.append(GpuActivity("memcpy", _copy_kind(name), name, start, end, corr))
        elif cat in _TORCH_MEMSET_CATS:
            trace.gpu.append(GpuActivity("memset", "", name, start, end, corr))
        elif cat in _TORCH_SYNC_CATS:
            kind = _sync_kind(str(args.get("cuda_sync_kind") or name))
            trace.gpu.append(GpuActivity("sync", kind, name, start, end, corr))
    if skipped:
        trace.warnings.append(f"{skipped} complete event(s) without numeric ts/dur skipped")
    return trace


# --------------------------------------------------------------------------------------------
# Summaries.


@dataclass
class RangeStats:
    """What happened inside every occurrence of one range name (or the whole trace)."""

    name: str
    domains: list[str] = field(default_factory=list)
    occurrences: int = 0
    total_ns: int = 0
    first_start_ns: int | None = None
    api_calls: int = 0
    kernels: int = 0
    graph_kernels: int = 0
    graph_launches: int = 0
    memcpys: dict[str, int] = field(default_factory=dict)
    memsets: int = 0
    sync_events: int = 0
    sync_types: dict[str, int] = field(default_factory=dict)
    sync_api_calls: dict[str, int] = field(default_factory=dict)
    d2h_copies: int = 0
    #: (kind, name) -> [count, first time in ns] for every host sync and device-to-host copy.
    hazards: dict[tuple[str, str], list[int]] = field(default_factory=dict)

    def _hazard(self, kind: str, name: str, t: int) -> None:
        h = self.hazards.setdefault((kind, name), [0, t])
        h[0] += 1
        h[1] = min(h[1], t)

    def _add_activity(self, a: GpuActivity, via: ApiCall | None) -> None:
        # A hazard reached through a call is timed by the call, on the host timeline the
        # ranges live on; an unclaimed one only has its own time.
        t = via.start if via is not None else a.start
        issuer = via.base_name if via is not None else None
        if a.kind == "kernel":
            self.kernels += 1
            self.graph_kernels += a.in_graph
        elif a.kind == "memcpy":
            self.memcpys[a.subkind] = self.memcpys.get(a.subkind, 0) + 1
            if is_d2h_copy(a):
                self.d2h_copies += 1
                self._hazard(D2H_COPY, f"{issuer} {a.subkind}" if issuer else a.name, t)
        elif a.kind == "memset":
            self.memsets += 1
        elif a.kind == "sync":
            self.sync_events += 1
            self.sync_types[a.subkind] = self.sync_types.get(a.subkind, 0) + 1
            # CUPTI also files an "event sync" record under cudaEventQuery, which returns at
            # once whether or not the event is done: a poll, not a wait.
            if is_host_blocking_sync(a) and not _is_query_api(issuer):
                self._hazard(SYNC_EVENT, a.subkind, t)

    def _add_call(self, call: ApiCall, linked: list[GpuActivity]) -> None:
        self.api_calls += 1
        base = call.base_name
        if is_graph_launch(base):
            self.graph_launches += 1
        if is_sync_api(base):
            self.sync_api_calls[base] = self.sync_api_calls.get(base, 0) + 1
            self._hazard(SYNC_API, base, call.start)
        if _is_d2h_async_api(base) and not any(a.kind == "memcpy" for a in linked):
            # The copy record is missing (not traced), but the API name says what it was.
            self.d2h_copies += 1
            self.memcpys["DtoH"] = self.memcpys.get("DtoH", 0) + 1
            self._hazard(D2H_COPY, f"{base} DtoH", call.start)
        for a in linked:
            self._add_activity(a, call)

    @property
    def has_events(self) -> bool:
        return bool(
            self.api_calls or self.kernels or self.memcpys or self.memsets or self.sync_events
        )

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "domains": list(self.domains),
            "occurrences": self.occurrences,
            "total_ns": self.total_ns,
            "first_start_ns": self.first_start_ns,
            "api_calls": self.api_calls,
            "kernels": self.kernels,
            "graph_kernels": self.graph_kernels,
            "graph_launches": self.graph_launches,
            "memcpys": dict(sorted(self.memcpys.items())),
            "memsets": self.memsets,
            "sync_events": self.sync_events,
            "sync_types": dict(sorted(self.sync_types.items())),
            "sync_api_calls": dict(sorted(self.sync_api_calls.items())),
            "d2h_copies": self.d2h_copies,
            "hazards": [
                {"kind": k, "name": n, "count": c, "first_time_ns": t}
                for (k, n), (c, t) in sorted(self.hazards.items())
            ],
        }


@dataclass
class TraceSummary:
    path: str
    format: str
    #: Range name -> stats, in order of first occurrence.
    ranges: dict[str, RangeStats]
    unattributed: RangeStats
    total: RangeStats
    start_ns: int
    end_ns: int
    counts: dict[str, int]
    device: str | None = None
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {
            "path": self.path,
            "format": self.format,
            "device": self.device,
            "start_ns": self.start_ns,
            "end_ns": self.end_ns,
            "counts": dict(self.counts),
            "warnings": list(self.warnings),
            "ranges": [s.to_dict() for s in self.ranges.values()],
            "unattributed": self.unattributed.to_dict(),
            "total": self.total.to_dict(),
        }


def _call_for(a: GpuActivity, by_corr: dict[int, list[int]], calls: list[ApiCall]) -> int | None:
    if a.correlation is None:
        return None
    candidates = by_corr.get(a.correlation)
    if not candidates:
        return None
    if len(candidates) == 1:
        return candidates[0]
    # Correlation ids are per process: several processes in one nsys capture reuse them.
    same = [i for i in candidates if calls[i].process == a.process]
    return same[0] if len(same) == 1 else None


def summarize(trace: Trace) -> TraceSummary:
    """Group a trace by range name and attribute every call and activity (see module doc)."""
    calls = trace.api_calls
    by_corr: dict[int, list[int]] = defaultdict(list)
    for i, c in enumerate(calls):
        if c.correlation is not None:
            by_corr[c.correlation].append(i)
    linked: list[list[GpuActivity]] = [[] for _ in calls]
    unclaimed: list[GpuActivity] = []
    for a in trace.gpu:
        i = _call_for(a, by_corr, calls)
        if i is None:
            unclaimed.append(a)
        else:
            linked[i].append(a)

    by_thread: dict[object, tuple[list[int], list[int]]] = {}
    for i in sorted(range(len(calls)), key=lambda i: calls[i].start):
        starts, idx = by_thread.setdefault(calls[i].thread, ([], []))
        starts.append(calls[i].start)
        idx.append(i)

    stats: dict[str, RangeStats] = {}
    members: dict[str, set[int]] = defaultdict(set)
    for r in sorted(trace.ranges, key=lambda r: (r.start, -r.end)):
        s = stats.get(r.name)
        if s is None:
            s = stats[r.name] = RangeStats(r.name, first_start_ns=r.start)
        s.occurrences += 1
        s.total_ns += r.end - r.start
        if r.domain and r.domain not in s.domains:
            s.domains.append(r.domain)
        threads = [r.thread] if r.thread is not None else list(by_thread)
        for t in threads:
            if t not in by_thread:
                continue
            starts, idx = by_thread[t]
            lo, hi = bisect.bisect_left(starts, r.start), bisect.bisect_right(starts, r.end)
            # A set per name: a call inside two nested occurrences of one name counts once.
            members[r.name].update(idx[lo:hi])
    for name, ids in members.items():
        for i in sorted(ids):
            stats[name]._add_call(calls[i], linked[i])

    unattributed = RangeStats(UNATTRIBUTED)
    for a in unclaimed:
        unattributed._add_activity(a, None)

    start, end = trace.bounds()
    total = RangeStats(TOTAL, occurrences=1, total_ns=end - start, first_start_ns=start)
    for i, c in enumerate(calls):
        total._add_call(c, linked[i])
    for a in unclaimed:
        total._add_activity(a, None)

    counts = {
        "ranges": len(trace.ranges),
        "range_names": len(stats),
        "api_calls": len(calls),
        "gpu_activities": len(trace.gpu),
        "unattributed_gpu_activities": len(unclaimed),
    }
    return TraceSummary(
        path=trace.path,
        format=trace.format,
        ranges=stats,
        unattributed=unattributed,
        total=total,
        start_ns=start,
        end_ns=end,
        counts=counts,
        device=trace.device,
        warnings=list(trace.warnings),
    )


def analyze(path: str | PathLike) -> TraceSummary:
    """Read a trace file (Nsight SQLite or torch.profiler JSON) and summarize it by range."""
    return summarize(load_trace(path))


# --------------------------------------------------------------------------------------------
# Checking.


@dataclass(frozen=True)
class Violation:
    range: str
    kind: str  # "sync_api" | "sync_event" | "d2h_copy"
    name: str
    count: int
    first_time_ns: int

    def to_dict(self) -> dict:
        return {
            "range": self.range,
            "kind": self.kind,
            "name": self.name,
            "count": self.count,
            "first_time_ns": self.first_time_ns,
        }


def _as_summary(summary_or_trace) -> TraceSummary:
    if isinstance(summary_or_trace, TraceSummary):
        return summary_or_trace
    if isinstance(summary_or_trace, Trace):
        return summarize(summary_or_trace)
    return analyze(summary_or_trace)


def _matching(summary: TraceSummary, pattern: str) -> list[str]:
    return [n for n in summary.ranges if fnmatch.fnmatchcase(n, pattern)]


def find_violations(summary_or_trace, patterns: list[str]) -> list[Violation]:
    """Host syncs and device-to-host copies inside ranges whose name matches a glob.

    Accepts a TraceSummary, a Trace, or a path to a trace file. One Violation per
    (range name, kind, name), in order of first occurrence.
    """
    summary = _as_summary(summary_or_trace)
    out: list[Violation] = []
    for name, s in summary.ranges.items():
        if not any(fnmatch.fnmatchcase(name, p) for p in patterns):
            continue
        for (kind, what), (count, first) in s.hazards.items():
            out.append(Violation(name, kind, what, count, first))
    return sorted(out, key=lambda v: (v.first_time_ns, v.range, v.kind, v.name))


@dataclass
class CheckResult:
    """Verdict of ``--forbid-sync``: exit code 1 on violations, 2 when the check was blind."""

    patterns: list[str]
    violations: list[Violation]
    unmatched: list[str]
    checked_ranges: list[str]
    error: str | None = None
    start_ns: int = 0
    notes: list[str] = field(default_factory=list)
    #: matching ranges that hold no CUDA activity at all: nothing in them was checked
    blind: list[str] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        if self.violations:
            return 1
        return 2 if self.error or self.unmatched or self.blind else 0

    @property
    def verdict(self) -> str:
        return {0: "PASS", 1: "FAIL", 2: "CANNOT CHECK"}[self.exit_code]

    def format_text(self) -> str:
        pats = ", ".join(repr(p) for p in self.patterns)
        lines = []
        if self.error:
            lines.append(f"{self.verdict}: {self.error}")
        elif self.violations:
            lines.append(
                f"{self.verdict}: host synchronization or device-to-host copy inside ranges "
                f"matching {pats}:"
            )
            for v in self.violations:
                at = (v.first_time_ns - self.start_ns) / 1e6
                lines.append(f"  {v.range}: {v.kind} {v.name} x{v.count} (first at +{at:.3f} ms)")
        elif not self.unmatched:
            lines.append(
                f"{self.verdict}: no synchronization or device-to-host copy inside "
                f"{len(self.checked_ranges)} range name(s) matching {pats}"
            )
        for p in self.unmatched:
            lines.append(
                f"{'CANNOT CHECK' if not self.violations else 'warning'}: "
                f"no range matches {p!r}: cannot check it"
            )
        if self.blind:
            shown = ", ".join(self.blind[:5]) + (" ..." if len(self.blind) > 5 else "")
            lines.append(
                f"{'CANNOT CHECK' if not self.violations else 'warning'}: "
                f"{len(self.blind)} matching range(s) hold no CUDA activity at all ({shown}): "
                "nothing in them was checked (was the trace recorded without CUDA tracing, "
                "e.g. nsys -t nvtx?)"
            )
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return {
            "patterns": list(self.patterns),
            "notes": list(self.notes),
            "verdict": self.verdict,
            "exit_code": self.exit_code,
            "error": self.error,
            "unmatched_patterns": list(self.unmatched),
            "ranges_without_cuda_activity": list(self.blind),
            "checked_ranges": list(self.checked_ranges),
            "violations": [v.to_dict() for v in self.violations],
        }


def check(summary_or_trace, patterns: list[str]) -> CheckResult:
    """Run the ``--forbid-sync`` check. A trace without ranges, a pattern that matches no
    range, or a matching range with no CUDA activity in it (a trace recorded without CUDA
    tracing) cannot prove anything and gives exit code 2 rather than a silent pass."""
    summary = _as_summary(summary_or_trace)
    patterns = list(patterns)
    if not summary.ranges:
        error = "no NVTX ranges in trace: cannot check"
        if summary.format == "torch-json":
            error += " (in a torch.profiler trace, record_function ranges stand for them)"
        return CheckResult(patterns, [], [], [], error=error, start_ns=summary.start_ns)
    checked = sorted({n for p in patterns for n in _matching(summary, p)})
    unmatched = [p for p in patterns if not _matching(summary, p)]
    notes = []
    if not summary.counts.get("api_calls"):
        notes.append(
            "the trace holds no CUDA API calls (CUDA not traced, or a CPU-only run): "
            "nothing could synchronize, so a pass proves little"
        )
    blind = [name for name in checked if not summary.ranges[name].has_events]
    return CheckResult(
        patterns,
        find_violations(summary, patterns),
        unmatched,
        checked,
        start_ns=summary.start_ns,
        notes=notes,
        blind=blind,
    )


# --------------------------------------------------------------------------------------------
# Output.


def _us(ns: int) -> str:
    return f"{ns / 1000:.1f}"


def _counts(d: dict[str, int]) -> str:
    return ", ".join(f"{k}:{v}" for k, v in sorted(d.items())) or "0"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def format_markdown(summary: TraceSummary, result: CheckResult | None = None) -> str:
    """A markdown table, one row per range name, then ``<unattributed>`` and ``<total>``."""
    header = (
        "| range | n | time (us) | kernels | graph launches | memcpy | memsets | "
        "sync events | sync API calls | D2H |"
    )
    lines = [
        f"Trace: `{summary.path}` ({summary.format}"
        + (f", {summary.device}" if summary.device else "")
        + ")",
        "",
        header,
        "|" + "---|" * 10,
    ]
    rows = list(summary.ranges.values())
    if summary.unattributed.has_events:
        rows.append(summary.unattributed)
    rows.append(summary.total)
    for s in rows:
        name = _cell(s.name) + (f" [{', '.join(s.domains)}]" if s.domains else "")
        if s.name == TOTAL:
            name = f"**{name}**"
        unattributed = s.name == UNATTRIBUTED
        occ = "-" if unattributed else str(s.occurrences)
        time_us = "-" if unattributed else _us(s.total_ns)
        sync = str(s.sync_events)
        if s.sync_types:
            sync += f" ({_counts(s.sync_types)})"
        lines.append(
            f"| {name} | {occ} | {time_us} | {s.kernels} | {s.graph_launches} | "
            f"{_counts(s.memcpys)} | {s.memsets} | {sync} | {_counts(s.sync_api_calls)} | "
            f"{s.d2h_copies} |"
        )
    for w in summary.warnings:
        lines.append(f"\n> warning: {w}")
    if result is not None:
        lines += ["", "**Verdict:** " + result.format_text().replace("\n", "  \n")]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------------
# Command line.


def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("file", help="Nsight Systems SQLite export or torch.profiler JSON trace")
    parser.add_argument(
        "--forbid-sync",
        metavar="PATTERN",
        action="append",
        default=[],
        help="glob on range names (e.g. 'replay/*'); exit 1 if a matching range holds a host "
        "sync or a device-to-host copy (repeatable)",
    )
    parser.add_argument("--json", metavar="PATH", help="also write the summary as JSON")
    parser.add_argument("--markdown", metavar="PATH", help="also write the table as markdown")
    return parser


def run(args: argparse.Namespace) -> int:
    """Exit codes: 0 clean, 1 violations, 2 unreadable trace or a check that cannot see."""
    try:
        summary = analyze(args.file)
    except TraceError as e:
        print(f"pagegraph trace: error: {e}", file=sys.stderr)
        return 2
    for w in summary.warnings:
        print(f"pagegraph trace: warning: {w}", file=sys.stderr)
    patterns = list(getattr(args, "forbid_sync", None) or [])
    result = check(summary, patterns) if patterns else None
    print(format_markdown(summary), end="")
    if result is not None:
        print(result.format_text(), file=sys.stdout if result.exit_code != 2 else sys.stderr)
    try:
        if args.json:
            doc = summary.to_dict()
            if result is not None:
                doc["check"] = result.to_dict()
            Path(args.json).write_text(json.dumps(doc, indent=2) + "\n")
        if args.markdown:
            Path(args.markdown).write_text(format_markdown(summary, result))
    except OSError as e:
        print(f"pagegraph trace: error: cannot write output: {e}", file=sys.stderr)
        return 2
    return result.exit_code if result is not None else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="pagegraph trace",
        description="Summarize a trace by NVTX range and check ranges for host syncs.",
    )
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
