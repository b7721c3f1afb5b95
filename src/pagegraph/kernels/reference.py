"""Reference builders in plain torch, with the kernels' signatures so every builder plugs in.

``reference_page_table`` is the oracle (row by row, obviously correct, a host read a call: use
it to check, never to serve); ``host_max_gather`` is the naive baseline engines start from (one
``seq_lens.max().item()`` a call), ``static_width_gather`` the sync-free one whose cost follows
the width. All clamp out-of-contract values as the kernel does, so they agree with it on any
input that does not need the ``errors`` counters. The decode-metadata and CSR oracles are here too.
"""

from __future__ import annotations

from typing import cast

import torch

from .contract import cdiv, check_builder_args, declare_outputs


def _row_capacity(req_to_token: torch.Tensor, page_table: torch.Tensor, page_size: int) -> int:
    return min(page_table.shape[1], cdiv(req_to_token.shape[1], page_size))


def _page_starts(
    req_to_token: torch.Tensor, rows: torch.Tensor, n_pages: int, page_size: int
) -> torch.Tensor:
    """``[len(rows), n_pages]`` slots at the first token of each page (int64)."""
    return req_to_token[rows][:, : n_pages * page_size : page_size].to(torch.int64)


def _swa_pages(full_to_swa: torch.Tensor, slots: torch.Tensor, page_size: int) -> torch.Tensor:
    idx = slots.clamp(0, full_to_swa.shape[0] - 1)
    return (full_to_swa[idx].to(torch.int64) // page_size).to(torch.int32)


def reference_page_table(
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
    """The oracle: for each row ``i``, ``n = min(cdiv(seq_lens[i], page_size), width)`` and
    ``page_table[i, :n] = req_to_token[req_pool_indices[i], :n*page_size:page_size] // page_size``.

    Shapes and dtypes as ``pagegraph.build_page_table``. Reads ``seq_lens`` and
    ``req_pool_indices`` on the host (syncs); ``errors`` is accepted and ignored.
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
        builder="reference_page_table",
    )
    capacity = _row_capacity(req_to_token, page_table, page_size)
    last_row = req_to_token.shape[0] - 1
    for i, (req, length) in enumerate(zip(req_pool_indices.tolist(), seq_lens.tolist())):
        n = min(max(cdiv(length, page_size), 0), capacity)
        if n == 0:
            continue
        req = min(max(req, 0), last_row)
        slots = req_to_token[req, : n * page_size : page_size].to(torch.int64)
        page_table[i, :n] = (slots // page_size).to(torch.int32)
        if full_to_swa is not None:
            cast(torch.Tensor, swa_page_table)[i, :n] = _swa_pages(full_to_swa, slots, page_size)


# Lengths seen by host_max_gather's last eager call, per page_table buffer: the width it
# freezes into a graph captured afterwards.
_frozen_pages: dict[int, int] = {}


def host_max_gather(
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
    """Naive baseline: ``n = cdiv(seq_lens.max().item(), page_size)``, then gather every row
    into ``page_table[:, :n]``.

    One device-to-host sync per eager call. Under CUDA-graph capture ``.item()`` is illegal,
    so, like an engine that computed the batch's maximum on the host before capturing, it uses
    the width its last eager call saw: the graph freezes that width, and replays with longer
    sequences leave the extra pages unwritten. It also writes past each row's own length, up
    to the batch's longest row. Shapes as ``pagegraph.build_page_table``.
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
        builder="host_max_gather",
    )
    capacity = _row_capacity(req_to_token, page_table, page_size)
    key = page_table.data_ptr()
    if page_table.is_cuda and torch.cuda.is_current_stream_capturing():
        n = _frozen_pages.get(key, 0)
    else:
        longest = int(seq_lens.max().item()) if seq_lens.numel() else 0
        n = min(max(cdiv(longest, page_size), 0), capacity)
        _frozen_pages[key] = n
    if n == 0:
        return
    rows = req_pool_indices.clamp(0, req_to_token.shape[0] - 1)
    slots = _page_starts(req_to_token, rows, n, page_size)
    page_table[:, :n] = (slots // page_size).to(torch.int32)
    if full_to_swa is not None:
        cast(torch.Tensor, swa_page_table)[:, :n] = _swa_pages(full_to_swa, slots, page_size)


def static_width_gather(
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
    """Sync-free baseline: gather the whole static width of every row, lengths ignored.

    Graph-safe and correct on the live entries, but it rewrites the stale tail of every row
    and its cost grows with the width of the table. Shapes as ``pagegraph.build_page_table``.
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
        builder="static_width_gather",
    )
    n = _row_capacity(req_to_token, page_table, page_size)
    if n == 0 or page_table.shape[0] == 0:
        return
    rows = req_pool_indices.clamp(0, req_to_token.shape[0] - 1)
    slots = _page_starts(req_to_token, rows, n, page_size)
    page_table[:, :n] = (slots // page_size).to(torch.int32)
    if full_to_swa is not None:
        cast(torch.Tensor, swa_page_table)[:, :n] = _swa_pages(full_to_swa, slots, page_size)


# -- decode metadata: the oracle and the unfused chain of kernels/decode_metadata.py ---------
#
# Both take build_decode_metadata's signature and accept and refuse the same calls (they run
# its host checks, with CPU tensors allowed). The metadata module is imported inside the
# functions: it imports the kernel module, which the page-table references above do not need.

_DECODE_INT32_MAX = 2**31 - 1


def reference_decode_metadata(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    page_size: int,
    *,
    cache_seqlens: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    page_table: torch.Tensor,
    draft_tokens: int = 0,
    cu_seqlens_q: torch.Tensor | None = None,
    swa_page_table: torch.Tensor | None = None,
    full_to_swa: torch.Tensor | None = None,
    errors: torch.Tensor | None = None,
) -> None:
    """The oracle of ``pagegraph.kernels.decode_metadata.build_decode_metadata``, in Python
    ints on the host.

    ``cache_seqlens[i] = min(max(seq_lens[i], 0) + draft_tokens, 2^31 - 1)``;
    ``cu_seqlens_k = [0, running sums of cache_seqlens]`` (an int32 ``cu_seqlens_k`` saturated
    at 2^31 - 1, as the kernel stores it); ``cu_seqlens_q[i] = i * max(draft_tokens, 1)``; the
    page tables from ``reference_page_table`` with lengths ``cache_seqlens``. With ``errors``
    it adds the counts the kernel adds
    (``pagegraph.kernels.decode_contract.DECODE_ERROR_KINDS``). Shapes and
    dtypes as ``build_decode_metadata``; reads values on the host (syncs).
    """
    from .decode_metadata import check_decode_args

    check_decode_args(
        req_to_token,
        req_pool_indices,
        seq_lens,
        page_size,
        cache_seqlens,
        cu_seqlens_k,
        page_table,
        draft_tokens,
        cu_seqlens_q,
        swa_page_table,
        full_to_swa,
        errors,
        caller="reference_decode_metadata",
    )
    bs = page_table.shape[0]
    lengths = seq_lens.tolist()
    cache = [min(max(n, 0) + draft_tokens, _DECODE_INT32_MAX) for n in lengths]
    sums = [0]
    for c in cache:
        sums.append(sums[-1] + c)
    cu_k_int32 = cu_seqlens_k.dtype == torch.int32
    stored = [min(s, _DECODE_INT32_MAX) for s in sums] if cu_k_int32 else sums
    cache_seqlens.copy_(torch.tensor(cache, dtype=torch.int32))
    cu_seqlens_k.copy_(torch.tensor(stored, dtype=cu_seqlens_k.dtype))
    if cu_seqlens_q is not None:
        step = max(draft_tokens, 1)
        cu_seqlens_q.copy_(torch.tensor([i * step for i in range(bs + 1)], dtype=torch.int32))
    if bs:
        reference_page_table(
            req_to_token,
            req_pool_indices,
            cache_seqlens,
            page_table,
            page_size,
            swa_page_table=swa_page_table,
            full_to_swa=full_to_swa,
        )
    if errors is None:
        return
    pages = _row_capacity(req_to_token, page_table, page_size)
    rows = req_to_token.shape[0]
    reqs = req_pool_indices.tolist()
    bad_swa = 0
    if full_to_swa is not None:
        for req, c in zip(reqs, cache):
            n = min(cdiv(c, page_size), pages)
            slots = req_to_token[min(max(req, 0), rows - 1), : n * page_size : page_size]
            bad_swa += int(((slots < 0) | (slots >= full_to_swa.shape[0])).sum())
    counts = [
        sum(c > pages * page_size for c in cache),
        sum(n < 0 for n in lengths),
        sum(not 0 <= r < rows for r in reqs),
        bad_swa,
        sum(s > _DECODE_INT32_MAX for s in sums[1:]) if cu_k_int32 else 0,
    ]
    errors[: len(counts)] += torch.tensor(counts, dtype=torch.int32).to(errors.device)


def unfused_decode_metadata(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    page_size: int,
    *,
    cache_seqlens: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    page_table: torch.Tensor,
    draft_tokens: int = 0,
    cu_seqlens_q: torch.Tensor | None = None,
    swa_page_table: torch.Tensor | None = None,
    full_to_swa: torch.Tensor | None = None,
    errors: torch.Tensor | None = None,
) -> None:
    """The chain an engine writes instead of ``build_decode_metadata``: sync-free and
    graph-safe, but a clamp, an add, a cumsum, a fill, an arange and ``build_page_table``,
    each its own launch (and the clamp an allocation).

    Equal to ``build_decode_metadata`` on in-contract inputs. Outside them it differs: a
    ``cache_seqlens`` or int32 running sum past 2^31 - 1 wraps instead of saturating, and
    ``errors`` gets only ``build_page_table``'s counts for lengths ``cache_seqlens`` (negative
    lengths are clamped before it sees them, and no ``cu_seqlens_k_overflow`` is counted).
    Shapes and dtypes as ``build_decode_metadata``.
    """
    from .decode_metadata import check_decode_args
    from .page_table import build_page_table

    check_decode_args(
        req_to_token,
        req_pool_indices,
        seq_lens,
        page_size,
        cache_seqlens,
        cu_seqlens_k,
        page_table,
        draft_tokens,
        cu_seqlens_q,
        swa_page_table,
        full_to_swa,
        errors,
        caller="unfused_decode_metadata",
        cpu_ok=False,
    )
    bs = page_table.shape[0]
    torch.add(seq_lens.clamp(min=0), draft_tokens, out=cache_seqlens)
    torch.cumsum(cache_seqlens, 0, dtype=cu_seqlens_k.dtype, out=cu_seqlens_k[1:])
    cu_seqlens_k[:1].zero_()
    if cu_seqlens_q is not None:
        step = max(draft_tokens, 1)
        torch.arange(0, (bs + 1) * step, step, dtype=torch.int32, out=cu_seqlens_q)
    build_page_table(
        req_to_token,
        req_pool_indices,
        cache_seqlens,
        page_table,
        page_size,
        swa_page_table=swa_page_table,
        full_to_swa=full_to_swa,
        errors=errors,
    )


def reference_kv_indices(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    page_size: int,
    *,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
) -> None:
    """The oracle of the CSR contract (``pagegraph.kernels.kv_indices``): row ``i`` owns
    ``n_i = min(cdiv(max(seq_lens[i], 0), page_size), cdiv(cols, page_size))`` pages,
    ``kv_indptr[: bs + 1] = [0, running sums of n_i, cut at len(kv_indices)]`` and each row's
    span of ``kv_indices`` holds its pages' ids. One row at a time, reading the lengths on
    the host (syncs): use it to check, never to serve. Shapes as ``build_kv_indices``."""
    row_pages = cdiv(req_to_token.shape[1], page_size)
    capacity = kv_indices.shape[0]
    last_row = req_to_token.shape[0] - 1
    offsets = [0]
    for req, length in zip(req_pool_indices.tolist(), seq_lens.tolist()):
        start = offsets[-1]
        n = min(max(cdiv(length, page_size), 0), row_pages, capacity - start)
        req = min(max(req, 0), last_row)
        slots = req_to_token[req, : n * page_size : page_size].to(torch.int64)
        kv_indices[start : start + n] = (slots // page_size).to(torch.int32)
        offsets.append(start + n)
    kv_indptr[: len(offsets)] = torch.tensor(offsets, dtype=torch.int32)


declare_outputs(reference_kv_indices, "csr")
