"""A KV-cache pool model: what tests, workloads and scenarios drive, mirroring an engine.

* ``req_to_token`` ``[max_reqs + 1, row_len]`` (int32 by default, ``row_len >=
  max_context_len``), zero-initialised: row 0 is a dummy request, and slot 0 (page 0) is
  reserved for padding, so a zeroed entry is always a valid slot. It can be a view that starts
  ``storage_offset`` elements into a larger allocation, as an engine's table inside a bigger
  pool is.
* Pages are allocated one at a time from a shuffled free list (random placement, seeded), so
  within a page slots are consecutive and every page start is page-aligned.
* Optional SWA pool: ``full_to_swa`` (int64 by default, one entry per full slot plus a
  trailing sentinel) maps each full slot to its slot in the sliding-window pool; freed or
  evicted slots map to 0.

The host keeps per-request metadata (pages and lengths, also as arrays, so a decode step's
growth of every running request is a few vectorised operations), and the SWA page of every
full page. Writes to the device tables are queued page by page (a run of consecutive slots,
five integers, whatever the page size) and applied by ``flush()``: one non-blocking copy from
a pinned staging ring, a few operators that expand the runs on the device into scratch
allocated once, and one ``index_copy_``, so a flush neither allocates device memory nor waits
for the device, and its host cost follows the pages touched, not the tokens. Freed rows keep
their old entries (engines do not clear them): a reused row with a shorter length has a stale
tail.
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


#: Table entries one flush chunk writes at most (per table); larger flushes go in chunks.
FLUSH_CHUNK = 1 << 18
#: Pinned staging buffers per table. A buffer is refilled only once the copy that last read
#: it has completed; with this many, a checker that keeps two replays in flight never waits.
FLUSH_RING = 4


class _PageWriter:
    """Writes whole-page runs into one table, sync- and allocation-free after construction.

    A run is ``(base, value, step, lo, hi)``: entries ``base + j`` for lanes ``lo <= j < hi``
    of one page get ``value + j * step`` (a request's token slots: step 1; an unmapped SWA
    page: value 0, step 0). The host sends five integers a page, not one a token: the runs go
    through a pinned staging ring and one non-blocking copy, and are expanded on the table's
    device into preallocated scratch (every operator writes ``out=``) for one ``index_copy_``.
    Lanes outside ``[lo, hi)`` write lane ``lo``'s own entry and value again, so the
    expansion is rectangular and still never writes an entry it was not given.
    """

    def __init__(self, table: torch.Tensor, page_size: int):
        self.flat = table.view(-1)
        dev, dtype = table.device, table.dtype
        self.cuda = table.is_cuda
        self.rows = max(1, FLUSH_CHUNK // page_size)  # runs a chunk
        n, ps = self.rows, page_size
        self.host = [
            torch.empty(5 * n, dtype=torch.int64, pin_memory=self.cuda)
            for _ in range(FLUSH_RING if self.cuda else 1)
        ]
        self.host_np = [h.numpy() for h in self.host]
        self.done: list = [None] * len(self.host)
        self.next = 0
        self.runs = torch.empty(5 * n, dtype=torch.int64, device=dev)
        self.lane = torch.arange(ps, dtype=torch.int64, device=dev)[None, :]
        self.inside = torch.empty((n, ps), dtype=torch.bool, device=dev)
        self.below = torch.empty((n, ps), dtype=torch.bool, device=dev)
        self.eff = torch.empty((n, ps), dtype=torch.int64, device=dev)
        self.index = torch.empty((n, ps), dtype=torch.int64, device=dev)
        self.value = torch.empty((n, ps), dtype=torch.int64, device=dev)
        self.cast = self.value if dtype == torch.int64 else torch.empty((n, ps), dtype=dtype,
                                                                        device=dev)  # fmt: skip

    def write(self, runs: np.ndarray) -> None:
        """Apply ``runs`` (``[k, 5]`` int64 rows of base, value, step, lo, hi). Entries
        written twice in one call must get equal values (a scatter has no defined winner)."""
        for first in range(0, len(runs), self.rows):
            part = runs[first : first + self.rows]
            k = len(part)
            slot = self.next
            self.next = (slot + 1) % len(self.host)
            if self.done[slot] is not None:
                self.done[slot].synchronize()  # outside any replay; practically never waits
            host = self.host_np[slot]
            for c in range(5):  # column-major: each field a contiguous [k] vector
                host[c * k : (c + 1) * k] = part[:, c]
            self.runs[: 5 * k].copy_(self.host[slot][: 5 * k], non_blocking=self.cuda)
            base, value, step, lo, hi = (self.runs[c * k : (c + 1) * k, None] for c in range(5))
            inside, below = self.inside[:k], self.below[:k]
            eff, index, val = self.eff[:k], self.index[:k], self.value[:k]
            torch.ge(self.lane, lo, out=inside)
            torch.lt(self.lane, hi, out=below)
            inside.logical_and_(below)
            torch.where(inside, self.lane, lo, out=eff)
            torch.add(base, eff, out=index)
            torch.mul(eff, step, out=val)
            val.add_(value)
            cast = self.cast[:k]
            if cast is not val:
                cast.copy_(val)
            self.flat.index_copy_(0, index.view(-1), cast.view(-1))
            if self.cuda:
                event = torch.cuda.Event()
                event.record()
                self.done[slot] = event


class _PageStack:
    """Free pages, last freed first out, in a numpy array (a request's thousands of pages
    move in one slice, not one Python object each)."""

    def __init__(self, pages: np.ndarray):
        self.pages = np.array(pages, dtype=np.int64)
        self.size = len(self.pages)

    def __len__(self) -> int:
        return self.size

    def take(self, n: int) -> np.ndarray:
        """The ``n`` pages on top, topmost first."""
        taken = self.pages[self.size - n : self.size][::-1].copy()
        self.size -= n
        return taken

    def push(self, pages) -> None:
        pages = np.asarray(pages, dtype=np.int64)
        end = self.size + len(pages)
        if end > len(self.pages):
            grown = np.empty(max(end, 2 * len(self.pages)), dtype=np.int64)
            grown[: self.size] = self.pages[: self.size]
            self.pages = grown
        self.pages[self.size : end] = pages
        self.size = end


class KVPool:
    """Request rows, a page allocator and (optionally) an SWA pool over device tables.

    Args:
        max_reqs: request rows usable by real requests (rows ``1..max_reqs``).
        max_context_len: tokens a request can hold.
        page_size: tokens per page.
        num_pages: full pages in the pool, page 0 included (default: enough for every row at
            full length).
        swa: keep an SWA pool and ``full_to_swa``.
        swa_num_pages: SWA pages, page 0 included (default ``num_pages``).
        device, dtype: of ``req_to_token`` (int32 or int64).
        seed: page placement.
        row_order: ``"low-first"`` hands out rows 1, 2, ... first; ``"high-first"`` starts at
            ``max_reqs``, so a large pool's ``row * stride`` offsets are exercised.
        extra_cols: ``req_to_token`` rows are this many entries longer than
            ``max_context_len`` (an engine whose table is wider than the page tables need).
        storage_offset: ``req_to_token`` is a view starting this many elements into a larger
            allocation (a non-zero storage offset).
        full_to_swa_dtype: int64 (default) or int32.
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
        extra_cols: int = 0,
        storage_offset: int = 0,
        full_to_swa_dtype: torch.dtype = torch.int64,
    ):
        if row_order not in ("low-first", "high-first"):
            raise ValueError(f"row_order must be 'low-first' or 'high-first', got {row_order!r}")
        if max_reqs < 1 or max_context_len < 1 or page_size < 1:
            raise ValueError(
                f"max_reqs, max_context_len and page_size must be >= 1, got "
                f"{max_reqs}, {max_context_len}, {page_size}"
            )
        if extra_cols < 0 or storage_offset < 0:
            raise ValueError(
                f"extra_cols and storage_offset must be >= 0, got {extra_cols}, {storage_offset}"
            )
        if dtype not in (torch.int32, torch.int64):
            raise ValueError(f"req_to_token dtype must be int32 or int64, got {dtype}")
        if full_to_swa_dtype not in (torch.int32, torch.int64):
            raise ValueError(f"full_to_swa dtype must be int32 or int64, got {full_to_swa_dtype}")
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
        rows, cols = max_reqs + 1, max_context_len + extra_cols
        base = torch.zeros(storage_offset + rows * cols, dtype=dtype, device=self.device)
        self.req_to_token = base[storage_offset:].view(rows, cols)
        free_rows = list(range(1, max_reqs + 1))
        # pop() hands out the end of the list first.
        self._free_rows = free_rows if row_order == "high-first" else free_rows[::-1]
        self._free_pages = _PageStack(self._shuffled(self.num_pages))
        self.requests: dict[int, Request] = {}
        #: Length each freed row held when its request finished.
        self.requests_history: dict[int, int] = {}
        # Per-row arrays mirroring self.requests, for vectorised growth.
        self._length = np.zeros(rows, dtype=np.int64)
        self._page_ids = np.zeros((rows, self.pages_per_req), dtype=np.int64)
        self.swa = swa
        self.full_to_swa: torch.Tensor | None = None
        self._swa_of_page: np.ndarray | None = None
        if swa:
            self.swa_num_pages = swa_num_pages or self.num_pages
            if full_to_swa_dtype == torch.int32 and self.swa_num_pages * page_size >= 2**31:
                raise ValueError("the SWA pool's slots do not fit in int32: use int64")
            self._free_swa_pages = _PageStack(self._shuffled(self.swa_num_pages))
            n_slots = self.num_pages * page_size + 1
            self.full_to_swa = torch.zeros(n_slots, dtype=full_to_swa_dtype, device=self.device)
            # SWA page of each full page (0: unmapped): a whole page maps at once.
            self._swa_of_page = np.zeros(self.num_pages, dtype=np.int64)
        self._r2t_writer = _PageWriter(self.req_to_token, page_size)
        self._swa_writer = _PageWriter(self.full_to_swa, page_size) if swa else None
        self._r2t_runs: list[np.ndarray] = []  # [k, 5] page runs queued for req_to_token
        self._r2t_rows: set[int] = set()  # rows written since the last flush
        self._swa_touched: list[np.ndarray] = []  # full pages whose mapping changed

    def _shuffled(self, n: int) -> np.ndarray:
        pages = np.arange(1, n, dtype=np.int64)
        self.rng.shuffle(pages)
        return pages

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

    def next_free_rows(self, n: int) -> list[int]:
        """The rows the next ``n`` allocations hand out, in order (fewer if fewer are free)."""
        return self._free_rows[::-1][:n]

    def alloc_many(self, lengths: list[int]) -> list[int]:
        """``alloc`` of several new requests at once (the rows ``next_free_rows`` named), with
        one vectorised growth: a decode step's arrivals."""
        if len(lengths) > len(self._free_rows):
            raise PoolExhausted(f"all {self.max_reqs} request rows are in use")
        rows = [self._free_rows.pop() for _ in lengths]
        if not self._r2t_rows.isdisjoint(rows):
            self._flush_r2t()  # as in alloc: never one entry twice in a flush
        for row in rows:
            self.requests[row] = Request(row)
        self._length[rows] = 0
        self.grow(np.asarray(rows, dtype=np.int64), np.asarray(lengths, dtype=np.int64))
        return rows

    def lengths_of(self, rows: np.ndarray) -> np.ndarray:
        """Current lengths of the given request rows (int64 array, 0 for a free row)."""
        return self._length[rows]

    def alloc(self, length: int, row: int | None = None) -> int:
        """A new request of ``length`` tokens; returns its row. ``row`` picks a free row."""
        if not self._free_rows:
            raise PoolExhausted(f"all {self.max_reqs} request rows are in use")
        if row is None:
            row = self._free_rows.pop()
        else:
            self._free_rows.remove(row)
        if row in self._r2t_rows:
            # The row's previous request still has queued writes: apply them first, so that
            # one flush never writes one entry twice (a scatter has no defined winner).
            self._flush_r2t()
        self.requests[row] = Request(row)
        self._length[row] = 0
        self.extend(row, length)
        return row

    def _add_pages(self, req: Request, need: int) -> None:
        if need > len(self._free_pages):
            raise PoolExhausted(f"need {need} pages, {len(self._free_pages)} free")
        first = len(req.pages)
        new = self._free_pages.take(need)
        req.pages.extend(new.tolist())
        self._page_ids[req.row, first : first + need] = new
        if self.swa:
            req.swa_pages.extend([0] * need)
            self._map_swa(req, first, first + need)

    def extend(self, row: int, k: int) -> None:
        """Grow request ``row`` by ``k`` tokens, allocating pages as it crosses page ends."""
        self.grow(np.asarray([row]), np.asarray([k]))

    def grow(self, rows: np.ndarray, ks: np.ndarray) -> None:
        """Grow request ``rows[i]`` by ``ks[i]`` tokens (distinct rows), vectorised: a decode
        step grows every running request by one token (plus draft tokens)."""
        rows = np.asarray(rows, dtype=np.int64)
        ks = np.asarray(ks, dtype=np.int64)
        old = self._length[rows]
        new = old + ks
        if (new > self.max_context_len).any():
            bad = int(rows[np.argmax(new > self.max_context_len)])
            raise ValueError(
                f"request row {bad}: {int(new.max())} tokens exceed max_context_len="
                f"{self.max_context_len}"
            )
        ps = self.page_size
        need = -(-new // ps) - np.asarray([len(self.requests[int(r)].pages) for r in rows])
        for i in np.flatnonzero(need > 0):
            self._add_pages(self.requests[int(rows[i])], int(need[i]))
        grown = ks > 0
        if grown.any():
            # One run per page a row's new tokens touch: tokens [max(t0, p*ps), min(t1,
            # (p+1)*ps)) of page p get slots page_ids[row, p] * ps + lane.
            r, t0, t1 = rows[grown], old[grown], new[grown]
            p0, p1 = t0 // ps, (t1 - 1) // ps
            count = p1 - p0 + 1
            owner = np.repeat(np.arange(len(r)), count)
            page = p0[owner] + (np.arange(int(count.sum())) - np.repeat(np.cumsum(count) - count,
                                                                        count))  # fmt: skip
            row_of = r[owner]
            runs = np.empty((len(page), 5), dtype=np.int64)
            runs[:, 0] = row_of * self.req_to_token.stride(0) + page * ps
            runs[:, 1] = self._page_ids[row_of, page] * ps
            runs[:, 2] = 1
            runs[:, 3] = np.maximum(t0[owner] - page * ps, 0)
            runs[:, 4] = np.minimum(t1[owner] - page * ps, ps)
            self._r2t_runs.append(runs)
            self._r2t_rows.update(r.tolist())
        self._length[rows] = new
        for r, n in zip(rows.tolist(), new.tolist()):
            self.requests[r].length = n

    def free(self, row: int) -> None:
        """Finish request ``row``: its pages return to the pool, its SWA slots map to 0, its
        ``req_to_token`` row keeps the old entries."""
        req = self.requests.pop(row)
        self.requests_history[row] = req.length
        if self.swa:
            self._unmap_swa(req, req.swa_first, len(req.pages))
        self._free_pages.push(req.pages)
        self._free_rows.append(row)
        self._length[row] = 0

    # -- SWA ------------------------------------------------------------------------------

    def _set_swa(self, pages, swa_pages) -> None:
        # The host copy takes every change in order; flush uploads its final state, so a page
        # mapped and evicted before one flush is written once.
        pages = np.asarray(pages, dtype=np.int64)
        self._swa_of_page[pages] = swa_pages
        self._swa_touched.append(pages)

    def _map_swa(self, req: Request, lo: int, hi: int) -> None:
        """Give full pages ``lo:hi`` of ``req`` fresh SWA pages."""
        n = hi - lo
        if n > len(self._free_swa_pages):
            raise PoolExhausted(f"need {n} SWA pages, {len(self._free_swa_pages)} free")
        swa = self._free_swa_pages.take(n)
        req.swa_pages[lo:hi] = swa.tolist()
        self._set_swa(req.pages[lo:hi], swa)

    def _unmap_swa(self, req: Request, lo: int, hi: int) -> None:
        """Return the SWA pages of full pages ``lo:hi``; their slots map to 0."""
        if hi <= lo:
            return
        mapped = np.asarray(req.swa_pages[lo:hi], dtype=np.int64)
        self._free_swa_pages.push(mapped[mapped != 0])
        req.swa_pages[lo:hi] = [0] * (hi - lo)
        self._set_swa(req.pages[lo:hi], 0)

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

    def evict_rows_outside_window(self, rows: list[int], window: int) -> int:
        """``evict_outside_window`` for many rows; only rows with pages to evict cost Python."""
        if not rows:
            return 0
        idx = np.asarray(rows, dtype=np.int64)
        first_kept = np.maximum(self._length[idx] - window, 0) // self.page_size
        swa_first = np.asarray([self.requests[r].swa_first for r in rows])
        return sum(
            self.evict_outside_window(rows[i], window)
            for i in np.flatnonzero(first_kept > swa_first)
        )

    def remap_swa(self, row: int) -> None:
        """Move every mapped SWA page of ``row`` to a new SWA page (mapping churn between
        replays): the new pages are taken before the old ones return."""
        req = self.requests[row]
        lo, hi = req.swa_first, len(req.pages)
        old = [p for p in req.swa_pages[lo:hi] if p]
        self._map_swa(req, lo, hi)
        self._free_swa_pages.push(old)

    # -- device tables --------------------------------------------------------------------

    def _flush_r2t(self) -> None:
        if self._r2t_runs:
            self._r2t_writer.write(np.concatenate(self._r2t_runs))
            self._r2t_runs.clear()
        self._r2t_rows.clear()

    def flush(self) -> None:
        """Apply queued writes to ``req_to_token`` and ``full_to_swa`` (non-blocking copies on
        the current stream; call it between replays, never inside one)."""
        self._flush_r2t()
        if self._swa_touched:
            # A page touched twice uploads its one final state twice: equal values, so no
            # need to deduplicate.
            pages = np.concatenate(self._swa_touched)
            swa = self._swa_of_page[pages]
            ps = self.page_size
            runs = np.empty((len(pages), 5), dtype=np.int64)
            runs[:, 0] = pages * ps
            runs[:, 1] = swa * ps
            runs[:, 2] = swa != 0  # an unmapped page: every slot maps to 0
            runs[:, 3] = 0
            runs[:, 4] = ps
            self._swa_writer.write(runs)
            self._swa_touched.clear()

    def batch(self, rows: list[int]) -> tuple[list[int], list[int]]:
        """``(req_pool_indices, seq_lens)`` of the given request rows, as host lists."""
        return list(rows), self._length[np.asarray(rows, dtype=np.int64)].tolist()
