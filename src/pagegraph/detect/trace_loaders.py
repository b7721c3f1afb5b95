"""Reading trace files into the model of :mod:`.trace_model`.

* an Nsight Systems SQLite export (``nsys export --type sqlite``), or an ``.nsys-rep`` report,
  exported to SQLite first when ``nsys`` is on PATH;
* a torch.profiler Chrome/Perfetto JSON trace (``prof.export_chrome_trace``, optionally
  gzipped).

The format is told by content, not by the file name.
"""

from __future__ import annotations

import decimal
import gzip
import json
import re
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Container
from os import PathLike
from pathlib import Path
from typing import Any

from .trace_model import ApiCall, GpuActivity, Range, Trace, TraceError

__all__ = ["GZIP_MAGIC", "NSYS_REPORT_SUFFIXES", "SQLITE_MAGIC", "load_trace"]

SQLITE_MAGIC = b"SQLite format 3\x00"
GZIP_MAGIC = b"\x1f\x8b"
NSYS_REPORT_SUFFIXES = (".nsys-rep", ".qdrep")


# --------------------------------------------------------------------------------------------
# One spelling for copy and sync kinds, whichever recorder wrote them.

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


def load_trace(path: str | PathLike[str]) -> Trace:
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


# --------------------------------------------------------------------------------------------
# Nsight Systems.

_NSYS_KNOWN_TABLES = ("StringIds", "NVTX_EVENTS", "TARGET_INFO_GPU", "ThreadNames")
_NSYS_TABLE_PREFIXES = ("CUPTI_ACTIVITY_KIND_", "ENUM_", "NVTX_", "TARGET_INFO_", "META_DATA_")
_GPU_COLUMNS = ("start", "end", "correlationId", "globalPid", "graphNodeId")


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
        self.strings: dict[int, str] = {}

    def columns(self, table: str) -> set[str]:
        if table not in self._columns:
            rows = self.con.execute(f'PRAGMA table_info("{table}")').fetchall()
            self._columns[table] = {row[1] for row in rows}
        return self._columns[table]

    def select(self, table: str, wanted: tuple[str, ...]) -> list[dict[str, Any]]:
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

    def load_strings(self) -> None:
        if "StringIds" in self.tables:
            rows = self.select("StringIds", ("id", "value"))
            self.strings = {int(r["id"]): str(r["value"]) for r in rows}

    def text(self, value: object) -> str | None:
        """A string column, or a ``StringIds`` id resolved; None for anything else."""
        if isinstance(value, int):
            return self.strings.get(value)
        return value if isinstance(value, str) else None


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


def _pid_of(global_id: object) -> object | None:
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
    db.load_strings()
    _read_api_calls(db, trace)
    _read_kernels(db, trace)
    _read_memcpys(db, trace)
    _read_memsets(db, trace)
    _read_syncs(db, trace)
    if "NVTX_EVENTS" in db.tables:
        # After the rest: a range never closed runs to the end of everything else.
        _read_nvtx(db, trace)
    if "TARGET_INFO_GPU" in db.tables and "name" in db.columns("TARGET_INFO_GPU"):
        names = sorted({str(r["name"]) for r in db.select("TARGET_INFO_GPU", ("name",))})
        trace.device = ", ".join(n for n in names if n) or None
    return trace


def _read_api_calls(db: _Db, trace: Trace) -> None:
    for table in ("CUPTI_ACTIVITY_KIND_RUNTIME", "CUPTI_ACTIVITY_KIND_DRIVER"):
        if table not in db.tables:
            continue
        for r in db.select(table, ("start", "end", "globalTid", "correlationId", "nameId")):
            if r["start"] is None:
                continue
            name = db.text(r["nameId"]) or f"<nameId {r['nameId']}>"
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


def _activity(r: dict[str, Any], kind: str, subkind: str, name: str) -> GpuActivity:
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


def _read_kernels(db: _Db, trace: Trace) -> None:
    if "CUPTI_ACTIVITY_KIND_KERNEL" not in db.tables:
        return
    cols = (*_GPU_COLUMNS, "shortName", "demangledName")
    for r in db.select("CUPTI_ACTIVITY_KIND_KERNEL", cols):
        if r["start"] is not None:
            name = db.text(r["shortName"]) or db.text(r["demangledName"]) or "<kernel>"
            trace.gpu.append(_activity(r, "kernel", "", name))


def _read_memcpys(db: _Db, trace: Trace) -> None:
    if "CUPTI_ACTIVITY_KIND_MEMCPY" not in db.tables:
        return
    opers = db.enum("ENUM_CUDA_MEMCPY_OPER")
    mem_kinds = db.enum("ENUM_CUDA_MEM_KIND")
    if not opers:
        trace.warnings.append(
            "no ENUM_CUDA_MEMCPY_OPER table: copy kinds unknown, device-to-host copies "
            "cannot be told apart"
        )
    cols = (*_GPU_COLUMNS, "copyKind", "srcKind", "dstKind")
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
        trace.gpu.append(_activity(r, "memcpy", subkind, name))


def _read_memsets(db: _Db, trace: Trace) -> None:
    if "CUPTI_ACTIVITY_KIND_MEMSET" not in db.tables:
        return
    for r in db.select("CUPTI_ACTIVITY_KIND_MEMSET", _GPU_COLUMNS):
        if r["start"] is not None:
            trace.gpu.append(_activity(r, "memset", "", "Memset"))


def _read_syncs(db: _Db, trace: Trace) -> None:
    if "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION" not in db.tables:
        return
    sync_types = db.enum("ENUM_CUPTI_SYNC_TYPE")
    if not sync_types:
        trace.warnings.append(
            "no ENUM_CUPTI_SYNC_TYPE table: every sync record is taken as host-blocking"
        )
    for r in db.select("CUPTI_ACTIVITY_KIND_SYNCHRONIZATION", (*_GPU_COLUMNS, "syncType")):
        if r["start"] is None:
            continue
        st = sync_types.get(r["syncType"]) if r["syncType"] is not None else None
        subkind = _sync_kind(st[0] or st[1]) if st else f"syncType={r['syncType']}"
        name = st[1] if st else subkind
        trace.gpu.append(_activity(r, "sync", subkind, name))


def _read_nvtx(db: _Db, trace: Trace) -> None:
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
        r["domainId"]: db.text(r["text"]) or db.text(r["textId"])
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
        trace.ranges.append(_nvtx_range(db, r, r["end"], push_pop, domains))
    if open_rows:
        # A range never closed (the process died inside it, or the capture stopped first)
        # still holds everything up to the end of the trace.
        _, last = trace.bounds()
        for r in open_rows:
            trace.ranges.append(_nvtx_range(db, r, max(last, r["start"]), push_pop, domains))
        trace.warnings.append(f"{len(open_rows)} NVTX range(s) never closed: taken to trace end")


def _nvtx_range(
    db: _Db,
    r: dict[str, Any],
    end: Any,
    push_pop: Container[object],
    domains: dict[Any, str | None],
) -> Range:
    return Range(
        name=db.text(r["text"]) or db.text(r["textId"]) or "<unnamed>",
        start=int(r["start"]),
        end=int(end),
        thread=r["globalTid"] if r["eventType"] in push_pop else None,
        domain=domains.get(r["domainId"]) if r["domainId"] else None,
    )


# --------------------------------------------------------------------------------------------
# torch.profiler.

_TORCH_API_CATS = frozenset(("cuda_runtime", "cuda_driver", "runtime", "driver"))
_TORCH_KERNEL_CATS = frozenset(("kernel",))
_TORCH_MEMCPY_CATS = frozenset(("gpu_memcpy", "memcpy"))
_TORCH_MEMSET_CATS = frozenset(("gpu_memset", "memset"))
_TORCH_SYNC_CATS = frozenset(("cuda_sync",))
_TORCH_RANGE_CATS = frozenset(("user_annotation",))


def _us_to_ns(value: object) -> int | None:
    if isinstance(value, bool) or not isinstance(value, (int, float, decimal.Decimal)):
        return None
    return int((decimal.Decimal(value) * 1000).to_integral_value(decimal.ROUND_HALF_EVEN))


def _json_events(path: Path, raw: bytes) -> tuple[object, list[Any]]:
    """The parsed document and its list of trace events."""
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
    return data, events


def _load_json(path: Path, raw: bytes) -> Trace:
    data, events = _json_events(path, raw)
    trace = Trace(path=str(path), format="torch-json")
    if isinstance(data, dict):
        props = data.get("deviceProperties")
        if isinstance(props, list):
            names = sorted({str(d.get("name")) for d in props if isinstance(d, dict)} - {"None"})
            trace.device = ", ".join(names) or None
    skipped = 0
    for ev in events:
        if isinstance(ev, dict) and ev.get("ph") == "X" and not _add_json_event(trace, ev):
            skipped += 1
    if skipped:
        trace.warnings.append(f"{skipped} complete event(s) without numeric ts/dur skipped")
    return trace


def _add_json_event(trace: Trace, ev: dict[str, Any]) -> bool:
    """Add one complete ("X") event to ``trace``; False when it has no numeric ts/dur."""
    cat = str(ev.get("cat", "")).lower()
    start, dur = _us_to_ns(ev.get("ts")), _us_to_ns(ev.get("dur", 0))
    if start is None or dur is None:
        return False
    end = start + max(dur, 0)
    name = str(ev.get("name", ""))
    raw_args = ev.get("args")
    args: dict[str, Any] = raw_args if isinstance(raw_args, dict) else {}
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
    return True
