"""The trace analyzer must find every host sync and device-to-host copy inside a range, and
attribute GPU work to ranges only through the API call that launched it.

Each test builds the same small timeline twice, as an Nsight Systems SQLite export (real
table and column names, enum tables, StringIds) and as a torch.profiler Chrome trace, and
expects identical answers from both. Recorded traces dropped into tests/data/ are checked too:
``*clean*`` ones must pass ``--forbid-sync 'replay/*'`` and ``*planted*`` ones must fail it.
"""

from __future__ import annotations

import gzip
import json
import sqlite3
from pathlib import Path

import pytest

from pagegraph.detect import trace as tr
from pagegraph.detect import trace_loaders

PID = 4123
MAIN, OTHER = 4123, 4200
GPU_PID = PID << 24  # nsys globalPid: the pid field of a globalTid, tid 0


def gtid(tid: int) -> int:
    return (PID << 24) | tid


# --------------------------------------------------------------------------------------------
# A timeline, written in both formats.


def rng(name, start, end, tid=MAIN, domain=None, start_end=False, open_=False):
    return dict(
        type="range",
        name=name,
        start=start,
        end=end,
        tid=tid,
        domain=domain,
        start_end=start_end,
        open=open_,
    )


def api(name, start, end, corr, tid=MAIN):
    return dict(type="api", name=name, start=start, end=end, corr=corr, tid=tid)


def kernel(name, start, end, corr, graph_node=None):
    return dict(type="kernel", name=name, start=start, end=end, corr=corr, node=graph_node)


def memcpy(kind, start, end, corr):
    return dict(type="memcpy", kind=kind, start=start, end=end, corr=corr)


def memset(start, end, corr):
    return dict(type="memset", start=start, end=end, corr=corr)


def sync(kind, start, end, corr):
    return dict(type="sync", kind=kind, start=start, end=end, corr=corr)


# nsys name of the API (versioned, as CUPTI reports it) -> torch name.
NSYS_API = {
    "cudaLaunchKernel": "cudaLaunchKernel_v7000",
    "cudaMemcpyAsync": "cudaMemcpyAsync_v3020",
    "cudaMemcpy": "cudaMemcpy_v3020",
    "cudaStreamSynchronize": "cudaStreamSynchronize_v3020",
    "cudaGraphLaunch": "cudaGraphLaunch_v10000",
    "cudaStreamWaitEvent": "cudaStreamWaitEvent_v3020",
    "cudaMemsetAsync": "cudaMemsetAsync_v3020",
    "cudaEventRecord": "cudaEventRecord_v3020",
}
MEMCPY_OPER = [
    (0, "CUDA_MEMCPY_OPER_UNKNOWN", "Unknown"),
    (1, "CUDA_MEMCPY_OPER_HTOD", "Host-to-Device"),
    (2, "CUDA_MEMCPY_OPER_DTOH", "Device-to-Host"),
    (3, "CUDA_MEMCPY_OPER_HTOA", "Host-to-Array"),
    (4, "CUDA_MEMCPY_OPER_ATOH", "Array-to-Host"),
    (8, "CUDA_MEMCPY_OPER_DTOD", "Device-to-Device"),
    (9, "CUDA_MEMCPY_OPER_HTOH", "Host-to-Host"),
    (10, "CUDA_MEMCPY_OPER_PTOP", "Peer-to-Peer"),
]
MEM_KIND = [
    (0, "CUDA_MEMOPR_MEMORY_KIND_UNKNOWN", "Unknown"),
    (1, "CUDA_MEMOPR_MEMORY_KIND_PAGEABLE", "Pageable"),
    (2, "CUDA_MEMOPR_MEMORY_KIND_PINNED", "Pinned"),
    (3, "CUDA_MEMOPR_MEMORY_KIND_DEVICE", "Device"),
]
SYNC_TYPE = [
    (0, "CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_UNKNOWN", "Unknown"),
    (1, "CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_EVENT_SYNCHRONIZE", "Event synchronize"),
    (2, "CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_STREAM_WAIT_EVENT", "Stream wait event"),
    (3, "CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_STREAM_SYNCHRONIZE", "Stream synchronize"),
    (4, "CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_CONTEXT_SYNCHRONIZE", "Context synchronize"),
]
EVENT_TYPE = [
    (34, "NvtxMark", "NVTX Mark"),
    (59, "NvtxPushPopRange", "NVTX PushPop Range"),
    (60, "NvtxStartEndRange", "NVTX StartEnd Range"),
    (75, "NvtxDomainCreate", "NVTX Domain Create"),
]
COPY_ID = {"HtoD": 1, "DtoH": 2, "DtoD": 8}
COPY_MEM = {"HtoD": (2, 3), "DtoH": (3, 2), "DtoD": (3, 3)}
SYNC_ID = {"event": 1, "wait": 2, "stream": 3, "context": 4}

SCHEMA = {
    "NVTX_EVENTS": "start INTEGER NOT NULL, end INTEGER, eventType INTEGER NOT NULL, "
    "rangeId INTEGER, category INTEGER, color INTEGER, text TEXT, globalTid INTEGER, "
    "endGlobalTid INTEGER, textId INTEGER, domainId INTEGER, uint64Value INTEGER, "
    "int64Value INTEGER, doubleValue REAL, uint32Value INTEGER, int32Value INTEGER, "
    "floatValue REAL, jsonTextId INTEGER, jsonText TEXT",
    "CUPTI_ACTIVITY_KIND_RUNTIME": "start INTEGER NOT NULL, end INTEGER NOT NULL, "
    "eventClass INTEGER NOT NULL, globalTid INTEGER, correlationId INTEGER, nameId INTEGER "
    "NOT NULL, returnValue INTEGER NOT NULL, callchainId INTEGER",
    "CUPTI_ACTIVITY_KIND_KERNEL": "start INTEGER NOT NULL, end INTEGER NOT NULL, "
    "deviceId INTEGER NOT NULL, contextId INTEGER NOT NULL, greenContextId INTEGER, "
    "streamId INTEGER NOT NULL, correlationId INTEGER, globalPid INTEGER, demangledName "
    "INTEGER NOT NULL, shortName INTEGER NOT NULL, mangledName INTEGER, launchType INTEGER, "
    "gridX INTEGER, gridY INTEGER, gridZ INTEGER, blockX INTEGER, blockY INTEGER, "
    "blockZ INTEGER, graphNodeId INTEGER, graphId INTEGER",
    "CUPTI_ACTIVITY_KIND_MEMCPY": "start INTEGER NOT NULL, end INTEGER NOT NULL, "
    "deviceId INTEGER NOT NULL, contextId INTEGER NOT NULL, greenContextId INTEGER, "
    "streamId INTEGER NOT NULL, correlationId INTEGER, globalPid INTEGER, bytes INTEGER NOT "
    "NULL, copyKind INTEGER NOT NULL, deprecatedSrcId INTEGER, srcKind INTEGER, dstKind "
    "INTEGER, srcDeviceId INTEGER, srcContextId INTEGER, dstDeviceId INTEGER, dstContextId "
    "INTEGER, migrationCause INTEGER, graphNodeId INTEGER, graphId INTEGER",
    "CUPTI_ACTIVITY_KIND_MEMSET": "start INTEGER NOT NULL, end INTEGER NOT NULL, "
    "deviceId INTEGER NOT NULL, contextId INTEGER NOT NULL, greenContextId INTEGER, "
    "streamId INTEGER NOT NULL, correlationId INTEGER, globalPid INTEGER, value INTEGER NOT "
    "NULL, bytes INTEGER NOT NULL, graphNodeId INTEGER, graphId INTEGER, memKind INTEGER",
    "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION": "start INTEGER NOT NULL, end INTEGER NOT NULL, "
    "deviceId INTEGER NOT NULL, contextId INTEGER NOT NULL, greenContextId INTEGER, "
    "streamId INTEGER NOT NULL, correlationId INTEGER, globalPid INTEGER, syncType INTEGER "
    "NOT NULL, eventId INTEGER NOT NULL, eventSyncId INTEGER",
}


def write_nsys(path: Path, events, *, event_type_enum=True) -> Path:
    """An nsys-export-like SQLite file: like nsys, a table exists only when it has rows."""
    strings: dict[str, int] = {}

    def sid(s: str) -> int:
        return strings.setdefault(s, len(strings) + 1)

    rows: dict[str, list[dict]] = {t: [] for t in SCHEMA}
    domains: dict[str, int] = {}
    for e in events:
        t = e["type"]
        if t == "range":
            dom = None
            if e["domain"]:
                if e["domain"] not in domains:
                    domains[e["domain"]] = len(domains) + 1
                    rows["NVTX_EVENTS"].append(
                        dict(
                            start=0,
                            eventType=75,
                            text=e["domain"],
                            globalTid=gtid(e["tid"]),
                            domainId=domains[e["domain"]],
                        )
                    )
                dom = domains[e["domain"]]
            row = dict(
                start=e["start"],
                end=None if e["open"] else e["end"],
                eventType=60 if e["start_end"] else 59,
                globalTid=gtid(e["tid"]),
                domainId=dom,
            )
            # Registered strings (nvtx's cached domains) arrive as textId, plain ones as text.
            if dom:
                row["textId"] = sid(e["name"])
            else:
                row["text"] = e["name"]
            rows["NVTX_EVENTS"].append(row)
        elif t == "api":
            rows["CUPTI_ACTIVITY_KIND_RUNTIME"].append(
                dict(
                    start=e["start"],
                    end=e["end"],
                    eventClass=1,
                    globalTid=gtid(e["tid"]),
                    correlationId=e["corr"],
                    nameId=sid(NSYS_API.get(e["name"], e["name"])),
                    returnValue=0,
                )
            )
        else:
            base = dict(
                start=e["start"],
                end=e["end"],
                deviceId=0,
                contextId=1,
                streamId=7,
                correlationId=e["corr"],
                globalPid=GPU_PID,
            )
            if t == "kernel":
                rows["CUPTI_ACTIVITY_KIND_KERNEL"].append(
                    dict(
                        base,
                        demangledName=sid(f"void {e['name']}<int>(int*)"),
                        shortName=sid(e["name"]),
                        graphNodeId=e["node"],
                        graphId=1 if e["node"] else None,
                    )
                )
            elif t == "memcpy":
                src, dst = COPY_MEM[e["kind"]]
                rows["CUPTI_ACTIVITY_KIND_MEMCPY"].append(
                    dict(base, bytes=4, copyKind=COPY_ID[e["kind"]], srcKind=src, dstKind=dst)
                )
            elif t == "memset":
                rows["CUPTI_ACTIVITY_KIND_MEMSET"].append(dict(base, value=0, bytes=64))
            elif t == "sync":
                rows["CUPTI_ACTIVITY_KIND_SYNCHRONIZATION"].append(
                    dict(base, syncType=SYNC_ID[e["kind"]], eventId=0)
                )
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT NOT NULL)")
    con.executemany("INSERT INTO StringIds VALUES (?, ?)", [(i, s) for s, i in strings.items()])
    enums = {
        "ENUM_CUDA_MEMCPY_OPER": MEMCPY_OPER,
        "ENUM_CUDA_MEM_KIND": MEM_KIND,
        "ENUM_CUPTI_SYNC_TYPE": SYNC_TYPE,
    }
    if event_type_enum:
        enums["ENUM_NSYS_EVENT_TYPE"] = EVENT_TYPE
    for table, values in enums.items():
        con.execute(f"CREATE TABLE {table} (id INTEGER PRIMARY KEY, name TEXT, label TEXT)")
        con.executemany(f"INSERT INTO {table} VALUES (?, ?, ?)", values)
    con.execute("CREATE TABLE TARGET_INFO_GPU (id INTEGER, name TEXT, busLocation TEXT)")
    con.execute("INSERT INTO TARGET_INFO_GPU VALUES (0, 'NVIDIA H200', '0000:19:00.0')")
    for table, schema in SCHEMA.items():
        if not rows[table]:
            continue
        con.execute(f"CREATE TABLE {table} ({schema})")
        for row in rows[table]:
            cols = ", ".join(row)
            marks = ", ".join("?" * len(row))
            con.execute(f"INSERT INTO {table} ({cols}) VALUES ({marks})", list(row.values()))
    con.commit()
    con.close()
    return path


TORCH_COPY = {
    "DtoH": "Memcpy DtoH (Device -> Pinned)",
    "HtoD": "Memcpy HtoD (Pinned -> Device)",
    "DtoD": "Memcpy DtoD (Device -> Device)",
}
TORCH_SYNC = {
    "event": "Event Sync",
    "wait": "Stream Wait Event",
    "stream": "Stream Sync",
    "context": "Context Sync",
}


def torch_events(events) -> list[dict]:
    out = [{"ph": "M", "name": "process_name", "pid": PID, "tid": 0, "args": {"name": "py"}}]
    for e in events:
        t = e["type"]
        ev = {"ph": "X", "ts": e["start"] / 1000, "dur": (e["end"] - e["start"]) / 1000}
        if t == "range":
            ev.update(cat="user_annotation", name=e["name"], pid=PID, tid=e["tid"], args={})
        elif t == "api":
            ev.update(
                cat="cuda_runtime",
                name=e["name"],
                pid=PID,
                tid=e["tid"],
                args={"cbid": 1, "correlation": e["corr"]},
            )
        else:
            args = {"device": 0, "stream": 7, "correlation": e["corr"]}
            ev.update(pid=0, tid=7, args=args)
            if t == "kernel":
                ev.update(cat="kernel", name=f"void {e['name']}<int>(int*)")
                if e["node"]:
                    args["graph node id"] = e["node"]
            elif t == "memcpy":
                ev.update(cat="gpu_memcpy", name=TORCH_COPY[e["kind"]])
            elif t == "memset":
                ev.update(cat="gpu_memset", name="Memset (Device)")
            elif t == "sync":
                ev.update(cat="cuda_sync", name=TORCH_SYNC[e["kind"]])
                args["cuda_sync_kind"] = TORCH_SYNC[e["kind"]]
        out.append(ev)
    return out


def write_torch(path: Path, events, *, gz=False) -> Path:
    doc = {
        "schemaVersion": 1,
        "deviceProperties": [{"id": 0, "name": "NVIDIA H200"}],
        "displayTimeUnit": "ms",
        "traceEvents": torch_events(events),
    }
    data = json.dumps(doc).encode()
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


def write(fmt: str, tmp_path: Path, name: str, events) -> Path:
    if fmt == "nsys":
        return write_nsys(tmp_path / f"{name}.sqlite", events)
    if fmt == "torch-gz":
        return write_torch(tmp_path / f"{name}.json.gz", events, gz=True)
    return write_torch(tmp_path / f"{name}.json", events)


FORMATS = ["nsys", "torch", "torch-gz"]

# The clean timeline: a warm-up (which syncs, legitimately), two replays of one graph nested in
# a decode range, a sync on another thread during the first replay, harmless copies and waits
# inside the second, and one kernel no API call claims.
CLEAN = [
    rng("warmup", 100, 800),
    api("cudaLaunchKernel", 110, 120, 1),
    kernel("warm_kernel", 130, 140, 1),
    api("cudaMemcpyAsync", 200, 210, 2),
    memcpy("DtoH", 220, 230, 2),
    api("cudaStreamSynchronize", 240, 300, 3),
    sync("stream", 240, 300, 3),
    rng("decode", 900, 9500, domain="pagegraph"),
    rng("replay/bs=8", 1000, 5000, domain="pagegraph"),
    api("cudaGraphLaunch", 1100, 1200, 10),
    kernel("page_table_kernel", 1300, 1400, 10, graph_node=101),
    kernel("attn_kernel", 1400, 1600, 10, graph_node=102),
    kernel("sample_kernel", 1600, 1700, 10, graph_node=103),
    api("cudaStreamSynchronize", 1500, 1800, 11, tid=OTHER),
    sync("stream", 1500, 1800, 11),
    rng("replay/bs=8", 6000, 9000, domain="pagegraph"),
    api("cudaGraphLaunch", 6100, 6200, 20),
    kernel("page_table_kernel", 6300, 6400, 20, graph_node=101),
    kernel("attn_kernel", 6400, 6600, 20, graph_node=102),
    kernel("sample_kernel", 6600, 6700, 20, graph_node=103),
    api("cudaMemcpyAsync", 6710, 6720, 21),
    memcpy("HtoD", 6730, 6740, 21),
    api("cudaMemsetAsync", 6750, 6760, 23),
    memset(6770, 6780, 23),
    api("cudaStreamWaitEvent", 6800, 6810, 22),
    sync("wait", 6800, 6810, 22),
    kernel("orphan_kernel", 9600, 9700, 99),
]
# The planted timeline: the second replay also reads a value back (an ``.item()``).
PLANTED = CLEAN + [
    api("cudaMemcpyAsync", 7000, 7010, 30),
    memcpy("DtoH", 7020, 7030, 30),
    api("cudaStreamSynchronize", 7040, 7100, 31),
    sync("stream", 7040, 7100, 31),
]


@pytest.fixture(params=FORMATS)
def fmt(request):
    return request.param


# --------------------------------------------------------------------------------------------
# Counting and attribution.


def test_replay_counts_through_correlation(fmt, tmp_path):
    s = tr.analyze(write(fmt, tmp_path, "clean", CLEAN))
    assert s.format == ("nsys-sqlite" if fmt == "nsys" else "torch-json")
    assert s.device == "NVIDIA H200"
    assert list(s.ranges) == ["warmup", "decode", "replay/bs=8"]
    r = s.ranges["replay/bs=8"]
    assert r.occurrences == 2
    assert r.total_ns == 4000 + 3000
    assert r.kernels == 6
    assert r.graph_kernels == 6
    assert r.graph_launches == 2
    assert r.memcpys == {"HtoD": 1}
    assert r.memsets == 1
    assert r.sync_events == 1
    assert r.sync_types == {"stream_wait_event": 1}
    assert r.sync_api_calls == {}
    assert r.d2h_copies == 0
    assert r.hazards == {}
    assert r.domains == (["pagegraph"] if fmt == "nsys" else [])


def test_warmup_syncs_are_counted(fmt, tmp_path):
    w = tr.analyze(write(fmt, tmp_path, "clean", CLEAN)).ranges["warmup"]
    assert (w.occurrences, w.kernels, w.graph_launches) == (1, 1, 0)
    assert w.memcpys == {"DtoH": 1}
    assert w.d2h_copies == 1
    assert w.sync_api_calls == {"cudaStreamSynchronize": 1}
    assert w.sync_types == {"stream_sync": 1}
    assert w.hazards == {
        ("d2h_copy", "cudaMemcpyAsync DtoH"): [1, 200],
        ("sync_api", "cudaStreamSynchronize"): [1, 240],
        ("sync_event", "stream_sync"): [1, 240],
    }


def test_nested_range_sees_inner_events(fmt, tmp_path):
    d = tr.analyze(write(fmt, tmp_path, "clean", CLEAN)).ranges["decode"]
    assert d.occurrences == 1
    assert d.kernels == 6
    assert d.graph_launches == 2
    assert d.total_ns == 8600


def test_other_thread_and_unclaimed_work_stay_out_of_ranges(fmt, tmp_path):
    s = tr.analyze(write(fmt, tmp_path, "clean", CLEAN))
    # The OTHER thread's cudaStreamSynchronize falls inside replay/bs=8 in time only.
    assert s.ranges["replay/bs=8"].sync_api_calls == {}
    assert s.unattributed.kernels == 1
    assert s.unattributed.api_calls == 0
    t = s.total
    assert t.kernels == 1 + 6 + 1
    assert t.graph_launches == 2
    assert t.sync_api_calls == {"cudaStreamSynchronize": 2}
    assert t.d2h_copies == 1
    assert t.total_ns == 9700 - 100
    assert s.counts["unattributed_gpu_activities"] == 1


def test_same_name_nested_in_itself_counts_once(fmt, tmp_path):
    events = [
        rng("replay/bs=1", 0, 1000),
        rng("replay/bs=1", 10, 900),
        api("cudaGraphLaunch", 20, 30, 1),
        kernel("k", 40, 50, 1, graph_node=1),
    ]
    r = tr.analyze(write(fmt, tmp_path, "self", events)).ranges["replay/bs=1"]
    assert (r.occurrences, r.graph_launches, r.kernels) == (2, 1, 1)


def test_range_boundaries_are_inclusive(fmt, tmp_path):
    events = [
        rng("a", 100, 200),
        api("cudaStreamSynchronize", 100, 150, 1),
        api("cudaDeviceSynchronize_v3020", 200, 250, 2),
        api("cudaEventSynchronize_v3020", 201, 250, 3),
    ]
    a = tr.analyze(write(fmt, tmp_path, "edge", events)).ranges["a"]
    assert a.sync_api_calls == {"cudaStreamSynchronize": 1, "cudaDeviceSynchronize": 1}


# --------------------------------------------------------------------------------------------
# Violations.


def test_planted_violations(fmt, tmp_path):
    path = write(fmt, tmp_path, "planted", PLANTED)
    got = tr.find_violations(path, ["replay/*"])
    assert [(v.range, v.kind, v.name, v.count, v.first_time_ns) for v in got] == [
        ("replay/bs=8", "d2h_copy", "cudaMemcpyAsync DtoH", 1, 7000),
        ("replay/bs=8", "sync_api", "cudaStreamSynchronize", 1, 7040),
        ("replay/bs=8", "sync_event", "stream_sync", 1, 7040),
    ]
    # The enclosing range sees them too; the warm-up's own syncs are no replay's business.
    assert {v.range for v in tr.find_violations(tr.analyze(path), ["decode"])} == {"decode"}
    assert tr.find_violations(tr.load_trace(path), ["nothing*"]) == []


def test_clean_trace_has_no_replay_violations(fmt, tmp_path):
    path = write(fmt, tmp_path, "clean", CLEAN)
    assert tr.find_violations(path, ["replay/*"]) == []
    assert len(tr.find_violations(path, ["warm*"])) == 3


def test_blocking_memcpy_and_free_are_syncs(fmt, tmp_path):
    events = [
        rng("replay/bs=2", 0, 1000),
        api("cudaMemcpy", 10, 20, 1),
        memcpy("HtoD", 12, 18, 1),
        api("cudaFree_v3020", 30, 40, 2),
    ]
    got = tr.find_violations(write(fmt, tmp_path, "blk", events), ["replay/*"])
    assert [(v.kind, v.name) for v in got] == [("sync_api", "cudaMemcpy"), ("sync_api", "cudaFree")]


def test_d2h_inside_a_graph_is_a_violation(fmt, tmp_path):
    events = [
        rng("replay/bs=4", 0, 1000),
        api("cudaGraphLaunch", 10, 20, 1),
        kernel("k", 30, 40, 1, graph_node=1),
        memcpy("DtoH", 40, 50, 1),
    ]
    got = tr.find_violations(write(fmt, tmp_path, "g", events), ["replay/*"])
    assert [(v.kind, v.name) for v in got] == [("d2h_copy", "cudaGraphLaunch DtoH")]


# --------------------------------------------------------------------------------------------
# Nsight-specific schema handling.


def test_nsys_start_end_range_takes_calls_from_any_thread(tmp_path):
    events = [
        rng("replay/window", 0, 1000, tid=MAIN, start_end=True),
        api("cudaStreamSynchronize", 10, 20, 1, tid=OTHER),
    ]
    got = tr.find_violations(write_nsys(tmp_path / "se.sqlite", events), ["replay/*"])
    assert [(v.range, v.name) for v in got] == [("replay/window", "cudaStreamSynchronize")]


def test_nsys_event_types_default_without_enum_table(tmp_path):
    path = write_nsys(tmp_path / "noenum.sqlite", CLEAN, event_type_enum=False)
    s = tr.analyze(path)
    assert s.ranges["replay/bs=8"].kernels == 6
    assert s.ranges["replay/bs=8"].domains == ["pagegraph"]


def test_nsys_unclosed_range_extends_to_trace_end(tmp_path):
    events = [
        rng("replay/bs=8", 1000, None, open_=True),
        api("cudaGraphLaunch", 1100, 1200, 10),
        api("cudaStreamSynchronize", 5000, 5100, 11),
    ]
    s = tr.analyze(write_nsys(tmp_path / "open.sqlite", events))
    assert s.ranges["replay/bs=8"].total_ns == 5100 - 1000
    assert s.ranges["replay/bs=8"].sync_api_calls == {"cudaStreamSynchronize": 1}
    assert any("never closed" in w for w in s.warnings)


def test_nsys_copy_names_carry_memory_kinds(tmp_path):
    t = tr.load_trace(write_nsys(tmp_path / "c.sqlite", CLEAN))
    names = {a.name for a in t.gpu if a.kind == "memcpy"}
    assert names == {"Memcpy DtoH (Device -> Pinned)", "Memcpy HtoD (Pinned -> Device)"}


def test_nsys_without_nvtx_tables(tmp_path, capsys):
    events = [e for e in CLEAN if e["type"] != "range"]
    path = write_nsys(tmp_path / "nonvtx.sqlite", events)
    con = sqlite3.connect(path)
    assert not con.execute("SELECT 1 FROM sqlite_master WHERE name = 'NVTX_EVENTS'").fetchall()
    con.close()
    s = tr.analyze(path)
    assert s.ranges == {}
    assert s.total.kernels == 8
    assert tr.main([str(path)]) == 0
    capsys.readouterr()
    assert tr.main([str(path), "--forbid-sync", "replay/*"]) == 2
    assert "no NVTX ranges in trace: cannot check" in capsys.readouterr().err


# --------------------------------------------------------------------------------------------
# The command line.


def test_cli_exit_codes(fmt, tmp_path, capsys):
    clean = write(fmt, tmp_path, "clean", CLEAN)
    planted = write(fmt, tmp_path, "planted", PLANTED)
    assert tr.main([str(clean), "--forbid-sync", "replay/*"]) == 0
    out = capsys.readouterr().out
    assert "| replay/bs=8" in out and "PASS" in out
    assert tr.main([str(planted), "--forbid-sync", "replay/*"]) == 1
    out = capsys.readouterr().out
    assert "FAIL" in out and "cudaStreamSynchronize" in out and "d2h_copy" in out
    assert tr.main([str(planted)]) == 0  # no check asked for: just the table


def test_cli_pattern_matching_nothing_cannot_pass(tmp_path, capsys):
    clean = write_nsys(tmp_path / "clean.sqlite", CLEAN)
    assert tr.main([str(clean), "--forbid-sync", "replay/*", "--forbid-sync", "step/*"]) == 2
    assert "no range matches 'step/*'" in capsys.readouterr().err


def test_cli_writes_json_and_markdown(fmt, tmp_path):
    planted = write(fmt, tmp_path, "planted", PLANTED)
    js, md = tmp_path / "out.json", tmp_path / "out.md"
    rc = tr.main(
        [str(planted), "--forbid-sync", "replay/*", "--json", str(js), "--markdown", str(md)]
    )
    assert rc == 1
    doc = json.loads(js.read_text())
    assert doc["check"]["verdict"] == "FAIL"
    assert len(doc["check"]["violations"]) == 3
    replay = next(r for r in doc["ranges"] if r["name"] == "replay/bs=8")
    assert replay["d2h_copies"] == 1 and replay["memcpys"] == {"DtoH": 1, "HtoD": 1}
    assert doc["unattributed"]["kernels"] == 1
    text = md.read_text()
    assert "| replay/bs=8 " in text and "<unattributed>" in text and "**Verdict:** FAIL" in text


def test_to_dict_is_json_serializable(fmt, tmp_path):
    s = tr.analyze(write(fmt, tmp_path, "clean", CLEAN))
    json.dumps(s.to_dict())
    json.dumps(tr.check(s, ["replay/*"]).to_dict())


def test_markdown_table_shape(tmp_path):
    s = tr.analyze(write_nsys(tmp_path / "clean.sqlite", CLEAN))
    text = tr.format_markdown(s)
    rows = [line for line in text.splitlines() if line.startswith("|")]
    assert len(rows) == 2 + 3 + 2  # header, rule, 3 ranges, <unattributed>, <total>
    assert all(row.count("|") == 11 for row in rows)
    assert "| replay/bs=8 [pagegraph] | 2 | 7.0 | 6 | 2 | HtoD:1 |" in text


BAD_FILES = {
    "garbage.bin": b"\x00\x01\x02 not a trace at all",
    "empty.json": b"",
    "not_a_trace.json": b'{"hello": "world"}',
    "events_not_list.json": b'{"traceEvents": 3}',
    "truncated.json": b'{"traceEvents": [{"ph": "X", ',
    "scalar.json": b"[1, 2, 3]",
    "corrupt.sqlite": tr.SQLITE_MAGIC + b"\x10\x00" + b"\xff" * 200,
    "bad.json.gz": b"\x1f\x8b\x08\x00garbage",
}


@pytest.mark.parametrize("name", sorted(BAD_FILES))
def test_unreadable_files_exit_2(name, tmp_path, capsys):
    path = tmp_path / name
    path.write_bytes(BAD_FILES[name])
    with pytest.raises(tr.TraceError):
        tr.analyze(path)
    assert tr.main([str(path), "--forbid-sync", "replay/*"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("pagegraph trace: error:") and name in err


def test_sqlite_that_is_not_nsys(tmp_path):
    path = tmp_path / "other.sqlite"
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE users (id INTEGER, name TEXT)")
    con.commit()
    con.close()
    with pytest.raises(tr.TraceError, match="not an Nsight Systems export"):
        tr.analyze(path)


def test_missing_file_exit_2(tmp_path):
    assert tr.main([str(tmp_path / "nope.sqlite")]) == 2


def test_nsys_report_needs_export(tmp_path, monkeypatch):
    rep = tmp_path / "run.nsys-rep"
    rep.write_bytes(b"\x00" * 64)
    monkeypatch.setattr(trace_loaders.shutil, "which", lambda name: None)
    with pytest.raises(tr.TraceError, match="nsys export --type sqlite -o .*run.sqlite"):
        tr.analyze(rep)


def test_torch_trace_as_bare_event_list(tmp_path):
    path = tmp_path / "list.json"
    path.write_text(json.dumps(torch_events(PLANTED)))
    assert len(tr.find_violations(path, ["replay/*"])) == 3


def test_torch_nanosecond_timestamps_are_exact(tmp_path):
    # Kineto writes microseconds with three decimals; a float round trip can move 1 ns.
    doc = {
        "traceEvents": [
            {
                "ph": "X",
                "cat": "user_annotation",
                "name": "r",
                "pid": 1,
                "tid": 1,
                "ts": 5376108013178.774,
                "dur": 1.001,
            },
            {
                "ph": "X",
                "cat": "cuda_runtime",
                "name": "cudaStreamSynchronize",
                "pid": 1,
                "tid": 1,
                "ts": 5376108013179.775,
                "dur": 0.5,
                "args": {"correlation": 1},
            },
        ]
    }
    path = tmp_path / "ns.json"
    path.write_text(json.dumps(doc))
    t = tr.load_trace(path)
    assert (t.ranges[0].start, t.ranges[0].end) == (5376108013178774, 5376108013179775)
    assert tr.summarize(t).ranges["r"].sync_api_calls == {"cudaStreamSynchronize": 1}


# --------------------------------------------------------------------------------------------
# Classification.


@pytest.mark.parametrize(
    "name, base",
    [
        ("cudaStreamSynchronize_v3020", "cudaStreamSynchronize"),
        ("cuMemcpyDtoHAsync_v2", "cuMemcpyDtoHAsync"),
        ("cudaMemcpyAsync_ptsz_v7000", "cudaMemcpyAsync"),
        ("cudaGraphLaunch_v10000", "cudaGraphLaunch"),
        ("cuLaunchKernelEx", "cuLaunchKernelEx"),
    ],
)
def test_api_base_name(name, base):
    assert tr.api_base_name(name) == base


@pytest.mark.parametrize(
    "name, expected",
    [
        ("cudaDeviceSynchronize_v3020", True),
        ("cudaStreamSynchronize", True),
        ("CUDASTREAMSYNCHRONIZE", True),
        ("cudaEventSynchronize_v3020", True),
        ("cuCtxSynchronize", True),
        ("cuStreamSynchronize", True),
        ("cuEventSynchronize", True),
        ("cudaMemcpy_v3020", True),
        ("cudaMemcpy2D_v3020", True),
        ("cuMemcpyDtoH_v2", True),
        ("cudaMemcpyAsync_v3020", False),
        ("cuMemcpyDtoHAsync_v2", False),  # counted as a D2H copy instead
        ("cuMemsetD32_v2", False),  # host-async unless the target is pinned or managed
        ("cudaMemset_v3020", False),
        ("cudaStreamWaitEvent", False),
        ("cudaEventQuery", False),
        ("cudaGraphLaunch_v10000", False),
        ("cuLaunchKernelEx", False),
    ],
)
def test_is_sync_api(name, expected):
    assert tr.is_sync_api(name) is expected


def test_d2h_async_driver_call_without_copy_record(fmt, tmp_path):
    events = [rng("replay/bs=1", 0, 100), api("cuMemcpyDtoHAsync_v2", 10, 20, 1)]
    got = tr.find_violations(write(fmt, tmp_path, "drv", events), ["replay/*"])
    assert [(v.kind, v.name) for v in got] == [("d2h_copy", "cuMemcpyDtoHAsync DtoH")]


@pytest.mark.parametrize(
    "text, kind",
    [
        ("CUDA_MEMCPY_OPER_DTOH", "DtoH"),
        ("CUDA_MEMCPY_OPER_HTOD", "HtoD"),
        ("CUDA_MEMCPY_OPER_PTOP", "PtoP"),
        ("Device-to-Host", "DtoH"),
        ("Memcpy DtoH (Device -> Pageable)", "DtoH"),
        ("Memcpy HtoD (Pinned -> Device)", "HtoD"),
        ("Device -> Pinned", "DtoH"),
    ],
)
def test_copy_kind(text, kind):
    assert trace_loaders._copy_kind(text) == kind


@pytest.mark.parametrize(
    "text, kind",
    [
        ("CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_STREAM_SYNCHRONIZE", "stream_sync"),
        ("CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_EVENT_SYNCHRONIZE", "event_sync"),
        ("CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_STREAM_WAIT_EVENT", "stream_wait_event"),
        ("CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_CONTEXT_SYNCHRONIZE", "context_sync"),
        ("Stream Sync", "stream_sync"),
        ("Event Sync", "event_sync"),
        ("Stream Wait Event", "stream_wait_event"),
        ("Context Sync", "context_sync"),
    ],
)
def test_sync_kind(text, kind):
    assert trace_loaders._sync_kind(text) == kind


# --------------------------------------------------------------------------------------------
# Traces recorded on an H200 (tests/data/).

DATA = Path(__file__).parent / "data"
RECORDED = sorted(
    p
    for pattern in ("*.sqlite", "*.json", "*.json.gz")
    for p in (DATA.glob(pattern) if DATA.is_dir() else [])
    if "clean" in p.name or "planted" in p.name
)


@pytest.mark.parametrize(
    "path",
    RECORDED
    or [pytest.param(None, marks=pytest.mark.skip(reason="no recorded traces in tests/data"))],
    ids=lambda p: p.name if p else "none",
)
def test_recorded_trace(path, capsys):
    want = 0 if "clean" in path.name else 1
    rc = tr.main([str(path), "--forbid-sync", "replay/*"])
    captured = capsys.readouterr()
    assert rc == want, captured.out + captured.err


def test_a_range_without_cuda_activity_cannot_be_checked(fmt, tmp_path, capsys):
    """A trace recorded without CUDA tracing (nsys -t nvtx) has the ranges but nothing in
    them: --forbid-sync must not pass it."""
    path = write(fmt, tmp_path, "cpu", [rng("replay/bs=1", 0, 100)])
    assert tr.main([str(path), "--forbid-sync", "replay/*"]) == 2
    captured = capsys.readouterr()
    out = captured.out + captured.err
    assert "CANNOT CHECK" in out and "no CUDA activity" in out and "replay/bs=1" in out


@pytest.mark.parametrize("path", [p for p in RECORDED if "clean" in p.name], ids=lambda p: p.name)
def test_recorded_clean_trace_details(path):
    """The clean H200 run: graph launches in every replay range, nothing blocking in the
    staging ranges either (their cudaEventQuery polls are not waits), and the verify phase's
    synchronizations are seen where they are."""
    summary = tr.analyze(path)
    replays = [r for name, r in summary.ranges.items() if name.split(" ")[0].startswith("replay/")]
    assert replays and all(r.graph_launches == r.occurrences for r in replays)
    assert tr.find_violations(summary, ["stage/*", "replay/*"]) == []
    verify = next(r for name, r in summary.ranges.items() if name.startswith("verify"))
    assert sum(verify.sync_api_calls.values()) == verify.occurrences


@pytest.mark.parametrize("path", [p for p in RECORDED if "planted" in p.name], ids=lambda p: p.name)
def test_recorded_planted_trace_names_the_item(path):
    """The planted run: exactly the one .item() (a DtoH copy and a stream sync) inside a
    replay range."""
    violations = tr.find_violations(tr.analyze(path), ["replay/*"])
    kinds = sorted({v.kind for v in violations})
    assert kinds == ["d2h_copy", "sync_api"], violations
    assert all(v.count == 1 for v in violations)
