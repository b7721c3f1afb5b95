"""The end of a table check's replays, summarised (``summarise_replays``): what the
verification counted, the counters, inputs and addresses, the allocations, the memory growth
and the syncs folded into their properties, and the replay properties nothing failed closed.
"""

from __future__ import annotations

from ..reports.report import Report
from ..run_end import TABLE_BED_PROPERTIES, Ending, RunEnd, mark_unfinished
from .graph_safety import EVERY_REPLAY, SAMPLE, never_compared
from .table_replays import ALLOCATION_PROBES, TableReplays

__all__ = ["summarise_replays"]


def summarise_replays(state: TableReplays, memory_after: int | None) -> None:
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


def _summarise_entries(state: TableReplays) -> None:
    props, report = state.props, state.report
    n_ooc = len(report.out_of_contract_replays)
    props["correct"].detail = (
        f"{_bucket_total(report, 'mismatches')} wrong live entries over "
        f"{report.replays - n_ooc} in-contract replays"
    )
    props[
        "bounded writes"
    ].detail = f"{_bucket_total(report, 'oob_writes')} entries written outside the live region"
    twin = state.twin
    props["graph-safe (captured short, replayed long)"].detail = (
        f"{twin.count} in-contract replays, {min(twin.count, EVERY_REPLAY)} and one in "
        f"{SAMPLE} after them compared with an eager call on the same inputs"
        if twin is not None
        else ""
    )
    props["row containment"].detail = (
        f"{_bucket_total(report, 'escaped_writes')} entries outside out-of-contract rows "
        f"written where they must not be, or wrong or never written, over {n_ooc} "
        "out-of-contract replays"
    )


def _summarise_counters_inputs_addresses(state: TableReplays) -> None:
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


def _summarise_allocations(state: TableReplays) -> None:
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
        replay = "emulated" if state.run.emulated else "eager"
        seen = "none" if alloc_prop.status == "pass" else "some"
        alloc_prop.detail = (
            f"torch operators seen allocating during staging + {replay} replay: {seen}"
        )


def _summarise_memory_growth(state: TableReplays, memory_after: int | None) -> None:
    growth = state.props["no memory growth"]
    before = state.memory_before
    if not state.graphs:
        growth.skip("needs a GPU: torch keeps allocator statistics for CUDA memory only")
    elif memory_after is not None:
        assert before is not None, "read before the replays on CUDA (ReplayState.after_capture)"
        growth.detail = f"{before} bytes allocated before the replays, {memory_after} after"
        if memory_after > before:
            growth.fail(f"+{memory_after - before} bytes over {state.report.replays} replays")


def _summarise_syncs(state: TableReplays) -> None:
    sync_prop = state.props["sync-free replay path"]
    if not state.run.detectors:
        sync_prop.skip(state.run.no_detector_reason or "no detector")
        return
    names = sorted({f"{e.name} in {e.range}" for e in state.replay_syncs})
    sync_prop.detail = f"{len(state.replay_syncs)} sync(s)" + (
        f": {', '.join(names[:5])}" if names else ""
    )


def _close_replay_properties(state: TableReplays) -> None:
    props, report, cfg, stopped = state.props, state.report, state.cfg, state.stopped
    completed = props["replays completed"]
    ran = completed.detail or f"{report.replays} of {cfg.steps} replays" + (
        f", then {stopped}" if stopped else ""
    )
    completed.detail = ran
    if stopped is None:
        # Properties that had nothing to judge are skipped, with the reason.
        graph_safe = props["graph-safe (captured short, replayed long)"]
        if state.twin is None:
            never_compared(graph_safe, state.run.no_graph_reason())
        elif state.twin.count == 0 or report.long_replays == 0:
            never_compared(graph_safe, "no in-contract replay longer than at capture")
        containment = props["row containment"]
        if not report.out_of_contract_replays and containment.status == "pass":
            containment.skip(
                "no out-of-contract replay in this workload (set overlong, negative, bad_index "
                "or num_blocks_overrun)"
            )
        return
    # A run that stopped early has not shown what it did not reach: nothing that was still
    # passing counts as passed.
    report.stopped = stopped
    checked = f"{report.replays} of {cfg.steps} replays checked, then {stopped}"
    mark_unfinished(props, TABLE_BED_PROPERTIES, RunEnd(Ending.STOPPED, checked))
    completed.detail = ran  # how far the replays went, not what they checked
