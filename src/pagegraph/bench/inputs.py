"""Inputs of one config, the tables that push them out of L2, and the exactness check.

``make_inputs`` makes a ``req_to_token`` table with random page placement, the batch and (SWA
configs) a ``full_to_swa`` map on the device. One build's page starts fit in the L2 for most
configs, so ``rotate_out_of_l2`` adds copies of the table, the same requests on other pages,
four times the L2 in all, and ``Rotation`` cycles a builder over them. ``make_outputs``,
``poison`` and ``Check`` compare the live entries exactly with ``expected_tables``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

import torch

from ..kernels.contract import POISON, cdiv
from ..kernels.table_reference import expected_tables
from .bench_settings import recover
from .configs import BenchConfig
from .floors import floor_bytes, live_pages


@dataclass
class BenchInputs:
    """Inputs of one config, on one device.

    ``req_to_token [bs + 1, max_context_len]`` int32 (int64 when the slots need it; row 0 a
    dummy), ``req_pool_indices [bs]`` and ``seq_lens [bs]`` int32, ``full_to_swa
    [num_slots + 1]`` int64 (SWA configs only); ``lengths`` and ``rows`` are the same batch
    as host lists."""

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


# -- L2 rotation ------------------------------------------------------------------------------


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

    def __init__(
        self,
        fn: Callable[..., object],
        tables: list[torch.Tensor],
        rest: tuple[Any, ...],
        kwargs: dict[str, Any],
    ):
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
        recover(True)


# -- outputs and the exactness check ----------------------------------------------------------


def make_outputs(inp: BenchInputs) -> tuple[torch.Tensor, torch.Tensor | None, dict[str, Any]]:
    """``(page_table, swa_page_table or None, kwargs)``: ``[bs, width]`` int32 tables filled
    with ``POISON``, and the SWA keyword arguments of a builder call (empty without SWA)."""
    cfg = inp.config
    dev = inp.req_to_token.device
    page_table = torch.full((cfg.bs, cfg.width), POISON, dtype=torch.int32, device=dev)
    swa_page_table = torch.full_like(page_table, POISON) if cfg.swa else None
    kwargs = {}
    if cfg.swa:
        kwargs = {"swa_page_table": swa_page_table, "full_to_swa": inp.full_to_swa}
    return page_table, swa_page_table, kwargs


def poison(*tables: torch.Tensor | None) -> None:
    """Refill the given tables (``None`` skipped) with ``POISON``."""
    for t in tables:
        if t is not None:
            t.fill_(POISON)


def live_mask(inp: BenchInputs, device: str | torch.device) -> torch.Tensor:
    """``[bs, width]`` bool: the entries a builder must write for ``inp``'s lengths."""
    cfg = inp.config
    cap = min(cfg.width, cdiv(inp.req_to_token.shape[1], cfg.page_size))
    n = (inp.seq_lens.to(torch.int64).clamp(min=0) + cfg.page_size - 1) // cfg.page_size
    n = n.clamp(max=cap)
    return torch.arange(cfg.width, device=device)[None, :] < n[:, None]


class Check:
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
        self.live = live_mask(inp, inp.req_to_token.device)

    def compare(self, page_table: torch.Tensor, swa_page_table: torch.Tensor | None) -> str | None:
        """``None`` when exact, else where the first live entry differs."""
        tables = [("page_table", page_table, self.want)]
        if self.want_swa is not None:
            # with SWA the caller passes its table
            tables.append(("swa_page_table", cast(torch.Tensor, swa_page_table), self.want_swa))
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
