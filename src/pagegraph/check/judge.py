"""Judging: turning what the probes measured and what the verifier recorded into property
results. Every function here folds its evidence into the properties (``PropertyResult``) and
the report; none runs the builder or the runner.

A property keeps its first failure (the one the report names); later failures only add to
the counts of the per-bucket table."""

from __future__ import annotations

import numpy as np

from ..kernels.contract import ERROR_KINDS
from ..kernels.decode_metadata import DECODE_ERROR_KINDS
from .config import REPLAY_PROPERTIES, CheckConfig
from .probes import BuilderProbe, CompileCounter, EagerCall
from .report import BucketStats, Failure, PropertyResult, Report
from .state import ALLOCATION_PROBES, ReplayMeasure, ReplayState
from .verify import CANARY_ROWS, VECTOR_NAMES, ModelStep, TableVerifier, read_mask

Props = dict[str, PropertyResult]

#: The tables' names, by table index in the checker's allocation.
TABLE_NAMES = ("page_table", "swa_page_table")


# -- the builder alone -------------------------------------------------------------------------


def judge_eager_call(props: Props, call: EagerCall, detectors: tuple[str, ...],
                     no_detector_reason: str | None) -> None:  # fmt: skip
    """The builder's own eager call on the first real batch: no sync, no allocation."""
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
        alloc_prop.fail(
            f"eager call on bs={call.bs}: {call.allocations} allocation(s)"
            + (f" ({', '.join(sorted(set(ops))[:4])})" if ops else "")
        )


def judge_eager_call_raised(props: Props, exc: Exception) -> None:
    """The eager call raised: a builder that raises is reported, not fatal."""
    sync_prop = props["sync-free builder call"]
    alloc_prop = props["no allocation in builder"]
    sync_prop.fail()
    sync_prop.detail = f"the eager call raised {exc!r}"
    alloc_prop.status = "incomplete"
    alloc_prop.detail = "the eager call raised"


def judge_builder_calls(probe: BuilderProbe, compiles: CompileCounter, props: Props) -> None:
    """Allocations and compilations of the warm-up and capture calls, per bucket."""
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
            alloc_prop.fail(f"{c.phase}: {c.allocations} allocation(s){ops}")
    if compiles.reason is not None:
        compile_prop.skip(compiles.reason)
        return
    warmups = [c for c in calls if c.phase.startswith("warmup")]
    later = [c for c in calls if c not in warmups[:1] and c.compiles]
    total = sum(c.compiles for c in calls)
    compile_prop.detail = (
        f"{total} compilation(s) in {len(calls)} warm-up/capture call(s), "
        f"{sum(c.compiles for c in later)} after the first bucket"
    )
    if later:
        compile_prop.fail("; ".join(f"{c.phase}: {c.compiles} compilation(s)" for c in later[:4]))


def mark_not_reached(props: Props, why: str) -> None:
    """Properties still passing with nothing judged yet become incomplete: ``why``."""
    for p in props.values():
        if p.status == "pass" and not p.detail:
            p.status = "incomplete"
            p.detail = f"not reached: {why}"


# -- one replay, as it happens -------------------------------------------------------------------


def judge_replay(state: ReplayState, i: int, mstep: ModelStep, measured: ReplayMeasure) -> None:
    """What replay ``i`` did on the host: allocations while staging and replaying, its time
    (into its bucket's row), syncs in its stage/replay ranges, static buffers moved."""
    _judge_replay_allocations(state, i, mstep, measured)
    stats = state.report.buckets.get(mstep.bucket)
    if stats is None:
        stats = state.report.buckets[mstep.bucket] = BucketStats(mstep.bucket)
    stats.replay_us.append(measured.dt_us)
    _judge_replay_syncs(state, i, mstep, measured.syncs_before, stats)
    _judge_addresses(state, i)


def _judge_replay_allocations(state: ReplayState, i: int, mstep: ModelStep,
                              measured: ReplayMeasure) -> None:  # fmt: skip
    alloc_prop = state.props["no allocation in replay"]
    if state.allocations.per_replay:
        delta = measured.allocations
        state.allocations.total += delta
        if delta and alloc_prop.status == "pass":
            alloc_prop.fail(
                f"replay {i} (bucket {mstep.bucket}): {delta} allocator event(s) "
                "during staging + replay"
            )
    counter = measured.counter
    if counter is not None and counter.count and alloc_prop.status == "pass":
        alloc_prop.fail(
            f"replay {i} (bucket {mstep.bucket}): {counter.count} allocation(s) "
            f"({', '.join(sorted(set(counter.ops))[:4])})"
        )


def _judge_replay_syncs(state: ReplayState, i: int, mstep: ModelStep, before: int,
                        stats: BucketStats) -> None:  # fmt: skip
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


def _judge_addresses(state: ReplayState, i: int) -> None:
    moved = state.props["static buffers unmoved"]
    runner = state.runner
    for name, address in state.watched.live:
        now = getattr(runner, name, None)
        if now is None:
            moved.fail(f"replay {i}: {name} replaced")
        elif now.data_ptr() != address and moved.status == "pass":
            moved.fail(f"replay {i}: {name} moved ({address:#x} -> {now.data_ptr():#x})")
    for name in state.watched.absent:
        if getattr(runner, name, None) is not None:
            moved.fail(f"replay {i}: {name} replaced")


def judge_chunk_allocations(state: ReplayState) -> None:
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


def judge_records(records: np.ndarray, steps: list[ModelStep], verifier: TableVerifier,
                  props: Props, report: Report, cfg: CheckConfig) -> None:  # fmt: skip
    """Fold one chunk of device records (``[len(steps), verifier.record_size]`` int64, one
    row a replay, laid out as ``pagegraph.check.verify`` says) into the report."""
    kinds = DECODE_ERROR_KINDS if verifier.vectors is not None else ERROR_KINDS
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
        _judge_tables(rec, st, verifier, stats, props, cfg)
        if verifier.vectors is not None:
            _judge_vectors(rec, st, verifier, stats, props)
        _judge_staged_inputs(rec, st, verifier, props["staged inputs"])
        if verifier.errors is not None:
            _judge_error_counters(rec, st, verifier, kinds, props["error counters"], report)


def _judge_tables(rec: np.ndarray, st: ModelStep, verifier: TableVerifier, stats: BucketStats,
                  props: Props, cfg: CheckConfig) -> None:  # fmt: skip
    """The table masks of one record: wrong live entries fail "correct" (and "graph-safe" on a
    replay longer than at capture), writes outside the live region fail "bounded writes"; on
    an out-of-contract replay either fails "row containment" instead."""
    T = verifier.T
    for mask in range(2 * T):
        found = read_mask(rec, mask)
        if found is None:
            continue
        count, flat, expected, got = found
        row, col = divmod(flat, verifier.padded_width)
        failure = Failure(
            st.index, st.bucket, row - CANARY_ROWS, col, expected, got,
            TABLE_NAMES[mask % T], verifier.max_bs, cfg.width,
        )  # fmt: skip
        if st.out_of_contract:
            stats.escaped_writes += count
            props["row containment"].fail(failure)
        elif mask < T:
            stats.mismatches += count
            props["correct"].fail(failure)
            if st.longer_than_capture:
                props["graph-safe (captured short, replayed long)"].fail(failure)
        else:
            stats.oob_writes += count
            props["bounded writes"].fail(failure)


def _judge_vectors(rec: np.ndarray, st: ModelStep, verifier: TableVerifier, stats: BucketStats,
                   props: Props) -> None:  # fmt: skip
    """A metadata builder's vectors: wrong entries of the live region fail "correct" (on an
    out-of-contract replay they are the out-of-contract values' own, and allowed), writes
    outside it fail "bounded writes" (or "row containment")."""
    length = verifier.vectors.shape[1]
    for k, mask in enumerate((2 * verifier.T, 2 * verifier.T + 1)):
        found = read_mask(rec, mask)
        if found is None:
            continue
        count, flat, expected, got = found
        vector, entry = divmod(flat, length)
        failure = Failure(
            st.index, st.bucket, entry - 1, 0, expected, got, VECTOR_NAMES[vector], vector=True
        )
        if st.out_of_contract:
            if k == 1:  # wrong live entries are the out-of-contract values' own
                stats.escaped_writes += count
                props["row containment"].fail(failure)
        elif k == 0:
            stats.mismatches += count
            props["correct"].fail(failure)
        else:
            stats.oob_writes += count
            props["bounded writes"].fail(failure)


def _judge_staged_inputs(rec: np.ndarray, st: ModelStep, verifier: TableVerifier,
                         staged_prop: PropertyResult) -> None:  # fmt: skip
    at = verifier.staged_at
    if rec[at] and staged_prop.status == "pass":
        row = int(rec[at + 1])
        staged_prop.fail(
            f"replay {st.index} (bucket {st.bucket}): {int(rec[at])} row(s) differ; first "
            f"row {row}: req_pool_index {int(rec[at + 2])}, seq_len {int(rec[at + 3])}, "
            f"asked for (padded) req_pool_index {_asked(st.asked_rpi, row)}, "
            f"seq_len {_asked(st.asked_sl, row)}"
        )


def _judge_error_counters(rec: np.ndarray, st: ModelStep, verifier: TableVerifier,
                          kinds: tuple[str, ...], err_prop: PropertyResult,
                          report: Report) -> None:  # fmt: skip
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
        err_prop.fail(f"replay {st.index} (bucket {st.bucket}): {diffs}")


def _asked(values: np.ndarray, row: int) -> str:
    return str(int(values[row])) if 0 <= row < len(values) else "?"


# -- after the last replay -----------------------------------------------------------------------


def summarise_replays(state: ReplayState, memory_after: int | None) -> None:
    """The details of the replay properties once the loop is over, the properties that had
    nothing to judge skipped, and, when the loop stopped early, those not finished marked
    incomplete."""
    _summarise_entries(state)
    _summarise_counters_inputs_addresses(state)
    _summarise_allocations(state)
    _summarise_memory_growth(state, memory_after)
    _summarise_syncs(state)
    _close_replay_properties(state)


def _bucket_total(report: Report, attr: str) -> int:
    return sum(getattr(b, attr) for b in report.buckets.values())


def _summarise_entries(state: ReplayState) -> None:
    props, report = state.props, state.report
    n_ooc = len(report.out_of_contract_replays)
    props["correct"].detail = (
        f"{_bucket_total(report, 'mismatches')} wrong live entries over "
        f"{report.replays - n_ooc} in-contract replays"
    )
    props[
        "bounded writes"
    ].detail = f"{_bucket_total(report, 'oob_writes')} entries written outside the live region"
    props[
        "graph-safe (captured short, replayed long)"
    ].detail = f"{report.long_replays} replays longer than the capture-time lengths"
    props["row containment"].detail = (
        f"{_bucket_total(report, 'escaped_writes')} entries written outside out-of-contract "
        f"rows over {n_ooc} out-of-contract replays"
    )


def _summarise_counters_inputs_addresses(state: ReplayState) -> None:
    props, report = state.props, state.report
    err_prop = props["error counters"]
    if state.runner.errors is None:
        err_prop.skip("error counters off (errors = false)")
    elif err_prop.status == "pass":
        err_prop.detail = "equal to the model's counts on every replay: " + ", ".join(
            f"{k} {v}" for k, v in report.errors.items()
        )
    staged_prop = props["staged inputs"]
    if not staged_prop.detail:
        staged_prop.detail = (
            "equal to the batch asked for on every replay"
            if staged_prop.status != "FAIL"
            else "differ from the batch asked for, padded by the policy"
        )
    moved = props["static buffers unmoved"]
    if not moved.detail:
        moved.detail = (
            "addresses equal at every replay"
            if moved.status != "FAIL"
            else "a static buffer is not where it was at capture"
        )


def _summarise_allocations(state: ReplayState) -> None:
    alloc_prop = state.props["no allocation in replay"]
    tally = state.allocations
    if state.graphs:
        alloc_prop.detail = f"{tally.total} allocator events during staging + replay" + (
            " (measured replay by replay: the workload between replays allocated "
            f"{tally.workload} time(s))"
            if tally.per_replay
            else f" (measured one by one over the first {ALLOCATION_PROBES} replays, then a "
            "chunk at a time)"
        )
    else:
        alloc_prop.detail = "torch operators seen allocating during staging + eager replay: " + (
            "none" if alloc_prop.status == "pass" else "some"
        )


def _summarise_memory_growth(state: ReplayState, memory_after: int | None) -> None:
    growth = state.props["no memory growth"]
    before = state.memory_before
    if not state.graphs:
        growth.skip("needs a GPU: torch keeps allocator statistics for CUDA memory only")
    elif memory_after is not None:
        growth.detail = f"{before} bytes allocated before the replays, {memory_after} after"
        if memory_after > before:
            growth.fail(f"+{memory_after - before} bytes over {state.report.replays} replays")


def _summarise_syncs(state: ReplayState) -> None:
    sync_prop = state.props["sync-free replay path"]
    if not state.run.detectors:
        sync_prop.skip(state.run.no_detector_reason or "no detector")
        return
    names = sorted({f"{e.name} in {e.range}" for e in state.replay_syncs})
    sync_prop.detail = f"{len(state.replay_syncs)} sync(s)" + (
        f": {', '.join(names[:5])}" if names else ""
    )


def _close_replay_properties(state: ReplayState) -> None:
    props, report, cfg, stopped = state.props, state.report, state.cfg, state.stopped
    completed = props["replays completed"]
    completed.detail = completed.detail or f"{report.replays} of {cfg.steps} replays" + (
        f", then {stopped}" if stopped else ""
    )
    if stopped is None:
        # Properties that had nothing to judge are skipped, with the reason.
        graph_safe = props["graph-safe (captured short, replayed long)"]
        if report.long_replays == 0 and graph_safe.status == "pass":
            graph_safe.skip("no replay was longer than at capture")
        containment = props["row containment"]
        if not report.out_of_contract_replays and containment.status == "pass":
            containment.skip(
                "no out-of-contract replay in this workload (set overlong, negative or bad_index)"
            )
        return
    # A run that stopped early has not shown what it did not reach: nothing that was still
    # passing counts as passed.
    report.stopped = stopped
    if completed.status == "pass":
        completed.status = "incomplete"
    for name in REPLAY_PROPERTIES:
        p = props[name]
        if p.status == "pass":
            p.status = "incomplete"
            p.detail = f"{report.replays} of {cfg.steps} replays checked, then {stopped}"
