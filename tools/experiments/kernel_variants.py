"""Kernel-design experiments behind profiles/bench/NOTES.md (GPU machine).

Times design variants of the page-table kernel on the bench configs, each one checked exactly
against the reference first, with the bench's own timing (a CUDA graph of builds, median of
event-timed replays; ``rot`` cycles over tables rotated out of L2, ``warm`` reads one table):

* ``current``: ``pagegraph.build_page_table`` as committed; ``block_grid``: the baseline
  (``pagegraph.kernels.baselines``).
* ``v:...``: one generic variant kernel with these switches:
  ``swap`` (row on grid axis 1, so the programs of all rows interleave across SMs instead of
  row-major), ``ps`` (page size a constexpr: divisions become shifts), ``i32`` (in-row page
  arithmetic in 32 bits), ``cg`` (page-start loads bypass L1), ``uN`` (N blocks per loop
  iteration, ``blk, blk + C, ...``, as one ``[N, BLOCK]`` tile whose loads are all issued
  before the stores; Triton gives a 2-D tile two register layouts and a shared-memory shuffle
  between gather and store), ``flat`` (the same tile as one 1-D range: one layout),
  ``bN`` / ``tN`` / ``wN`` (block, target programs, warps).
* ``p:...``: a grid planned on the device: every program of a group of ``rN`` rows takes a
  prefix sum of the rows' block counts, then walks blocks of any row of the group (``bN``
  block, ``pN`` programs per group, ``uN`` blocks a pass, ``wN`` warps, ``ld`` reloads a
  block's row scalars instead of selecting them from registers).
* ``m:...``: several rows a program: ``rN`` rows share each program of the grid
  ``(C, cdiv(bs, N))``, one 1-D tile holding ``uN`` blocks of ``bN`` pages of every row,
  the loop bound the longest row of the group (``tN`` cap on the grid, ``wN`` warps).
  ``m:r1`` is the one-row-a-program design committed before ``ROWS_PER_PROGRAM``.
* ``oracle``: a grid planned on the host from the lengths (one program per live block, its
  row, first page, page count and row offset precomputed): what a length-aware launch could
  reach if it were allowed the host sync. Not graph-safe; a floor for the access pattern.
* ``chain``: one program doing the kernel's minimal dependent chain (load a length, load a
  page start at an address that depends on it, store): the latency any build pays above the
  empty-kernel launch floor.

Usage: ``PYTHONPATH=src python tools/experiments/kernel_variants.py [--sweep N | --variants
...] [--configs ...] [--json PATH]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

import torch
import triton
import triton.language as tl

from pagegraph import bench as B
from pagegraph import build_page_table
from pagegraph.kernels.contract import cdiv


@triton.jit
def _variant_kernel(
    r2t_ptr,
    rpi_ptr,
    sl_ptr,
    pt_ptr,
    swa_pt_ptr,
    f2s_ptr,
    r2t_stride,
    r2t_rows,
    pt_stride,
    max_pages,
    page_size_arg,
    f2s_len,
    HAS_SWA: tl.constexpr,
    BLOCK: tl.constexpr,
    PS: tl.constexpr,  # 0: page size from page_size_arg
    SWAP: tl.constexpr,
    I32: tl.constexpr,
    CG: tl.constexpr,
    U: tl.constexpr,  # blocks per iteration: blk, blk + parts, ..., as one [U, BLOCK] tile
    FLAT: tl.constexpr,  # the tile as one 1-D range of U * BLOCK offsets instead
):
    if SWAP:
        row = tl.program_id(1)
        part = tl.program_id(0)
        parts = tl.num_programs(0)
    else:
        row = tl.program_id(0)
        part = tl.program_id(1)
        parts = tl.num_programs(1)
    if PS > 0:
        page_size = PS
    else:
        page_size = page_size_arg
    seq_len = tl.load(sl_ptr + row)
    req = tl.load(rpi_ptr + row).to(tl.int64)
    req = tl.minimum(tl.maximum(req, 0), r2t_rows - 1)
    if I32:
        seq_len = tl.minimum(tl.maximum(seq_len.to(tl.int32), 0), max_pages * page_size)
        n_pages = (seq_len + page_size - 1) // page_size
        if FLAT:
            flat = tl.arange(0, U * BLOCK)
            tile = (flat // BLOCK) * (parts * BLOCK) + flat % BLOCK
        else:
            tile = tl.arange(0, U)[:, None] * (parts * BLOCK) + tl.arange(0, BLOCK)[None, :]
        blk = part
    else:
        seq_len = seq_len.to(tl.int64)
        n_pages = tl.minimum((tl.maximum(seq_len, 0) + page_size - 1) // page_size, max_pages)
        if FLAT:
            flat = tl.arange(0, U * BLOCK)
            tile = (flat // BLOCK) * (parts * BLOCK) + flat % BLOCK
        else:
            tile = tl.arange(0, U)[:, None] * (parts * BLOCK) + tl.arange(0, BLOCK)[None, :]
        tile = tile.to(tl.int64)
        blk = part.to(tl.int64)
    r2t_row = r2t_ptr + req * r2t_stride
    pt_row = pt_ptr + row.to(tl.int64) * pt_stride
    swa_row = swa_pt_ptr + row.to(tl.int64) * pt_stride
    n_blocks = (n_pages + BLOCK - 1) // BLOCK
    while blk < n_blocks:
        pages = blk * BLOCK + tile
        live = pages < n_pages
        if CG:
            slot = tl.load(r2t_row + pages * page_size, mask=live, other=0, cache_modifier=".cg")
        else:
            slot = tl.load(r2t_row + pages * page_size, mask=live, other=0)
        tl.store(pt_row + pages, (slot // page_size).to(tl.int32), mask=live)
        if HAS_SWA:
            idx = tl.minimum(tl.maximum(slot.to(tl.int64), 0), f2s_len - 1)
            w = tl.load(f2s_ptr + idx, mask=live, other=0)
            tl.store(swa_row + pages, (w // page_size).to(tl.int32), mask=live)
        blk += parts * U


def variant(spec: str):
    """A builder for ``v:flag+flag+...`` (see the module docstring)."""
    flags = set(spec.split("+")) if spec else set()
    block, target, warps = 256, 8192, 4
    for f in list(flags):
        if f[0] in "btw" and f[1:].isdigit():
            flags.discard(f)
            block, target, warps = (
                (int(f[1:]), target, warps)
                if f[0] == "b"
                else (block, int(f[1:]), warps)
                if f[0] == "t"
                else (block, target, int(f[1:]))
            )
    unroll = 1
    for f in list(flags):
        if f[0] == "u" and f[1:].isdigit():
            flags.discard(f)
            unroll = int(f[1:])
    unknown = flags - {"swap", "ps", "i32", "cg", "flat"}
    if unknown:
        raise ValueError(f"unknown variant flags {sorted(unknown)}")

    def build(r2t, rpi, sl, pt, ps, *, swa_page_table=None, full_to_swa=None):
        bs, width = pt.shape
        max_pages = min(width, cdiv(r2t.shape[1], ps))
        c = max(1, min(cdiv(max_pages, block * unroll), target // bs))
        grid = (c, bs) if "swap" in flags else (bs, c)
        has_swa = full_to_swa is not None
        _variant_kernel[grid](
            r2t,
            rpi,
            sl,
            pt,
            swa_page_table if has_swa else pt,
            full_to_swa if has_swa else pt,
            r2t.stride(0),
            r2t.shape[0],
            pt.stride(0),
            max_pages,
            ps,
            full_to_swa.shape[0] if has_swa else 1,
            HAS_SWA=has_swa,
            BLOCK=block,
            PS=ps if "ps" in flags else 0,
            SWAP="swap" in flags,
            I32="i32" in flags,
            CG="cg" in flags,
            U=unroll,
            FLAT="flat" in flags,
            num_warps=warps,
        )

    return build


# -- device-planned variants -----------------------------------------------------------------


@triton.jit
def _planned_kernel(
    r2t_ptr, rpi_ptr, sl_ptr, pt_ptr, swa_pt_ptr, f2s_ptr,
    r2t_stride, r2t_rows, pt_stride, capacity, f2s_len, bs,
    PAGE_SIZE: tl.constexpr, HAS_SWA: tl.constexpr, BLOCK: tl.constexpr, ROWS: tl.constexpr,
    LD: tl.constexpr, U: tl.constexpr,
):  # fmt: skip
    # Grid (P, groups): the P programs of a group of ROWS rows share its live blocks. Every
    # program loads the group's lengths, prefix-sums their block counts and takes global
    # blocks part, part + P, ... of the group, each located by a search of the prefix sum.
    part = tl.program_id(0)
    parts = tl.num_programs(0)
    first_row = tl.program_id(1) * ROWS
    r = tl.arange(0, ROWS)
    in_b = first_row + r < bs
    seq = tl.load(sl_ptr + first_row + r, mask=in_b, other=0)
    tokens = tl.minimum(tl.maximum(seq, 0), capacity).to(tl.int32)
    npg = (tokens + PAGE_SIZE - 1) // PAGE_SIZE
    nb = (npg + BLOCK - 1) // BLOCK
    cum = tl.cumsum(nb, 0)
    total = tl.sum(nb, 0)
    if not LD:
        reqs = tl.load(rpi_ptr + first_row + r, mask=in_b, other=0)
    lane = tl.arange(0, U * BLOCK)
    sub = lane // BLOCK
    off = lane % BLOCK
    b = part
    while b < total:
        if U == 1:
            before = cum <= b
            row = tl.sum(before.to(tl.int32), 0)
            start = tl.sum(tl.where(before, nb, 0), 0)
            if LD:
                n_tok = tl.minimum(tl.maximum(tl.load(sl_ptr + first_row + row), 0), capacity)
                n_row = (n_tok.to(tl.int32) + PAGE_SIZE - 1) // PAGE_SIZE
                req = tl.load(rpi_ptr + first_row + row).to(tl.int64)
            else:
                hit = r == row
                n_row = tl.sum(tl.where(hit, npg, 0), 0)
                req = tl.sum(tl.where(hit, reqs, 0), 0).to(tl.int64)
            pages = (b - start) * BLOCK + lane
            live = pages < n_row
            row_l = first_row + row
        else:
            b1 = b + parts
            before0 = cum <= b
            before1 = cum <= b1
            row0 = tl.sum(before0.to(tl.int32), 0)
            row1 = tl.sum(before1.to(tl.int32), 0)
            start0 = tl.sum(tl.where(before0, nb, 0), 0)
            start1 = tl.sum(tl.where(before1, nb, 0), 0)
            hit0 = r == row0
            hit1 = r == row1
            n0 = tl.sum(tl.where(hit0, npg, 0), 0)
            n1 = tl.sum(tl.where(hit1, npg, 0), 0)
            q0 = tl.sum(tl.where(hit0, reqs, 0), 0).to(tl.int64)
            q1 = tl.sum(tl.where(hit1, reqs, 0), 0).to(tl.int64)
            second = sub == 1
            pages = tl.where(second, (b1 - start1) * BLOCK, (b - start0) * BLOCK) + off
            n_row = tl.where(second, n1, n0)
            live = (pages < n_row) & (tl.where(second, b1, b) < total)
            req = tl.where(second, q1, q0)
            row_l = first_row + tl.where(second, row1, row0)
        req = tl.minimum(tl.maximum(req, 0), r2t_rows - 1)
        slot = tl.load(r2t_ptr + req * r2t_stride + pages * PAGE_SIZE, mask=live, other=0)
        pt_off = row_l.to(tl.int64) * pt_stride + pages
        tl.store(pt_ptr + pt_off, (slot // PAGE_SIZE).to(tl.int32), mask=live)
        if HAS_SWA:
            idx = tl.minimum(tl.maximum(slot.to(tl.int64), 0), f2s_len - 1)
            w = tl.load(f2s_ptr + idx, mask=live, other=0)
            tl.store(swa_pt_ptr + pt_off, (w // PAGE_SIZE).to(tl.int32), mask=live)
        b += parts * U


def _row_group_args(r2t, rpi, sl, pt, ps, max_pages, swa_page_table, full_to_swa) -> tuple:
    """The positional arguments shared by ``_planned_kernel`` and ``_multirow_kernel``: the six
    tensors (unused ones alias ``pt``), the strides and bounds, and the batch size."""
    has_swa = full_to_swa is not None
    return (
        r2t,
        rpi,
        sl,
        pt,
        swa_page_table if has_swa else pt,
        full_to_swa if has_swa else pt,
        r2t.stride(0),
        r2t.shape[0],
        pt.stride(0),
        max_pages * ps,
        full_to_swa.shape[0] if has_swa else 1,
        pt.shape[0],
    )


def planned(spec: str):
    """A builder for ``p:flag+flag+...``: ``bN`` block pages, ``pN`` cap on programs per row
    group, ``rN`` rows per group, ``wN`` warps, ``ld`` (a block's row length and request
    reloaded from memory instead of picked from registers), ``u2`` (two blocks a pass)."""
    block, cap, rows, warps, ld, unroll = 256, 1056, 256, 4, False, 1
    for f in spec.split("+") if spec else ():
        if f == "ld":
            ld = True
        elif f[0] in "bprwu" and f[1:].isdigit():
            v = int(f[1:])
            if f[0] == "b":
                block = v
            elif f[0] == "p":
                cap = v
            elif f[0] == "r":
                rows = v
            elif f[0] == "w":
                warps = v
            else:
                unroll = v
        else:
            raise ValueError(f"unknown planned flag {f!r}")

    def build(r2t, rpi, sl, pt, ps, *, swa_page_table=None, full_to_swa=None):
        bs, width = pt.shape
        max_pages = min(width, cdiv(r2t.shape[1], ps))
        groups = cdiv(bs, rows)
        p = max(1, min(cdiv(min(bs, rows) * cdiv(max_pages, block), unroll), cap))
        _planned_kernel[(p, groups)](
            *_row_group_args(r2t, rpi, sl, pt, ps, max_pages, swa_page_table, full_to_swa),
            PAGE_SIZE=ps,
            HAS_SWA=full_to_swa is not None,
            BLOCK=block,
            ROWS=rows,
            LD=ld,
            U=unroll,
            num_warps=warps,
        )

    return build


# -- several rows a program -------------------------------------------------------------------


@triton.jit
def _multirow_kernel(
    r2t_ptr, rpi_ptr, sl_ptr, pt_ptr, swa_pt_ptr, f2s_ptr,
    r2t_stride, r2t_rows, pt_stride, capacity, f2s_len, bs,
    PAGE_SIZE: tl.constexpr, HAS_SWA: tl.constexpr, BLOCK: tl.constexpr, U: tl.constexpr,
    R: tl.constexpr,
):  # fmt: skip
    # Grid (C, cdiv(bs, R)): program j of row group g owns blocks j, j + C, ... of each of
    # the group's R rows; one 1-D tile holds U blocks of every row, so R rows cost one
    # program instead of R (a grid of programs that exit at once costs ~0.6 ns a program).
    part = tl.program_id(0)
    parts = tl.num_programs(0)
    first = tl.program_id(1) * R
    rr = first + tl.arange(0, R)
    lens = tl.load(sl_ptr + rr, mask=rr < bs, other=0)
    toks = tl.minimum(tl.maximum(lens, 0), capacity).to(tl.int32)
    nb_max = tl.max((toks + PAGE_SIZE * BLOCK - 1) // (PAGE_SIZE * BLOCK), 0)
    flat = tl.arange(0, R * U * BLOCK)
    row = first + flat // (U * BLOCK)
    pos = flat % (U * BLOCK)
    tile = (pos // BLOCK) * (parts * BLOCK) + pos % BLOCK
    in_b = row < bs
    seq = tl.load(sl_ptr + row, mask=in_b, other=0)
    req = tl.load(rpi_ptr + row, mask=in_b, other=0).to(tl.int64)
    req = tl.minimum(tl.maximum(req, 0), r2t_rows - 1)
    n_pages = (tl.minimum(tl.maximum(seq, 0), capacity).to(tl.int32) + PAGE_SIZE - 1) // PAGE_SIZE
    r2t_row = r2t_ptr + req * r2t_stride
    pt_row = pt_ptr + row.to(tl.int64) * pt_stride
    swa_row = swa_pt_ptr + row.to(tl.int64) * pt_stride
    blk = part
    while blk < nb_max:
        pages = blk * BLOCK + tile
        live = pages < n_pages
        slot = tl.load(r2t_row + pages * PAGE_SIZE, mask=live, other=0)
        tl.store(pt_row + pages, (slot // PAGE_SIZE).to(tl.int32), mask=live)
        if HAS_SWA:
            idx = tl.minimum(tl.maximum(slot.to(tl.int64), 0), f2s_len - 1)
            w = tl.load(f2s_ptr + idx, mask=live, other=0)
            tl.store(swa_row + pages, (w // PAGE_SIZE).to(tl.int32), mask=live)
        blk += parts * U


def multirow(spec: str):
    """A builder for ``m:flag+...``: ``rN`` rows a program, ``bN`` block pages, ``uN`` blocks
    a pass, ``tN`` cap on the grid, ``wN`` warps."""
    vals = {"r": 2, "b": 128, "u": 2, "t": 8192, "w": 4}
    for f in spec.split("+") if spec else ():
        if f[0] not in vals or not f[1:].isdigit():
            raise ValueError(f"unknown multirow flag {f!r}")
        vals[f[0]] = int(f[1:])
    rows, block, unroll, target, warps = (vals[k] for k in "rbutw")

    def build(r2t, rpi, sl, pt, ps, *, swa_page_table=None, full_to_swa=None):
        bs, width = pt.shape
        max_pages = min(width, cdiv(r2t.shape[1], ps))
        groups = cdiv(bs, rows)
        c = max(1, min(cdiv(max_pages, block * unroll), target // groups))
        _multirow_kernel[(c, groups)](
            *_row_group_args(r2t, rpi, sl, pt, ps, max_pages, swa_page_table, full_to_swa),
            PAGE_SIZE=ps,
            HAS_SWA=full_to_swa is not None,
            BLOCK=block,
            U=unroll,
            R=rows,
            num_warps=warps,
        )

    return build


# -- the host-planned oracle ------------------------------------------------------------------

ORACLE_BLOCK = 256


@triton.jit
def _oracle_kernel(
    r2t_ptr, plan_ptr, pt_ptr, swa_pt_ptr, f2s_ptr, pt_stride, f2s_len, page_size,
    HAS_SWA: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    # plan [programs, 4] int64: batch row, first page, pages in this block, r2t row offset
    base = plan_ptr + tl.program_id(0) * 4
    row = tl.load(base)
    first = tl.load(base + 1)
    count = tl.load(base + 2)
    r2t_off = tl.load(base + 3)
    lane = tl.arange(0, BLOCK)
    live = lane < count
    pages = first + lane
    slot = tl.load(r2t_ptr + r2t_off + pages * page_size, mask=live, other=0)
    tl.store(pt_ptr + row * pt_stride + pages, (slot // page_size).to(tl.int32), mask=live)
    if HAS_SWA:
        w = tl.load(f2s_ptr + tl.minimum(slot.to(tl.int64), f2s_len - 1), mask=live, other=0)
        tl.store(swa_pt_ptr + row * pt_stride + pages, (w // page_size).to(tl.int32), mask=live)


def oracle(inp: B.BenchInputs):
    """The host-planned builder for ``inp``'s lengths (planned once, outside the timing)."""
    cfg = inp.config
    plan = []
    stride = inp.req_to_token.stride(0)
    for i, (n_tok, r) in enumerate(zip(inp.lengths, inp.rows, strict=True)):
        n = min(cdiv(n_tok, cfg.page_size), cfg.width)
        for first in range(0, n, ORACLE_BLOCK):
            plan.append((i, first, min(ORACLE_BLOCK, n - first), r * stride))
    plan_t = torch.tensor(plan or [(0, 0, 0, 0)], dtype=torch.int64, device=inp.req_to_token.device)

    def build(r2t, rpi, sl, pt, ps, *, swa_page_table=None, full_to_swa=None):
        has_swa = full_to_swa is not None
        _oracle_kernel[(plan_t.shape[0],)](
            r2t,
            plan_t,
            pt,
            swa_page_table if has_swa else pt,
            full_to_swa if has_swa else pt,
            pt.stride(0),
            full_to_swa.shape[0] if has_swa else 1,
            ps,
            HAS_SWA=has_swa,
            BLOCK=ORACLE_BLOCK,
            num_warps=4,
        )

    return build


# -- the dependent-chain floor ----------------------------------------------------------------


@triton.jit
def _chain_kernel(len_ptr, table_ptr, out_ptr):
    n = tl.load(len_ptr)  # like seq_lens[row]
    lane = tl.arange(0, 32)
    v = tl.load(table_ptr + lane * 64, mask=lane < n, other=0)  # page starts, after n
    tl.store(out_ptr + lane, v, mask=lane < n)


def chain_floor_us(builds: int, replays: int) -> float:
    lens = torch.full((1,), 8, dtype=torch.int32, device="cuda")
    table = torch.arange(64 * 64, dtype=torch.int32, device="cuda")
    out = torch.zeros(32, dtype=torch.int32, device="cuda")
    us, graph = B.device_time_us(lambda: _chain_kernel[(1,)](lens, table, out), builds, replays)
    del graph
    return us


# -- driver -----------------------------------------------------------------------------------


def _sweep2() -> tuple[str, ...]:
    out = ["current", "oracle"]
    for swap in ("", "swap+"):
        for block, unroll in ((256, 1), (256, 2), (256, 4), (128, 2), (128, 4), (512, 2)):
            for target in (4096, 8192, 16384):
                out.append(f"v:{swap}ps+i32+b{block}+u{unroll}+t{target}")
    return tuple(out)


#: The first sweep (NOTES.md, variants 5-6): one switch at a time, then combinations.
SWEEP1 = (
    "current",
    "block_grid",
    "v:",
    "v:swap",
    "v:ps",
    "v:i32+ps",
    "v:cg",
    "v:swap+ps+i32",
    "v:swap+ps+i32+cg",
    "v:swap+ps+i32+b128+t16384",
    "v:swap+ps+i32+b128+t16384+w2",
    "v:swap+ps+i32+b512+w8",
    "v:swap+ps+i32+u2",
    "v:swap+ps+i32+t16384",
    "oracle",
)
#: The third: the committed kernel (1-D tile) against its 2-D-tile twin and neighbours.
SWEEP3 = (
    "current",
    "block_grid",
    "oracle",
    "v:swap+ps+i32+b128+u2+t8192",
    "v:swap+ps+i32+b128+u2+t8192+flat",
    "v:swap+ps+i32+b128+u4+t8192+flat",
    "v:swap+ps+i32+b256+u2+t8192+flat",
    "v:swap+ps+i32+b64+u4+t8192+flat",
    "v:swap+ps+i32+b128+u2+t4096+flat",
    "v:swap+ps+i32+b128+u2+t8192+flat+w2",
    "v:ps+i32+b128+u2+t8192+flat",
)
#: The fourth: device-planned grids (a prefix sum of the block counts in every program).
SWEEP4 = (
    "current",
    "oracle",
    "p:",
    "p:ld",
    "p:p528",
    "p:p2112",
    "p:b128+p1056",
    "p:b128+p2112",
    "p:u2+b128+p1056",
    "p:u2+b128+p528",
    "p:r1024",
    "p:w8+b512+p528",
)
#: The fifth: rows a program, and its tile and grid cap.
SWEEP5 = (
    "current",
    "oracle",
    "m:r1",
    "m:r2",
    "m:r4",
    "m:r2+b256+u1",
    "m:r2+t2048",
    "m:r4+b64+u2",
)
SWEEPS = {"1": SWEEP1, "2": _sweep2(), "3": SWEEP3, "4": SWEEP4, "5": SWEEP5}


def measure(configs, variants, builds, replays) -> dict:
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    rows = []
    for name in configs:
        cfg = B.get_config(name)
        inp = B.make_inputs(cfg, "cuda")
        B.rotate_out_of_l2(inp, l2, builds)
        check = B.Check(inp)
        for spec in variants:
            if spec == "current":
                fn = build_page_table
            elif spec == "block_grid":
                fn = B.block_grid
            elif spec == "oracle":
                fn = oracle(inp)
            elif spec.startswith("p:"):
                fn = planned(spec[2:])
            elif spec.startswith("m:"):
                fn = multirow(spec[2:])
            else:
                fn = variant(spec[2:])
            pt, swa, kwargs = B.make_outputs(inp)
            args = (inp.req_to_token, inp.req_pool_indices, inp.seq_lens, pt, cfg.page_size)
            row = {"config": name, "variant": spec}
            try:
                fn(*args, **kwargs)
                torch.cuda.synchronize()
                row["exact"] = check.compare(pt, swa) is None
                rot = B.Rotation(fn, [*inp.rotated, args[0]], args[1:], kwargs)
                row["rot_us"], g = B.device_time_us(rot, builds, replays, rot.reset)
                del g
                row["warm_us"], g = B.device_time_us(
                    B.Rotation(fn, [args[0]], args[1:], kwargs), builds, replays
                )
                del g
            except Exception as exc:  # noqa: BLE001
                row["error"] = f"{type(exc).__name__}: {exc}"[:300]
            rows.append(row)
            nan = float("nan")
            rot_us, warm_us = row.get("rot_us", nan), row.get("warm_us", nan)
            err = f" {row['error']}" if "error" in row else ""
            print(
                f"{name:13s} {spec:36s} exact={row.get('exact')} "
                f"rot={rot_us:7.2f} warm={warm_us:7.2f}{err}",
                flush=True,
            )
        del inp, check
        torch.cuda.empty_cache()
    empty = B.measure_launch_floor(builds, replays)
    chain = statistics.median(chain_floor_us(builds, replays) for _ in range(3))
    print(f"launch floor {empty:.2f} us, dependent-chain floor {chain:.2f} us")
    return {"rows": rows, "launch_floor_us": empty, "chain_floor_us": chain, "builds": builds}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--configs", nargs="*", default=[c.name for c in B.CONFIGS])
    p.add_argument("--sweep", choices=sorted(SWEEPS), default="3")
    p.add_argument("--variants", nargs="*", help="instead of a sweep's list")
    p.add_argument("--builds", type=int, default=20)
    p.add_argument("--replays", type=int, default=30)
    p.add_argument("--json")
    a = p.parse_args(argv)
    result = measure(a.configs, a.variants or SWEEPS[a.sweep], a.builds, a.replays)
    result["env"] = B.bench_environment(True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1, default=str)
    return 0 if all(r.get("exact") for r in result["rows"]) else 1


if __name__ == "__main__":
    sys.exit(main())
