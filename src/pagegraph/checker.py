"""Replay-safety checks of any page-table builder: ``check_replay_safety(builder, config)``.

For a builder and an engine-like workload, the checker captures the builder into a
``GraphRunner`` and, for every replay, checks:

* **correct**: the live entries of every real row equal the reference exactly (SWA too);
* **bounded writes**: before each replay both static tables are poisoned outside the graph;
  afterwards every entry other than the live entries still holds the poison. Padded rows may
  hold only what the reference builds for their padded inputs (values read from valid rows of
  ``req_to_token``);
* **no allocation** during staging and replay (``torch.cuda.memory_stats`` counters), **no
  compilation** after warm-up (Triton's post-compile hook), **no static-buffer move**;
* **graph-safe**: capture happens with short lengths, and the replays with longer ones must
  still be correct (a width frozen at capture fails here);
* **sync-free**: no host sync in the builder's own eager call, nor in the replay path
  (``stage/*`` and ``replay/*`` ranges), by the detectors of ``pagegraph.sync``.

Properties that need a GPU (graphs, allocator counters, compilation, detectors) are reported as
skipped on a machine without CUDA, never as passed.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from .builders import builder_name, resolve_builder
from .contract import ERROR_KINDS, cdiv
from .pool import KVPool
from .ranges import phase
from .runner import GraphRunner
from .workload import DecodeWorkload

#: Value the static tables are filled with before each replay; no builder writes it.
POISON = -0x5A5A5A5


@dataclass
class CheckConfig:
    """One graph setup and its workload (what a scenario file describes)."""

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

    def replace(self, **changes) -> CheckConfig:
        return dataclasses.replace(self, **changes)


@dataclass
class Failure:
    """The first failing replay of a property."""

    replay: int
    bucket: int
    row: int
    col: int
    expected: int
    got: int
    table: str = "page_table"

    def __str__(self) -> str:
        return (
            f"replay {self.replay} (bucket {self.bucket}): {self.table}[{self.row}, {self.col}] "
            f"expected {self.expected}, got {self.got}"
        )


@dataclass
class PropertyResult:
    name: str
    passed: bool | None  # None: skipped
    detail: str = ""
    first_failure: Failure | str | None = None

    @property
    def status(self) -> str:
        return "skip" if self.passed is None else ("pass" if self.passed else "FAIL")


@dataclass
class BucketStats:
    bucket: int
    replays: int = 0
    mismatches: int = 0
    oob_writes: int = 0
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
    capture_ms: float = float("nan")
    detectors: tuple[str, ...] = ()
    errors: dict[str, int] = field(default_factory=dict)

    @property
    def safe(self) -> bool:
        """No property failed (skipped ones do not count as passed: see ``skipped``)."""
        return all(p.passed is not False for p in self.properties)

    @property
    def skipped(self) -> list[str]:
        return [p.name for p in self.properties if p.passed is None]

    def property(self, name: str) -> PropertyResult:
        return next(p for p in self.properties if p.name == name)

    def to_dict(self) -> dict:
        return {
            "builder": self.builder,
            "config": dataclasses.asdict(self.config),
            "device": self.device,
            "graphs": self.graphs,
            "safe": self.safe,
            "replays": self.replays,
            "capture_ms": self.capture_ms,
            "detectors": list(self.detectors),
            "errors": self.errors,
            "properties": [
                {
                    "name": p.name,
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
                    "mismatches": b.mismatches,
                    "oob_writes": b.oob_writes,
                    "syncs": b.syncs,
                    "median_replay_us": b.median_replay_us,
                }
                for b in sorted(self.buckets.values(), key=lambda b: b.bucket)
            ],
        }

    def format(self) -> str:
        lines = [
            f"builder {self.builder} on {self.device} ({'CUDA graphs' if self.graphs else 'eager'})"
            f", {self.replays} replays, capture {self.capture_ms:.1f} ms, detectors: "
            f"{', '.join(self.detectors) or 'none'}",
            "",
            "| bucket | replays | mismatches | syncs | oob writes | replay us (median) |",
            "|---:|---:|---:|---:|---:|---:|",
        ]
        for b in sorted(self.buckets.values(), key=lambda b: b.bucket):
            lines.append(
                f"| {b.bucket} | {b.replays} | {b.mismatches} | {b.syncs} | {b.oob_writes} | "
                f"{b.median_replay_us:.1f} |"
            )
        lines += ["", "| property | status | detail |", "|---|---|---|"]
        for p in self.properties:
            detail = p.detail + (f"; first: {p.first_failure}" if p.first_failure else "")
            lines.append(f"| {p.name} | {p.status} | {detail} |")
        verdict = "SAFE" if self.safe else "UNSAFE"
        if self.safe and self.skipped:
            verdict += f" (skipped, need a GPU: {', '.join(self.skipped)})"
        lines += ["", f"verdict: {verdict}"]
        return "\n".join(lines)


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
    slots = req_to_token[rows][:, : cap * page_size : page_size].to(torch.int64)
    table = torch.full((bs, width), fill, dtype=torch.int32, device=dev)
    table[:, :cap] = torch.where(live, slots // page_size, fill).to(torch.int32)
    swa = None
    if full_to_swa is not None:
        swa_slots = full_to_swa[slots.clamp(0, full_to_swa.shape[0] - 1)].to(torch.int64)
        swa = torch.full((bs, width), fill, dtype=torch.int32, device=dev)
        swa[:, :cap] = torch.where(live, swa_slots // page_size, fill).to(torch.int32)
    return table, swa


def _first_failure(replay, bucket, table, mask, got, want) -> Failure:
    """The first (row, column) of ``mask``, with what was expected and what was there."""
    r, c = mask.nonzero()[0].tolist()
    return Failure(replay, bucket, r, c, int(want[r, c]), int(got[r, c]), table)


def _compile_counter():
    """A counter of Triton JIT compilations (any kernel) and a function to stop counting."""
    counts = [0]
    try:
        import triton

        knobs = triton.knobs.runtime
        previous = knobs.jit_post_compile_hook
    except (ImportError, AttributeError):
        return None, lambda: None

    def hook(*args, **kwargs):
        counts[0] += 1
        if previous is not None:
            return previous(*args, **kwargs)
        return None

    knobs.jit_post_compile_hook = hook

    def stop():
        knobs.jit_post_compile_hook = previous

    return counts, stop


def _allocations(device: torch.device) -> int | None:
    if device.type != "cuda":
        return None
    stats = torch.cuda.memory_stats(device)
    return stats.get("allocation.all.allocated", 0) + stats.get("segment.all.allocated", 0)


def check_replay_safety(
    builder: Callable | str = "build_page_table",
    config: CheckConfig | None = None,
    *,
    device: str | torch.device | None = None,
    progress: Callable[[int, int], None] | None = None,
    **overrides,
) -> Report:
    """Capture ``builder`` over the config's buckets, replay the workload, check every replay.

    ``overrides`` replace fields of ``config`` (see ``CheckConfig``). Returns a ``Report``; the
    checker never raises for a misbehaving builder, it reports it.
    """
    from . import sync  # late: the detectors pull in optional CUDA-only pieces

    cfg = (config or CheckConfig()).replace(**overrides)
    fn = resolve_builder(builder)
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    graphs = dev.type == "cuda"
    report = Report(builder_name(fn), cfg, str(dev), graphs)
    props = report.properties
    index_dtype = getattr(torch, cfg.index_dtype)

    pool = KVPool(
        max_reqs=cfg.max_reqs or cfg.max_bs + 1,
        max_context_len=cfg.max_context_len,
        page_size=cfg.page_size,
        num_pages=cfg.num_pages,
        swa=cfg.swa,
        device=dev,
        seed=cfg.seed,
        row_order=cfg.row_order,
    )
    workload = DecodeWorkload(
        pool,
        max_bs=cfg.max_bs,
        steps=cfg.steps,
        seed=cfg.seed + 1,
        finish_rate=cfg.finish_rate,
        draft_tokens=cfg.draft_tokens,
        initial_len=cfg.initial_len,
        swa_window=cfg.swa_window,
        swa_churn=cfg.swa_churn,
        near_capacity=cfg.near_capacity,
    )
    runner = GraphRunner(
        pool.req_to_token,
        max_bs=cfg.max_bs,
        max_context_len=cfg.max_context_len,
        page_size=cfg.page_size,
        buckets=cfg.buckets,
        padding=cfg.padding,
        builder=fn,
        full_to_swa=pool.full_to_swa,
        errors=cfg.errors,
        index_dtype=index_dtype,
    )
    width = runner.max_num_pages
    steps = iter(workload)
    first = next(steps)

    # The builder's own eager call, on a real batch, must not sync.
    status = sync.available_detectors()
    if cfg.detectors == "auto":
        wanted = tuple(name for name, reason in status.items() if reason is None)
    else:
        wanted = tuple(cfg.detectors)
        missing = {name: status.get(name, "unknown detector") for name in wanted}
        missing = {name: reason for name, reason in missing.items() if reason is not None}
        if missing:
            raise sync.DetectorUnavailable(
                "requested detector(s) cannot run: "
                + "; ".join(f"{name}: {reason}" for name, reason in missing.items())
            )
    report.detectors = wanted
    eager_result = PropertyResult("sync-free builder call", None, "needs a GPU and a detector")
    if wanted:
        rpi = torch.tensor(first.req_pool_indices, dtype=index_dtype, device=dev)
        sl = torch.tensor(first.seq_lens, dtype=index_dtype, device=dev)
        scratch = torch.empty((first.bs, width), dtype=torch.int32, device=dev)
        kwargs = {}
        if pool.full_to_swa is not None:
            kwargs = {"swa_page_table": torch.empty_like(scratch), "full_to_swa": pool.full_to_swa}
        try:
            # One call first: compiling and loading a kernel may sync, and happens once.
            fn(pool.req_to_token, rpi, sl, scratch, cfg.page_size, **kwargs)
            torch.cuda.synchronize(dev)
            with sync.record_device_syncs(wanted) as rec, phase("build", first.bs):
                fn(pool.req_to_token, rpi, sl, scratch, cfg.page_size, **kwargs)
            names = sorted({e.name for e in rec.events})
            eager_result = PropertyResult(
                "sync-free builder call",
                not names,
                f"{len(rec.events)} sync(s): {', '.join(names)}" if names else "0 syncs",
            )
        except sync.DetectorUnavailable:
            raise
        except Exception as exc:  # noqa: BLE001 - a builder that raises is reported, not fatal
            eager_result = PropertyResult("sync-free builder call", False, f"raised {exc!r}")
    props.append(eager_result)

    compiles, stop_counting = _compile_counter()
    t0 = time.perf_counter()
    try:
        with phase("capture"):
            runner.capture()
        if graphs:
            torch.cuda.synchronize(dev)
        report.capture_ms = (time.perf_counter() - t0) * 1e3
        props.append(
            PropertyResult(
                "capture",
                True,
                f"{len(runner.buckets)} buckets"
                + (" captured" if graphs else " warmed up eagerly (no CUDA graphs)"),
            )
        )
    except Exception as exc:  # noqa: BLE001
        stop_counting()
        props.append(PropertyResult("capture", False, f"capture raised {exc!r}"))
        return report
    compiles_after_warmup = compiles[0] if compiles is not None else None

    correct = PropertyResult("correct", True, "")
    bounded = PropertyResult("bounded writes", True, "")
    long_replays = 0
    graph_safe = PropertyResult("graph-safe (captured short, replayed long)", True, "")
    moved = PropertyResult("static buffers unmoved", True, "addresses equal at every replay")
    replay_syncs: list = []
    alloc_delta = 0
    recorder_cm = sync.record_device_syncs(wanted) if wanted else None

    def run_replays(rec) -> None:
        nonlocal long_replays, alloc_delta
        step = first
        for i in range(cfg.steps):
            if i > 0:
                step = next(steps)
            bucket = runner.buckets.bucket_for(step.bs)
            stats = report.buckets.setdefault(bucket, BucketStats(bucket))
            runner.page_table.fill_(POISON)
            if runner.swa_page_table is not None:
                runner.swa_page_table.fill_(POISON)
            before_events = len(rec.events) if rec is not None else 0
            allocs = _allocations(dev)
            t = time.perf_counter()
            try:
                runner.replay(step.req_pool_indices, step.seq_lens)
            except Exception as exc:  # noqa: BLE001
                moved.passed = False
                moved.detail = f"replay raised {exc!r}"
                return
            stats.replay_us.append((time.perf_counter() - t) * 1e6)
            if allocs is not None:
                alloc_delta += _allocations(dev) - allocs
            if rec is not None:
                new = [
                    e
                    for e in rec.events[before_events:]
                    if e.range and e.range.split("/")[0] in ("stage", "replay")
                ]
                stats.syncs += len(new)
                replay_syncs.extend(new)
            with phase("verify"):
                _verify(i, bucket, step, stats)
            stats.replays += 1
            report.replays += 1
            if progress is not None:
                progress(i + 1, cfg.steps)

    def _verify(i: int, bucket: int, step, stats: BucketStats) -> None:
        nonlocal long_replays
        want, want_swa = expected_tables(
            pool.req_to_token,
            runner.req_pool_indices[:bucket],
            runner.seq_lens[:bucket],
            width,
            cfg.page_size,
            pool.full_to_swa,
        )
        full_want = torch.full_like(runner.page_table, POISON)
        full_want[:bucket] = want
        tables = [("page_table", runner.page_table, full_want)]
        if want_swa is not None:
            full_swa = torch.full_like(runner.page_table, POISON)
            full_swa[:bucket] = want_swa
            tables.append(("swa_page_table", runner.swa_page_table, full_swa))
        is_long = max(step.seq_lens) > cfg.page_size  # capture saw length 1: one page
        long_replays += is_long
        for name, got, expect in tables:
            diff = got != expect
            if not bool(diff.any()):
                continue
            # Live entries of the real rows must be exact; anything else that differs (poison
            # overwritten, or a padded row holding what its padded inputs do not give) is a
            # write outside the live region.
            live_real = expect != POISON
            live_real[step.bs :] = False
            wrong = diff & live_real
            outside = diff & ~live_real
            n_wrong, n_outside = int(wrong.sum()), int(outside.sum())
            stats.mismatches += n_wrong
            stats.oob_writes += n_outside
            if n_wrong:
                correct.passed = False
                failure = _first_failure(i, bucket, name, wrong, got, expect)
                if correct.first_failure is None:
                    correct.first_failure = failure
                if is_long and graph_safe.first_failure is None:
                    graph_safe.passed = False
                    graph_safe.first_failure = failure
            if n_outside:
                bounded.passed = False
                if bounded.first_failure is None:
                    bounded.first_failure = _first_failure(i, bucket, name, outside, got, expect)

    memory_before = torch.cuda.memory_allocated(dev) if graphs else None
    try:
        if recorder_cm is not None:
            with recorder_cm as rec:
                run_replays(rec)
        else:
            run_replays(None)
    finally:
        stop_counting()
    memory_after = torch.cuda.memory_allocated(dev) if graphs else None

    total_mismatch = sum(b.mismatches for b in report.buckets.values())
    total_oob = sum(b.oob_writes for b in report.buckets.values())
    correct.detail = f"{total_mismatch} wrong live entries over {report.replays} replays"
    bounded.detail = f"{total_oob} entries written outside the live region"
    graph_safe.detail = f"{long_replays} replays longer than the capture-time lengths"
    if long_replays == 0:
        graph_safe.passed = None
        graph_safe.detail = "no replay was longer than at capture"
    props += [correct, bounded, graph_safe]

    if graphs:
        props.append(
            PropertyResult(
                "no allocation in replay",
                alloc_delta == 0,
                f"{alloc_delta} allocator events during staging + replay",
            )
        )
        if compiles is not None:
            extra = compiles[0] - compiles_after_warmup
            props.append(
                PropertyResult(
                    "no compilation after warm-up",
                    extra == 0,
                    f"{compiles_after_warmup} compile(s) during warm-up, {extra} after",
                )
            )
        props.append(
            PropertyResult(
                "no memory growth",
                memory_after == memory_before,
                f"{memory_before} bytes allocated before the replays, {memory_after} after",
            )
        )
    else:
        for name in ("no allocation in replay", "no compilation after warm-up", "no memory growth"):
            props.append(PropertyResult(name, None, "needs a GPU"))
    props.append(moved)

    if wanted:
        names = sorted({f"{e.name} in {e.range}" for e in replay_syncs})
        props.append(
            PropertyResult(
                "sync-free replay path",
                not replay_syncs,
                f"{len(replay_syncs)} sync(s)" + (f": {', '.join(names[:5])}" if names else ""),
            )
        )
    else:
        props.append(
            PropertyResult("sync-free replay path", None, "needs a GPU and a sync detector")
        )
    if runner.errors is not None:
        report.errors = runner.read_errors()
    runner.close()
    return report


__all__ = [
    "CheckConfig",
    "ERROR_KINDS",
    "POISON",
    "Report",
    "check_replay_safety",
    "expected_tables",
]
