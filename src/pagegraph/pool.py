"""A KV-cache pool model: what tests, workloads and scenarios drive, mirroring an engine.

* ``req_to_token`` ``[max_reqs + 1, max_context_len]`` (int32 by default), zero-initialised:
  row 0 is a dummy request, and slot 0 (page 0) is reserved for padding, so a zeroed entry is
  always a valid slot.
* Pages are allocated one at a time from a shuffled free list (random placement, seeded), so
  within a page slots are consecutive and every page start is page-aligned.
* Optional SWA pool: ``full_to_swa`` (int64, one entry per full slot plus a trailing sentinel)
  maps each full slot to its slot in the sliding-window pool; freed or evicted slots map to 0.

The host keeps only per-request metadata (pages and lengths). Writes to the device tables are
queued and applied by ``flush()`` in one scatter per table, so a decode step of many requests
costs two host-to-device copies rather than one per request. Freed rows keep their old entries
(engines do not clear them): a reused row with a shorter length has a stale tail.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from .contract import cdiv


class PoolExhausted(RuntimeError):
    """No free request row, full page or SWA page is left."""


@dataclass
class Request:
    row: int
    length: int = 0
    pages: list[int] = field(default_factory=list)
    #: SWA page of each full page index; evicted pages are absent.
    swa_pages: dict[int, int] = field(default_factory=dict)


class KVPool:
    """Request rows, a page allocator and (optionally) an SWA pool over device tables.

    Args:
        max_reqs: request rows usable by real requests (rows ``1..max_reqs``).
        max_context_len: tokens per request row (columns of ``req_to_token``).
        page_size: tokens per page.
        num_pages: full pages in the pool, page 0 included (default: enough for every row at
            full length).
        swa: keep an SWA pool and ``full_to_swa``.
        swa_num_pages: SWA pages, page 0 included (default ``num_pages``).
        device, dtype: of ``req_to_token``.
        seed: page placement.
        row_order: ``"low-first"`` hands out rows 1, 2, ... first; ``"high-first"`` starts at
            ``max_reqs``, so a large pool's ``row * stride`` offsets are exercised.
    """

    def __init__(
        self,
        *,
        max_reqs: int,
        max_context_len: int,
        page_size: int,
        num_pages: int | None = None,
        swa: bool = False,
        swa_num_pages: int | None = None,
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.int32,
        seed: int = 0,
        row_order: str = "low-first",
    ):
        if row_order not in ("low-first", "high-first"):
            raise ValueError(f"row_order must be 'low-first' or 'high-first', got {row_order!r}")
        if max_reqs < 1 or max_context_len < 1 or page_size < 1:
            raise ValueError(
                f"max_reqs, max_context_len and page_size must be >= 1, got "
                f"{max_reqs}, {max_context_len}, {page_size}"
            )
        self.max_reqs = max_reqs
        self.max_context_len = max_context_len
        self.page_size = page_size
        self.device = torch.device(device)
        self.pages_per_req = cdiv(max_context_len, page_size)
        self.num_pages = num_pages or max_reqs * self.pages_per_req + 1
        if self.num_pages < 2:
            raise ValueError("num_pages must be >= 2: page 0 is reserved for padding")
        if dtype == torch.int32 and self.num_pages * page_size >= 2**31:
            raise ValueError("the pool's slots do not fit in int32: use dtype=torch.int64")
        self.rng = np.random.default_rng(seed)
        self.req_to_token = torch.zeros(
            (max_reqs + 1, max_context_len), dtype=dtype, device=self.device
        )
        # pop() hands out the end of the list first.
        rows = list(range(1, max_reqs + 1))
        self._free_rows = rows if row_order == "high-first" else rows[::-1]
        self._free_pages = self._shuffled(self.num_pages)
        self.requests: dict[int, Request] = {}
        #: Length each freed row held when its request finished.
        self.requests_history: dict[int, int] = {}
        self.swa = swa
        self.full_to_swa: torch.Tensor | None = None
        if swa:
            self.swa_num_pages = swa_num_pages or self.num_pages
            self._free_swa_pages = self._shuffled(self.swa_num_pages)
            self.full_to_swa = torch.zeros(
                self.num_pages * page_size + 1, dtype=torch.int64, device=self.device
            )
        self._r2t_writes: list[tuple[np.ndarray, np.ndarray]] = []
        self._swa_writes: list[tuple[np.ndarray, np.ndarray]] = []

    def _shuffled(self, n: int) -> list[int]:
        pages = np.arange(1, n, dtype=np.int64)
        self.rng.shuffle(pages)
        return pages.tolist()

    # -- requests -------------------------------------------------------------------------

    @property
    def free_rows(self) -> int:
        return len(self._free_rows)

    @property
    def free_pages(self) -> int:
        return len(self._free_pages)

    def next_free_row(self) -> int | None:
        """The row the next ``alloc()`` hands out, or ``None`` when none is free."""
        return self._free_rows[-1] if self._free_rows else None

    def alloc(self, length: int, row: int | None = None) -> int:
        """A new request of ``length`` tokens; returns its row. ``row`` picks a free row."""
        if not self._free_rows:
            raise PoolExhausted(f"all {self.max_reqs} request rows are in use")
        if row is None:
            row = self._free_rows.pop()
        else:
            self._free_rows.remove(row)
        self.requests[row] = Request(row)
        self.extend(row, length)
        return row

    def extend(self, row: int, k: int) -> None:
        """Grow request ``row`` by ``k`` tokens, allocating pages as it crosses page ends."""
        req = self.requests[row]
        new_len = req.length + k
        if new_len > self.max_context_len:
            raise ValueError(
                f"request row {row}: {new_len} tokens exceed max_context_len={self.max_context_len}"
            )
        ps = self.page_size
        need = cdiv(new_len, ps) - len(req.pages)
        if need > len(self._free_pages):
            raise PoolExhausted(f"need {need} pages, {len(self._free_pages)} free")
        for _ in range(need):
            page = self._free_pages.pop()
            req.pages.append(page)
            if self.swa:
                self._map_swa(req, len(req.pages) - 1)
        if k > 0:
            tokens = np.arange(req.length, new_len, dtype=np.int64)
            pages = np.asarray(req.pages, dtype=np.int64)[tokens // ps]
            slots = pages * ps + tokens % ps
            flat = row * self.req_to_token.stride(0) + tokens
            self._r2t_writes.append((flat, slots))
        req.length = new_len

    def free(self, row: int) -> None:
        """Finish request ``row``: its pages return to the pool, its SWA slots map to 0, its
        ``req_to_token`` row keeps the old entries."""
        req = self.requests.pop(row)
        self.requests_history[row] = req.length
        for idx in list(req.swa_pages):
            self._unmap_swa(req, idx)
        self._free_pages.extend(req.pages)
        self._free_rows.append(row)

    # -- SWA ------------------------------------------------------------------------------

    def _page_slots(self, page: int) -> np.ndarray:
        return page * self.page_size + np.arange(self.page_size, dtype=np.int64)

    def _map_swa(self, req: Request, idx: int) -> None:
        if not self._free_swa_pages:
            raise PoolExhausted("no free SWA page")
        swa_page = self._free_swa_pages.pop()
        req.swa_pages[idx] = swa_page
        self._swa_writes.append((self._page_slots(req.pages[idx]), self._page_slots(swa_page)))

    def _unmap_swa(self, req: Request, idx: int) -> None:
        swa_page = req.swa_pages.pop(idx)
        self._free_swa_pages.append(swa_page)
        slots = self._page_slots(req.pages[idx])
        self._swa_writes.append((slots, np.zeros_like(slots)))

    def evict_outside_window(self, row: int, window: int) -> int:
        """Free the SWA pages of ``row`` that lie wholly before its last ``window`` tokens, as a
        sliding-window engine does; their slots map to 0. Returns pages evicted."""
        req = self.requests[row]
        first_kept = max(req.length - window, 0) // self.page_size
        evicted = [i for i in req.swa_pages if i < first_kept]
        for idx in evicted:
            self._unmap_swa(req, idx)
        return len(evicted)

    def remap_swa(self, row: int) -> None:
        """Move every SWA page of ``row`` to a new SWA page (mapping churn between replays)."""
        req = self.requests[row]
        for idx in list(req.swa_pages):
            old = req.swa_pages.pop(idx)
            self._map_swa(req, idx)
            self._free_swa_pages.append(old)

    # -- device tables --------------------------------------------------------------------

    def flush(self) -> None:
        """Apply queued writes to ``req_to_token`` and ``full_to_swa`` (host-to-device copies;
        call it between replays, never inside one)."""
        tables = ((self.req_to_token, self._r2t_writes), (self.full_to_swa, self._swa_writes))
        for table, writes in tables:
            if not writes:
                continue
            flat = np.concatenate([w[0] for w in writes])
            vals = np.concatenate([w[1] for w in writes])
            # A scatter with repeated indices has no defined winner on the GPU: keep the last
            # write of each entry (a page mapped then evicted in one step ends evicted).
            last = len(flat) - 1 - np.unique(flat[::-1], return_index=True)[1]
            flat_t = torch.from_numpy(flat[last]).to(table.device)
            vals_t = torch.from_numpy(vals[last]).to(table.device, table.dtype)
            table.view(-1).index_copy_(0, flat_t, vals_t)
            writes.clear()

    def batch(self, rows: list[int]) -> tuple[list[int], list[int]]:
        """``(req_pool_indices, seq_lens)`` of the given request rows, as host lists."""
        return list(rows), [self.requests[r].length for r in rows]
