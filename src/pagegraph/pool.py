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
    #: SWA page of each full page (same index), 0 where unmapped. Eviction runs from the
    #: front, as a window slides: pages ``[:swa_first]`` are evicted.
    swa_pages: list[int] = field(default_factory=list)
    swa_first: int = 0


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
        self._r2t_rows: set[int] = set()  # rows written since the last flush
        self._r2t_may_repeat = False
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
        self._r2t_may_repeat |= row in self._r2t_rows
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
        if need > 0:
            first = len(req.pages)
            req.pages.extend(self._take(self._free_pages, need))
            if self.swa:
                req.swa_pages.extend([0] * need)
                self._map_swa(req, first, first + need)
        if k > 0:
            tokens = np.arange(req.length, new_len, dtype=np.int64)
            first_page = req.length // ps
            span = np.asarray(req.pages[first_page:], dtype=np.int64)
            pages = span[tokens // ps - first_page]
            slots = pages * ps + tokens % ps
            flat = row * self.req_to_token.stride(0) + tokens
            self._r2t_writes.append((flat, slots))
            self._r2t_rows.add(row)
        req.length = new_len

    @staticmethod
    def _take(free: list[int], n: int) -> list[int]:
        taken = free[len(free) - n :]
        del free[len(free) - n :]
        return taken[::-1]

    def free(self, row: int) -> None:
        """Finish request ``row``: its pages return to the pool, its SWA slots map to 0, its
        ``req_to_token`` row keeps the old entries."""
        req = self.requests.pop(row)
        self.requests_history[row] = req.length
        if self.swa:
            self._unmap_swa(req, req.swa_first, len(req.pages))
        self._free_pages.extend(req.pages)
        self._free_rows.append(row)

    # -- SWA ------------------------------------------------------------------------------

    def _slots_of(self, pages) -> np.ndarray:
        """``[len(pages) * page_size]`` slots of the given pages, in order."""
        pages = np.asarray(pages, dtype=np.int64)
        return (pages[:, None] * self.page_size + np.arange(self.page_size)).reshape(-1)

    def _map_swa(self, req: Request, lo: int, hi: int) -> None:
        """Give full pages ``lo:hi`` of ``req`` fresh SWA pages."""
        n = hi - lo
        if n > len(self._free_swa_pages):
            raise PoolExhausted(f"need {n} SWA pages, {len(self._free_swa_pages)} free")
        swa = self._take(self._free_swa_pages, n)
        req.swa_pages[lo:hi] = swa
        self._swa_writes.append((self._slots_of(req.pages[lo:hi]), self._slots_of(swa)))

    def _unmap_swa(self, req: Request, lo: int, hi: int) -> None:
        """Return the SWA pages of full pages ``lo:hi``; their slots map to 0."""
        if hi <= lo:
            return
        self._free_swa_pages.extend(p for p in req.swa_pages[lo:hi] if p)
        req.swa_pages[lo:hi] = [0] * (hi - lo)
        slots = self._slots_of(req.pages[lo:hi])
        self._swa_writes.append((slots, np.zeros_like(slots)))

    def evict_outside_window(self, row: int, window: int) -> int:
        """Free the SWA pages of ``row`` that lie wholly before its last ``window`` tokens, as a
        sliding-window engine does; their slots map to 0. Returns pages evicted."""
        req = self.requests[row]
        first_kept = max(req.length - window, 0) // self.page_size
        evicted = max(first_kept - req.swa_first, 0)
        if evicted:
            self._unmap_swa(req, req.swa_first, first_kept)
            req.swa_first = first_kept
        return evicted

    def remap_swa(self, row: int) -> None:
        """Move every mapped SWA page of ``row`` to a new SWA page (mapping churn between
        replays): the new pages are taken before the old ones return."""
        req = self.requests[row]
        lo, hi = req.swa_first, len(req.pages)
        old = [p for p in req.swa_pages[lo:hi] if p]
        self._map_swa(req, lo, hi)
        self._free_swa_pages.extend(old)

    # -- device tables --------------------------------------------------------------------

    def flush(self) -> None:
        """Apply queued writes to ``req_to_token`` and ``full_to_swa`` (host-to-device copies;
        call it between replays, never inside one)."""
        # req_to_token entries repeat only when a row is freed and reused before a flush;
        # full_to_swa entries repeat whenever a page is mapped and evicted or remapped.
        tables = (
            (self.req_to_token, self._r2t_writes, self._r2t_may_repeat),
            (self.full_to_swa, self._swa_writes, True),
        )
        for table, writes, may_repeat in tables:
            if not writes:
                continue
            flat = torch.from_numpy(np.concatenate([w[0] for w in writes])).to(table.device)
            vals = torch.from_numpy(np.concatenate([w[1] for w in writes]))
            vals = vals.to(table.device, table.dtype)
            if may_repeat:
                flat, vals = _last_write_wins(flat, vals)
            table.view(-1).index_copy_(0, flat, vals)
            writes.clear()
        self._r2t_rows.clear()
        self._r2t_may_repeat = False

    def batch(self, rows: list[int]) -> tuple[list[int], list[int]]:
        """``(req_pool_indices, seq_lens)`` of the given request rows, as host lists."""
        return list(rows), [self.requests[r].length for r in rows]


def _last_write_wins(flat: torch.Tensor, vals: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Keep the last of repeated writes: a scatter with repeated indices has no defined winner
    on the GPU. A stable sort by index puts each index's writes in queue order; the last of
    each run wins. Done where the table lives (a GPU sorts millions of entries in a blink)."""
    order = torch.argsort(flat, stable=True)
    sorted_flat = flat[order]
    last = torch.ones_like(sorted_flat, dtype=torch.bool)
    last[:-1] = sorted_flat[1:] != sorted_flat[:-1]
    keep = order[last]
    return flat[keep], vals[keep]
