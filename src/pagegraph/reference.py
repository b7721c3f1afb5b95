"""Reference builders in plain torch, with the kernel's signature so every builder plugs in.

* ``reference_page_table``: the oracle. One row at a time, obviously correct, and it reads the
  lengths on the host (a sync per call): use it to check, never to serve.
* ``host_max_gather``: the naive baseline engines start from. One ``seq_lens.max().item()``
  per call, then a strided gather into ``page_table[:, :n]``.
* ``static_width_gather``: the sync-free baseline. Gathers the whole static width every call,
  so its cost follows the width of the table, not the real lengths.

All three clamp out-of-contract values the way the kernel does (a ``req_pool_index`` into
``req_to_token``, a slot into ``full_to_swa``, the width into the pages ``req_to_token`` can
supply), so they agree with it on any input that does not need the ``errors`` counters.
"""

from __future__ import annotations

import torch

from .contract import cdiv, check_builder_args


def _row_capacity(req_to_token: torch.Tensor, page_table: torch.Tensor, page_size: int) -> int:
    return min(page_table.shape[1], cdiv(req_to_token.shape[1], page_size))


def _page_starts(req_to_token, rows, n_pages: int, page_size: int) -> torch.Tensor:
    """``[len(rows), n_pages]`` slots at the first token of each page (int64)."""
    return req_to_token[rows][:, : n_pages * page_size : page_size].to(torch.int64)


def _swa_pages(full_to_swa: torch.Tensor, slots: torch.Tensor, page_size: int) -> torch.Tensor:
    idx = slots.clamp(0, full_to_swa.shape[0] - 1)
    return (full_to_swa[idx].to(torch.int64) // page_size).to(torch.int32)


def reference_page_table(
    req_to_token,
    req_pool_indices,
    seq_lens,
    page_table,
    page_size,
    *,
    swa_page_table=None,
    full_to_swa=None,
    errors=None,
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
            swa_page_table[i, :n] = _swa_pages(full_to_swa, slots, page_size)


# Lengths seen by host_max_gather's last eager call, per page_table buffer: the width it
# freezes into a graph captured afterwards.
_frozen_pages: dict[int, int] = {}


def host_max_gather(
    req_to_token,
    req_pool_indices,
    seq_lens,
    page_table,
    page_size,
    *,
    swa_page_table=None,
    full_to_swa=None,
    errors=None,
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
        swa_page_table[:, :n] = _swa_pages(full_to_swa, slots, page_size)


def static_width_gather(
    req_to_token,
    req_pool_indices,
    seq_lens,
    page_table,
    page_size,
    *,
    swa_page_table=None,
    full_to_swa=None,
    errors=None,
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
        swa_page_table[:, :n] = _swa_pages(full_to_swa, slots, page_size)
