"""The decode step end to end (``StepBed``): a builder's tables consumed by paged attention
in one CUDA graph a bucket (``pagegraph.graph.step_graphs``), driven by the engine-like
workload and judged on the attention's output, each replay up to four times on the same live
data (stale tails renamed, values past each length renewed, padded queries NaN then finite, a
planned reader's unwritten workspace refilled) by the judges of ``step_judges``; on CUDA each
bucket is timed too. docs/ARCHITECTURE.md ("The decode step end to end") walks through it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from ...consumers.paged_attention import BLOCK_N, TOKENS_PER_SPLIT
from ...consumers.reader import Reader
from ...graph.buckets import Buckets
from ...graph.builder_names import builder_name
from ...graph.step_consumer import StepShape
from ...graph.step_graphs import TIMING_CALLS, StepGraphs
from ...kernels.contract import cdiv
from ...kinds import KindSpec
from ...runtime.device import pick_device
from ...runtime.timing import WARMUP_REPLAYS
from ...workload.decode import DecodeWorkload, Injection, Step
from ...workload.pool import KVPool, Request
from ..config import CONSUMER_DTYPES, INDEX_DTYPES, CheckConfig
from ..judges.cache_write_judge import (
    CacheModel,
    describe_diff,
    new_token_slot,
    pad_slot_value,
    slot_owners,
)
from ..judges.padded_rows import describe as describe_padded_rows
from ..judges.padded_rows import judge_capture as judge_reserved_at_capture
from ..judges.padded_rows import nan_page as nan_page_id
from ..judges.padded_rows import note_convention
from ..judges.protocol import Judge
from ..judges.reader_judges import (
    ReaderSyncWatch,
    canary_replay,
    compares_eagerly,
    eager_rows,
    reader_details,
    reader_judges,
    reader_sync_capture_cause,
    set_details,
)
from ..judges.step_judges import STEP_JUDGES, StepBatch, StepReplays, StepSeen
from ..judges.step_plan import fresh_detail, plan_detail, replay_refilled
from ..planned import CheckPlan
from ..reports.report import BucketStats, PropertyResult, Report
from ..reports.step_report import STEP_PROPERTIES, StepSection
from ..run_end import STEP_BED_PROPERTIES, Ending, RunEnd, mark_unfinished
from ..signals import CheckInterrupted, stop_requested
from .engine_state import EngineState, make_engine_state, update_engine_state
from .phases import LoopEnd, fail_capture, record_capture
from .state import CheckHooks
from .workload_setup import pool_kwargs, workload_kwargs

__all__ = ["CPU_LIMITS", "STEP_PROPERTIES", "StepBed", "shrink_for_cpu", "step_properties"]

#: One replay in this many fills the stale table entries with the NaN page (``_poison_tails``).
NAN_TAIL_EVERY = 3
#: Caps on the shapes without CUDA (the Triton interpreter runs every program on the CPU). The
#: context keeps one tile past one split's worth of tokens, so the consumer's workspace has
#: two split-K splits (``default_num_splits``), rows longer than a tile fill both, and the
#: combine kernel merges more than one partial result.
CPU_LIMITS = {
    "num_q_heads": 4,
    "num_kv_heads": 2,
    "head_dim": 16,
    "max_bs": 4,
    "max_context_len": TOKENS_PER_SPLIT + BLOCK_N,
}
#: Pages a row can hold at least after shrinking, so stale tails stay in the table.
CPU_MIN_PAGES = 4


def step_properties(status: str = "pass") -> dict[str, PropertyResult]:
    """The step's properties by name, in the report's order, each saying what it covers."""
    return {
        name: PropertyResult(name, status, scope=covers)
        for name, (covers, _) in STEP_PROPERTIES.items()
    }


def shrink_for_cpu(cfg: CheckConfig) -> tuple[CheckConfig, str | None]:
    """``cfg`` with its shapes capped by ``CPU_LIMITS`` (the context to at least
    ``CPU_MIN_PAGES`` pages), and a note of what changed (None when nothing did)."""
    lim = CPU_LIMITS
    kv = min(cfg.num_kv_heads, lim["num_kv_heads"])
    q = max(kv, min(cfg.num_q_heads, lim["num_q_heads"]) // kv * kv)
    ctx = min(cfg.max_context_len, max(lim["max_context_len"], CPU_MIN_PAGES * cfg.page_size))
    bs = min(cfg.max_bs, lim["max_bs"])
    new = dict(
        num_q_heads=q,
        num_kv_heads=kv,
        head_dim=min(cfg.head_dim, lim["head_dim"]),
        max_bs=bs,
        max_context_len=ctx,
    )
    changed = {k: (getattr(cfg, k), v) for k, v in new.items() if getattr(cfg, k) != v}
    if not changed:
        return cfg, None
    extra: dict[str, object] = {}
    if cfg.initial_len is not None:
        extra["initial_len"] = (min(cfg.initial_len[0], ctx), min(cfg.initial_len[1], ctx))
    if not isinstance(cfg.buckets, str):
        extra["buckets"] = [b for b in cfg.buckets if b <= bs] or [bs]
    if cfg.table_width is not None:
        extra["table_width"] = min(cfg.table_width, cdiv(ctx, cfg.page_size))
    if cfg.max_reqs is not None:
        extra["max_reqs"] = min(cfg.max_reqs, 4 * bs)
    if cfg.num_pages is not None:
        extra["num_pages"] = None
    what = ", ".join(f"{k} {a} -> {b}" for k, (a, b) in changed.items())
    note = f"no CUDA: shapes shrunk for the Triton interpreter ({what})"
    return cfg.replace(**new, **extra), note


@dataclass
class _Run:
    """One decode-step check: its settings, parts and tallies."""

    cfg: CheckConfig
    graphs: StepGraphs
    pool: KVPool
    report: Report
    props: dict[str, PropertyResult]
    buckets: Buckets
    gen: torch.Generator
    #: the builder's kind
    kind: KindSpec
    #: the engine state the kind reads (``engine_state``: vLLM's tables), None without
    engine: EngineState | None = None
    #: ``EngineRun``'s: the decode step never breaks the engine's guarantees
    engine_rng: np.random.Generator | None = None
    engine_overrun: np.ndarray | None = None
    padded_replays: int = 0
    #: told the phase reached (``check_decode_step``'s ``on_phase``)
    on_phase: Callable[[str], None] | None = None
    #: what judges each step's replays (``pagegraph.check.judges.step_judges``)
    judges: tuple[Judge[StepSeen], ...] = field(
        default_factory=lambda: (*STEP_JUDGES, *reader_judges())
    )


class StepBed:
    """The decode step's pipeline (``pagegraph.check.pipeline.phases.Bed``): the builder and the
    consumer captured in one graph a bucket, each replay judged on the attention's output
    (docs/ARCHITECTURE.md)."""

    def __init__(
        self,
        fn: Callable[..., object],
        plan: CheckPlan,
        device: str | torch.device | None,
        consumer: Callable[..., object] | Reader | None,
        hooks: CheckHooks,
        emulate: bool | None,
    ) -> None:
        cfg = plan.config
        dev = pick_device(device)
        note = None
        if dev.type != "cuda":
            cfg, note = shrink_for_cpu(cfg)
        assert cfg.consumer is not None, "a decode-step plan's config has a consumer (plan_check)"
        graphs = "cuda" if dev.type == "cuda" else "none"
        self.report = Report(
            builder_name(fn),
            cfg,
            str(dev),
            graphs,
            step=StepSection(consumer=cfg.consumer, shrunk=note),
        )
        self.props = step_properties()
        self.steps = cfg.steps
        note_convention(self.props, cfg.null_block)
        self.report.properties = list(self.props.values())
        self._fn, self._kind, self._consumer = fn, plan.kind_spec, consumer
        self._cfg, self._device = cfg, dev
        self._emulate = cfg.emulate if emulate is None else emulate
        self._hooks = hooks
        self.run: _Run | None = None

    def set_up(self) -> None:
        self.run = _setup(
            self._fn,
            self._kind,
            self._consumer,
            self._cfg,
            self._device,
            self.report,
            self.props,
            self._emulate,
        )
        self.run.on_phase = self._hooks.note
        if self._hooks.on_chunk is not None:
            self._hooks.on_chunk(self.report)  # the shapes and device, before anything can crash

    def capture(self) -> bool:
        assert self.run is not None and self.run.on_phase is not None, "set_up makes the run"
        self.run.on_phase("capture")
        return _capture(self.run)

    def start_replays(self) -> None:
        assert self.run is not None, "set_up makes the run"
        cfg = self.run.cfg
        kwargs = workload_kwargs(cfg, self._kind.tables_include_draft, cfg.max_context_len)
        kwargs.update(inject=Injection(), draft_tokens=0)
        self._steps = iter(DecodeWorkload(self.run.pool, **kwargs))

    def replay_one(self, k: int) -> bool:
        assert self.run is not None, "set_up makes the run"
        _one_step(self.run, k, next(self._steps))
        self.report.replays = k + 1
        return True  # each step is judged as it runs

    def end_replays(self, end: LoopEnd) -> None:
        """What passed is described, or, after an early end, what was not finished marked
        incomplete (``CheckInterrupted`` when a signal ended it)."""
        if end.stopped is None:
            assert self.run is not None, "set_up makes the run"
            _details(self.run)
            return
        self.report.stopped = end.stopped
        mark_unfinished(self.props, STEP_BED_PROPERTIES, RunEnd(Ending.STOPPED, end.stopped))
        if end.interrupted is not None:
            raise CheckInterrupted(self.report, end.interrupted)

    def after_replays(self) -> None:
        assert self.run is not None and self.run.on_phase is not None, "set_up makes the run"
        self.run.on_phase("timing")
        _timing(self.run)

    def release(self) -> None:
        if self.run is not None:
            self.run.graphs.close()

    def finish(self) -> None:
        pass


def _setup(
    fn: Callable[..., object],
    kind: KindSpec,
    consumer: Callable[..., object] | Reader | None,
    cfg: CheckConfig,
    dev: torch.device,
    report: Report,
    props: dict[str, PropertyResult],
    emulate: bool | None = None,
) -> _Run:
    assert cfg.consumer is not None, "a decode-step plan's config has a consumer (plan_check)"
    pool = KVPool(**pool_kwargs(cfg), device=dev)
    engine = make_engine_state(kind, cfg, pool, dev)
    shape = StepShape(
        max_bs=cfg.max_bs,
        width=cfg.width,
        page_size=cfg.page_size,
        num_pages=pool.num_pages,
        num_q_heads=cfg.num_q_heads,
        num_kv_heads=cfg.num_kv_heads,
        head_dim=cfg.head_dim,
        dtype=CONSUMER_DTYPES[cfg.consumer_dtype],
        fmt=cfg.consumer,
        index_dtype=INDEX_DTYPES[cfg.index_dtype],
    )
    buckets = Buckets(cfg.buckets, cfg.max_bs)
    graphs = StepGraphs(
        fn,
        kind,
        consumer or shape.format.kernel,
        shape,
        pool.req_to_token,
        buckets,
        cfg.seed + 2,
        emulate,
        null_block=cfg.null_block,
        padding=cfg.padding,
        engine=engine,
        table_pad_cols=cfg.table_pad_cols,
    )
    gen = torch.Generator().manual_seed(cfg.seed + 3)
    return _Run(cfg, graphs, pool, report, props, buckets, gen, kind, engine)


def _capture(run: _Run) -> bool:
    """Warm up and capture every bucket; False (the rest incomplete) when that raised."""
    watch = ReaderSyncWatch(run)  # around the reader's second call: a warm-up
    t0 = time.perf_counter()
    try:
        run.graphs.capture()
    except Exception as exc:  # noqa: BLE001 - a builder or consumer that raises is reported
        what = reader_sync_capture_cause(exc, watch.judge())
        what = what or f"capture raised {type(exc).__name__}: {exc}"
        fail_capture(run.report, run.props, what, STEP_BED_PROPERTIES)
        return False
    watch.judge()
    g = run.graphs
    record_capture(
        run.report, run.props["capture"], len(run.buckets), g.graphs, g.use_graphs, g.emulated, t0
    )
    if not run.graphs.sentinel_intact():
        run.props["sentinel page untouched"].fail("the sentinel page changed during capture")
    judge_reserved_at_capture(run)
    return True


# -- one step ------------------------------------------------------------------------------------


def _model(run: _Run, k: int, step: Step) -> StepBatch:
    reqs = run.pool.requests
    rpi = [int(r) for r in step.req_pool_indices]
    lens = [int(n) for n in step.seq_lens]
    ps = run.cfg.page_size
    rows = [(reqs[r].pages[: cdiv(n, ps)], n) for r, n in zip(rpi, lens)]
    live = torch.tensor(sorted({p for r in reqs.values() for p in r.pages}), dtype=torch.int32)
    return StepBatch(k, run.buckets.bucket_for(len(rpi)), rpi, lens, rows, live)


def _stage_new_tokens(run: _Run, b: StepBatch) -> CacheModel:
    """Each row's new token for the step's cache write (fresh K/V, the real rows' slots from
    the pool, padded rows' by ``pad_slot``), and the model of what the write must leave."""
    g, ps = run.graphs, run.cfg.page_size
    slots = [new_token_slot(pages, n, ps) for pages, n in b.rows]
    pad_slot = run.cfg.cache_pad_slot
    g.consumer.stage_writes(slots, [n - 1 for n in b.lens], b.bucket, pad_slot_value(pad_slot))
    dims = (b.bucket, g.shape.num_kv_heads, g.shape.head_dim)
    for new in (g.k_new, g.v_new):
        new[: b.bucket].copy_(torch.randn(dims, generator=run.gen).to(new.dtype))
    return CacheModel(g, slots, pad_slot)


def _cache_failure(run: _Run, b: StepBatch, model: CacheModel, replay: str) -> str | None:
    """The replayed cache against ``model``, a failure's text where they differ."""
    diff = model.compare(replay)
    if not diff:
        return None
    owners = slot_owners(
        run.pool.requests, {s // run.cfg.page_size for s in diff.stray}, run.cfg.page_size
    )
    where = [b.where(i) for i in range(len(b.rpi))]
    return describe_diff(diff, where, model.slots, owners)


def _one_step(run: _Run, k: int, step: Step) -> None:
    """Stage, replay A, B, D and C (docs/ARCHITECTURE.md), then hand the step to each judge."""
    g, b = run.graphs, _model(run, k, step)
    n, bucket = len(b.rpi), b.bucket
    update_engine_state(run, step, may_break=False)  # an eager builder's state (vLLM's tables)
    g.stage(b.rpi, b.lens)  # the runner stages and pads it at each replay
    # A planned reader's host plan, eagerly, before the step's replays.
    g.plan(bucket, f"replay {k} (bucket {bucket}, {n} real rows)")
    dims = (n, run.cfg.num_q_heads, run.cfg.head_dim)
    g.q[:n].copy_(torch.randn(dims, generator=run.gen).to(g.q.dtype))
    _padded_queries(g, n, bucket, finite=None)
    model = _stage_new_tokens(run, b)

    # One replay in NAN_TAIL_EVERY fills the stale entries with the NaN page instead: a
    # consumer that loads them and only masks their scores (a read times zero) then shows.
    picks = _poison_tails(run, b, nan_page=k % NAN_TAIL_EVERY == NAN_TAIL_EVERY - 1)
    g.replay()
    out_a = g.out[:n].clone()
    sentinel = g.sentinel_intact()
    cache_failure = _cache_failure(run, b, model, "A")
    _poison_tails(run, b, picks)
    _renew_past_length(run, b, model)
    g.replay()
    out_b = g.out[:n].clone()
    sentinel = sentinel and g.sentinel_intact()
    # The reader's own eager call on B's inputs (every step where the scenario judges it).
    out_eager = eager_rows(run, b) if compares_eagerly(run, b) else None
    out_d = replay_refilled(run, b)  # D: the entries earlier plans left changed
    out_fresh = replay_refilled(run, b, stale=False)  # and those no plan has written
    sentinel = sentinel and g.sentinel_intact()
    out_c = pad_c = None
    if n < bucket:
        run.padded_replays += 1
        _padded_queries(g, n, bucket, finite=run.gen)
        g.replay()
        sentinel = sentinel and g.sentinel_intact()
        out_c = g.out[:n].clone()
        pad_c = g.out[n:bucket].clone()
    out_e, pad_e = canary_replay(run, b)  # E: the NaN page in every entry outside the rows
    sentinel = sentinel and g.sentinel_intact()
    # Page 0 and the guard are never restored: one read-back after the step's last replay
    # sees a write in any of them.
    cache_failure = cache_failure or _cache_failure(run, b, model, "the step's last")
    reserved = g.reserved_changed()
    model.restore()
    replays = StepReplays(
        out_a,
        out_b,
        out_c,
        sentinel,
        pad_c=pad_c,
        reserved_changed=reserved,
        out_plan=out_d,
        out_fresh=out_fresh,
        model_kv=(model.k, model.v),
        cache_failure=cache_failure,
        out_eager=out_eager,
        out_canary=out_e,
        pad_canary=pad_e,
    )
    seen = StepSeen(run, b, replays)
    for judge in run.judges:
        judge.observe(seen)
    for judge in run.judges:
        judge.settle(run.props)
    stats = run.report.buckets.setdefault(bucket, BucketStats(bucket))
    stats.replays += 1


def _padded_queries(g: StepGraphs, n: int, bucket: int, finite: torch.Generator | None) -> None:
    """Rows ``n:bucket`` of ``q``: NaN and +Inf by turns, or seeded finite values."""
    if bucket <= n:
        return
    pad = g.q[n:bucket]
    if finite is not None:
        pad.copy_(torch.randn(tuple(pad.shape), generator=finite).to(pad.dtype))
        return
    pad[0::2] = float("nan")
    pad[1::2] = float("inf")


def _poison_tails(
    run: _Run, b: StepBatch, before: tuple[torch.Tensor, ...] | None = None, nan_page: bool = False
) -> tuple[torch.Tensor, ...]:
    """Fill the whole table of the bucket (and the reader format's stale entries,
    ``ReaderFormat.stale``: CSR's ``kv_indices``) with ids of live pages drawn at random, each
    entry a different page than ``before`` (the picks this returned last) where two pages
    live: the builder overwrites the live entries, and a stale tail then names real data, so
    reading it changes the output (-1 or 0 might be skipped or read as padding's page). With
    ``nan_page`` every entry is the NaN page (page 0, or the guard page -1 where the null block
    holds data: ``pagegraph.check.judges.padded_rows``): a read of a stale entry, even one whose
    score is masked by a multiplication by zero, makes the row NaN. The picks are returned
    either way (``before`` of the next fill)."""
    g, live = run.graphs, len(b.live)
    sizes: list[tuple[int, ...]] = [(b.bucket, g.shape.width)]
    sizes += [tuple(t.shape) for t in g.stale]
    picks = []
    for k, size in enumerate(sizes):
        pick = torch.randint(live, size, generator=run.gen)
        if before is not None and live > 1:
            pick = (before[k] + 1 + torch.randint(live - 1, size, generator=run.gen)) % live
        picks.append(pick)
    if nan_page:
        page = nan_page_id(g.null_block)
        g.page_table[: b.bucket].fill_(page)
        for t in g.stale:
            t.fill_(page)
        return tuple(picks)
    g.page_table[: b.bucket].copy_(b.live[picks[0]])
    for t, pick in zip(g.stale, picks[1:], strict=True):
        t.copy_(b.live[pick])
    return tuple(picks)


def _renew_past_length(run: _Run, b: StepBatch, model: CacheModel) -> None:
    """New random K and V in each real row's last page past its length (tokens that row
    does not hold yet; no other request owns them), in the cache and in its ``model``."""
    ps, pages, slots = run.cfg.page_size, [], []
    for row_pages, n in b.rows:
        if n % ps and row_pages:
            pages += [row_pages[-1]] * (ps - n % ps)
            slots += list(range(n % ps, ps))
    if not pages:
        return
    g = run.graphs
    idx = (torch.tensor(pages, device=g.device), torch.tensor(slots, device=g.device))
    dims = (len(pages), g.shape.num_kv_heads, g.shape.head_dim)
    for cache in (g.k_cache, g.v_cache):
        cache[idx] = torch.randn(dims, generator=run.gen).to(cache.dtype).to(g.device)
    model.renew(*idx)


def _details(run: _Run) -> None:
    """What each passed property covered."""
    p, r, ps = run.props, run.report, run.cfg.page_size
    assert r.step is not None, "a decode-step report has its step section"
    ok = {k: v for k, v in p.items() if v.status == "pass"}
    nan_pages = "page 0" if run.graphs.null_block == "nan" else "the guard page and the sentinel"
    text = {
        "output correct through the consumer": (
            f"{r.step.rows_checked} real rows over {r.replays} replays within tolerance of dense "
            "fp32 attention over the host model's pages (consumers/attention_reference.py)"
        ),
        "consumer reads only within cache_seqlens": (
            f"{r.replays} replays re-run with other live pages' ids in every stale tail and new "
            f"values past each length in the last page (page size {ps}): real rows bit-identical"
        ),
        "padded rows contained": (
            f"{run.padded_replays} replays with padded rows ({run.cfg.padding} padding, NaN/Inf "
            f"queries, NaN in {nan_pages}): real rows finite and bit-identical with finite padded "
            "queries"
            if run.padded_replays
            else "no replay had padded rows"
        ),
        "sentinel page untouched": (
            f"page {run.graphs.sentinel} of K and V (no request holds it) unchanged after "
            "capture and every replay"
        ),
        "replays completed": f"{r.replays} replays, none raised",
        "cache write exact": (
            f"{r.step.rows_checked} real rows' new K/V at the slots the host model gives them "
            f"(writer {builder_name(run.graphs.consumer.reader.writer)}), every other slot of the "
            f"pool bit-identical after each step's first and last replay; padded rows "
            f"({run.cfg.padding} padding) "
            + (
                "may write slot 0 (pad_slot 'null')"
                if run.cfg.cache_pad_slot == "null"
                else "write nothing (pad_slot 'skip': PAD_SLOT_ID)"
            )
        ),
        "reader reads only what the current plan wrote": plan_detail(run),
        "reader reads only workspace a plan wrote": fresh_detail(run),
    }
    for name, detail in text.items():
        if name in ok:
            ok[name].detail = detail
    set_details(p, reader_details(run, run.judges))
    describe_padded_rows(run)


def _timing(run: _Run) -> None:
    """Per bucket, the device time per call of the step, the builder alone and the consumer
    alone (CUDA graphs only; graph/step_graphs.py says how)."""
    r, g = run.report, run.graphs
    assert r.step is not None, "a decode-step report has its step section"
    if stop_requested() is not None:  # the verdict is whole: only the figures are dropped
        r.step.timing_skipped = "a stop was requested after the replays"
        return
    if not g.use_graphs:
        r.step.timing_skipped = (
            f"needs a GPU (CUDA events around replays of graphs of {TIMING_CALLS} calls)"
        )
        return
    if r.stopped:
        r.step.timing_skipped = "the run stopped early"
        return
    if run.cfg.timing_iters == 0:
        r.step.timing_skipped = "timing_iters = 0"
        return
    reqs = run.pool.requests
    if not reqs:
        r.step.timing_skipped = "no running request left to time"
        return
    try:
        _time_buckets(run, list(reqs.values()))
    except Exception as exc:  # noqa: BLE001 - the verdict stands; only the figures are lost
        _drop_timing(r.step, f"timing raised {type(exc).__name__}: {exc}")


def _drop_timing(step: StepSection, why: str) -> None:
    """No timing figures in the report, and why."""
    step.timing.clear()
    step.timing_method = None
    step.timing_skipped = why


def _time_buckets(run: _Run, rows: list[Request]) -> None:
    """Capture the timing graphs, then time every bucket on ``rows`` (running requests)."""
    r, g = run.report, run.graphs
    assert r.step is not None, "a decode-step report has its step section"
    g.capture_timing(TIMING_CALLS)
    iters = run.cfg.timing_iters
    r.step.timing_method = (
        f"a graph of {TIMING_CALLS} back-to-back calls of the step, of the builder and of the "
        f"consumer, replayed in turns between CUDA events; median of {iters} replays over "
        f"{TIMING_CALLS}, {WARMUP_REPLAYS} warm-up replays untimed; every row real (the running "
        "requests repeated to fill the bucket); builder share = builder / step"
    )
    for bucket in run.buckets.sizes:
        if stop_requested() is not None:  # the figures of some buckets only: none kept
            _drop_timing(r.step, "a stop was requested during the timing")
            return
        # The running requests, repeated to fill the bucket: real lengths, no padded row.
        batch = [rows[i % len(rows)] for i in range(bucket)]
        req_rows, lens = [req.row for req in batch], [req.length for req in batch]
        g.load_timed_batch(req_rows, lens)
        update_engine_state(run, Step(-1, req_rows, lens), may_break=False)
        slots = [new_token_slot(req.pages, req.length, run.cfg.page_size) for req in batch]
        g.consumer.stage_writes(slots, [req.length - 1 for req in batch], bucket, 0)
        g.plan(bucket)  # a planned reader's plan for this batch, outside the timed replays
        g.q[:bucket].normal_()
        r.buckets.setdefault(bucket, BucketStats(bucket))
        r.step.timing[bucket] = g.time_bucket(bucket, iters)
