"""Replay-safety checks of any page-table builder: ``check_replay_safety(builder, config)``.

For a builder and an engine-like workload, the checker captures the builder into a
``GraphRunner`` (or a runner of the caller's), replays the workload and judges every replay
against its own model of what should have happened, never against what the runner staged:

* the expected inputs of each replay come from the batch the workload asked for, padded by
  the checker's own reading of the padding policy into the bucket the checker picks
  (``pagegraph.verify.BatchModel``);
* the expected tables come from an independent plain-torch gather of those inputs, compared
  exactly with the whole allocation the tables live in, canary rows and columns included
  (``pagegraph.verify.TableVerifier``), on the device, with no sync per replay.

Each property says what it covers (``PROPERTIES``): the builder, the runner, or both. A
property that could not run is reported as skipped with its reason; a run that stopped early
(a replay raised, Ctrl-C) reports the properties it could not finish as incomplete. Only
passed properties count as passed: ``Report.safe`` needs no failure and nothing incomplete.
"""

from __future__ import annotations

import contextlib
import dataclasses
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from ..detect.ranges import current_range, phase
from ..graph.buckets import Buckets, resolve_padding
from ..graph.runner import GraphRunner
from ..kernels.contract import ERROR_KINDS, cdiv
from ..kernels.decode_metadata import DECODE_ERROR_KINDS
from ..kernels.registry import OUTPUT_KINDS, builder_kind, builder_name, resolve_builder
from ..workload.decode import Injection
from ..workload.pool import KVPool
from ..workload.producer import MAX_STREAMS, ProducedWorkload
from .verify import (
    CANARY_ROWS,
    POISON,
    VECTOR_NAMES,
    BatchModel,
    ModelStep,
    TableVerifier,
    batch_size,
    read_mask,
    replay_bytes,
)

INDEX_DTYPES = {"int32": torch.int32, "int64": torch.int64}
#: Values of ``CheckConfig.staging`` and ``CheckConfig.workload_process``.
STAGING_MODES = ("mixed", "host", "device")
WORKLOAD_PROCESS_MODES = ("auto", "on", "off")
TABLE_NAMES = ("page_table", "swa_page_table")

#: property -> (what it covers, what makes it fail). The order is the report's.
PROPERTIES: dict[str, tuple[str, str]] = {
    "sync-free builder call": (
        "builder",
        "a host sync in one eager call of the builder, seen by any detector that runs here",
    ),
    "no allocation in builder": (
        "builder",
        "a memory allocation in the eager call or in any bucket's warm-up call",
    ),
    "one compilation for all buckets": (
        "builder",
        "a Triton compilation after the first bucket's warm-up (a kernel specialised per "
        "batch size), or during capture",
    ),
    "capture": ("builder + runner", "warm-up or capture raising"),
    "replays completed": ("builder + runner", "a replay raising, or the run interrupted"),
    "staged inputs": (
        "runner",
        "static inputs after staging and padding that differ from the batch asked for, padded "
        "by the policy into the right bucket",
    ),
    "correct": (
        "builder + runner",
        "a live entry (real or padded row) that differs from the reference, on a replay "
        "whose values are all in the contract",
    ),
    "bounded writes": (
        "builder + runner",
        "any entry outside the live region (stale tail, rows past the bucket, canary rows and "
        "columns) that is not the poison written before the replay, on in-contract replays",
    ),
    "graph-safe (captured short, replayed long)": (
        "builder",
        "a wrong live entry on a replay with rows longer than at capture (a width frozen at "
        "capture)",
    ),
    "row containment": (
        "builder",
        "on a replay with out-of-contract values, any write outside an out-of-contract row's "
        "own [0, width) region, or any change to another row or a canary",
    ),
    "error counters": (
        "builder",
        "an errors counter that differs from the count of out-of-contract values the replay held",
    ),
    "static buffers unmoved": (
        "runner",
        "a static buffer (inputs, tables, errors, req_to_token, full_to_swa) whose address "
        "differs from capture's",
    ),
    "no allocation in replay": (
        "runner (with graphs); runner + builder (eager)",
        "a memory allocation while staging or replaying",
    ),
    "no memory growth": (
        "runner (with graphs); runner + builder (eager)",
        "more device memory allocated after the replays than before",
    ),
    "sync-free replay path": (
        "runner (with graphs); runner + builder (eager)",
        "a host sync inside a stage/* or replay/* range, seen by any detector that runs here",
    ),
}


@dataclass
class CheckConfig:
    """One graph setup, its buffer layout and its workload (what a scenario file describes)."""

    max_bs: int = 16
    max_context_len: int = 512
    page_size: int = 16
    buckets: str | list[int] = "sglang"
    padding: str = "sglang"
    swa: bool = False
    steps: int = 40
    seed: int = 0
    finish_rate: float = 0.05
    draft_tokens: int = 0
    initial_len: tuple[int, int] | None = None
    swa_window: int | None = None
    swa_churn: float = 0.0
    near_capacity: float = 0.1
    max_reqs: int | None = None
    num_pages: int | None = None
    row_order: str = "low-first"
    index_dtype: str = "int32"
    errors: bool = False
    detectors: str | tuple[str, ...] = "auto"
    # -- layout: buffers as engines hand them over --
    #: pages per table row (default ``cdiv(max_context_len, page_size)``; narrower caps pages
    #: per request, so long rows must stop at the width)
    table_width: int | None = None
    #: extra columns in the tables' allocation: the tables are column slices of wider
    #: buffers (row stride = width + pad), as attention backends slice ``[:, :max_pages]``
    table_pad_cols: int = 0
    #: ``req_to_token`` rows this much longer than ``max_context_len``
    r2t_extra_cols: int = 0
    #: ``req_to_token`` starts this many elements into a larger allocation
    r2t_offset: int = 0
    r2t_dtype: str = "int32"
    full_to_swa_dtype: str = "int64"
    # -- out-of-contract and edge values in the batches (probabilities per step) --
    overlong: float = 0.0
    negative: float = 0.0
    zero_len: float = 0.0
    bad_index: float = 0.0
    #: independently seeded workload streams taking turns, ``SEGMENT_STEPS`` replays each
    #: (``ProducedWorkload``): with child processes, that many pool models generate steps at
    #: once; a run shorter than one segment replays stream 0 alone
    workload_streams: int = 1
    # -- how the checker drives the runner --
    #: "mixed" alternates host lists and device tensors; "host" or "device" uses one
    staging: str = "mixed"
    #: replays between two read-backs of the device records
    chunk: int = 256
    #: "auto" (what the builder says), "page_table" or "decode_metadata"
    outputs: str = "auto"
    #: where the workload's host models run: "on": a child process a stream
    #: (``ProducedWorkload``), "off": in this one, "auto": in children for CUDA-graph runs of
    #: at least ``PRODUCER_MIN_STEPS`` replays, where their start-up (a second or two) pays off
    workload_process: str = "auto"

    def replace(self, **changes) -> CheckConfig:
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_dict(cls, d: dict) -> CheckConfig:
        """The config ``dataclasses.asdict`` made (through JSON: lists become tuples again)."""
        names = {f.name for f in dataclasses.fields(cls)}
        config = cls(**{k: v for k, v in d.items() if k in names})
        if isinstance(config.initial_len, list):
            config.initial_len = tuple(config.initial_len)
        if isinstance(config.detectors, list):
            config.detectors = tuple(config.detectors)
        return config

    @property
    def width(self) -> int:
        return self.table_width or cdiv(self.max_context_len, self.page_size)

    def injection(self) -> Injection:
        return Injection(self.overlong, self.negative, self.zero_len, self.bad_index)


@dataclass
class Failure:
    """The first failing entry of a property."""

    replay: int
    bucket: int
    row: int
    col: int
    expected: int
    got: int
    table: str = "page_table"
    max_bs: int | None = None
    width: int | None = None

    vector: bool = False

    def where(self) -> str:
        if self.vector:
            return f"{self.table}[{self.row}]" + (" (canary)" if self.row < 0 else "")
        if self.max_bs is not None and not 0 <= self.row < self.max_bs:
            return f"{self.table} canary row {'above' if self.row < 0 else 'below'}, col {self.col}"
        cell = f"{self.table}[{self.row}, {self.col}]"
        if self.width is not None and self.col >= self.width:
            cell += " (canary column past the width)"
        return cell

    def __str__(self) -> str:
        return (
            f"replay {self.replay} (bucket {self.bucket}): {self.where()} "
            f"expected {self.expected}, got {self.got}"
        )


STATUSES = ("pass", "FAIL", "skip", "incomplete")


@dataclass
class PropertyResult:
    name: str
    status: str = "pass"
    detail: str = ""
    first_failure: Failure | str | None = None

    @property
    def passed(self) -> bool | None:
        """True: passed; False: failed; None: skipped or incomplete."""
        return {"pass": True, "FAIL": False}.get(self.status)

    @property
    def covers(self) -> str:
        return PROPERTIES.get(self.name, ("?", ""))[0]

    def fail(self, failure: Failure | str | None = None) -> None:
        self.status = "FAIL"
        if failure is not None and self.first_failure is None:
            self.first_failure = failure

    def skip(self, reason: str) -> None:
        self.status = "skip"
        self.detail = reason


@dataclass
class BucketStats:
    bucket: int
    replays: int = 0
    out_of_contract: int = 0
    mismatches: int = 0
    oob_writes: int = 0
    escaped_writes: int = 0
    syncs: int = 0
    replay_us: list[float] = field(default_factory=list)

    @property
    def median_replay_us(self) -> float:
        xs = sorted(self.replay_us)
        return xs[len(xs) // 2] if xs else float("nan")


@dataclass
class Report:
    builder: str
    config: CheckConfig
    device: str
    graphs: bool
    properties: list[PropertyResult] = field(default_factory=list)
    buckets: dict[int, BucketStats] = field(default_factory=dict)
    replays: int = 0
    out_of_contract_replays: list[int] = field(default_factory=list)
    capture_ms: float = float("nan")
    detectors: tuple[str, ...] = ()
    errors: dict[str, int] = field(default_factory=dict)
    #: why the run stopped before its last replay, or None
    stopped: str | None = None
    #: checked replays per second, steady state (start-up and capture excluded)
    replays_per_s: float = float("nan")
    #: in-contract replays with a row longer than at capture
    long_replays: int = 0
    #: host time per replay by phase, means in us (a mean, not a median: the workload
    #: generates its steps in batches, and the rate follows the mean): the workload step
    #: (pool model and its device writes), the runner's replay() (staging + graph launch),
    #: and the checker's own work (model, upload, verification launch, bookkeeping; the
    #: read-back once a chunk is not in it); "workload receive" is the part of the workload
    #: step spent getting batches of steps (from the child processes: when it nears the
    #: whole workload step, the children's generation limits the rate)
    phase_us: dict = field(default_factory=dict)
    #: whether the workload's host models ran in child processes (``workload_process``)
    workload_in_process: bool = False
    #: milliseconds the replays waited, after capture, for every workload child's first
    #: batch (the children's start-up, outside the steady state; 0 without children)
    workload_start_ms: float = 0.0

    @property
    def safe(self) -> bool:
        """No property failed and none is incomplete (skipped ones are listed in
        ``skipped`` and do not count as passed)."""
        return all(p.status in ("pass", "skip") for p in self.properties)

    @property
    def verdict(self) -> str:
        if any(p.status == "FAIL" for p in self.properties):
            return "UNSAFE"
        return "SAFE" if self.safe else "INCOMPLETE"

    @property
    def skipped(self) -> list[str]:
        return [p.name for p in self.properties if p.status == "skip"]

    @property
    def incomplete(self) -> list[str]:
        return [p.name for p in self.properties if p.status == "incomplete"]

    def property(self, name: str) -> PropertyResult:
        return next(p for p in self.properties if p.name == name)

    def to_dict(self) -> dict:
        return {
            "builder": self.builder,
            "config": dataclasses.asdict(self.config),
            "device": self.device,
            "graphs": self.graphs,
            "verdict": self.verdict,
            "safe": self.safe,
            "complete": self.stopped is None,
            "stopped": self.stopped,
            "replays": self.replays,
            "out_of_contract_replays": len(self.out_of_contract_replays),
            "out_of_contract_replay_indices": self.out_of_contract_replays,
            "capture_ms": self.capture_ms,
            "replays_per_s": self.replays_per_s,
            "long_replays": self.long_replays,
            "phase_us": self.phase_us,
            "workload_in_process": self.workload_in_process,
            "workload_start_ms": self.workload_start_ms,
            "detectors": list(self.detectors),
            "errors": self.errors,
            "properties": [
                {
                    "name": p.name,
                    "covers": p.covers,
                    "status": p.status,
                    "detail": p.detail,
                    "first_failure": None if p.first_failure is None else str(p.first_failure),
                }
                for p in self.properties
            ],
            "buckets": [
                {
                    "bucket": b.bucket,
                    "replays": b.replays,
                    "out_of_contract": b.out_of_contract,
                    "mismatches": b.mismatches,
                    "oob_writes": b.oob_writes,
                    "escaped_writes": b.escaped_writes,
                    "syncs": b.syncs,
                    "median_replay_us": b.median_replay_us,
                }
                for b in sorted(self.buckets.values(), key=lambda b: b.bucket)
            ],
        }

    @classmethod
    def from_dict(cls, d: dict) -> Report:
        """The report ``to_dict`` wrote (a child process's, say); per-replay times and the
        first failures come back as text."""
        report = cls(d["builder"], CheckConfig.from_dict(d["config"]), d["device"], d["graphs"])
        report.properties = [
            PropertyResult(p["name"], p["status"], p["detail"], p["first_failure"])
            for p in d["properties"]
        ]
        for b in d["buckets"]:
            stats = BucketStats(
                b["bucket"], b["replays"], b["out_of_contract"], b["mismatches"],
                b["oob_writes"], b["escaped_writes"], b["syncs"],
            )  # fmt: skip
            if b["median_replay_us"] == b["median_replay_us"]:
                stats.replay_us = [b["median_replay_us"]]
            report.buckets[b["bucket"]] = stats
        report.replays = d["replays"]
        report.out_of_contract_replays = list(d.get("out_of_contract_replay_indices", []))
        report.capture_ms = d["capture_ms"]
        report.replays_per_s = d.get("replays_per_s", float("nan"))
        report.detectors = tuple(d["detectors"])
        report.errors = dict(d["errors"])
        report.stopped = d.get("stopped")
        report.long_replays = d.get("long_replays", 0)
        report.phase_us = dict(d.get("phase_us", {}))
        report.workload_in_process = bool(d.get("workload_in_process", False))
        report.workload_start_ms = float(d.get("workload_start_ms", 0.0))
        return report

    def format(self) -> str:
        rate = (
            ""
            if self.replays_per_s != self.replays_per_s
            else (f", {self.replays_per_s:.0f} checked replays/s")
        )
        lines = [
            f"builder {self.builder} on {self.device} ({'CUDA graphs' if self.graphs else 'eager'})"
            f", {self.replays} replays ({len(self.out_of_contract_replays)} out of contract)"
            f", capture {self.capture_ms:.1f} ms{rate}, detectors: "
            f"{', '.join(self.detectors) or 'none'}"
            + (
                "; host us a replay (mean): "
                + ", ".join(f"{k} {v:.0f}" for k, v in self.phase_us.items())
                if self.phase_us
                else ""
            )
            + (
                f"; workload in child processes (their start-up waited {self.workload_start_ms:.0f}"
                " ms after capture)"
                if self.workload_in_process
                else ""
            ),
            "",
            "| bucket | replays | out of contract | mismatches | oob writes | escaped writes "
            "| syncs | replay us (median) |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for b in sorted(self.buckets.values(), key=lambda b: b.bucket):
            lines.append(
                f"| {b.bucket} | {b.replays} | {b.out_of_contract} | {b.mismatches} | "
                f"{b.oob_writes} | {b.escaped_writes} | {b.syncs} | {b.median_replay_us:.1f} |"
            )
        lines += ["", "| property | covers | status | detail |", "|---|---|---|---|"]
        for p in self.properties:
            detail = p.detail + (f"; first: {p.first_failure}" if p.first_failure else "")
            lines.append(f"| {p.name} | {p.covers} | {p.status} | {detail} |")
        verdict = self.verdict
        if self.stopped:
            verdict += f" (stopped early: {self.stopped})"
        elif verdict == "SAFE" and self.skipped:
            reasons = "; ".join(
                f"{p.name}: {p.detail}" for p in self.properties if p.status == "skip"
            )
            verdict += f" (skipped: {reasons})"
        lines += ["", f"verdict: {verdict}"]
        return "\n".join(lines)


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
def stop_on_signals(signals=(signal.SIGINT, signal.SIGTERM)):
    """While the body runs, SIGINT and SIGTERM request a stop instead of raising wherever the
    interpreter happens to be (inside a CUPTI callback, say, where an exception would be
    lost): the check stops between two replays, reports what it checked, and raises
    ``CheckInterrupted``. Handlers are restored and the request cleared on exit."""
    previous = {sig: signal.signal(sig, lambda signum, frame: request_stop(signum))
                for sig in signals}  # fmt: skip
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


def expected_tables(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    width: int,
    page_size: int,
    full_to_swa: torch.Tensor | None = None,
    fill: int = POISON,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Vectorised ``reference_page_table`` into fresh ``[bs, width]`` int32 tables filled with
    ``fill`` outside the live entries (tested equal to the row-by-row oracle)."""
    bs = seq_lens.shape[0]
    dev = req_to_token.device
    cap = min(width, cdiv(req_to_token.shape[1], page_size))
    n = ((seq_lens.to(torch.int64).clamp(min=0) + page_size - 1) // page_size).clamp(max=cap)
    rows = req_pool_indices.to(torch.int64).clamp(0, req_to_token.shape[0] - 1)
    cols = torch.arange(cap, device=dev)
    live = cols[None, :] < n[:, None]
    slots = req_to_token[rows[:, None], (cols * page_size)[None, :]].to(torch.int64)
    table = torch.full((bs, width), fill, dtype=torch.int32, device=dev)
    table[:, :cap] = torch.where(live, slots // page_size, fill).to(torch.int32)
    swa = None
    if full_to_swa is not None:
        swa_slots = full_to_swa[slots.clamp(0, full_to_swa.shape[0] - 1)].to(torch.int64)
        swa = torch.full((bs, width), fill, dtype=torch.int32, device=dev)
        swa[:, :cap] = torch.where(live, swa_slots // page_size, fill).to(torch.int32)
    return table, swa


# -- measuring the builder ---------------------------------------------------------------------


class AllocationCounter:
    """Counts tensor allocations by torch operators while active (a dispatch mode): the way
    to see allocations on a CPU, where torch keeps no allocator statistics. An operator
    output that shares storage with no input (and every tensor made from Python data)
    counts as one allocation. Triton launches allocate nothing it can see."""

    def __init__(self):
        from torch.utils._python_dispatch import TorchDispatchMode
        from torch.utils._pytree import tree_flatten

        counter = self

        class _Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                if func is torch.ops.aten.lift_fresh.default:
                    counter.count += 1
                    counter.ops.append(str(func))
                    return out
                inputs = {
                    t.untyped_storage().data_ptr()
                    for t in tree_flatten((args, kwargs))[0]
                    if isinstance(t, torch.Tensor)
                }
                for o in tree_flatten(out)[0]:
                    if (
                        isinstance(o, torch.Tensor)
                        and o.numel()
                        and o.untyped_storage().data_ptr() not in inputs
                    ):
                        counter.count += 1
                        counter.ops.append(str(func))
                return out

        self.count = 0
        self.ops: list[str] = []
        self._mode = _Mode()

    def __enter__(self) -> AllocationCounter:
        self._mode.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._mode.__exit__(*exc)


def _cuda_allocations(device: torch.device) -> int:
    stats = torch.cuda.memory_stats(device)
    return stats.get("allocation.all.allocated", 0) + stats.get("segment.all.allocated", 0)


class _Compiles:
    """Counts Triton JIT compilations (any kernel) through Triton's post-compile hook."""

    def __init__(self):
        from ..kernels.contract import interpreter_active

        self.count = 0
        self.reason: str | None = None
        self._knobs = None
        if interpreter_active():
            self.reason = "the Triton interpreter compiles nothing (no GPU here)"
            return
        try:
            import triton

            knobs = triton.knobs.runtime
            self._previous = knobs.jit_post_compile_hook
        except (ImportError, AttributeError):
            self.reason = "this Triton has no jit_post_compile_hook to count compilations"
            return
        self._knobs = knobs

        def hook(*args, **kwargs):
            self.count += 1
            if self._previous is not None:
                return self._previous(*args, **kwargs)
            return None

        knobs.jit_post_compile_hook = hook

    def stop(self) -> None:
        if self._knobs is not None:
            self._knobs.jit_post_compile_hook = self._previous
            self._knobs = None


@dataclass
class _Call:
    phase: str
    bs: int
    allocations: int
    compiles: int
    allocation_ops: list[str]


class _BuilderProbe:
    """The builder as the runner sees it: each call (warm-up, capture, eager replay) is
    measured for allocations and compilations and recorded with its NVTX phase."""

    def __init__(self, fn: Callable, device: torch.device, compiles: _Compiles):
        self.fn = fn
        self.cuda = device.type == "cuda"
        self.device = device
        self.compiles = compiles
        self.calls: list[_Call] = []
        self.measure = True

    def __call__(self, *args, **kwargs):
        if not self.measure:
            return self.fn(*args, **kwargs)
        where = current_range() or "?"
        table = kwargs.get("page_table", args[3] if len(args) > 3 else None)
        bs = table.shape[0] if hasattr(table, "shape") else -1
        c0 = self.compiles.count
        if self.cuda:
            a0 = _cuda_allocations(self.device)
            result = self.fn(*args, **kwargs)
            allocations, ops = _cuda_allocations(self.device) - a0, []
        else:
            with AllocationCounter() as counter:
                result = self.fn(*args, **kwargs)
            allocations, ops = counter.count, counter.ops
        self.calls.append(_Call(where, bs, allocations, self.compiles.count - c0, ops))
        return result


# -- the check ---------------------------------------------------------------------------------


def _resolve_detectors(spec) -> tuple[tuple[str, ...], str | None]:
    """The detectors to run and, when none runs, why (for the skipped properties)."""
    from ..detect import sync

    choice = sync.parse_detectors(spec)
    status = sync.available_detectors()
    if choice == "auto":
        wanted = tuple(name for name, reason in status.items() if reason is None)
        if wanted:
            return wanted, None
        if not torch.cuda.is_available():
            return (), "needs a GPU: no sync detector runs without CUDA"
        why = "; ".join(f"{n}: {r}" for n, r in status.items())
        return (), f"no sync detector can run here ({why})"
    if not choice:
        return (), "detectors off (detectors = none)"
    missing = {name: status.get(name) for name in choice if status.get(name) is not None}
    if missing:
        raise sync.DetectorUnavailable(
            "requested detector(s) cannot run: "
            + "; ".join(f"{name}: {reason}" for name, reason in missing.items())
        )
    return choice, None


def _pool_kwargs(cfg: CheckConfig) -> dict:
    """``KVPool`` arguments of the config, ``device`` aside."""
    return dict(
        max_reqs=cfg.max_reqs or cfg.max_bs + 1,
        max_context_len=cfg.max_context_len,
        page_size=cfg.page_size,
        num_pages=cfg.num_pages,
        swa=cfg.swa,
        seed=cfg.seed,
        row_order=cfg.row_order,
        dtype=INDEX_DTYPES[cfg.r2t_dtype],
        extra_cols=cfg.r2t_extra_cols,
        storage_offset=cfg.r2t_offset,
        full_to_swa_dtype=INDEX_DTYPES[cfg.full_to_swa_dtype],
    )


def _make_pool(cfg: CheckConfig, dev: torch.device) -> KVPool:
    return KVPool(**_pool_kwargs(cfg), device=dev)


def _workload_in_process(cfg: CheckConfig, dev: torch.device) -> bool:
    """Whether the run's workload goes to a child process (``CheckConfig.workload_process``)."""
    if cfg.workload_process == "auto":
        return dev.type == "cuda" and cfg.steps >= PRODUCER_MIN_STEPS
    return cfg.workload_process == "on"


def validate_config(cfg: CheckConfig) -> None:
    """``ValueError`` naming the field for a config that cannot run (scenario files have
    their own, key-naming checks; this guards the Python API)."""
    for name in ("r2t_dtype", "full_to_swa_dtype", "index_dtype"):
        if getattr(cfg, name) not in INDEX_DTYPES:
            raise ValueError(f"{name} must be 'int32' or 'int64', got {getattr(cfg, name)!r}")
    if cfg.staging not in STAGING_MODES:
        raise ValueError(f"staging must be 'mixed', 'host' or 'device', got {cfg.staging!r}")
    if cfg.table_width is not None and cfg.table_width < 1:
        raise ValueError(f"table_width must be >= 1, got {cfg.table_width}")
    for name in ("table_pad_cols", "r2t_extra_cols", "r2t_offset"):
        if getattr(cfg, name) < 0:
            raise ValueError(f"{name} must be >= 0, got {getattr(cfg, name)}")
    for name in ("overlong", "negative", "zero_len", "bad_index"):
        if not 0 <= getattr(cfg, name) <= 1:
            raise ValueError(f"{name} must be a probability in [0, 1], got {getattr(cfg, name)}")
    if cfg.chunk < 1:
        raise ValueError(f"chunk must be >= 1, got {cfg.chunk}")
    if not 1 <= cfg.workload_streams <= MAX_STREAMS:
        raise ValueError(
            f"workload_streams must be in 1..{MAX_STREAMS}, got {cfg.workload_streams}"
        )
    if cfg.workload_process not in WORKLOAD_PROCESS_MODES:
        raise ValueError(
            f"workload_process must be 'auto', 'on' or 'off', got {cfg.workload_process!r}"
        )
    if cfg.outputs not in ("auto", *OUTPUT_KINDS):
        raise ValueError(f"outputs must be auto or one of {OUTPUT_KINDS}, got {cfg.outputs!r}")
    if cfg.steps < 1:
        raise ValueError(f"steps must be >= 1, got {cfg.steps}")


def table_bytes(cfg: CheckConfig) -> int:
    """Device bytes the checker's tables and their verification take (an upper estimate of
    the working set, for the memory check before allocating): the tables, and twice the
    snapshots and intermediates of one verification batch (``pagegraph.verify.replay_bytes``):
    the warm-up run before capture leaves its intermediates cached beside the graph's own."""
    tables = 2 if cfg.swa else 1
    rows = cfg.max_bs + 2 * CANARY_ROWS
    padded_width = cfg.width + cfg.table_pad_cols
    per = replay_bytes(tables, rows, padded_width, cfg.max_bs, cfg.width)
    return tables * rows * padded_width * 4 + 2 * per * batch_size(per, min(cfg.chunk, cfg.steps))


def check_replay_safety(
    builder: Callable | str = "build_page_table",
    config: CheckConfig | None = None,
    *,
    device: str | torch.device | None = None,
    progress: Callable[[int, int], None] | None = None,
    runner_factory: Callable[..., GraphRunner] | None = None,
    on_phase: Callable[[str], None] | None = None,
    on_chunk: Callable[[Report], None] | None = None,
    stop_on_failure: bool = False,
    **overrides,
) -> Report:
    """Capture ``builder`` over the config's buckets, replay the workload, check every replay.

    Args:
        builder: a callable with the builder signature, a built-in name or ``module:fn``.
        config: the setup (``CheckConfig``); ``overrides`` replace its fields.
        device: default CUDA when present, else the CPU (eager, Triton interpreter).
        progress: called as ``progress(done, total)`` after each replay.
        runner_factory: makes the runner under test, with ``GraphRunner``'s arguments
            (default ``GraphRunner``): the checker judges any runner by what it was asked.
        on_phase: called with the phase reached (``"capture"``, ``"replay 17"``, ...), for
            a supervisor that must say where a crashed run stopped.
        on_chunk: called with the report so far after each chunk of replays is judged (a
            supervisor keeps it, so a crash later loses nothing already found).
        stop_on_failure: stop after the first chunk in which a property failed (mutation
            runs: one failure decides the verdict); the rest is reported incomplete.

    Returns a ``Report``; a misbehaving builder or runner is reported, not raised. Ctrl-C
    raises ``CheckInterrupted`` carrying the report of what was checked so far.
    """
    cfg = (config or CheckConfig()).replace(**overrides)
    validate_config(cfg)
    fn = resolve_builder(builder)
    metadata = builder_kind(fn, cfg.outputs) == "decode_metadata"
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    graphs = dev.type == "cuda"
    report = Report(builder_name(fn), cfg, str(dev), graphs)
    wanted, no_detector_reason = _resolve_detectors(cfg.detectors)
    report.detectors = wanted
    note = on_phase or (lambda _: None)
    props = {name: PropertyResult(name) for name in PROPERTIES}
    report.properties = list(props.values())
    index_dtype = INDEX_DTYPES[cfg.index_dtype]
    width = cfg.width
    ps = cfg.page_size
    T = 2 if cfg.swa else 1

    note("setup")
    pool = _make_pool(cfg, dev)
    len_limit = max(cfg.max_context_len, width * ps)
    workload_kwargs = dict(
        max_bs=cfg.max_bs,
        steps=cfg.steps,
        seed=cfg.seed + 1,
        finish_rate=cfg.finish_rate,
        draft_tokens=cfg.draft_tokens,
        initial_len=cfg.initial_len,
        swa_window=cfg.swa_window,
        swa_churn=cfg.swa_churn,
        near_capacity=cfg.near_capacity,
        inject=cfg.injection(),
        capacity=len_limit,
        max_len=2**31 - 1 if index_dtype == torch.int32 else 2**40,
        committed_lengths=metadata,
    )
    # The tables live in one allocation with a canary row above and below and the layout's
    # pad columns: the checker poisons and compares all of it.
    tables = torch.full(
        (T, cfg.max_bs + 2 * CANARY_ROWS, width + cfg.table_pad_cols),
        POISON,
        dtype=torch.int32,
        device=dev,
    )
    views = [tables[t, CANARY_ROWS : CANARY_ROWS + cfg.max_bs, :width] for t in range(T)]
    # A metadata builder's vectors, each with a canary entry on both sides.
    vectors = vector_views = None
    metadata_buffers = {}
    if metadata:
        vectors = torch.full((3, cfg.max_bs + 3), POISON, dtype=torch.int32, device=dev)
        vector_views = {
            "cache_seqlens": vectors[0, 1 : 1 + cfg.max_bs],
            "cu_seqlens_k": vectors[1, 1 : 2 + cfg.max_bs],
            "cu_seqlens_q": vectors[2, 1 : 2 + cfg.max_bs],
        }
        metadata_buffers = dict(vector_views, outputs="decode_metadata",
                                draft_tokens=cfg.draft_tokens)  # fmt: skip
    compiles = _Compiles()
    probe = _BuilderProbe(fn, dev, compiles)
    make_runner = runner_factory or GraphRunner
    runner = workload = None
    try:
        # Started before the capture, so child processes generate steps meanwhile.
        report.workload_in_process = _workload_in_process(cfg, dev)
        workload = ProducedWorkload(
            pool,
            _pool_kwargs(cfg),
            workload_kwargs,
            streams=cfg.workload_streams,
            processes=report.workload_in_process,
        )
        runner = make_runner(
            pool.req_to_token,
            max_bs=cfg.max_bs,
            max_context_len=cfg.max_context_len,
            page_size=ps,
            buckets=cfg.buckets,
            padding=cfg.padding,
            builder=probe,
            full_to_swa=pool.full_to_swa,
            errors=cfg.errors,
            index_dtype=index_dtype,
            table_width=width,
            page_table=views[0],
            swa_page_table=views[1] if T == 2 else None,
            **metadata_buffers,
        )
        steps = iter(workload)
        first = next(steps)
        _eager_call(cfg, fn, pool, first, views, vector_views, dev, wanted, no_detector_reason,
                    props, report)  # fmt: skip

        # -- capture ---------------------------------------------------------------------
        note("capture")
        probe.calls.clear()
        t0 = time.perf_counter()
        try:
            with phase("capture"):
                runner.capture()
            if graphs:
                torch.cuda.synchronize(dev)
        except Exception as exc:  # noqa: BLE001 - a builder that raises is reported
            props["capture"].fail()
            props["capture"].detail = f"capture raised {exc!r}"
            _judge_builder_calls(probe, compiles, props)
            _not_reached(props, "capture failed")
            report.stopped = f"capture raised {type(exc).__name__}"
            return report
        report.capture_ms = (time.perf_counter() - t0) * 1e3
        n_buckets = len(runner.buckets)
        props["capture"].detail = f"{n_buckets} buckets" + (
            " captured" if graphs else " warmed up eagerly (no CUDA graphs)"
        )
        _judge_builder_calls(probe, compiles, props)
        probe.measure = not graphs  # eager replays run the builder: keep measuring it
        _replays(cfg, runner, workload, first, steps, tables, vectors, pool, dev, wanted,
                 no_detector_reason, props, report, progress, note, len_limit,
                 on_chunk, stop_on_failure)  # fmt: skip
    finally:
        compiles.stop()
        if workload is not None:
            workload.close()
        if runner is not None:
            try:
                runner.close()
            except Exception:  # noqa: BLE001 - a dead CUDA context: nothing left to release
                pass
    return report


def _not_reached(props: dict[str, PropertyResult], why: str) -> None:
    for p in props.values():
        if p.status == "pass" and not p.detail:
            p.status = "incomplete"
            p.detail = f"not reached: {why}"


def _eager_call(cfg, fn, pool, first, views, vector_views, dev, wanted, no_detector_reason,
                props, report):  # fmt: skip
    """The builder's own eager call on the first real batch: no sync, no allocation."""
    from ..detect import sync

    rpi = torch.tensor(first.req_pool_indices, dtype=INDEX_DTYPES[cfg.index_dtype], device=dev)
    sl = torch.tensor(first.seq_lens, dtype=INDEX_DTYPES[cfg.index_dtype], device=dev)
    bs = first.bs
    kwargs = {}
    if pool.full_to_swa is not None:
        kwargs = {"swa_page_table": views[1][:bs], "full_to_swa": pool.full_to_swa}
    if vector_views is not None:
        # build_decode_metadata's signature: page_size fourth, the outputs by keyword.
        meta_fn, page_table = fn, views[0][:bs]
        kwargs.update(
            cache_seqlens=vector_views["cache_seqlens"][:bs],
            cu_seqlens_k=vector_views["cu_seqlens_k"][: bs + 1],
            cu_seqlens_q=vector_views["cu_seqlens_q"][: bs + 1],
            draft_tokens=cfg.draft_tokens,
        )

        def fn(r2t, rpi, sl, _table, page_size, **kw):
            meta_fn(r2t, rpi, sl, page_size, page_table=page_table, **kw)

    sync_prop = props["sync-free builder call"]
    alloc_prop = props["no allocation in builder"]
    try:
        # One call first: compiling and loading a kernel may sync and allocate, once.
        with phase("build", bs):
            fn(pool.req_to_token, rpi, sl, views[0][:bs], cfg.page_size, **kwargs)
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
            a0 = _cuda_allocations(dev)
            with sync.record_device_syncs(wanted) as rec, phase("build", bs):
                fn(pool.req_to_token, rpi, sl, views[0][:bs], cfg.page_size, **kwargs)
            allocations, ops = _cuda_allocations(dev) - a0, []
            events = rec.events if wanted else []
        else:
            with AllocationCounter() as counter, phase("build", bs):
                fn(pool.req_to_token, rpi, sl, views[0][:bs], cfg.page_size, **kwargs)
            allocations, ops, events = counter.count, counter.ops, []
    except sync.DetectorUnavailable:
        raise
    except Exception as exc:  # noqa: BLE001 - a builder that raises is reported, not fatal
        sync_prop.fail()
        sync_prop.detail = f"the eager call raised {exc!r}"
        alloc_prop.status = "incomplete"
        alloc_prop.detail = "the eager call raised"
        return
    if not wanted:
        sync_prop.skip(no_detector_reason or "no detector")
    else:
        names = sorted({e.name for e in events})
        sync_prop.detail = (
            f"{len(events)} sync(s) by {', '.join(wanted)}: {', '.join(names)}"
            if names
            else f"0 syncs ({', '.join(wanted)})"
        )
        if names:
            sync_prop.fail(f"eager call on bs={bs}: {', '.join(names)}")
    alloc_prop.detail = f"eager call: {allocations} allocation(s)"
    if allocations:
        alloc_prop.fail(
            f"eager call on bs={bs}: {allocations} allocation(s)"
            + (f" ({', '.join(sorted(set(ops))[:4])})" if ops else "")
        )


def _judge_builder_calls(probe: _BuilderProbe, compiles: _Compiles, props) -> None:
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


def _replays(cfg, runner, workload, first, steps, tables, vectors, pool, dev, wanted,
             no_detector_reason, props, report, progress, note, len_limit,
             on_chunk=None, stop_on_failure=False) -> None:  # fmt: skip
    """Replay the workload and judge every replay (see the module docstring)."""
    from ..detect import sync

    graphs = dev.type == "cuda"
    width = cfg.width
    policy = resolve_padding(cfg.padding)
    sizes = Buckets(cfg.buckets, cfg.max_bs).sizes
    capture_lens = runner.seq_lens[: cfg.max_bs].to(torch.int64).cpu().numpy()
    model = BatchModel(
        sizes=sizes,
        max_bs=cfg.max_bs,
        pad_seq_len=policy.seq_len,
        pad_req_pool_index=policy.req_pool_index,
        initial_req_pool_indices=runner.req_pool_indices[: cfg.max_bs].cpu().numpy(),
        len_limit=len_limit,
        r2t_rows=pool.req_to_token.shape[0],
        capture_pages=cdiv(
            int(max(capture_lens.max(), 0)) + (cfg.draft_tokens if vectors is not None else 0),
            cfg.page_size,
        ),
        page_size=cfg.page_size,
        draft_tokens=cfg.draft_tokens if vectors is not None else 0,
    )
    chunk = min(cfg.chunk, cfg.steps)
    verifier = TableVerifier(
        tables=tables,
        width=width,
        req_to_token=pool.req_to_token,
        full_to_swa=pool.full_to_swa,
        page_size=cfg.page_size,
        staged=(runner.req_pool_indices, runner.seq_lens),
        errors=runner.errors,
        chunk=chunk,
        use_graph=graphs,
        vectors=vectors,
        draft_tokens=cfg.draft_tokens if vectors is not None else 0,
        error_kinds=len(DECODE_ERROR_KINDS if vectors is not None else ERROR_KINDS),
    )
    verifier.poison()
    # The checker's own record of every static buffer's address after capture.
    watched = {
        "req_pool_indices": runner.req_pool_indices,
        "seq_lens": runner.seq_lens,
        "page_table": runner.page_table,
        "swa_page_table": runner.swa_page_table,
        "errors": runner.errors,
        "req_to_token": runner.req_to_token,
        "full_to_swa": runner.full_to_swa,
        **{name: getattr(runner, name, None) for name in VECTOR_NAMES},
    }
    # Checked after every replay: each buffer there at capture still at its address, and
    # none of those absent at capture (None) now set.
    watched_live = [(k, t.data_ptr()) for k, t in watched.items() if t is not None]
    watched_absent = [k for k, t in watched.items() if t is None]

    moved = props["static buffers unmoved"]
    staged_prop = props["staged inputs"]
    alloc_prop = props["no allocation in replay"]
    sync_prop = props["sync-free replay path"]
    completed = props["replays completed"]
    pending: list[ModelStep] = []
    replay_syncs: list = []
    in_flight: list[torch.cuda.Event] = []
    # Events reused in turn (one more than can be in flight): none is created per replay.
    events = [torch.cuda.Event() for _ in range(IN_FLIGHT + 1)] if graphs else []
    model_dev = verifier.model
    device_batches: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    M = cfg.max_bs
    stopped: str | None = None
    interrupted: int | None = None
    allocations = 0
    alloc_base = _cuda_allocations(dev) if graphs else 0
    # On CUDA, allocator statistics cost tens of microseconds to read: the first
    # ALLOCATION_PROBES replays are measured one by one (the workload step apart from the
    # replay); if the checker's own work between replays allocated nothing there, later
    # replays are measured a chunk at a time (any allocation in a chunk is then the runner's),
    # else every replay stays measured on its own.
    per_replay = graphs
    workload_allocations = 0
    memory_before = torch.cuda.memory_allocated(dev) if graphs else None
    t_start = None
    steady_from = 0
    workload_us: list[float] = []
    checker_us: list[float] = []

    def flush_records() -> None:
        nonlocal allocations, alloc_base
        if not pending:
            return
        with phase("verify"):
            records = verifier.read(len(pending))
        _judge_records(records, list(pending), verifier, props, report, cfg)
        if graphs and not per_replay:
            now = _cuda_allocations(dev)
            if now != alloc_base and alloc_prop.status == "pass":
                alloc_prop.fail(
                    f"{now - alloc_base} allocation(s) during replays "
                    f"{pending[0].index}..{pending[-1].index}"
                )
            allocations += now - alloc_base
            alloc_base = now
        pending.clear()
        if on_chunk is not None:
            on_chunk(report)

    recorder = sync.record_device_syncs(wanted) if wanted else None
    rec = recorder.__enter__() if recorder is not None else None
    if rec is not None:
        # Watched while staging and replaying only: the property judges those ranges, and a
        # detector on the workload's and the verification's driver calls only costs time.
        rec.pause()
    try:
        if cfg.steps > 1:
            # Every workload child's start-up is over before the steady state begins (its
            # first turn would otherwise stall the replays in the middle of the measurement).
            report.workload_start_ms = (
                workload.wait_started(should_stop=lambda: _STOP.signum is not None) * 1e3
            )
        step = first
        for i in range(cfg.steps):
            if _STOP.signum is not None:  # a signal asked for a stop (see stop_on_signals)
                raise KeyboardInterrupt()
            if i == 1:
                t_start, steady_from = time.perf_counter(), 1
            if graphs and per_replay and i == ALLOCATION_PROBES and not workload_allocations:
                per_replay = False
                alloc_base = _cuda_allocations(dev)
            t_step = time.perf_counter()
            if i > 0:
                a0 = _cuda_allocations(dev) if per_replay else 0
                with phase("workload"):
                    step = next(steps)
                if per_replay:
                    workload_allocations += _cuda_allocations(dev) - a0
                workload_us.append((time.perf_counter() - t_step) * 1e6)
            t_step = time.perf_counter()
            note(f"replay {i}")
            mstep = model.stage(i, step.req_pool_indices, step.seq_lens)
            slot = len(pending)
            verifier.upload(model, slot)
            if graphs and len(in_flight) >= IN_FLIGHT:
                # IN_FLIGHT replays at most: the staging rings never wait (outside the replay
                # path, so this wait is not one of the replay's syncs).
                with phase("verify"):
                    in_flight.pop(0).synchronize()
            use_device = cfg.staging == "device" or (cfg.staging == "mixed" and i % 2 == 1)
            if use_device:
                args = device_batches.get(mstep.n)
                if args is None:  # views made once per batch size (a slice costs a microsecond)
                    args = device_batches[mstep.n] = (
                        model_dev[: mstep.n],
                        model_dev[M : M + mstep.n],
                    )
            else:
                args = (step.req_pool_indices, step.seq_lens)
            before = len(rec.events) if rec is not None else 0
            counter = None if graphs else AllocationCounter()
            a0 = _cuda_allocations(dev) if per_replay else 0
            t = time.perf_counter()
            if rec is not None:
                rec.resume()
            try:
                if counter is not None:
                    with counter:
                        runner.replay(*args)
                else:
                    runner.replay(*args)
            except Exception as exc:  # noqa: BLE001 - reported, then the run stops
                stopped = f"replay {i} (bucket {mstep.bucket}) raised {exc!r}"
                completed.fail(stopped)
                break
            finally:
                if rec is not None:
                    rec.pause()
            dt = (time.perf_counter() - t) * 1e6
            if per_replay:
                delta = _cuda_allocations(dev) - a0
                allocations += delta
                if delta and alloc_prop.status == "pass":
                    alloc_prop.fail(
                        f"replay {i} (bucket {mstep.bucket}): {delta} allocator event(s) "
                        "during staging + replay"
                    )
            if counter is not None and counter.count and alloc_prop.status == "pass":
                alloc_prop.fail(
                    f"replay {i} (bucket {mstep.bucket}): {counter.count} allocation(s) "
                    f"({', '.join(sorted(set(counter.ops))[:4])})"
                )
            stats = report.buckets.get(mstep.bucket)
            if stats is None:
                stats = report.buckets[mstep.bucket] = BucketStats(mstep.bucket)
            stats.replay_us.append(dt)
            if rec is not None and len(rec.events) > before:
                new = [
                    e
                    for e in rec.events[before:]
                    if e.range and e.range.split("/")[0] in ("stage", "replay")
                ]
                if new:
                    stats.syncs += len(new)
                    if not replay_syncs:
                        sync_prop.fail(
                            f"replay {i} (bucket {mstep.bucket}): "
                            + ", ".join(sorted({f"{e.name} in {e.range}" for e in new}))
                        )
                    replay_syncs.extend(new)
            for name, address in watched_live:
                now = getattr(runner, name, None)
                if now is None:
                    moved.fail(f"replay {i}: {name} replaced")
                elif now.data_ptr() != address and moved.status == "pass":
                    moved.fail(f"replay {i}: {name} moved ({address:#x} -> {now.data_ptr():#x})")
            for name in watched_absent:
                if getattr(runner, name, None) is not None:
                    moved.fail(f"replay {i}: {name} replaced")
            with phase("verify"):
                verifier.verify()
            if graphs:
                event = events[i % len(events)]
                event.record()
                in_flight.append(event)
            pending.append(mstep)
            checker_us.append((time.perf_counter() - t_step) * 1e6 - dt)
            if len(pending) == chunk:
                try:
                    flush_records()
                except Exception as exc:  # noqa: BLE001 - e.g. a CUDA context a builder broke
                    stopped = f"reading the records after replay {i} raised {exc!r}"
                    completed.fail(stopped)
                    pending.clear()
                    break
                if stop_on_failure and any(p.status == "FAIL" for p in props.values()):
                    stopped = f"stopped at the first failure, after {report.replays} replays"
                    break
            if progress is not None:
                progress(i + 1, cfg.steps)
    except KeyboardInterrupt as exc:
        interrupted = _STOP.signum or getattr(exc, "signum", signal.SIGINT)
        stopped = (
            "interrupted by "
            + ("SIGTERM" if interrupted == signal.SIGTERM else "SIGINT")
            + f" after {report.replays + len(pending)} replays"
        )
    finally:
        if recorder is not None:
            recorder.__exit__(None, None, None)
    try:
        flush_records()
    except Exception as exc:  # noqa: BLE001 - e.g. a CUDA context a builder broke
        stopped = stopped or f"reading the records raised {exc!r}"
        completed.fail(stopped)
        pending.clear()
    if t_start is not None and report.replays > steady_from:
        report.replays_per_s = (report.replays - steady_from) / (time.perf_counter() - t_start)
    replay_us = [u for b in report.buckets.values() for u in b.replay_us]
    for name, xs in (("workload", workload_us), ("replay", replay_us), ("checker", checker_us)):
        if xs:
            report.phase_us[name] = round(float(np.mean(xs)), 1)
    receive_s = getattr(workload, "receive_s", None)
    if workload_us and receive_s is not None:
        # The part of the workload phase spent getting the steps' batches (ProducedWorkload)
        report.phase_us["workload receive"] = round(receive_s / len(workload_us) * 1e6, 1)
    memory_after = torch.cuda.memory_allocated(dev) if graphs and stopped is None else None

    # -- summaries ----------------------------------------------------------------------------
    total = lambda attr: sum(getattr(b, attr) for b in report.buckets.values())  # noqa: E731
    n_ooc = len(report.out_of_contract_replays)
    props["correct"].detail = (
        f"{total('mismatches')} wrong live entries over {report.replays - n_ooc} in-contract "
        "replays"
    )
    props[
        "bounded writes"
    ].detail = f"{total('oob_writes')} entries written outside the live region"
    graph_safe = props["graph-safe (captured short, replayed long)"]
    graph_safe.detail = f"{report.long_replays} replays longer than the capture-time lengths"
    containment = props["row containment"]
    containment.detail = (
        f"{total('escaped_writes')} entries written outside out-of-contract rows over "
        f"{n_ooc} out-of-contract replays"
    )
    err_prop = props["error counters"]
    if runner.errors is None:
        err_prop.skip("error counters off (errors = false)")
    elif err_prop.status == "pass":
        err_prop.detail = "equal to the model's counts on every replay: " + ", ".join(
            f"{k} {v}" for k, v in report.errors.items()
        )
    if not staged_prop.detail:
        staged_prop.detail = (
            "equal to the batch asked for on every replay"
            if staged_prop.status != "FAIL"
            else "differ from the batch asked for, padded by the policy"
        )
    if not moved.detail:
        moved.detail = (
            "addresses equal at every replay"
            if moved.status != "FAIL"
            else "a static buffer is not where it was at capture"
        )
    if graphs:
        alloc_prop.detail = f"{allocations} allocator events during staging + replay" + (
            " (measured replay by replay: the workload between replays allocated "
            f"{workload_allocations} time(s))"
            if per_replay
            else f" (measured one by one over the first {ALLOCATION_PROBES} replays, then a "
            "chunk at a time)"
        )
    else:
        alloc_prop.detail = "torch operators seen allocating during staging + eager replay: " + (
            "none" if alloc_prop.status == "pass" else "some"
        )
    growth = props["no memory growth"]
    if not graphs:
        growth.skip("needs a GPU: torch keeps allocator statistics for CUDA memory only")
    elif memory_after is not None:
        growth.detail = f"{memory_before} bytes allocated before the replays, {memory_after} after"
        if memory_after > memory_before:
            growth.fail(f"+{memory_after - memory_before} bytes over {report.replays} replays")
    if not wanted:
        sync_prop.skip(no_detector_reason or "no detector")
    else:
        names = sorted({f"{e.name} in {e.range}" for e in replay_syncs})
        sync_prop.detail = f"{len(replay_syncs)} sync(s)" + (
            f": {', '.join(names[:5])}" if names else ""
        )
    completed.detail = completed.detail or f"{report.replays} of {cfg.steps} replays" + (
        f", then {stopped}" if stopped else ""
    )
    if stopped is None:
        # Properties that had nothing to judge are skipped, with the reason.
        if report.long_replays == 0 and graph_safe.status == "pass":
            graph_safe.skip("no replay was longer than at capture")
        if n_ooc == 0 and containment.status == "pass":
            containment.skip(
                "no out-of-contract replay in this workload (set overlong, negative or bad_index)"
            )
    else:
        # A run that stopped early has not shown what it did not reach: nothing that was
        # still passing counts as passed.
        report.stopped = stopped
        if completed.status == "pass":
            completed.status = "incomplete"
        for name in REPLAY_PROPERTIES:
            p = props[name]
            if p.status == "pass":
                p.status = "incomplete"
                p.detail = f"{report.replays} of {cfg.steps} replays checked, then {stopped}"
    if interrupted is not None:
        raise CheckInterrupted(report, interrupted)


#: Replays whose allocations are measured one by one before the checker trusts chunks.
ALLOCATION_PROBES = 8

#: Replays the host may be ahead of the device (checked, then waited for before the next
#: replay). Three, not two: the verification of a whole batch (``TableVerifier``) runs on
#: the device after every ``batch`` replays, a burst longer than one replay's host work, and
#: with two in flight the host waited for it. The verifier's upload ring must hold one more
#: entry than this (``verify.UPLOAD_RING``).
IN_FLIGHT = 3

#: Replays from which ``workload_process = "auto"`` runs the workload in a child process.
PRODUCER_MIN_STEPS = 1000

#: Properties judged over the replays (incomplete when the run stops early).
REPLAY_PROPERTIES = (
    "staged inputs",
    "correct",
    "bounded writes",
    "graph-safe (captured short, replayed long)",
    "row containment",
    "error counters",
    "static buffers unmoved",
    "no allocation in replay",
    "no memory growth",
    "sync-free replay path",
)


def _judge_records(records: np.ndarray, steps: list[ModelStep], verifier: TableVerifier,
                   props, report: Report, cfg: CheckConfig) -> None:  # fmt: skip
    """Fold one chunk of device records into the report."""
    T = verifier.T
    rows = verifier.max_bs
    padded_width = verifier.padded_width
    correct = props["correct"]
    bounded = props["bounded writes"]
    graph_safe = props["graph-safe (captured short, replayed long)"]
    containment = props["row containment"]
    staged_prop = props["staged inputs"]
    err_prop = props["error counters"]
    kinds = DECODE_ERROR_KINDS if verifier.vectors is not None else ERROR_KINDS
    if verifier.errors is not None and not report.errors:
        report.errors = dict.fromkeys(kinds, 0)
    E = verifier.E
    for rec, st in zip(records, steps):
        stats = report.buckets.setdefault(st.bucket, BucketStats(st.bucket))
        stats.replays += 1
        report.replays += 1
        report.long_replays += st.longer_than_capture and not st.out_of_contract
        if st.out_of_contract:
            stats.out_of_contract += 1
            report.out_of_contract_replays.append(st.index)
        for mask in range(2 * T):
            found = read_mask(rec, mask)
            if found is None:
                continue
            count, flat, expected, got = found
            row, col = divmod(flat, padded_width)
            failure = Failure(
                st.index, st.bucket, row - CANARY_ROWS, col, expected, got,
                TABLE_NAMES[mask % T], rows, cfg.width,
            )  # fmt: skip
            if st.out_of_contract:
                stats.escaped_writes += count
                containment.fail(failure)
            elif mask < T:
                stats.mismatches += count
                correct.fail(failure)
                if st.longer_than_capture:
                    graph_safe.fail(failure)
            else:
                stats.oob_writes += count
                bounded.fail(failure)
        if verifier.vectors is not None:
            _judge_vectors(rec, st, verifier, stats, correct, bounded, containment)
        at = verifier.staged_at
        if rec[at] and staged_prop.status == "pass":
            row = int(rec[at + 1])
            staged_prop.fail(
                f"replay {st.index} (bucket {st.bucket}): {int(rec[at])} row(s) differ; first "
                f"row {row}: req_pool_index {int(rec[at + 2])}, seq_len {int(rec[at + 3])}, "
                f"asked for (padded) req_pool_index {_asked(st.asked_rpi, row)}, "
                f"seq_len {_asked(st.asked_sl, row)}"
            )
        if verifier.errors is not None:
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


def _judge_vectors(rec, st: ModelStep, verifier: TableVerifier, stats: BucketStats,
                   correct, bounded, containment) -> None:  # fmt: skip
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
                containment.fail(failure)
        elif k == 0:
            stats.mismatches += count
            correct.fail(failure)
        else:
            stats.oob_writes += count
            bounded.fail(failure)


def _asked(values: np.ndarray, row: int) -> str:
    return str(int(values[row])) if 0 <= row < len(values) else "?"


__all__ = [
    "PROPERTIES",
    "AllocationCounter",
    "CheckConfig",
    "CheckInterrupted",
    "ERROR_KINDS",
    "POISON",
    "Report",
    "check_replay_safety",
    "expected_tables",
]
