"""Benchmark suite: the page-table builders against the two floors they cannot beat.

What is measured, per (config, builder) row:

* **device time per build** (``device_us``): warm up on a side stream, capture a CUDA graph of
  ``N`` back-to-back builds, replay it ``R`` times with a CUDA event pair around each replay,
  and take the median replay time over ``N``. The GPU is kept busy (``torch.cuda._sleep``)
  while the replays are queued, so the events time the graph, not the host's launch gap.
  The page starts one build reads fit in the L2 cache for most configs, so the ``N`` builds of
  a graph cycle over several ``req_to_token`` tables holding the same requests on other
  pages (``input_sets``, chosen so that together they are four times the L2): in a serving
  engine the model's forward pass between two decode steps evicts them too. ``l2_resident``
  says whether one build's footprint alone would fit.
* **the bandwidth floor** (``floor_us``): the bytes that must move (per live page, the
  page-start read ``min(32, page_size * itemsize)`` bytes, i.e. one sector at most, and the
  4-byte write; SWA adds a 32-byte ``full_to_swa`` sector and another 4-byte write) over the
  device-to-device bandwidth measured in the same run (a 2 GiB ``copy_``, read + write).
* **the launch floor** (``launch_floor_us``): an empty one-program Triton kernel captured
  ``N`` times in a graph, per node.
* **eager wall time** (``eager_us``): host time of one call (Python + launch), median of many,
  with the queue drained outside the timed region now and then; for ``build_page_table`` also
  ``eager_prepared_us``, the same build through ``prepare_build``'s ``PreparedBuild``.
* **replay wall time** (``replay_us``, ``replay_host_us``), for ``build_page_table`` only: one
  ``GraphRunner.replay()`` including staging, from device tensors and from host lists.

``host_max_gather`` cannot be captured correctly (its ``.item()`` freezes the width at capture),
so it has eager wall time only. ``block_grid`` is the rejected design, kept here as a baseline:
a fixed ``(bs, cdiv(width, 64))`` grid of page blocks over the whole static width.

Before timing, every builder's output is checked once, exactly, against
``pagegraph.checker.expected_tables`` on the live entries (``exact``), and again after a graph
replay (``graph_exact``). Without CUDA only a tiny smoke run under the Triton interpreter is
possible: eager wall times of the interpreter, exactness, and ``None`` for every device field.

Run: ``python -m pagegraph.bench`` (or ``pagegraph bench``), ``--quick``, ``--configs NAME...``,
``--tune`` for the kernel-parameter sweep.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import triton
import triton.language as tl

from . import kernel as _kernel
from .checker import POISON, expected_tables
from .contract import cdiv, check_builder_args
from .environment import environment
from .kernel import build_page_table, prepare_build
from .ranges import phase
from .reference import host_max_gather, static_width_gather
from .runner import GraphRunner

K = 1024

# -- configurations ---------------------------------------------------------------------------


@dataclass(frozen=True)
class BenchConfig:
    """One benchmark shape. ``lengths`` is ``("uniform", lo, hi)`` (tokens drawn uniformly in
    ``lo..hi``) or ``("skewed", long, short)`` (one request of ``long`` tokens, the rest
    ``short``)."""

    name: str
    bs: int
    page_size: int
    max_context_len: int
    lengths: tuple[str, int, int]
    swa: bool = False

    @property
    def width(self) -> int:
        return cdiv(self.max_context_len, self.page_size)

    def describe_lengths(self) -> str:
        kind, a, b = self.lengths
        if kind == "uniform":
            return f"uniform {_tokens(a)}..{_tokens(b)}"
        return f"one at {_tokens(a)}, the rest {_tokens(b)}"


CONFIGS: tuple[BenchConfig, ...] = (
    BenchConfig("decode-small", 8, 64, 128 * K, ("uniform", 1, 4 * K)),
    BenchConfig("decode-mid", 64, 64, 128 * K, ("uniform", 1, 32 * K)),
    BenchConfig("decode-large", 256, 64, 128 * K, ("uniform", 1, 128 * K)),
    BenchConfig("skewed", 256, 64, 128 * K, ("skewed", 128 * K, 100)),
    BenchConfig("long-1m", 64, 64, 1024 * K, ("uniform", 1, 1024 * K)),
    BenchConfig("ps1", 256, 1, 32 * K, ("uniform", 1, 32 * K)),
    BenchConfig("swa", 128, 16, 64 * K, ("uniform", 1, 64 * K), swa=True),
    BenchConfig("ps256", 256, 256, 128 * K, ("uniform", 1, 128 * K)),
)
CONFIG_NAMES = tuple(c.name for c in CONFIGS)

#: Configs the kernel-parameter sweep (``--tune``) covers by default.
TUNE_CONFIGS = ("decode-small", "decode-large", "skewed", "long-1m", "ps1", "swa")

#: Sweeps for the plots: (bs values at 128K context) and (context values at bs 64).
SWEEP_BS = (1, 8, 32, 64, 128, 256, 512)
SWEEP_CONTEXT = (2 * K, 8 * K, 32 * K, 128 * K, 512 * K, 1024 * K)
SWEEP_BUILDERS = ("build_page_table", "block_grid", "static_width_gather")

#: Builds per captured graph, and replays of it, for the device time.
GRAPH_BUILDS = 20
GRAPH_REPLAYS = 50
EAGER_CALLS = 200
REPLAY_CALLS = 200
#: The queue is drained (outside the timed region) every this many timed calls.
SYNC_EVERY = 50
#: Bytes per copy buffer for the bandwidth measurement.
COPY_BYTES = 2 * 2**30
#: Footprints below this are taken as L2-resident across the builds of one graph (H200: 60 MB).
DEFAULT_L2_BYTES = 60 * 10**6

#: Sector size: a page-start read costs at most one 32-byte sector, whatever the page size.
SECTOR = 32

# Smoke run without CUDA: tiny shapes under the interpreter.
SMOKE_BS = 4
SMOKE_CONTEXT = 256


def get_config(name: str) -> BenchConfig:
    for cfg in CONFIGS:
        if cfg.name == name:
            return cfg
    raise ValueError(f"unknown bench config {name!r}: use one of {', '.join(CONFIG_NAMES)}")


def smoke_config(cfg: BenchConfig) -> BenchConfig:
    """``cfg`` scaled down for the interpreter: bs 4, context 256, page size / 4, lengths
    scaled by the context ratio."""
    ctx = SMOKE_CONTEXT
    scale = ctx / cfg.max_context_len
    kind, a, b = cfg.lengths
    if kind == "uniform":
        lengths = ("uniform", 1, max(2, min(ctx, round(b * scale))))
    else:
        lengths = ("skewed", min(ctx, max(1, round(a * scale))), max(1, round(b * scale)))
    return BenchConfig(cfg.name, SMOKE_BS, max(1, cfg.page_size // 4), ctx, lengths, swa=cfg.swa)


def _tokens(n: int) -> str:
    if n >= K and n % (K * K) == 0:
        return f"{n // (K * K)}M"
    if n >= K and n % K == 0:
        return f"{n // K}K"
    return str(n)


# -- the block-grid baseline ------------------------------------------------------------------

#: Pages per program of the fixed block grid.
BLOCK_GRID_PAGES = 64
BLOCK_GRID_WARPS = 2


def block_grid(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    page_table: torch.Tensor,
    page_size: int,
    *,
    swa_page_table: torch.Tensor | None = None,
    full_to_swa: torch.Tensor | None = None,
    errors: torch.Tensor | None = None,
) -> None:
    """The rejected design, as a baseline: a fixed grid ``(bs, cdiv(width, 64))`` of 64-page
    blocks covering the whole static width. Each program loads its row's ``seq_len`` and exits
    when its block starts past the row's page count, so the work is bounded, but the number
    of programs is ``bs * width / 64`` whatever the lengths.

    Same contract and outputs as ``pagegraph.build_page_table`` (SWA included; the width is
    clamped, so an overlong ``seq_len`` stays in its row). ``errors`` is accepted and ignored.
    Shapes as ``build_page_table``.
    """
    check_builder_args(
        req_to_token,
        req_pool_indices,
        seq_lens,
        page_table,
        page_size,
        swa_page_table,
        full_to_swa,
        errors,
        builder="block_grid",
        cpu_ok=False,
    )
    bs, width = page_table.shape
    max_pages = min(width, cdiv(req_to_token.shape[1], page_size))
    if bs == 0 or max_pages == 0:
        return
    has_swa = full_to_swa is not None
    # Unused pointer arguments alias page_table: the HAS_SWA constexpr compiles them out.
    swa_pt = swa_page_table if has_swa else page_table
    f2s = full_to_swa if has_swa else page_table
    grid = (bs, cdiv(max_pages, BLOCK_GRID_PAGES))
    # A device context costs microseconds of host time: only when not on that device already.
    dev = page_table.device
    switch = dev.type == "cuda" and dev.index != torch.cuda.current_device()
    with torch.cuda.device(dev) if switch else nullcontext():
        _block_grid_kernel[grid](
            req_to_token,
            req_pool_indices,
            seq_lens,
            page_table,
            swa_pt,
            f2s,
            req_to_token.stride(0),
            req_to_token.shape[0],
            page_table.stride(0),
            swa_pt.stride(0),
            max_pages,
            page_size,
            f2s.shape[0],
            HAS_SWA=has_swa,
            BLOCK=BLOCK_GRID_PAGES,
            num_warps=BLOCK_GRID_WARPS,
        )


#: Builders benchmarked, in table order.
BUILDERS: dict[str, Callable] = {
    "build_page_table": build_page_table,
    "block_grid": block_grid,
    "static_width_gather": static_width_gather,
    "host_max_gather": host_max_gather,
}
#: Builders whose captured graph is correct (host_max_gather freezes its width at capture).
GRAPH_SAFE = ("build_page_table", "block_grid", "static_width_gather")


# -- inputs -----------------------------------------------------------------------------------


@dataclass
class BenchInputs:
    """Inputs of one config: ``req_to_token [bs + 1, max_context_len]`` (row 0 a dummy),
    ``req_pool_indices [bs]`` / ``seq_lens [bs]`` int32 on the device, ``full_to_swa``."""

    config: BenchConfig
    req_to_token: torch.Tensor
    req_pool_indices: torch.Tensor
    seq_lens: torch.Tensor
    full_to_swa: torch.Tensor | None
    lengths: list[int]
    rows: list[int]
    #: More req_to_token tables of the same requests on other pages (device timing only).
    rotated: list[torch.Tensor] = field(default_factory=list)

    @property
    def width(self) -> int:
        return self.config.width


def _lengths(cfg: BenchConfig, gen: torch.Generator) -> torch.Tensor:
    kind, a, b = cfg.lengths
    if kind == "uniform":
        lengths = torch.randint(a, b + 1, (cfg.bs,), generator=gen, dtype=torch.int64)
    elif kind == "skewed":
        lengths = torch.full((cfg.bs,), b, dtype=torch.int64)
        lengths[int(torch.randint(0, cfg.bs, (1,), generator=gen))] = a
    else:
        raise ValueError(f"{cfg.name}: unknown lengths kind {kind!r}")
    return lengths.clamp(0, cfg.max_context_len)


def make_inputs(cfg: BenchConfig, device: str | torch.device, seed: int = 0) -> BenchInputs:
    """Random page placement, built with vectorised torch on ``device`` (1M contexts take
    well under a second on a GPU).

    Request row ``r`` (``1..bs``) owns ``width`` distinct pages taken from one permutation of
    the pool's pages ``1..bs*width`` (page 0 is the padding page); its ``req_to_token`` row is
    ``page * page_size + offset`` up to its length and zeros after. Batch row ``i`` uses a
    random request row. With SWA, every full page maps to a random SWA page, offsets kept.
    """
    device = torch.device(device)
    bs, ps, ctx, width = cfg.bs, cfg.page_size, cfg.max_context_len, cfg.width
    gen = torch.Generator().manual_seed(seed)
    lengths = _lengths(cfg, gen)
    rows = torch.randperm(bs, generator=gen) + 1
    num_pages = bs * width + 1
    dtype = torch.int32 if num_pages * ps < 2**31 else torch.int64
    pages = (torch.randperm(bs * width, generator=gen) + 1).view(bs, width)
    pages = pages.to(device=device, dtype=dtype)
    row_len = torch.zeros(bs + 1, dtype=torch.int64)
    row_len[rows] = lengths
    row_len = row_len.to(device)

    req_to_token = torch.zeros((bs + 1, ctx), dtype=dtype, device=device)
    offsets = torch.arange(ps, dtype=dtype, device=device)
    cols = torch.arange(ctx, device=device)
    chunk = max(1, (1 << 25) // (width * ps))  # rows per chunk: ~32M entries of scratch
    for a in range(0, bs, chunk):
        b = min(bs, a + chunk)
        slots = (pages[a:b, :, None] * ps + offsets).reshape(b - a, width * ps)[:, :ctx]
        live = cols[None, :] < row_len[a + 1 : b + 1, None]
        req_to_token[a + 1 : b + 1] = torch.where(live, slots, torch.zeros_like(slots))
        del slots, live

    full_to_swa = None
    if cfg.swa:
        swa_of_page = torch.zeros(num_pages, dtype=torch.int64)
        swa_of_page[1:] = torch.randperm(num_pages - 1, generator=gen) + 1
        swa_of_page = swa_of_page.to(device)
        full_to_swa = torch.zeros(num_pages * ps + 1, dtype=torch.int64, device=device)
        slots = torch.arange(num_pages * ps, dtype=torch.int64, device=device)
        full_to_swa[:-1] = swa_of_page[slots // ps] * ps + slots % ps
        del slots, swa_of_page

    return BenchInputs(
        config=cfg,
        req_to_token=req_to_token,
        req_pool_indices=rows.to(device=device, dtype=torch.int32),
        seq_lens=lengths.to(device=device, dtype=torch.int32),
        full_to_swa=full_to_swa,
        lengths=lengths.tolist(),
        rows=rows.tolist(),
    )


def rotated_copies(inp: BenchInputs, copies: int, seed: int = 1) -> list[torch.Tensor]:
    """``copies`` more ``req_to_token`` tables holding the same requests on other pages
    (a random permutation of page ids, page 0 kept), so that a graph of builds cycling over
    them reads page starts that are not already in L2 from the previous build."""
    r2t = inp.req_to_token
    ps = inp.config.page_size
    num_pages = inp.config.bs * inp.config.width + 1
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(copies):
        perm = torch.zeros(num_pages, dtype=torch.int64)
        perm[1:] = torch.randperm(num_pages - 1, generator=gen) + 1
        perm = perm.to(r2t.device, r2t.dtype)
        out.append(perm[(r2t // ps).long()] * ps + r2t % ps)
    return out


class Rotation:
    """``fn(table, *rest, **kwargs)`` cycling over ``tables``; ``reset()`` restarts the cycle,
    so a graph of a multiple of ``len(tables)`` builds ends on the last table."""

    def __init__(self, fn: Callable, tables: list[torch.Tensor], rest: tuple, kwargs: dict):
        self.fn, self.tables, self.rest, self.kwargs = fn, tables, rest, kwargs
        self.turn = 0

    def __call__(self) -> None:
        table = self.tables[self.turn % len(self.tables)]
        self.turn += 1
        self.fn(table, *self.rest, **self.kwargs)

    def reset(self) -> None:
        self.turn = 0


def rotation_count(nbytes: int, table_bytes: int, l2_bytes: int, builds: int) -> int:
    """Input sets a graph of ``builds`` builds cycles over: enough that the page starts of
    all of them together are four times the L2, a divisor of ``builds`` (so the last build
    uses the first set), and at most 8 GiB of tables."""
    want = max(1, math.ceil(4 * l2_bytes / max(nbytes, 1)))
    want = min(want, max(1, (8 << 30) // max(table_bytes, 1)))
    divisors = [d for d in range(1, builds + 1) if builds % d == 0]
    return next((d for d in divisors if d >= want), divisors[-1])


def rotate_out_of_l2(inp: BenchInputs, l2_bytes: int, builds: int) -> None:
    """Give ``inp`` the rotated tables a graph of ``builds`` builds cycles over (none when
    the device has no memory left for them: the row is then measured L2-warm, and its
    ``input_sets`` says 1)."""
    cfg = inp.config
    pages = live_pages(inp.lengths, cfg.page_size, cfg.width)
    nbytes = floor_bytes(pages, cfg.page_size, inp.req_to_token.element_size(), cfg.swa)
    table_bytes = inp.req_to_token.numel() * inp.req_to_token.element_size()
    try:
        inp.rotated = rotated_copies(inp, rotation_count(nbytes, table_bytes, l2_bytes, builds) - 1)
    except torch.OutOfMemoryError:
        inp.rotated = []
        _recover(True)


# -- the floors -------------------------------------------------------------------------------


def live_pages(lengths: Sequence[int], page_size: int, width: int) -> int:
    """Pages a builder must write: ``sum(min(cdiv(len, page_size), width))``."""
    return sum(min(max(cdiv(n, page_size), 0), width) for n in lengths)


def floor_bytes(pages: int, page_size: int, itemsize: int = 4, swa: bool = False) -> int:
    """Bytes that must move for ``pages`` live pages: the page-start read (one sector at most,
    ``min(32, page_size * itemsize)``) and the 4-byte write; SWA adds a 32-byte
    ``full_to_swa`` sector and another 4-byte write."""
    per_page = min(SECTOR, page_size * itemsize) + 4
    if swa:
        per_page += SECTOR + 4
    return pages * per_page


def expected_live_pages(cfg: BenchConfig) -> int:
    """Expected live pages of a config, from the mean length: ``bs * ceil(mean_len / ps)``
    (uniform), or the one long row plus ``bs - 1`` short ones (skewed)."""
    kind, a, b = cfg.lengths
    ps = cfg.page_size
    if kind == "uniform":
        return cfg.bs * min(math.ceil((a + b) / 2 / ps), cfg.width)
    return min(cdiv(a, ps), cfg.width) + (cfg.bs - 1) * min(cdiv(b, ps), cfg.width)


def expected_floor_bytes(cfg: BenchConfig, itemsize: int = 4) -> int:
    return floor_bytes(expected_live_pages(cfg), cfg.page_size, itemsize, cfg.swa)


# -- timing primitives (CUDA) -----------------------------------------------------------------


@triton.jit
def _empty_kernel(x_ptr):  # [1] int32, never touched
    pass


def _sync(cuda: bool) -> None:
    if cuda:
        torch.cuda.synchronize()


def _keep_gpu_busy(seconds: float) -> None:
    """Queue a spin kernel so that work queued behind it starts back to back."""
    sleep = getattr(torch.cuda, "_sleep", None)
    if sleep is None:
        return
    try:
        sleep(int(seconds * 2e9))  # ~2 GHz SM clock: an estimate is enough
    except Exception:  # noqa: BLE001 - timing still works, only less tightly
        pass


def _capture(
    fn: Callable[[], None], builds: int, reset: Callable[[], None] | None = None
) -> torch.cuda.CUDAGraph:
    """Warm ``fn`` up on a side stream, then capture ``builds`` calls of it in one graph
    (``reset`` runs just before the capture)."""
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    if reset is not None:
        reset()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(builds):
            fn()
    torch.cuda.synchronize()
    return graph


def _time_graph(graph: torch.cuda.CUDAGraph, replays: int) -> float:
    """Median milliseconds of one replay, event-timed, replays queued behind a spin."""
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    events = [
        (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
        for _ in range(replays)
    ]
    _keep_gpu_busy(replays * 50e-6 + 1e-3)
    for start, end in events:
        start.record()
        graph.replay()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(start.elapsed_time(end) for start, end in events)


def device_time_us(
    fn: Callable[[], None],
    builds: int = GRAPH_BUILDS,
    replays: int = GRAPH_REPLAYS,
    reset: Callable[[], None] | None = None,
) -> tuple[float, torch.cuda.CUDAGraph]:
    """Device microseconds per call of ``fn``: a graph of ``builds`` calls, median of
    ``replays`` replays, divided by ``builds``. Returns the graph too (caller deletes it)."""
    graph = _capture(fn, builds, reset)
    ms = _time_graph(graph, replays)
    return ms * 1e3 / builds, graph


def wall_time_us(
    fn: Callable[[], object],
    calls: int = EAGER_CALLS,
    warmup: int = 10,
    cuda: bool = True,
    sync_every: int = SYNC_EVERY,
) -> float:
    """Median host microseconds of one call. The queue is drained outside the timed region
    every ``sync_every`` calls, so it never builds up, and never inside one."""
    for _ in range(warmup):
        fn()
    _sync(cuda)
    times = []
    for i in range(calls):
        if i and i % sync_every == 0:
            _sync(cuda)
        t0 = time.perf_counter_ns()
        fn()
        times.append(time.perf_counter_ns() - t0)
    _sync(cuda)
    return statistics.median(times) / 1e3


def measure_bandwidth(nbytes: int = COPY_BYTES, copies: int = 10) -> float:
    """Device-to-device bytes per second (read + write) of a large ``dst.copy_(src)``, median
    of ``copies`` event-timed copies."""
    while True:
        try:
            src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
            dst = torch.empty_like(src)
            break
        except torch.OutOfMemoryError:
            if nbytes <= 2**26:
                raise
            nbytes //= 2
    src.fill_(1)
    for _ in range(2):
        dst.copy_(src)
    torch.cuda.synchronize()
    times = []
    for _ in range(copies):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    del src, dst
    torch.cuda.empty_cache()
    return 2 * nbytes / (statistics.median(times) * 1e-3)


def measure_launch_floor(builds: int = GRAPH_BUILDS, replays: int = GRAPH_REPLAYS) -> float:
    """Microseconds per graph node of an empty one-program Triton kernel."""
    buf = torch.zeros(1, dtype=torch.int32, device="cuda")
    us, graph = device_time_us(lambda: _empty_kernel[(1,)](buf), builds, replays)
    del graph
    return us


# -- one config -------------------------------------------------------------------------------


def _error(exc: BaseException) -> str:
    where = traceback.extract_tb(exc.__traceback__)
    loc = f" at {Path(where[-1].filename).name}:{where[-1].lineno}" if where else ""
    return f"{type(exc).__name__}: {exc}"[:500] + loc


def _live_mask(inp: BenchInputs, device) -> torch.Tensor:
    cfg = inp.config
    cap = min(cfg.width, cdiv(inp.req_to_token.shape[1], cfg.page_size))
    n = (inp.seq_lens.to(torch.int64).clamp(min=0) + cfg.page_size - 1) // cfg.page_size
    n = n.clamp(max=cap)
    return torch.arange(cfg.width, device=device)[None, :] < n[:, None]


class _Check:
    """Expected tables of one input set, and an exact comparison of the live entries."""

    def __init__(self, inp: BenchInputs):
        cfg = inp.config
        self.want, self.want_swa = expected_tables(
            inp.req_to_token,
            inp.req_pool_indices,
            inp.seq_lens,
            cfg.width,
            cfg.page_size,
            inp.full_to_swa,
        )
        self.live = _live_mask(inp, inp.req_to_token.device)

    def compare(self, page_table, swa_page_table) -> str | None:
        """``None`` when exact, else where the first live entry differs."""
        tables = [("page_table", page_table, self.want)]
        if self.want_swa is not None:
            tables.append(("swa_page_table", swa_page_table, self.want_swa))
        for name, got, want in tables:
            if torch.equal(got[self.live], want[self.live]):
                continue
            bad = ((got != want) & self.live).nonzero()
            r, c = bad[0].tolist()
            return (
                f"{name}: {bad.shape[0]} live entries differ; first [{r}, {c}] "
                f"got {int(got[r, c])} want {int(want[r, c])}"
            )
        return None


def _outputs(inp: BenchInputs) -> tuple[torch.Tensor, torch.Tensor | None, dict]:
    cfg = inp.config
    dev = inp.req_to_token.device
    page_table = torch.full((cfg.bs, cfg.width), POISON, dtype=torch.int32, device=dev)
    swa_page_table = torch.full_like(page_table, POISON) if cfg.swa else None
    kwargs = {}
    if cfg.swa:
        kwargs = {"swa_page_table": swa_page_table, "full_to_swa": inp.full_to_swa}
    return page_table, swa_page_table, kwargs


def _poison(*tables) -> None:
    for t in tables:
        if t is not None:
            t.fill_(POISON)


def _base_row(cfg: BenchConfig, builder: str, env: dict, launch_floor: float | None) -> dict:
    return {
        "gpu": env.get("device"),
        "torch": env.get("torch"),
        "triton": env.get("triton"),
        "date": env.get("date"),
        "config": cfg.name,
        "bs": cfg.bs,
        "page_size": cfg.page_size,
        "max_context_len": cfg.max_context_len,
        "width": cfg.width,
        "lengths": cfg.describe_lengths(),
        "swa": cfg.swa,
        "builder": builder,
        "device_us": None,
        "floor_us": None,
        "fraction_of_floor": None,
        "launch_floor_us": launch_floor,
        "eager_us": None,
        "eager_prepared_us": None,
        "replay_us": None,
        "replay_host_us": None,
        "live_pages": None,
        "bytes": None,
        "l2_resident": None,
        "input_sets": None,
        "device_warm_us": None,
        "exact": None,
        "graph_exact": None,
        "replay_exact": None,
        "mismatch": None,
        "error": None,
    }


@dataclass
class _Settings:
    cuda: bool
    builds: int
    replays: int
    eager_calls: int
    replay_calls: int
    bandwidth: float | None  # bytes / s
    l2_bytes: int


def single_bucket_runner(inp: BenchInputs) -> GraphRunner:
    """A ``GraphRunner`` over ``inp``'s tables with one bucket, the config's batch size."""
    cfg = inp.config
    return GraphRunner(
        inp.req_to_token,
        max_bs=cfg.bs,
        max_context_len=cfg.max_context_len,
        page_size=cfg.page_size,
        buckets=[cfg.bs],
        full_to_swa=inp.full_to_swa,
    )


def _runner_replays(inp: BenchInputs, check: _Check, s: _Settings, row: dict, errors: list):
    runner = single_bucket_runner(inp)
    try:
        runner.capture()
        rpi_list, len_list = list(inp.rows), list(inp.lengths)
        _poison(runner.page_table, runner.swa_page_table)
        pt, swa = runner.replay(rpi_list, len_list)
        _sync(s.cuda)
        mismatch = check.compare(pt, swa)
        row["replay_exact"] = mismatch is None
        if mismatch:
            errors.append(f"replay: {mismatch}")
        if not s.cuda:
            return  # eager replays of the interpreter: no wall time worth reporting
        rpi_dev, len_dev = inp.req_pool_indices, inp.seq_lens
        row["replay_us"] = wall_time_us(
            lambda: runner.replay(rpi_dev, len_dev), s.replay_calls, cuda=True
        )
        row["replay_host_us"] = wall_time_us(
            lambda: runner.replay(rpi_list, len_list), s.replay_calls, cuda=True
        )
    finally:
        runner.close()


def _bench_builder(name: str, inp: BenchInputs, check: _Check, s: _Settings, row: dict) -> None:
    """Fill ``row`` for one builder; each measurement fails on its own, into ``row["error"]``."""
    cfg = inp.config
    fn = BUILDERS[name]
    page_table, swa_page_table, kwargs = _outputs(inp)
    r2t, rpi, lens, ps = inp.req_to_token, inp.req_pool_indices, inp.seq_lens, cfg.page_size

    def call() -> None:
        fn(r2t, rpi, lens, page_table, ps, **kwargs)

    errors: list[str] = []
    try:  # exactness first: an inexact builder is still timed, but flagged
        _poison(page_table, swa_page_table)
        call()
        _sync(s.cuda)
        mismatch = check.compare(page_table, swa_page_table)
        row["exact"] = mismatch is None
        row["mismatch"] = mismatch
    except Exception as exc:  # noqa: BLE001
        errors.append(f"check: {_error(exc)}")

    if s.cuda and name in GRAPH_SAFE and not errors:
        graph = None
        # Cycle over the rotated tables, so each build in the graph reads page starts the
        # previous one did not leave in L2; the last build uses the original table.
        tables = [*inp.rotated, r2t]
        rotation = Rotation(fn, tables, (rpi, lens, page_table, ps), kwargs)
        try:
            # L2-warm first: the same inputs every build, as a back-to-back microbenchmark sees.
            row["device_warm_us"], graph = device_time_us(call, s.builds, s.replays)
            del graph
            us, graph = device_time_us(rotation, s.builds, s.replays, rotation.reset)
            row["input_sets"] = len(tables)
            row["device_us"] = us
            if row["floor_us"] is not None and us > 0:
                row["fraction_of_floor"] = row["floor_us"] / us
            _poison(page_table, swa_page_table)
            graph.replay()
            torch.cuda.synchronize()
            mismatch = check.compare(page_table, swa_page_table)
            row["graph_exact"] = mismatch is None
            if mismatch:
                errors.append(f"graph: {mismatch}")
        except Exception as exc:  # noqa: BLE001
            errors.append(f"device time: {_error(exc)}")
        finally:
            del graph
            _recover(s.cuda)

    try:
        calls = s.eager_calls if s.cuda else max(3, s.eager_calls)
        row["eager_us"] = wall_time_us(call, calls, warmup=2 if not s.cuda else 10, cuda=s.cuda)
    except Exception as exc:  # noqa: BLE001
        errors.append(f"eager: {_error(exc)}")
        _recover(s.cuda)

    if name == "build_page_table":
        try:  # the same call with the checks done once (pagegraph.prepare_build)
            prepared = prepare_build(r2t, rpi, lens, page_table, ps, **kwargs)
            calls = s.eager_calls if s.cuda else max(3, s.eager_calls)
            row["eager_prepared_us"] = wall_time_us(
                prepared, calls, warmup=2 if not s.cuda else 10, cuda=s.cuda
            )
            _poison(page_table, swa_page_table)
            prepared()
            _sync(s.cuda)
            mismatch = check.compare(page_table, swa_page_table)
            if mismatch:
                errors.append(f"prepared: {mismatch}")
        except Exception as exc:  # noqa: BLE001
            errors.append(f"prepared: {_error(exc)}")
            _recover(s.cuda)
        try:
            _runner_replays(inp, check, s, row, errors)
        except Exception as exc:  # noqa: BLE001
            errors.append(f"replay: {_error(exc)}")
            _recover(s.cuda)
    if errors:
        row["error"] = "; ".join(errors)


def _recover(cuda: bool) -> None:
    if not cuda:
        return
    try:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    except Exception:  # noqa: BLE001 - a poisoned context: later rows will say so
        pass


def bench_config(
    cfg: BenchConfig,
    s: _Settings,
    env: dict,
    launch_floor: float | None,
    builders: Sequence[str] = tuple(BUILDERS),
) -> list[dict]:
    """One row per builder for ``cfg``; a failure is recorded in its row, never raised."""
    rows = [_base_row(cfg, b, env, launch_floor) for b in builders]
    device = "cuda" if s.cuda else "cpu"
    inp = check = None
    try:
        with phase("bench", cfg.bs):
            inp = make_inputs(cfg, device)
            check = _Check(inp)
    except Exception as exc:  # noqa: BLE001
        for row in rows:
            row["error"] = f"inputs: {_error(exc)}"
        _recover(s.cuda)
        return rows
    pages = live_pages(inp.lengths, cfg.page_size, cfg.width)
    nbytes = floor_bytes(pages, cfg.page_size, inp.req_to_token.element_size(), cfg.swa)
    if s.cuda:
        rotate_out_of_l2(inp, s.l2_bytes, s.builds)
    for row in rows:
        row["live_pages"] = pages
        row["bytes"] = nbytes
        row["l2_resident"] = nbytes < s.l2_bytes
        if s.bandwidth:
            row["floor_us"] = nbytes / s.bandwidth * 1e6
    for row in rows:
        with phase("bench", cfg.bs):
            try:
                _bench_builder(row["builder"], inp, check, s, row)
            except Exception as exc:  # noqa: BLE001
                row["error"] = _error(exc)
    del inp, check
    _recover(s.cuda)
    return rows


# -- sweeps -----------------------------------------------------------------------------------


def _sweep(
    name: str, x_name: str, configs: list[tuple[int, BenchConfig]], fixed: dict, s: _Settings
) -> dict:
    series: dict[str, list] = {b: [] for b in SWEEP_BUILDERS}
    exact: dict[str, list] = {b: [] for b in SWEEP_BUILDERS}
    errors: list[str] = []
    for x, cfg in configs:
        inp = check = None
        try:
            inp = make_inputs(cfg, "cuda")
            check = _Check(inp)
        except Exception as exc:  # noqa: BLE001
            errors.append(f"{x_name}={x}: inputs: {_error(exc)}")
            for b in SWEEP_BUILDERS:
                series[b].append(None)
                exact[b].append(None)
            _recover(True)
            continue
        rotate_out_of_l2(inp, s.l2_bytes, s.builds)  # as for the config rows
        tables = [*inp.rotated, inp.req_to_token]
        for b in SWEEP_BUILDERS:
            fn = BUILDERS[b]
            page_table, swa_page_table, kwargs = _outputs(inp)
            rest = (inp.req_pool_indices, inp.seq_lens, page_table, cfg.page_size)
            rotation = Rotation(fn, tables, rest, kwargs)
            graph = None
            try:
                fn(inp.req_to_token, *rest, **kwargs)
                torch.cuda.synchronize()
                exact[b].append(check.compare(page_table, swa_page_table) is None)
                us, graph = device_time_us(rotation, s.builds, s.replays, rotation.reset)
                series[b].append(us)
            except Exception as exc:  # noqa: BLE001
                errors.append(f"{x_name}={x} {b}: {_error(exc)}")
                series[b].append(None)
                if len(exact[b]) < len(series[b]):
                    exact[b].append(None)
            finally:
                del graph
                _recover(True)
        del inp, check
        _recover(True)
    return {
        "name": name,
        "x_name": x_name,
        "x": [x for x, _ in configs],
        "fixed": fixed,
        "series": series,
        "exact": exact,
        "errors": errors,
    }


def run_sweeps(s: _Settings, quick: bool = False) -> dict:
    bs_values = (1, 64, 512) if quick else SWEEP_BS
    ctx_values = (2 * K, 128 * K, 1024 * K) if quick else SWEEP_CONTEXT
    by_bs = [
        (bs, BenchConfig(f"sweep-bs{bs}", bs, 64, 128 * K, ("uniform", 1, 128 * K)))
        for bs in bs_values
    ]
    by_ctx = [
        (ctx, BenchConfig(f"sweep-ctx{_tokens(ctx)}", 64, 64, ctx, ("uniform", 1, ctx)))
        for ctx in ctx_values
    ]
    sweeps = {}
    for key, x_name, configs, fixed in (
        (
            "device_time_vs_bs",
            "bs",
            by_bs,
            {"page_size": 64, "max_context_len": 128 * K, "lengths": "uniform 1..128K"},
        ),
        (
            "device_time_vs_context",
            "max_context_len",
            by_ctx,
            {"bs": 64, "page_size": 64, "lengths": "uniform 1..max_context_len"},
        ),
    ):
        with phase("bench"):
            try:
                sweeps[key] = _sweep(key, x_name, configs, fixed, s)
            except Exception as exc:  # noqa: BLE001
                sweeps[key] = {"name": key, "x_name": x_name, "error": _error(exc)}
    return sweeps


def _plot(sweep: dict, path: Path, gpu: str, launch_floor: float | None) -> str | None:
    """Write one PNG; returns an error message instead of raising."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import matplotlib.ticker  # noqa: F401 - matplotlib.ticker below
    except Exception as exc:  # noqa: BLE001
        return f"matplotlib unavailable: {exc}"
    try:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        xs = sweep["x"]
        for builder, ys in sweep["series"].items():
            pts = [(x, y) for x, y in zip(xs, ys) if y is not None]
            if pts:
                ax.plot(*zip(*pts), marker="o", label=builder)
        if launch_floor:
            ax.axhline(launch_floor, color="grey", linestyle="--", label="launch floor")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
        ax.set_xticks(xs)
        if sweep["x_name"] == "max_context_len":
            ax.set_xticklabels([_tokens(x) for x in xs])
            ax.set_xlabel("max context (tokens), bs 64, page size 64, lengths uniform 1..ctx")
        else:
            ax.set_xticklabels([str(x) for x in xs])
            ax.set_xlabel("batch size, context 128K, page size 64, lengths uniform 1..128K")
        ax.set_ylabel("device time per build (us, log)")
        ax.set_title(f"{sweep['name'].replace('_', ' ')} on {gpu}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        plt.close(fig)
    except Exception as exc:  # noqa: BLE001
        return f"plot {path.name}: {_error(exc)}"
    return None


# -- report -----------------------------------------------------------------------------------


def _f(v, digits: int = 2, none: str = "n/a") -> str:
    if v is None:
        return none
    if isinstance(v, bool):
        return "yes" if v else "NO"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


def _row_for(rows: list[dict], config: str, builder: str) -> dict | None:
    for row in rows:
        if row["config"] == config and row["builder"] == builder:
            return row
    return None


def _speedup(rows: list[dict], config: str, other: str, key: str = "device_us") -> float | None:
    ours = _row_for(rows, config, "build_page_table")
    theirs = _row_for(rows, config, other)
    if not ours or not theirs or not ours.get(key) or not theirs.get(key):
        return None
    return theirs[key] / ours[key]


def targets(rows: list[dict], launch_floor: float | None, key: str = "device_us") -> list[dict]:
    """The H200 targets, each with its measured value and whether it is met (``None``: not
    measured), on device times ``key`` (``device_us``: inputs rotated out of L2;
    ``device_warm_us``: the same inputs every build). A target on an inexact
    ``build_page_table`` row is never met."""
    out = []

    def ours(config: str) -> dict | None:
        return _row_for(rows, config, "build_page_table")

    def add(target: str, value, met, unit: str, config: str | None) -> None:
        row = ours(config) if config else None
        if met and row is not None and row["exact"] is False:
            met = False
            target += " (inexact output)"
        out.append({"target": target, "measured": value, "unit": unit, "met": met})

    for config, limit in (("decode-large", 4.0), ("skewed", 2.0), ("ps1", 9.0), ("swa", 7.0)):
        row = ours(config)
        v = row.get(key) if row else None
        add(
            f"{config} device time <= {limit} us",
            v,
            None if v is None else v <= limit,
            "us",
            config,
        )
    for config in ("decode-small", "decode-mid"):
        row = ours(config)
        v = None
        if row and row.get(key) is not None and launch_floor is not None:
            v = row[key] - launch_floor
        add(
            f"{config} within 0.2 us of the launch floor",
            v,
            None if v is None else v <= 0.2,
            "us above floor",
            config,
        )
    v = _speedup(rows, "long-1m", "block_grid", key)
    add("long-1m >= 2x faster than block_grid", v, None if v is None else v >= 2.0, "x", "long-1m")
    for config in ("decode-large", "skewed", "long-1m", "ps1"):
        v = _speedup(rows, config, "static_width_gather", key)
        add(
            f"{config} >= 3x faster than static_width_gather",
            v,
            None if v is None else v >= 3.0,
            "x",
            config,
        )
    for field_name, what in (
        ("eager_us", "build_page_table"),
        ("eager_prepared_us", "PreparedBuild call"),
    ):
        eager = [
            (r[field_name], r["config"])
            for r in rows
            if r["builder"] == "build_page_table" and r.get(field_name) is not None
        ]
        worst, where = max(eager) if eager else (None, None)
        out.append(
            {
                "target": f"{what} eager wall time <= 12 us"
                + (f" (worst: {where})" if where else ""),
                "measured": worst,
                "unit": "us",
                "met": None if worst is None else worst <= 12.0,
            }
        )
    return out


def format_markdown(result: dict) -> str:
    env = result["env"]
    rows = result["rows"]
    cuda = env.get("cuda_available")
    lines = ["# pagegraph bench", ""]
    if not cuda:
        lines += [
            "**No CUDA device: this is a smoke run under the Triton interpreter** with tiny "
            f"shapes (bs {SMOKE_BS}, context {SMOKE_CONTEXT}, page sizes / 4). Device times, "
            "floors and replay times need a GPU and are not reported (n/a); the eager times "
            "below are the interpreter's and say nothing about a GPU.",
            "",
        ]
    lines += ["## Environment", "", "| key | value |", "|---|---|"]
    for key in ("device", "date", "torch", "triton", "cuda", "python", "sm_count", "l2_bytes"):
        lines.append(f"| {key} | {_f(env.get(key))} |")
    bw = env.get("bandwidth_bytes_per_s")
    lines.append("")
    if cuda:
        builds, replays = env.get("graph_builds"), env.get("graph_replays")
        lines += [
            f"- Device-to-device bandwidth: {_f(bw / 1e9 if bw else None, 0)} GB/s (read + "
            f"write, a {COPY_BYTES // 2**30} GiB copy_, median of event-timed copies).",
            f"- Launch floor: {_f(env.get('launch_floor_us'))} us per graph node (an empty "
            f"one-program Triton kernel, {builds} per graph).",
            f"- Device time: a CUDA graph of {builds} builds, median of {replays} event-timed "
            f"replays, / {builds}. `device us`: the builds of one graph cycle over several "
            "`req_to_token` tables with the same requests on other pages, so page starts come "
            "from DRAM, as after a forward pass has flushed L2. `L2-warm us`: every build "
            "reads the same inputs, as a back-to-back microbenchmark sees them.",
            f"- Eager: host wall time of one call, median of {env.get('eager_calls')}; in "
            "square brackets the same build through a `PreparedBuild` (`prepare_build`: checks "
            "done once, per call only the address checks and the launch). Replay: "
            "host wall time of one `GraphRunner.replay()` including staging, median of "
            f"{env.get('replay_calls')}, from device tensors and (in brackets) from host lists.",
            "- host_max_gather cannot be captured correctly (its `.item()` freezes the width at "
            "capture): eager time only.",
            "",
        ]
    else:
        lines += [
            f"- Eager: interpreter wall time of one call, median of {env.get('eager_calls')}.",
            "- exact: the output checked once against `expected_tables` on the live entries "
            "(replay: through `GraphRunner`, eagerly).",
            "",
        ]
    for note in result.get("notes", []):
        lines.append(f"> {note}")
    if result.get("notes"):
        lines.append("")

    configs = []
    for row in rows:
        if row["config"] not in configs:
            configs.append(row["config"])
    for config in configs:
        first = next(r for r in rows if r["config"] == config)
        mb = first["bytes"] / 1e6 if first["bytes"] is not None else None
        lines += [
            f"## {config}",
            "",
            f"bs {first['bs']}, page size {first['page_size']}, max context "
            f"{_tokens(first['max_context_len'])} (width {first['width']} pages), lengths "
            f"{first['lengths']}, SWA {'on' if first['swa'] else 'off'}; live pages "
            f"{_f(first['live_pages'])}, floor bytes {_f(first['bytes'])} ({_f(mb, 2)} MB"
            f"{', fits in L2' if first['l2_resident'] else ''}; device time cycles over "
            f"{_f(first.get('input_sets'))} input tables).",
            "",
            "| builder | device us | L2-warm us | floor us | % of floor | eager us | replay us "
            "| exact |",
            "|---|---:|---:|---:|---:|---:|---:|:---:|",
        ]
        errors = []
        for row in (r for r in rows if r["config"] == config):
            pct = row["fraction_of_floor"] * 100 if row["fraction_of_floor"] is not None else None
            replay = _f(row["replay_us"])
            if row["replay_host_us"] is not None:
                replay += f" ({_f(row['replay_host_us'])})"
            if row["builder"] != "build_page_table":
                replay = "-"
            device = _f(row["device_us"], 2)
            if row["builder"] not in GRAPH_SAFE:
                device = "n/a (no graph)"
            exact = _f(row["exact"])
            eager = _f(row["eager_us"], 1)
            if row.get("eager_prepared_us") is not None:
                eager += f" [{_f(row['eager_prepared_us'], 1)}]"
            if row["graph_exact"] is False or row["replay_exact"] is False:
                exact += " (graph: NO)"
            lines.append(
                f"| {row['builder']} | {device} | {_f(row.get('device_warm_us'), 2)} | "
                f"{_f(row['floor_us'], 3)} | {_f(pct, 1)} | "
                f"{eager} | {replay} | {exact} |"
            )
            if row["error"] or row["mismatch"]:
                errors.append(f"- {row['builder']}: {row['error'] or row['mismatch']}")
        lines.append("")
        if errors:
            lines += ["Errors:", "", *errors, ""]

    lines += [
        "## build_page_table speed-up (device time)",
        "",
        "| config | vs static_width_gather | vs block_grid |",
        "|---|---:|---:|",
    ]
    for config in configs:
        a = _speedup(rows, config, "static_width_gather")
        b = _speedup(rows, config, "block_grid")
        lines.append(f"| {config} | {_f(a, 2)}{'x' if a else ''} | {_f(b, 2)}{'x' if b else ''} |")
    lines += ["", "## Targets (H200)", ""]
    if not cuda:
        lines += ["Not checked: the targets are device and GPU wall times.", ""]
    for title, key in (
        ("inputs rotated out of L2 (`device_us`)", "targets"),
        ("same inputs every build, L2-warm (`device_warm_us`)", "targets_warm"),
    ):
        if not cuda:
            break
        lines += [f"### {title}", "", "| target | measured | met |", "|---|---:|:---:|"]
        for t in result.get(key, []):
            measured = _f(t["measured"], 2)
            if t["measured"] is not None:
                measured += f" {t['unit']}"
            met = "n/a" if t["met"] is None else ("yes" if t["met"] else "no")
            lines.append(f"| {t['target']} | {measured} | {met} |")
        lines.append("")

    sweeps = result.get("sweeps") or {}
    if sweeps:
        lines += ["## Sweeps", ""]
        for sweep in sweeps.values():
            if "series" not in sweep:
                lines += [f"- {sweep['name']}: {sweep.get('error')}", ""]
                continue
            xs = sweep["x"]
            label = _tokens if sweep["x_name"] == "max_context_len" else str
            lines += [
                f"### {sweep['name']} (device us per build)",
                "",
                f"| builder | {' | '.join(label(x) for x in xs)} |",
                f"|---|{'---:|' * len(xs)}",
            ]
            for builder, ys in sweep["series"].items():
                cells = []
                for y, ok in zip(ys, sweep["exact"][builder]):
                    cells.append(_f(y, 2) + (" (inexact)" if ok is False else ""))
                lines.append(f"| {builder} | {' | '.join(cells)} |")
            lines.append("")
            for err in sweep["errors"]:
                lines.append(f"- error: {err}")
            if sweep["errors"]:
                lines.append("")
    elif not cuda:
        lines += ["## Sweeps", "", "Not run: device-time sweeps need a GPU.", ""]
    for plot in result.get("plots", []):
        lines.append(f"![{plot}]({plot})")
    return "\n".join(lines).rstrip() + "\n"


# -- entry points -----------------------------------------------------------------------------


def _env(cuda: bool) -> dict:
    env = environment()
    env["cuda_available"] = cuda
    env["sm_count"] = None
    env["l2_bytes"] = None
    if cuda:
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        env["sm_count"] = getattr(props, "multi_processor_count", None)
        env["l2_bytes"] = getattr(props, "L2_cache_size", None)
    return env


def _settings(cuda: bool, quick: bool, env: dict) -> _Settings:
    l2 = env.get("l2_bytes") or DEFAULT_L2_BYTES
    if not cuda:
        return _Settings(False, 0, 0, 3, 0, None, l2)
    if quick:
        return _Settings(True, GRAPH_BUILDS, 20, 50, 50, None, l2)
    return _Settings(True, GRAPH_BUILDS, GRAPH_REPLAYS, EAGER_CALLS, REPLAY_CALLS, None, l2)


def run_bench(
    out_dir: str | Path = "profiles/bench",
    configs: Sequence[str] | None = None,
    quick: bool = False,
    plots: bool = True,
    sweeps: bool = True,
) -> dict:
    """Run the suite and write ``bench.json``, ``bench.md`` and (with a GPU) the two sweep
    PNGs into ``out_dir``; returns the result dict (``env``, ``rows``, ``targets``,
    ``sweeps``, ``notes``, ``plots``) and prints the markdown.

    ``configs``: names from ``CONFIG_NAMES`` (default all). ``quick``: fewer calls and replays
    and three points per sweep. Without CUDA: a tiny smoke run under the interpreter.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    cuda = torch.cuda.is_available()
    chosen = [get_config(n) for n in (configs or CONFIG_NAMES)]
    env = _env(cuda)
    s = _settings(cuda, quick, env)
    notes: list[str] = []
    env["bandwidth_bytes_per_s"] = None
    env["launch_floor_us"] = None
    if cuda:
        try:
            with phase("bench"):
                env["bandwidth_bytes_per_s"] = s.bandwidth = measure_bandwidth()
        except Exception as exc:  # noqa: BLE001
            notes.append(f"bandwidth not measured ({_error(exc)}): floor_us is n/a")
            _recover(True)
        try:
            with phase("bench"):
                env["launch_floor_us"] = measure_launch_floor(s.builds, s.replays)
        except Exception as exc:  # noqa: BLE001
            notes.append(f"launch floor not measured: {_error(exc)}")
            _recover(True)
    else:
        chosen = [smoke_config(c) for c in chosen]
        notes.append(
            "CPU smoke run (Triton interpreter): device fields are None; run on a GPU for "
            "device times, floors, replay times and sweeps."
        )
    if quick:
        notes.append("quick run: fewer calls and replays, three points per sweep")
    env.update(
        graph_builds=s.builds if cuda else None,
        graph_replays=s.replays if cuda else None,
        eager_calls=s.eager_calls,
        replay_calls=s.replay_calls if cuda else None,
        quick=quick,
    )

    rows: list[dict] = []
    for cfg in chosen:
        print(f"[bench] {cfg.name} ...", file=sys.stderr, flush=True)
        rows += bench_config(cfg, s, env, env["launch_floor_us"])

    result = {
        "env": env,
        "rows": rows,
        "targets": targets(rows, env["launch_floor_us"]) if cuda else [],
        "targets_warm": targets(rows, env["launch_floor_us"], "device_warm_us") if cuda else [],
        "sweeps": {},
        "notes": notes,
        "plots": [],
    }
    if cuda and sweeps:
        print("[bench] sweeps ...", file=sys.stderr, flush=True)
        result["sweeps"] = run_sweeps(s, quick)
        if plots:
            for key, sweep in result["sweeps"].items():
                if "series" not in sweep:
                    continue
                name = f"{key}.png"
                err = _plot(sweep, out / name, env["device"], env["launch_floor_us"])
                if err:
                    notes.append(err)
                else:
                    result["plots"].append(name)
    markdown = format_markdown(result)
    (out / "bench.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
    (out / "bench.md").write_text(markdown)
    print(markdown)
    return result


# -- tune -------------------------------------------------------------------------------------


def sweep_kernel_params(
    config_names: Sequence[str] | None = None,
    blocks: Sequence[int] = (64, 128, 256, 512),
    targets: Sequence[int] = (1024, 2048, 4096, 8192),
    num_warps: Sequence[int] = (4, 8),
    *,
    out_dir: str | Path = "profiles/bench",
    builds: int = 10,
    replays: int = 10,
) -> dict:
    """Device time of ``build_page_table`` per config for every (``BLOCK_PAGES``,
    ``TARGET_PROGRAMS``, ``NUM_WARPS``) combination; writes ``tune.json`` and ``tune.md``.

    The kernel module's globals are patched and restored afterwards (``programs_per_row``
    reads them, so the programs per row follow the block being tried), and its fast-launch
    cache (``pagegraph.kernel._compiled``) is cleared at every change. ``UNROLL`` stays at the
    kernel's value. Each combination is checked exactly.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    cuda = torch.cuda.is_available()
    env = _env(cuda)
    names = list(config_names or TUNE_CONFIGS)
    cfgs = [get_config(n) for n in names]
    if not cuda:
        cfgs = [smoke_config(c) for c in cfgs]
    device = "cuda" if cuda else "cpu"
    prepared: dict[str, tuple] = {}
    results: list[dict] = []
    input_errors: dict[str, str] = {}
    for cfg in cfgs:
        try:
            inp = make_inputs(cfg, device)
            if cuda:
                rotate_out_of_l2(inp, env.get("l2_bytes") or DEFAULT_L2_BYTES, builds)
            prepared[cfg.name] = (inp, _Check(inp))
        except Exception as exc:  # noqa: BLE001
            input_errors[cfg.name] = _error(exc)
            _recover(cuda)

    saved = (_kernel.BLOCK_PAGES, _kernel.TARGET_PROGRAMS, _kernel.NUM_WARPS)
    t_start = time.perf_counter()
    try:
        for block in blocks:
            for target in targets:
                for warps in num_warps:
                    _kernel.BLOCK_PAGES = block
                    _kernel.TARGET_PROGRAMS = target
                    _kernel.NUM_WARPS = warps
                    _kernel._compiled.clear()
                    for cfg in cfgs:
                        results.append(
                            _tune_one(
                                cfg,
                                prepared,
                                input_errors,
                                block,
                                target,
                                warps,
                                cuda,
                                builds,
                                replays,
                            )
                        )
    finally:
        _kernel.BLOCK_PAGES, _kernel.TARGET_PROGRAMS, _kernel.NUM_WARPS = saved
        _kernel._compiled.clear()
    elapsed = time.perf_counter() - t_start
    prepared.clear()
    _recover(cuda)

    result = {
        "env": env,
        "configs": [asdict(c) for c in cfgs],
        "defaults": {"block": saved[0], "target": saved[1], "num_warps": saved[2]},
        "unroll": _kernel.UNROLL,
        "graph_builds": builds,
        "graph_replays": replays,
        "elapsed_s": elapsed,
        "rows": results,
    }
    markdown = format_tune_markdown(result)
    (out / "tune.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
    (out / "tune.md").write_text(markdown)
    print(markdown)
    return result


def _tune_one(cfg, prepared, input_errors, block, target, warps, cuda, builds, replays) -> dict:
    row = {
        "config": cfg.name,
        "block": block,
        "target": target,
        "num_warps": warps,
        "programs_per_row": None,
        "device_us": None,
        "exact": None,
        "error": input_errors.get(cfg.name),
    }
    if cfg.name not in prepared:
        return row
    inp, check = prepared[cfg.name]
    max_pages = min(cfg.width, cdiv(inp.req_to_token.shape[1], cfg.page_size))
    row["programs_per_row"] = _kernel.programs_per_row(cfg.bs, max_pages)
    page_table, swa_page_table, kwargs = _outputs(inp)
    args = (inp.req_to_token, inp.req_pool_indices, inp.seq_lens, page_table, cfg.page_size)
    graph = None
    try:
        build_page_table(*args, **kwargs)
        _sync(cuda)
        mismatch = check.compare(page_table, swa_page_table)
        row["exact"] = mismatch is None
        if mismatch:
            row["error"] = mismatch
        if cuda:
            rotation = Rotation(build_page_table, [*inp.rotated, args[0]], args[1:], kwargs)
            us, graph = device_time_us(rotation, builds, replays, rotation.reset)
            row["device_us"] = us
    except Exception as exc:  # noqa: BLE001
        row["error"] = _error(exc)
    finally:
        del graph
        _recover(cuda)
    return row


def format_tune_markdown(result: dict) -> str:
    rows = result["rows"]
    configs = [c["name"] for c in result["configs"]]
    d = result["defaults"]
    cuda = result["env"].get("cuda_available")
    lines = [
        "# pagegraph kernel-parameter sweep",
        "",
        f"{result['env'].get('device')}, torch {result['env'].get('torch')}, triton "
        f"{result['env'].get('triton')}, {result['env'].get('date')}; device us per build "
        f"(graph of {result['graph_builds']}, median of {result['graph_replays']} replays); "
        f"C = programs per row; current defaults BLOCK {d['block']}, TARGET {d['target']}, "
        f"warps {d['num_warps']} (marked *), UNROLL {result.get('unroll', 1)} throughout; "
        f"fastest per config in bold; took "
        f"{result['elapsed_s']:.0f} s.",
        "",
    ]
    if not cuda:
        lines += [
            "**No CUDA device: interpreter smoke run, exactness only (device times n/a).**",
            "",
        ]
    best: dict[str, float] = {}
    for r in rows:
        if r["device_us"] is not None and r["exact"]:
            best[r["config"]] = min(best.get(r["config"], math.inf), r["device_us"])
    lines += [
        f"| BLOCK | TARGET | warps | {' | '.join(configs)} |",
        f"|---:|---:|---:|{'---:|' * len(configs)}",
    ]
    combos: list[tuple] = []
    for r in rows:
        key = (r["block"], r["target"], r["num_warps"])
        if key not in combos:
            combos.append(key)
    errors = []
    for key in combos:
        cells = []
        for name in configs:
            r = next(
                (
                    x
                    for x in rows
                    if (x["block"], x["target"], x["num_warps"]) == key and x["config"] == name
                ),
                None,
            )
            if r is None:
                cells.append("")
                continue
            cell = _f(r["device_us"], 2)
            if r["device_us"] is not None and r["device_us"] == best.get(name):
                cell = f"**{cell}**"
            if r["exact"] is False:
                cell += " (inexact)"
            cell += f" C={r['programs_per_row']}"
            cells.append(cell)
            if r["error"]:
                errors.append(f"- {name} {key}: {r['error']}")
        mark = "*" if key == (d["block"], d["target"], d["num_warps"]) else ""
        lines.append(f"| {key[0]}{mark} | {key[1]} | {key[2]} | {' | '.join(cells)} |")
    lines.append("")
    if errors:
        lines += ["Errors:", "", *errors[:50], ""]
    return "\n".join(lines)


# -- CLI --------------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Arguments of ``pagegraph bench``."""
    parser.add_argument("--out", default="profiles/bench", help="output folder")
    parser.add_argument(
        "--configs",
        nargs="+",
        metavar="NAME",
        choices=CONFIG_NAMES,
        help=f"configs to run (default all: {', '.join(CONFIG_NAMES)})",
    )
    parser.add_argument(
        "--quick", action="store_true", help="fewer calls and replays, 3 points per sweep"
    )
    parser.add_argument("--no-plots", action="store_true", help="do not write the PNGs")
    parser.add_argument("--no-sweeps", action="store_true", help="skip the plot sweeps")
    parser.add_argument(
        "--tune",
        action="store_true",
        help="sweep BLOCK_PAGES x TARGET_PROGRAMS x NUM_WARPS instead (tune.json, tune.md); "
        f"default configs {', '.join(TUNE_CONFIGS)}",
    )
    return parser


def run(args: argparse.Namespace) -> int:
    """``pagegraph bench``: 0 when every row ran and was exact, 1 otherwise."""
    if getattr(args, "tune", False):
        result = sweep_kernel_params(args.configs, out_dir=args.out)
        bad = [r for r in result["rows"] if r["error"] or r["exact"] is False]
        return 1 if bad else 0
    result = run_bench(
        out_dir=args.out,
        configs=args.configs,
        quick=args.quick,
        plots=not args.no_plots,
        sweeps=not getattr(args, "no_sweeps", False),
    )
    bad = [
        r
        for r in result["rows"]
        if r["error"] or False in (r["exact"], r["graph_exact"], r["replay_exact"])
    ]
    return 1 if bad else 0


# -- kernel -----------------------------------------------------------------------------------


@triton.jit
def _block_grid_kernel(
    req_to_token_ptr,  # [max_reqs, r2t_stride] int32|int64
    req_pool_indices_ptr,  # [bs] int32|int64
    seq_lens_ptr,  # [bs] int32|int64
    page_table_ptr,  # [bs, pt_stride] int32
    swa_page_table_ptr,  # [bs, swa_stride] int32 (aliases page_table_ptr without SWA)
    full_to_swa_ptr,  # [f2s_len] int32|int64 (unused without SWA)
    r2t_stride,
    r2t_rows,
    pt_stride,
    swa_stride,
    max_pages,  # min(width, cdiv(req_to_token.shape[1], page_size))
    page_size,
    f2s_len,
    HAS_SWA: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    start = tl.program_id(1).to(tl.int64) * BLOCK
    seq_len = tl.load(seq_lens_ptr + row).to(tl.int64)
    # Clamped to the width: the guard alone (seq_len) would let an overlong row spill into
    # the next one, which is what the contract forbids.
    n_pages = tl.minimum((tl.maximum(seq_len, 0) + page_size - 1) // page_size, max_pages)
    if start >= n_pages:
        return
    req = tl.load(req_pool_indices_ptr + row).to(tl.int64)
    req = tl.minimum(tl.maximum(req, 0), r2t_rows - 1)
    pages = start + tl.arange(0, BLOCK)
    live = pages < n_pages
    slot = tl.load(req_to_token_ptr + req * r2t_stride + pages * page_size, mask=live, other=0)
    pt_row = page_table_ptr + row.to(tl.int64) * pt_stride
    tl.store(pt_row + pages, (slot // page_size).to(tl.int32), mask=live)
    if HAS_SWA:
        idx = tl.minimum(tl.maximum(slot.to(tl.int64), 0), f2s_len - 1)
        swa_slot = tl.load(full_to_swa_ptr + idx, mask=live, other=0)
        swa_row = swa_page_table_ptr + row.to(tl.int64) * swa_stride
        tl.store(swa_row + pages, (swa_slot // page_size).to(tl.int32), mask=live)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pagegraph.bench", description=__doc__.split("\n")[0]
    )
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    # Run the importable module, not this __main__ copy, so the kernels have one home.
    from pagegraph.bench import main as _main

    sys.exit(_main())
