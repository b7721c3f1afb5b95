"""The tables' judgments: what the probes measured and what the verifier recorded, folded into
property results, and the two judges of the tables' replays built on them (``HostJudge``,
``TableVerification``). None runs the builder or the runner. A property keeps its first
failure (the one the report names); later failures only add to the per-bucket counts."""

from __future__ import annotations

import collections
import re
from collections.abc import Callable

import numpy as np
import torch

from ...detect.probes import BuilderProbe, CompileCounter, EagerCall
from ...detect.ranges import phase
from ...graph.runner import GraphRunner
from ...kernels.contract import POISON
from ...kernels.registry import raised_at
from ..config import CheckConfig
from ..reports.report import REAL_DETECTORS, BucketStats, Failure, PropertyResult, Report
from ..run_end import TABLE_BED_PROPERTIES, fail_at_capture
from .protocol import JudgedAtOnce
from .table_replays import ReplayMeasure, TableReplays, TableSeen
from .verify import CANARY_ROWS, ModelStep, TableVerifier, read_mask, read_previous

Props = dict[str, PropertyResult]
#: names a replay's out-of-contract rows, for its failures (``BatchModel.describe_rows``)
DescribeRows = Callable[[ModelStep], str]

#: The tables' names, by table index in the checker's allocation.
TABLE_NAMES = ("page_table", "swa_page_table")

#: Properties judged by a sync detector: real only with the torch or cupti detector.
SYNC_PROPERTIES = ("sync-free builder call", "sync-free replay path")
#: Properties about what a captured graph does: real only with CUDA graphs.
GRAPH_PROPERTIES = (
    "capture",
    "graph-safe (captured short, replayed long)",
    "static buffers unmoved",
    "no allocation in replay",
    "no memory growth",
)


def record_how_judged(report: Report) -> None:
    """Each judged property's ``judged`` (``pagegraph.check.reports.report.JUDGED``): "real" on a
    CUDA
    device, with a torch or cupti detector for a sync property and CUDA graphs for a property
    about graphs; else "emulated" (the CPU standing in for the device, the cpu detector, an
    emulated capture). Skipped and incomplete properties were not judged: ""."""
    cuda = not report.on_cpu
    real_syncs = any(d in REAL_DETECTORS for d in report.detectors)
    for p in report.properties:
        if p.status in ("skip", "incomplete"):
            p.judged = ""
            continue
        real = cuda
        if p.name in SYNC_PROPERTIES:
            real = real and real_syncs
        elif p.name in GRAPH_PROPERTIES:
            real = real and report.graphs == "cuda"
        p.judged = "real" if real else "emulated"


# -- the builder alone -------------------------------------------------------------------------


def judge_eager_call(
    props: Props,
    call: EagerCall,
    detectors: tuple[str, ...],
    no_detector_reason: str | None,
    strict: tuple[str, ...] = (),
) -> None:
    """The builder's own eager call on the first real batch: no sync (safety); its
    allocations are advice (``strict`` may promote them)."""
    sync_prop = props["sync-free builder call"]
    alloc_prop = props["no allocation in builder"]
    if not detectors:
        sync_prop.skip(no_detector_reason or "no detector")
    else:
        names = sorted({e.name for e in call.sync_events})
        sync_prop.detail = (
            f"{len(call.sync_events)} sync(s) by {', '.join(detectors)}: {', '.join(names)}"
            if names
            else f"0 syncs ({', '.join(detectors)})"
        )
        if names:
            sync_prop.fail(f"eager call on bs={call.bs}: {', '.join(names)}")
    alloc_prop.detail = f"eager call: {call.allocations} allocation(s)"
    if call.allocations:
        ops = call.allocation_ops
        alloc_prop.advise(
            f"eager call on bs={call.bs}: {call.allocations} allocation(s)"
            + (f" ({', '.join(sorted(set(ops))[:4])})" if ops else ""),
            strict,
        )


def judge_eager_call_raised(
    props: Props, exc: BaseException, builder: Callable[..., object]
) -> str:
    """The builder's first eager call raised (before any capture): "capture" fails with the
    exception and where in the builder's code it raised; the rest is not reached. Returns
    the text for ``Report.stopped``."""
    what = f"the builder's eager call (before capture) raised {describe_exception(exc, builder)}"
    why = "not reached: the builder's eager call raised"
    fail_at_capture(props, TABLE_BED_PROPERTIES, what, why)
    return what


def describe_exception(exc: BaseException, builder: Callable[..., object] | None = None) -> str:
    """``TypeName: message at file:line``, the line being the innermost frame in the
    builder's own file (else the innermost frame outside pagegraph, torch and triton)."""
    where = raised_at(exc, builder)
    text = f"{type(exc).__name__}: {exc}".strip()
    if len(text) > 300:
        text = text[:297] + "..."
    return text + (f" at {where}" if where else "")


#: How a capture broken by a host sync reads (torch's and the CUDA runtime's words).
_CAPTURE_ERROR = re.compile(r"captur|cudaErrorStreamCapture|operation not permitted", re.I)
_STACK_FRAME = re.compile(r'File "([^"]+)", line (\d+)')


def _sync_site(stack: str | None, builder: Callable[..., object] | None) -> str:
    """``file:line`` of a sync's stack (``traceback.format_list`` text): its innermost frame
    in the builder's file, else its innermost frame outside pagegraph, torch and triton."""
    frames = _STACK_FRAME.findall(stack or "")
    own = getattr(getattr(builder, "__code__", None), "co_filename", None)
    if own is None:
        inner = getattr(builder, "fn", None)  # a probe wrapping the builder
        own = getattr(getattr(inner, "__code__", None), "co_filename", None)
    library = ("/pagegraph/", "/torch/", "/triton/", "<frozen")
    for wanted in (lambda f: f == own, lambda f: not any(p in f for p in library)):
        for filename, line in reversed(frames):
            if wanted(filename):
                return f"{filename}:{line}"
    return "an unknown place"


def sync_capture_cause(
    exc: BaseException, call: EagerCall | None, builder: Callable[..., object] | None
) -> str | None:
    """The line for a capture that raised because the builder synchronises: when the
    exception reads as a capture error and the eager call before the capture saw a sync,
    ``capture failed: the builder synchronised at FILE:LINE (WHAT), which a CUDA graph
    cannot capture``; else None (the exception is reported as it is)."""
    if call is None or not call.sync_events or not _CAPTURE_ERROR.search(str(exc)):
        return None
    event = next((e for e in call.sync_events if e.stack), call.sync_events[0])
    what = event.name.removeprefix("sync_debug: ")
    return (
        f"capture failed: the builder synchronised at {_sync_site(event.stack, builder)} "
        f"({what}), which a CUDA graph cannot capture"
    )


def judge_builder_calls(
    probe: BuilderProbe, compiles: CompileCounter, props: Props, strict: tuple[str, ...] = ()
) -> None:
    """Allocations and compilations of the warm-up and capture calls, per bucket: advice
    (``strict`` may promote them)."""
    alloc_prop = props["no allocation in builder"]
    compile_prop = props["one compilation for all buckets"]
    calls = probe.calls
    allocating = [c for c in calls if c.allocations]
    if alloc_prop.status != "incomplete":
        alloc_prop.detail += (
            f"; {len(calls)} warm-up/capture call(s): "
            f"{sum(c.allocations for c in calls)} allocation(s)"
        )
        if allocating:
            c = allocating[0]
            ops = f" ({', '.join(sorted(set(c.allocation_ops))[:4])})" if c.allocation_ops else ""
            alloc_prop.advise(f"{c.phase}: {c.allocations} allocation(s){ops}", strict)
    if compiles.reason is not None:
        compile_prop.skip(compiles.reason)
        return
    warmups = [c for c in calls if c.phase.startswith("warmup")]
    later = [c for c in calls if c not in warmups[:1] and c.compiles]
    total = sum(c.compiles for c in calls)
    cold_ms = sum(c.ms for c in calls if c.compiles)
    compile_prop.detail = (
        f"{total} compilation(s) in {len(calls)} warm-up/capture call(s), "
        f"{sum(c.compiles for c in later)} after the first bucket; the calls that compiled "
        f"took {cold_ms:.0f} ms"
    )
    if later:
        compile_prop.advise(
            f"{sum(c.compiles for c in later)} compilation(s) after the first bucket ("
            + "; ".join(f"{c.phase}: {c.compiles}" for c in later[:4])
            + (", ..." if len(later) > 4 else "")
            + f"): start-up time, {cold_ms:.0f} ms in the calls that compiled",
            strict,
        )


# -- the tables' judges ---------------------------------------------------------------------------


class HostJudge(JudgedAtOnce):
    """What each replay did on the host (``judge_replay``: allocations, time, syncs,
    addresses), and, measured a chunk at a time, the chunk's allocations."""

    def __init__(self, state: TableReplays) -> None:
        self.state = state

    def observe(self, seen: TableSeen) -> None:
        judge_replay(self.state, seen.index, seen.mstep, seen.measured)

    def settle(self, props: Props) -> None:
        if self.state.graphs and not self.state.allocations.per_replay:
            judge_chunk_allocations(self.state)


class TableVerification:
    """The exact comparison of every output with the checker's model (``TableVerifier``): each
    replay's snapshot and comparison queued on the device (``observe``, no sync), the
    chunk's records read back into "correct", "bounded writes", "row containment", "staged
    inputs" and "error counters" (``settle``)."""

    def __init__(self, state: TableReplays) -> None:
        self.state = state

    def observe(self, seen: TableSeen) -> None:
        with phase("verify"):
            self.state.verifier.verify()

    def settle(self, props: Props) -> None:
        state = self.state
        with phase("verify"):
            records = state.verifier.read(len(state.pending))
        judge_records(
            records,
            list(state.pending),
            state.verifier,
            props,
            state.report,
            state.cfg,
            state.model.describe_rows,
        )


# -- one replay, as it happens -------------------------------------------------------------------


def judge_replay(state: TableReplays, i: int, mstep: ModelStep, measured: ReplayMeasure) -> None:
    """What replay ``i`` did on the host: allocations while staging and replaying, its time
    (into its bucket's row), syncs in its stage/replay ranges, static buffers moved."""
    _judge_replay_allocations(state, i, mstep, measured)
    stats = state.report.buckets.get(mstep.bucket)
    if stats is None:
        stats = state.report.buckets[mstep.bucket] = BucketStats(mstep.bucket)
    stats.replay_us.append(measured.dt_us)
    _judge_replay_syncs(state, i, mstep, measured.syncs_before, stats)
    _judge_addresses(state, i)


def _judge_replay_allocations(
    state: TableReplays, i: int, mstep: ModelStep, measured: ReplayMeasure
) -> None:
    alloc_prop = state.props["no allocation in replay"]
    # A builder called at each replay (eagerly, or a kind built before its graph) is measured
    # on its own: its allocations are its advice, not the runner's.
    builder_ops = collections.Counter(op for c in measured.builder_calls for op in c.allocation_ops)
    builder_count = sum(c.allocations for c in measured.builder_calls)
    if builder_count:
        state.props["no allocation in builder"].advise(
            f"replay {i} (bucket {mstep.bucket}): {builder_count} allocation(s) by the "
            f"builder, called at each replay ({', '.join(sorted(builder_ops)[:4])})",
            state.cfg.strict,
        )
    if state.allocations.per_replay:
        delta = measured.allocations - builder_count
        state.allocations.total += delta
        if delta and alloc_prop.status == "pass":
            alloc_prop.fail(
                f"replay {i} (bucket {mstep.bucket}): {delta} allocator event(s) "
                "during staging + replay"
            )
    counter = measured.counter
    if counter is None:
        return
    # Replaying eagerly, the builder runs inside the replay: its own allocations are advice
    # (a captured graph serves them from its pool), the runner's staging must allocate none.
    runner_ops = collections.Counter(counter.ops) - builder_ops
    runner_count = counter.count - builder_count
    if runner_count > 0 and alloc_prop.status == "pass":
        alloc_prop.fail(
            f"replay {i} (bucket {mstep.bucket}): {runner_count} allocation(s) by the runner's "
            f"staging ({', '.join(sorted(runner_ops)[:4])})"
        )


def _judge_replay_syncs(
    state: TableReplays, i: int, mstep: ModelStep, before: int, stats: BucketStats
) -> None:
    rec = state.recorder
    if rec is None or len(rec.events) <= before:
        return
    new = [
        e for e in rec.events[before:] if e.range and e.range.split("/")[0] in ("stage", "replay")
    ]
    if not new:
        return
    stats.syncs += len(new)
    if not state.replay_syncs:
        state.props["sync-free replay path"].fail(
            f"replay {i} (bucket {mstep.bucket}): "
            + ", ".join(sorted({f"{e.name} in {e.range}" for e in new}))
        )
    state.replay_syncs.extend(new)


def _judge_addresses(state: TableReplays, i: int) -> None:
    moved = state.props["static buffers unmoved"]
    runner = state.runner
    for name, address in state.watched.live:
        now = _current(runner, name)
        if now is None:
            moved.fail(f"replay {i}: {name} replaced")
        elif now.data_ptr() != address and moved.status == "pass":
            moved.fail(f"replay {i}: {name} moved ({address:#x} -> {now.data_ptr():#x})")
    for name in state.watched.absent:
        if _current(runner, name) is not None:
            moved.fail(f"replay {i}: {name} replaced")


def _current(runner: GraphRunner, name: str) -> torch.Tensor | None:
    """The runner's buffer ``name`` now (``None`` when it is gone)."""
    try:
        return runner.static_buffer(name)
    except AttributeError:
        return None


def judge_chunk_allocations(state: TableReplays) -> None:
    """Allocations over the pending chunk, once replays are measured a chunk at a time."""
    tally = state.allocations
    now = tally.read()
    alloc_prop = state.props["no allocation in replay"]
    if now != tally.base and alloc_prop.status == "pass":
        alloc_prop.fail(
            f"{now - tally.base} allocation(s) during replays "
            f"{state.pending[0].index}..{state.pending[-1].index}"
        )
    tally.total += now - tally.base
    tally.base = now


# -- the verifier's records, a chunk at a time ---------------------------------------------------


def judge_records(
    records: np.ndarray,
    steps: list[ModelStep],
    verifier: TableVerifier,
    props: Props,
    report: Report,
    cfg: CheckConfig,
    describe_rows: DescribeRows | None = None,
) -> None:
    """Fold one chunk of device records (``[len(steps), verifier.record_size]`` int64, one
    row a replay, laid out as ``pagegraph.check.judges.verify`` says) into the report.
    ``describe_rows(step)`` names a replay's out-of-contract rows for its failures."""
    kinds = verifier.kind.error_kinds
    if verifier.errors is not None and not report.errors:
        report.errors = dict.fromkeys(kinds, 0)
    for rec, st in zip(records, steps):
        stats = report.buckets.setdefault(st.bucket, BucketStats(st.bucket))
        stats.replays += 1
        report.replays += 1
        report.long_replays += st.longer_than_capture and not st.out_of_contract
        if st.out_of_contract:
            stats.out_of_contract += 1
            report.out_of_contract_replays.append(st.index)
        _judge_tables(rec, st, verifier, stats, props, cfg, describe_rows)
        if verifier.vectors is not None:
            _judge_vectors(rec, st, verifier, stats, props, cfg, describe_rows)
        _judge_staged_inputs(rec, st, verifier, props["staged inputs"])
        if verifier.errors is not None:
            _judge_error_counters(
                rec, st, verifier, kinds, props["error counters"], report, describe_rows
            )
        verifier.previous_step = st


def left_by(step: ModelStep) -> str:
    """The replay a stale value was left by, as a failure names it."""
    return f"left by replay {step.index} (bucket {step.bucket}, {step.n} real rows)"


def _stale(rec: np.ndarray, verifier: TableVerifier) -> tuple[list[int], int, int] | None:
    """What the previous replay left at this record's first failures, when the verifier's
    previous ring entry holds it and the host knows that replay."""
    if verifier.previous_step is None:
        return None
    return read_previous(rec, verifier)


def _fail_with(
    prop: PropertyResult, failure: Failure, st: ModelStep, describe_rows: DescribeRows | None
) -> None:
    """``prop`` fails; its first failure gets the row's inputs and the replay's
    out-of-contract rows (worked out for the first failure only: they cost a few numpy
    calls)."""
    if prop.first_failure is None:
        failure.poison = POISON
        if not failure.vector and 0 <= failure.row < len(st.asked_sl):
            failure.seq_len = int(st.asked_sl[failure.row])
            failure.req_pool_index = int(st.asked_rpi[failure.row])
        if st.out_of_contract and describe_rows is not None:
            failure.injected = describe_rows(st)
    prop.fail(failure)


def _judge_tables(
    rec: np.ndarray,
    st: ModelStep,
    verifier: TableVerifier,
    stats: BucketStats,
    props: Props,
    cfg: CheckConfig,
    describe_rows: DescribeRows | None = None,
) -> None:
    """The table masks of one record: wrong live entries fail "correct", writes outside the
    live region fail "bounded writes"; on an out-of-contract replay either fails "row
    containment" instead. ("graph-safe" compares a replay with an eager call instead:
    ``pagegraph.check.judges.graph_safety``.)"""
    T = verifier.T
    for mask in range(2 * T):
        found = read_mask(rec, mask)
        if found is None:
            continue
        count, flat, expected, got = found
        row, col = divmod(flat, verifier.row_strides[mask % T])
        failure = Failure(
            st.index,
            st.bucket,
            row - CANARY_ROWS,
            col,
            expected,
            got,
            TABLE_NAMES[mask % T],
            verifier.max_bs,
            cfg.width,
        )
        if st.out_of_contract:
            stats.escaped_writes += count
            _fail_with(props["row containment"], failure, st, describe_rows)
        elif mask < T:
            stats.mismatches += count
            previous = _stale(rec, verifier)
            if previous is not None and got == previous[0][mask] != POISON:
                assert verifier.previous_step is not None  # _stale found it
                failure.stale = left_by(verifier.previous_step)
            _fail_with(props["correct"], failure, st, describe_rows)
        else:
            stats.oob_writes += count
            _fail_with(props["bounded writes"], failure, st, describe_rows)


def _judge_vectors(
    rec: np.ndarray,
    st: ModelStep,
    verifier: TableVerifier,
    stats: BucketStats,
    props: Props,
    cfg: CheckConfig,
    describe_rows: DescribeRows | None = None,
) -> None:
    """A metadata or CSR builder's vectors: wrong entries of the live region fail "correct"
    (on an out-of-contract replay they are the out-of-contract values' own, and allowed,
    except a CSR builder's
    rows before the first out-of-contract one: "row containment"), writes outside it fail
    "bounded writes" (or "row containment")."""
    vectors = verifier.vectors
    assert vectors is not None, "judged only for a kind with vectors (judge_records)"
    length = vectors.shape[1]
    for k, mask in enumerate((2 * verifier.T, 2 * verifier.T + 1)):
        found = read_mask(rec, mask)
        if found is None:
            continue
        count, flat, expected, got = found
        vector, entry = divmod(flat, length)
        name = verifier.vector_names[vector]
        spec = verifier.kind.vectors[vector]
        failure = Failure(
            st.index,
            st.bucket,
            entry - 1,
            0,
            expected,
            got,
            name,
            vector=True,
            note=verifier.kind.entry_owner(
                name,
                entry - 1,
                st.asked_sl[: st.bucket].tolist(),
                cfg.page_size,
                verifier.cap,
                verifier.csr_capacity,
            ),
            untouched=spec.untouched,
        )
        if st.out_of_contract:
            # Wrong live entries are the out-of-contract values' own, except where the kind's
            # live region there ends where the first out-of-contract row starts (CSR).
            if k == 1 or verifier.kind.ooc_prefix_exact:
                stats.escaped_writes += count
                _fail_with(props["row containment"], failure, st, describe_rows)
        elif k == 0:
            stats.mismatches += count
            _fail_with(props["correct"], failure, st, describe_rows)
        else:
            stats.oob_writes += count
            _fail_with(props["bounded writes"], failure, st, describe_rows)


def _judge_staged_inputs(
    rec: np.ndarray, st: ModelStep, verifier: TableVerifier, staged_prop: PropertyResult
) -> None:
    at = verifier.staged_at
    if rec[at] and staged_prop.status == "pass":
        row = int(rec[at + 1])
        got_rpi, got_sl = int(rec[at + 2]), int(rec[at + 3])
        stale = ""
        previous = _stale(rec, verifier)
        if previous is not None and (got_rpi, got_sl) == previous[1:]:
            assert verifier.previous_step is not None  # _stale found it
            stale = f" (stale: {left_by(verifier.previous_step)})"
        staged_prop.fail(
            f"replay {st.index} (bucket {st.bucket}): {int(rec[at])} row(s) differ; first "
            f"row {row}: req_pool_index {got_rpi}, seq_len {got_sl}{stale}, "
            f"asked for (padded) req_pool_index {_asked(st.asked_rpi, row)}, "
            f"seq_len {_asked(st.asked_sl, row)}"
        )


def _judge_error_counters(
    rec: np.ndarray,
    st: ModelStep,
    verifier: TableVerifier,
    kinds: tuple[str, ...],
    err_prop: PropertyResult,
    report: Report,
    describe_rows: DescribeRows | None = None,
) -> None:
    E = verifier.E
    at = verifier.errors_at
    want, got = rec[at : at + E], rec[at + E : at + 2 * E]
    for k in range(E):
        report.errors[kinds[k]] += int(got[k])
    if (want != got).any() and err_prop.status == "pass":
        diffs = ", ".join(
            f"{kinds[k]} expected {int(want[k])} got {int(got[k])}"
            for k in range(E)
            if want[k] != got[k]
        )
        rows = describe_rows(st) if describe_rows is not None else ""
        err_prop.fail(
            f"replay {st.index} (bucket {st.bucket}): {diffs}"
            + (f"; the replay's out-of-contract rows: {rows}" if rows else "")
        )


def _asked(values: np.ndarray, row: int) -> str:
    return str(int(values[row])) if 0 <= row < len(values) else "?"


# -- after the last replay -----------------------------------------------------------------------
