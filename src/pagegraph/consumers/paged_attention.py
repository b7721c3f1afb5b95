"""Paged decode attention: the consumer of the page tables pagegraph's builders write.

``paged_decode_attention`` reads a page table and ``cache_seqlens``, ``csr_decode_attention``
FlashInfer's ``kv_indptr`` / ``kv_indices`` / ``kv_last_page_len``; both run the same two
split-K kernels. A row reads only its own tokens' page ids and slots, lengths clamped on the
device, and both grids come from host metadata with a workspace allocated once
(``prepare_decode_attention``), so a call is legal inside CUDA-graph capture. Bounded reads and
the split-K design: docs/ARCHITECTURE.md, "Paged attention, the consumer".
"""

from __future__ import annotations

from typing import cast

import torch
import triton
import triton.language as tl

from ..kernels.contract import cdiv, interpreter_active

#: Query and cache dtypes; softmax and accumulation are fp32 whatever the input dtype.
DTYPES = (torch.bfloat16, torch.float16, torch.float32)
#: Tokens per tile of the split kernel's loop.
BLOCK_N = 64
#: Largest number of splits ``default_num_splits`` chooses.
MAX_SPLITS = 16
#: Tokens a split should have at least before another split pays for its partial write.
TOKENS_PER_SPLIT = 512
NUM_WARPS = 4
#: The tensor-core tile needs at least 16 rows: smaller GQA groups are padded (masked).
MIN_BLOCK_H = 16
LOG2E = 1.4426950408889634


def default_num_splits(max_context_len: int) -> int:
    """Splits for a batch whose rows hold at most ``max_context_len`` tokens (a static bound,
    e.g. the page table's ``width * page_size``: a device length would need a sync)."""
    return max(1, min(MAX_SPLITS, cdiv(max_context_len, TOKENS_PER_SPLIT)))


class DecodeWorkspace:
    """The split kernel's fp32 partial results, allocated once at the largest batch.

    ``acc``   ``[max_bs, num_q_heads, num_splits, head_dim]`` fp32: unnormalised outputs;
    ``stats`` ``[max_bs, num_q_heads, num_splits, 2]`` fp32: running max (log2 units) and sum.

    A call for ``bs <= max_bs`` rows uses the leading rows. Only splits that hold tokens are
    written, and the combine kernel reads only those, so stale contents are harmless.
    """

    def __init__(
        self,
        max_bs: int,
        num_q_heads: int,
        head_dim: int,
        num_splits: int,
        device: torch.device | str,
    ) -> None:
        if min(max_bs, num_q_heads, head_dim, num_splits) < 1:
            raise ValueError("max_bs, num_q_heads, head_dim and num_splits must be >= 1")
        shape = (max_bs, num_q_heads, num_splits)
        self.acc = torch.empty((*shape, head_dim), dtype=torch.float32, device=device)
        self.stats = torch.empty((*shape, 2), dtype=torch.float32, device=device)
        self.max_bs, self.num_q_heads, self.head_dim = max_bs, num_q_heads, head_dim
        self.num_splits = num_splits

    def check(self, bs: int, num_q_heads: int, head_dim: int, device: torch.device | str) -> None:
        if bs > self.max_bs or (num_q_heads, head_dim) != (self.num_q_heads, self.head_dim):
            raise ValueError(
                f"workspace for max_bs={self.max_bs}, num_q_heads={self.num_q_heads}, "
                f"head_dim={self.head_dim} cannot serve bs={bs}, num_q_heads={num_q_heads}, "
                f"head_dim={head_dim}"
            )
        if self.acc.device != device:
            raise ValueError(f"workspace is on {self.acc.device}, the inputs on {device}")


def prepare_decode_attention(
    max_bs: int,
    num_q_heads: int,
    head_dim: int,
    *,
    device: torch.device | str,
    num_splits: int | None = None,
    max_context_len: int | None = None,
) -> DecodeWorkspace:
    """Allocate the workspace for every later call (before capture): ``num_splits`` given, or
    chosen from the static ``max_context_len`` by ``default_num_splits``."""
    if num_splits is None:
        if max_context_len is None:
            raise ValueError("give num_splits or max_context_len")
        num_splits = default_num_splits(max_context_len)
    return DecodeWorkspace(max_bs, num_q_heads, head_dim, num_splits, device)


def paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    page_table: torch.Tensor,
    cache_seqlens: torch.Tensor,
    out: torch.Tensor,
    *,
    page_size: int,
    sm_scale: float | None = None,
    num_splits: int | None = None,
    workspace: DecodeWorkspace | None = None,
    block_n: int = BLOCK_N,
) -> torch.Tensor:
    """Decode attention over a page table; writes ``out`` in place and returns it.

    q             ``[bs, num_q_heads, head_dim]``                      bf16 | fp16 | fp32
    k_cache       ``[num_pages, page_size, num_kv_heads, head_dim]``   q's dtype
    v_cache       ``[num_pages, page_size, num_kv_heads, head_dim]``   q's dtype
    page_table    ``[>= bs, width]`` int32: page ids, row ``i`` read up to
                  ``cdiv(cache_seqlens[i], page_size)`` entries
    cache_seqlens ``[>= bs]`` int32: tokens of each row (clamped to ``[0, width * page_size]``)
    out           ``[bs, num_q_heads, head_dim]`` q's dtype; rows of length 0 get zeros

    ``sm_scale`` defaults to ``head_dim ** -0.5``. Pass a ``workspace`` from
    ``prepare_decode_attention`` to make the call allocation-free and graph-capturable (then
    ``num_splits`` is the workspace's); without one, a workspace is allocated for this call.
    ``block_n`` is the tokens per tile (a power of two >= 16).
    """
    bs = _check_common(q, k_cache, v_cache, out, page_size)
    _check_index("page_table", page_table, 2)
    _check_index("cache_seqlens", cache_seqlens, 1)
    if page_table.shape[0] < bs or cache_seqlens.shape[0] < bs:
        raise ValueError(
            f"page_table {tuple(page_table.shape)} and cache_seqlens "
            f"{tuple(cache_seqlens.shape)} need at least bs={bs} rows"
        )
    width = page_table.shape[1]
    if num_splits is None and workspace is None:
        num_splits = default_num_splits(width * page_size)
    ws = _workspace(workspace, num_splits, q)
    meta = (page_table, cache_seqlens, cache_seqlens, page_table.stride(0), width)
    _launch(q, k_cache, v_cache, out, meta, ws, page_size, sm_scale, block_n, csr=False)
    return out


def csr_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    kv_last_page_len: torch.Tensor,
    out: torch.Tensor,
    *,
    page_size: int,
    sm_scale: float | None = None,
    num_splits: int | None = None,
    max_context_len: int | None = None,
    workspace: DecodeWorkspace | None = None,
    block_n: int = BLOCK_N,
) -> torch.Tensor:
    """Decode attention over FlashInfer's CSR page lists; writes ``out`` and returns it.

    kv_indptr        ``[>= bs + 1]`` int32: row ``i`` owns ``kv_indices[kv_indptr[i] :
                     kv_indptr[i + 1]]`` (clamped into ``kv_indices``)
    kv_indices       ``[nnz]`` int32: page ids, entries past ``kv_indptr[bs]`` never read
    kv_last_page_len ``[>= bs]`` int32: tokens in the row's last page, FlashInfer's convention
                     (``1..page_size``; clamped to ``[0, page_size]``); a row with no pages
                     has length 0 whatever its value

    The length of row ``i`` is ``(pages_i - 1) * page_size + kv_last_page_len[i]`` when
    ``pages_i > 0``, else 0. Other arguments as ``paged_decode_attention``; without a workspace
    or ``num_splits``, the splits are chosen from ``max_context_len`` (a static bound), or from
    ``nnz * page_size`` when that is not given either.
    """
    bs = _check_common(q, k_cache, v_cache, out, page_size)
    _check_index("kv_indptr", kv_indptr, 1)
    _check_index("kv_indices", kv_indices, 1)
    _check_index("kv_last_page_len", kv_last_page_len, 1)
    if kv_indptr.shape[0] < bs + 1 or kv_last_page_len.shape[0] < bs:
        raise ValueError(
            f"kv_indptr {tuple(kv_indptr.shape)} needs bs + 1 = {bs + 1} entries and "
            f"kv_last_page_len {tuple(kv_last_page_len.shape)} bs = {bs}"
        )
    nnz = kv_indices.shape[0]
    if num_splits is None and workspace is None:
        num_splits = default_num_splits(max_context_len or nnz * page_size)
    ws = _workspace(workspace, num_splits, q)
    meta = (kv_indices, kv_indptr, kv_last_page_len, 0, nnz)
    _launch(q, k_cache, v_cache, out, meta, ws, page_size, sm_scale, block_n, csr=True)
    return out


def _check_common(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    out: torch.Tensor,
    page_size: int,
) -> int:
    """Shapes, dtypes, devices and strides of the tensors both formats share (metadata only:
    reading a value would be a device-to-host sync); returns the batch size."""
    for name, t, ndim in (
        ("q", q, 3),
        ("k_cache", k_cache, 4),
        ("v_cache", v_cache, 4),
        ("out", out, 3),
    ):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != ndim:
            raise ValueError(f"{name} must have {ndim} dimensions, got {tuple(t.shape)}")
        if t.dtype != q.dtype or t.device != q.device:
            raise TypeError(f"{name} is {t.dtype} on {t.device}, q is {q.dtype} on {q.device}")
        # head_dim is the kernels' contiguous vector axis.
        if t.stride(-1) != 1:
            raise ValueError(f"{name} must have inner stride 1, got {tuple(t.stride())}")
    if q.dtype not in DTYPES:
        raise TypeError(f"q must be bfloat16, float16 or float32, got {q.dtype}")
    bs, num_q_heads, head_dim = q.shape
    _, slots, num_kv_heads, kv_dim = k_cache.shape
    if v_cache.shape != k_cache.shape or tuple(out.shape) != tuple(q.shape):
        raise ValueError(
            f"shapes: q {tuple(q.shape)}, out {tuple(out.shape)}, k_cache "
            f"{tuple(k_cache.shape)}, v_cache {tuple(v_cache.shape)}"
        )
    if not 1 <= page_size <= 256 or slots != page_size:
        raise ValueError(f"page_size {page_size} must be in 1..256 and match k_cache {slots}")
    if kv_dim != head_dim or head_dim < 16 or head_dim & (head_dim - 1):
        raise ValueError(f"head_dim {head_dim} (cache {kv_dim}) must be a power of two >= 16")
    if num_q_heads % num_kv_heads:
        raise ValueError(f"num_q_heads {num_q_heads} is no multiple of num_kv_heads {num_kv_heads}")
    return bs


def _check_index(name: str, t: object, ndim: int) -> None:
    if not isinstance(t, torch.Tensor) or t.dtype != torch.int32 or t.dim() != ndim:
        what = f"{t.dtype} {tuple(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__
        raise TypeError(f"{name} must be an int32 tensor of {ndim} dimension(s), got {what}")
    if t.stride(-1) != 1 and t.shape[-1] > 1:
        raise ValueError(f"{name} must have inner stride 1, got {tuple(t.stride())}")


def _workspace(
    workspace: DecodeWorkspace | None, num_splits: int | None, q: torch.Tensor
) -> DecodeWorkspace:
    bs, num_q_heads, head_dim = q.shape
    if workspace is None:
        # Both callers choose num_splits when no workspace is given.
        splits = cast(int, num_splits)
        return DecodeWorkspace(max(bs, 1), num_q_heads, head_dim, splits, q.device)
    if num_splits is not None and num_splits != workspace.num_splits:
        raise ValueError(f"num_splits {num_splits} != the workspace's {workspace.num_splits}")
    workspace.check(bs, num_q_heads, head_dim, q.device)
    return workspace


#: ``_launch``'s ``meta``: three int32 index tensors, the first one's row stride and width.
_LaunchMeta = tuple[torch.Tensor, torch.Tensor, torch.Tensor, int, int]


def _launch(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    out: torch.Tensor,
    meta: _LaunchMeta,
    ws: DecodeWorkspace,
    page_size: int,
    sm_scale: float | None,
    block_n: int,
    *,
    csr: bool,
) -> None:
    """Launch both kernels. ``meta`` is ``(pages, lens, last, pages_stride, width)``: the
    page table, ``cache_seqlens`` (twice) and the table's row stride and width; or
    ``kv_indices``, ``kv_indptr``, ``kv_last_page_len``, 0 and ``nnz``."""
    bs, num_q_heads, head_dim = q.shape
    if bs == 0:
        return
    if block_n < 16 or block_n & (block_n - 1):
        raise ValueError(f"block_n {block_n} must be a power of two >= 16")
    num_kv_heads = k_cache.shape[2]
    group = num_q_heads // num_kv_heads
    scale = (head_dim**-0.5 if sm_scale is None else sm_scale) * LOG2E
    pages, lens, last, pages_stride, width = meta
    splits = ws.num_splits
    _split_kernel[(bs, num_kv_heads, splits)](
        q,
        k_cache,
        v_cache,
        pages,
        lens,
        last,
        ws.acc,
        ws.stats,
        q.stride(0),
        q.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        v_cache.stride(0),
        v_cache.stride(1),
        v_cache.stride(2),
        pages_stride,
        width,
        num_q_heads,
        scale,
        GROUP=group,
        BLOCK_H=max(MIN_BLOCK_H, triton.next_power_of_2(group)),
        HEAD_DIM=head_dim,
        PAGE_SIZE=page_size,
        BLOCK_N=block_n,
        NUM_SPLITS=splits,
        CSR=csr,
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        WIDEN_DOT=q.dtype == torch.bfloat16 and interpreter_active(),
        num_warps=NUM_WARPS,
    )
    _combine_kernel[(bs, num_q_heads)](
        out,
        lens,
        last,
        ws.acc,
        ws.stats,
        out.stride(0),
        out.stride(1),
        width,
        num_q_heads,
        HEAD_DIM=head_dim,
        PAGE_SIZE=page_size,
        BLOCK_N=block_n,
        NUM_SPLITS=splits,
        SPLITS_P2=triton.next_power_of_2(splits),
        CSR=csr,
        num_warps=NUM_WARPS,
    )


@triton.jit
def _row_span(  # type: ignore[no-untyped-def]  # a Triton kernel
    row,
    pages_ptr,
    lens_ptr,
    last_ptr,
    pages_stride,
    width,
    PAGE_SIZE,
    CSR,
):
    """Pointer to row ``row``'s first page id, and its length clamped into the contract."""
    if CSR:
        start = tl.minimum(tl.maximum(tl.load(lens_ptr + row), 0), width)
        end = tl.minimum(tl.maximum(tl.load(lens_ptr + row + 1), start), width)
        last = tl.minimum(tl.maximum(tl.load(last_ptr + row), 0), PAGE_SIZE)
        length = tl.where(end > start, (end - start - 1) * PAGE_SIZE + last, 0)
        base = pages_ptr + start
    else:
        length = tl.minimum(tl.maximum(tl.load(lens_ptr + row), 0), width * PAGE_SIZE)
        base = pages_ptr + row.to(tl.int64) * pages_stride
    return base, length


@triton.jit  # type: ignore[untyped-decorator]  # Triton ships no types
def _dot(  # type: ignore[no-untyped-def]  # a Triton kernel
    a,
    b,
    WIDEN: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """``a @ b`` accumulated in fp32. ``WIDEN`` (the interpreter with bf16 only) widens both
    operands to fp32 first: the interpreter's dot multiplies bf16's raw bits, and bf16 widens
    exactly, so the products are the ones the tensor cores form."""
    if WIDEN:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    else:
        return tl.dot(a, b, input_precision=PRECISION)


@triton.jit  # type: ignore[untyped-decorator]  # Triton ships no types
def _split_tokens(  # type: ignore[no-untyped-def]  # a Triton kernel
    length,
    NUM_SPLITS: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """Tokens per split: an equal share of the row, rounded up to whole tiles, so every tile
    but a split's last is full and the splits past the row's end are empty."""
    return tl.cdiv(tl.cdiv(length, NUM_SPLITS), BLOCK_N) * BLOCK_N


@triton.jit  # type: ignore[untyped-decorator]  # Triton ships no types
def _split_kernel(  # type: ignore[no-untyped-def]  # a Triton kernel
    q_ptr,  # [bs, Hq, D] bf16 | fp16 | fp32
    k_ptr,  # [num_pages, PAGE_SIZE, Hkv, D] q's dtype
    v_ptr,  # [num_pages, PAGE_SIZE, Hkv, D] q's dtype
    pages_ptr,  # [>= bs, width] int32 page table, or [nnz] int32 kv_indices (CSR)
    lens_ptr,  # [>= bs] int32 cache_seqlens, or [>= bs + 1] int32 kv_indptr (CSR)
    last_ptr,  # [>= bs] int32 kv_last_page_len (CSR; unused otherwise)
    acc_ptr,  # [>= bs, Hq, NUM_SPLITS, D] fp32 workspace
    stats_ptr,  # [>= bs, Hq, NUM_SPLITS, 2] fp32 workspace (max in log2 units, sum)
    stride_qb,
    stride_qh,
    stride_kp,
    stride_ks,
    stride_kh,
    stride_vp,
    stride_vs,
    stride_vh,
    pages_stride,
    width,
    num_q_heads,
    qk_scale,  # sm_scale * log2(e): the softmax runs in exp2
    GROUP: tl.constexpr,
    BLOCK_H: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    CSR: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    WIDEN_DOT: tl.constexpr,
):
    row = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    base, length = _row_span(
        row, pages_ptr, lens_ptr, last_ptr, pages_stride, width, PAGE_SIZE, CSR
    )
    per_split = _split_tokens(length, NUM_SPLITS, BLOCK_N)
    lo = split * per_split
    hi = tl.minimum(lo + per_split, length)
    # An empty split writes nothing: the combine kernel derives the same count from length.
    if lo >= hi:
        return

    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, HEAD_DIM)
    h_mask = offs_h < GROUP
    heads = kv_head * GROUP + offs_h
    q_off = row.to(tl.int64) * stride_qb + heads[:, None] * stride_qh + offs_d[None, :]
    q = tl.load(q_ptr + q_off, mask=h_mask[:, None], other=0.0)

    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, HEAD_DIM], dtype=tl.float32)
    # A while loop, not range(lo, hi): the interpreter cannot take a tensor as a range bound
    # under numpy 2 (its scalars are one-element arrays), and the compiled loop is the same.
    start = lo
    while start < hi:
        tok = start + tl.arange(0, BLOCK_N)
        t_mask = tok < hi
        # Only the page ids of live tokens are loaded: the stale tail is never touched.
        page = tl.load(base + tok // PAGE_SIZE, mask=t_mask, other=0).to(tl.int64)
        slot = tok % PAGE_SIZE
        k_off = page * stride_kp + slot * stride_ks + kv_head * stride_kh
        k = tl.load(k_ptr + k_off[:, None] + offs_d[None, :], mask=t_mask[:, None], other=0.0)
        s = _dot(q, tl.trans(k), WIDEN_DOT, DOT_PRECISION) * qk_scale
        s = tl.where(t_mask[None, :], s, float("-inf"))
        # Every tile holds a live token (start < hi), so m_new is finite from the first tile.
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v_off = page * stride_vp + slot * stride_vs + kv_head * stride_vh
        v = tl.load(v_ptr + v_off[:, None] + offs_d[None, :], mask=t_mask[:, None], other=0.0)
        pv = _dot(p.to(v.dtype), v, WIDEN_DOT, DOT_PRECISION)
        acc = acc * alpha[:, None] + pv
        m_i = m_new
        start += BLOCK_N

    ws = (row.to(tl.int64) * num_q_heads + heads) * NUM_SPLITS + split  # [BLOCK_H]
    tl.store(acc_ptr + ws[:, None] * HEAD_DIM + offs_d[None, :], acc, mask=h_mask[:, None])
    tl.store(stats_ptr + ws * 2, m_i, mask=h_mask)
    tl.store(stats_ptr + ws * 2 + 1, l_i, mask=h_mask)


@triton.jit  # type: ignore[untyped-decorator]  # Triton ships no types
def _combine_kernel(  # type: ignore[no-untyped-def]  # a Triton kernel
    out_ptr,  # [bs, Hq, D] bf16 | fp16 | fp32
    lens_ptr,  # [>= bs] int32 cache_seqlens, or [>= bs + 1] int32 kv_indptr (CSR)
    last_ptr,  # [>= bs] int32 kv_last_page_len (CSR; unused otherwise)
    acc_ptr,  # [>= bs, Hq, NUM_SPLITS, D] fp32 workspace
    stats_ptr,  # [>= bs, Hq, NUM_SPLITS, 2] fp32 workspace
    stride_ob,
    stride_oh,
    width,
    num_q_heads,
    HEAD_DIM: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    SPLITS_P2: tl.constexpr,
    CSR: tl.constexpr,
):
    row = tl.program_id(0)
    head = tl.program_id(1)
    # The page-id pointer is not needed here: lens_ptr stands in for it.
    _, length = _row_span(row, lens_ptr, lens_ptr, last_ptr, 0, width, PAGE_SIZE, CSR)
    per_split = _split_tokens(length, NUM_SPLITS, BLOCK_N)
    live = tl.where(length > 0, tl.cdiv(length, tl.maximum(per_split, 1)), 0)

    offs_s = tl.arange(0, SPLITS_P2)
    offs_d = tl.arange(0, HEAD_DIM)
    s_mask = offs_s < live
    ws = (row.to(tl.int64) * num_q_heads + head) * NUM_SPLITS + offs_s
    m = tl.load(stats_ptr + ws * 2, mask=s_mask, other=float("-inf"))
    l_s = tl.load(stats_ptr + ws * 2 + 1, mask=s_mask, other=0.0)
    # With no live split every weight is 0 and the row's output is 0 (the documented value).
    m_max = tl.where(live > 0, tl.max(m, 0), 0.0)
    w = tl.where(s_mask, tl.exp2(m - m_max), 0.0)
    acc = tl.load(
        acc_ptr + ws[:, None] * HEAD_DIM + offs_d[None, :], mask=s_mask[:, None], other=0.0
    )
    num = tl.sum(acc * w[:, None], 0)
    den = tl.sum(l_s * w, 0)
    o = num / tl.where(den > 0, den, 1.0)
    o_off = row.to(tl.int64) * stride_ob + head * stride_oh + offs_d
    tl.store(out_ptr + o_off, o.to(out_ptr.dtype.element_ty))
