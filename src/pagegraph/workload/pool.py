"""A KV-cache pool model: what tests, workloads and scenarios drive, mirroring an engine.

``KVPool`` holds ``req_to_token`` (row 0 a dummy request, page 0 reserved for padding), pages
from a shuffled, seeded free list and an optional SWA pool (``full_to_swa``). The host keeps
each request's state in per-row arrays, and writes to the device tables are queued as page
runs, applied by ``flush()`` with no allocation and no wait for the device, or handed over by
``take_writes()`` for a ``WriteAhead`` (``pagegraph.workload.write_ahead``). Freed rows keep
their old entries, as engines leave them (docs/ARCHITECTURE.md, "The workload"). The tables'
sizes are ``pool_sizing``'s, which a memory check counts before anything is allocated.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TypeAlias, cast

import numpy as np
import torch
from numpy.typing import ArrayLike

from ..kernels.contract import cdiv
from .page_writes import MAX_PAGE_SIZE, RunWriter


class PoolExhausted(RuntimeError):
    """No free request row, full page or SWA page is left."""


@dataclass
class Request:
    """A snapshot of one running request (``KVPool.requests``), for inspection."""

    row: int
    length: int = 0
    pages: list[int] = field(default_factory=list)
    #: SWA page of each full page (same index), 0 where unmapped. Eviction runs from the
    #: front, as a window slides: pages ``[:swa_first]`` are evicted.
    swa_pages: list[int] = field(default_factory=list)
    swa_first: int = 0


#: Table entries one upload expands at most (per table); larger writes go in parts.
FLUSH_CHUNK = 1 << 21
#: Pinned staging buffers per table. A buffer is refilled only once the copy that last read
#: it has completed; with this many, a checker that keeps three replays in flight never waits.
FLUSH_RING = 4


def _ranges(lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Every ``(i, j)`` with ``lo[i] <= j < hi[i]``, ``i`` after ``i``, as two int64 arrays
    (``i`` indexes the caller's per-row arrays: ``rows[i]``, ``t0[i]``, ...)."""
    count = np.maximum(hi - lo, 0)
    total = int(count.sum())
    owner = np.repeat(np.arange(len(lo)), count)
    j = lo[owner] + (np.arange(total) - np.repeat(np.cumsum(count) - count, count))
    return owner, j


def writer_capacity(numel: int, page_size: int) -> int:
    """Runs one upload of a ``_PageWriter`` holds: ``FLUSH_CHUNK`` entries, or fewer for a
    small table (a step writes each page at most twice: an arrival's last page, then its
    growth)."""
    return max(1, min(FLUSH_CHUNK // page_size, 2 * cdiv(numel, page_size) + 2))


def writer_bytes(numel: int, page_size: int, itemsize: int) -> int:
    """Device bytes of a ``_PageWriter``'s scratch for a table of ``numel`` entries of
    ``itemsize`` bytes, at most (for a memory check before anything is allocated): the
    operators' expansion scratch, which a writer on a GPU, with the kernel, does not need."""
    n = writer_capacity(numel, page_size)
    entries = n * page_size
    return 6 * n * 8 + entries * (3 * 8 + (0 if itemsize == 8 else itemsize)) + page_size * 8


@dataclass(frozen=True)
class PoolSizing:
    """A ``KVPool``'s device tables, sized before any is allocated: ``req_to_token`` is
    ``[rows, cols]`` from ``storage_offset`` elements into its allocation; ``full_to_swa``
    (SWA only) has an entry a slot of the full pool, and one."""

    rows: int
    cols: int
    storage_offset: int
    page_size: int
    pages_per_req: int
    num_pages: int
    swa: bool
    r2t_itemsize: int
    f2s_itemsize: int

    @property
    def r2t_entries(self) -> int:
        return self.storage_offset + self.rows * self.cols

    @property
    def f2s_entries(self) -> int:
        return self.num_pages * self.page_size + 1 if self.swa else 0

    def device_bytes(self) -> dict[str, int]:
        """Bytes of ``req_to_token``, ``full_to_swa`` and the write scratch (``writer_bytes``,
        one writer a table)."""
        scratch = writer_bytes(self.rows * self.cols, self.page_size, self.r2t_itemsize)
        if self.swa:
            scratch += writer_bytes(self.f2s_entries, self.page_size, self.f2s_itemsize)
        return {
            "req_to_token": self.r2t_entries * self.r2t_itemsize,
            "full_to_swa": self.f2s_entries * self.f2s_itemsize,
            "pool write scratch": scratch,
        }


def pool_sizing(
    *,
    max_reqs: int,
    max_context_len: int,
    page_size: int,
    num_pages: int | None = None,
    swa: bool = False,
    dtype: torch.dtype = torch.int32,
    extra_cols: int = 0,
    storage_offset: int = 0,
    full_to_swa_dtype: torch.dtype = torch.int64,
    **placement: object,
) -> PoolSizing:
    """The tables ``KVPool(**kwargs)`` allocates, sized (``placement``: the arguments that size
    none, ``device``, ``seed``, ``row_order``, ``swa_num_pages``); the pool checks them."""
    per_req = cdiv(max_context_len, page_size)
    return PoolSizing(
        rows=max_reqs + 1,
        cols=max_context_len + extra_cols,
        storage_offset=storage_offset,
        page_size=page_size,
        pages_per_req=per_req,
        num_pages=num_pages or max_reqs * per_req + 1,
        swa=swa,
        r2t_itemsize=dtype.itemsize,
        f2s_itemsize=full_to_swa_dtype.itemsize,
    )


#: A group of page runs, ``[k, 5]`` int64: a numpy array, or a contiguous CPU tensor in
#: page-locked memory (see ``_PageWriter.stage``).
Runs = np.ndarray | torch.Tensor


class _PageWriter:
    """Writes whole-page runs into one table, sync- and allocation-free after construction.

    A run is ``(base, value, step, lo, hi)``: entries ``base + j`` for lanes ``lo <= j < hi``
    of one page get ``value + j * step`` (a request's token slots: step 1; an unmapped SWA
    page: value 0, step 0). The host sends five integers a page, not one a token: ``stage``
    puts up to ``capacity`` runs through a pinned staging ring and one non-blocking copy and
    expands them on the table's device into preallocated scratch (every operator writes
    ``out=``); ``apply(lo, hi)`` writes runs ``lo:hi`` of it with one ``index_copy_``. Lanes
    outside ``[lo, hi)`` are clamped into it, so they write an entry of their own run again
    with its own value: the expansion is rectangular and never writes an entry it was not
    given. The runs go up row by row, as the pool made them (one memory copy a group of runs,
    no transposition on the host); the device reads each field as a strided column.

    On a GPU (pages up to ``page_writes.MAX_PAGE_SIZE``; or with ``kernel=True``) no
    expansion happens: ``apply`` launches a Triton kernel (``page_writes.RunWriter``) that
    reads the uploaded runs and writes their entries, one launch a step instead of five
    operators a staging and an ``index_copy_`` a step. Both paths write the same entries with
    the same values (``tests/test_pool.py``).
    """

    def __init__(self, table: torch.Tensor, page_size: int, kernel: bool | None = None):
        self.flat = table.view(-1)
        dev, dtype = table.device, table.dtype
        self.cuda = table.is_cuda
        n = self.capacity = writer_capacity(table.numel(), page_size)
        ps = page_size
        self.host = [
            torch.empty(5 * n, dtype=torch.int64, pin_memory=self.cuda)
            for _ in range(FLUSH_RING if self.cuda else 1)
        ]
        self.host_np = [h.numpy() for h in self.host]
        # One event a staging slot, made once and recorded again at each use of the slot (a
        # never-recorded event's synchronize() returns at once).
        self.done = [torch.cuda.Event() for _ in self.host] if self.cuda else None
        self.next = 0
        self.runs = torch.empty(5 * n, dtype=torch.int64, device=dev)
        self.page_size = ps
        use_kernel = (self.cuda and ps <= MAX_PAGE_SIZE) if kernel is None else kernel
        self._kernel = RunWriter(self.runs, self.flat, ps) if use_kernel else None
        if self._kernel is not None:
            return
        self.last = torch.empty((n, 1), dtype=torch.int64, device=dev)
        # Made on the host and moved: ``arange`` on the ``meta`` device (the producer's host
        # model) goes through torch's Python references, whose first use imports sympy.
        self.lane = torch.arange(ps, dtype=torch.int64).to(dev)[None, :]
        self.eff = torch.empty((n, ps), dtype=torch.int64, device=dev)
        self.index = torch.empty((n, ps), dtype=torch.int64, device=dev)
        self.value = torch.empty((n, ps), dtype=torch.int64, device=dev)
        self.cast = (
            self.value if dtype == torch.int64 else torch.empty((n, ps), dtype=dtype, device=dev)
        )
        # Flat views made once: ``apply`` slices them (a slice and a view per call cost more).
        self._index_flat = self.index.view(-1)
        self._cast_flat = self.cast.view(-1)

    def stage(self, runs: Runs | list[Runs]) -> None:
        """Upload and expand ``runs`` (``[k, 5]`` int64 rows of base, value, step, lo, hi, or a
        list of such arrays taken in order as if concatenated; ``k <= capacity`` in all) into
        scratch rows ``:k``, replacing what was staged before.

        A part may be a numpy array (copied into this writer's pinned staging) or a C-contiguous
        CPU tensor in page-locked memory (copied to the device in place, adjacent such parts in
        one copy: a workload child's ring, see ``producer``). The caller keeps a tensor part's
        memory unchanged until the copy has completed (an event recorded after this call)."""
        parts = runs if isinstance(runs, list) else [runs]
        k = sum(len(part) for part in parts)
        if k > self.capacity:
            raise ValueError(f"{k} runs staged at once, capacity {self.capacity}")
        slot = self.next
        self.next = (slot + 1) % len(self.host)
        if self.done is not None:
            self.done[slot].synchronize()  # outside any replay; practically never waits
        host, pinned = self.host_np[slot], self.host[slot]
        at = 0
        # Scratch entries [lo, at) not uploaded yet: from the staging slot (tensor None), or
        # from adjacent tensor parts (first, the first of them).
        lo, first, end_ptr, storage = 0, None, -1, None
        for part in parts:
            if not len(part):
                continue
            end = at + 5 * len(part)
            if isinstance(part, torch.Tensor):
                if part.dtype != torch.int64 or not part.is_contiguous() or part.is_cuda:
                    raise ValueError("tensor runs must be contiguous int64 on the CPU")
                # One copy for parts that follow each other in one storage (as_strided below
                # reads the first part's storage).
                here = part.untyped_storage().data_ptr()
                if first is None or part.data_ptr() != end_ptr or here != storage:
                    self._upload(lo, at, first, pinned)
                    lo, first, storage = at, part, here
                end_ptr = part.data_ptr() + 8 * part.numel()
            else:
                if first is not None:
                    self._upload(lo, at, first, pinned)
                    lo, first = at, None
                host[at:end] = part.reshape(-1)
            at = end
        self._upload(lo, at, first, pinned)
        if self.done is not None:
            # On the stream the copy went to: the table's device's (whatever device is current).
            self.done[slot].record(torch.cuda.current_stream(self.flat.device))
        if self._kernel is not None:
            return  # apply() reads the runs as uploaded
        rows = self.runs[: 5 * k].view(k, 5)
        base, value, step, first_lane, hi = (rows[:, c : c + 1] for c in range(5))
        last = self.last[:k]
        torch.sub(hi, 1, out=last)  # the last lane, for the clamp
        eff, val = self.eff[:k], self.value[:k]
        torch.clamp(self.lane, first_lane, last, out=eff)
        torch.add(base, eff, out=self.index[:k])
        torch.mul(eff, step, out=val)
        val.add_(value)
        cast = self.cast[:k]
        if cast is not val:
            cast.copy_(val)

    def _upload(self, lo: int, hi: int, first: torch.Tensor | None, pinned: torch.Tensor) -> None:
        """Copy scratch entries ``[lo, hi)`` to the device: from ``first`` onwards in its memory
        (adjacent tensor parts), or from the same entries of the pinned staging slot."""
        if hi == lo:
            return
        if first is None:
            src = pinned[lo:hi]
        else:
            src = first.as_strided((hi - lo,), (1,), first.storage_offset())
        self.runs[lo:hi].copy_(src, non_blocking=self.cuda)

    def apply(self, lo: int, hi: int) -> None:
        """Write staged runs ``lo:hi``. Entries written twice by them must get equal values
        (a scatter has no defined winner)."""
        if self._kernel is not None:
            self._kernel(lo, hi - lo)
            return
        ps = self.page_size
        self.flat.index_copy_(
            0, self._index_flat[lo * ps : hi * ps], self._cast_flat[lo * ps : hi * ps]
        )

    def write(self, runs: Runs) -> None:
        """Stage and apply ``runs`` now, in parts of ``capacity`` runs."""
        for first in range(0, len(runs), self.capacity):
            part = runs[first : first + self.capacity]
            self.stage(part)
            self.apply(0, len(part))


#: Queued writes, closed and in order: ``(writer, runs)`` groups.
Writes: TypeAlias = list[tuple["_PageWriter", Runs]]


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

    def push(self, pages: ArrayLike) -> None:
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
        sizing = pool_sizing(
            max_reqs=max_reqs,
            max_context_len=max_context_len,
            page_size=page_size,
            num_pages=num_pages,
            swa=swa,
            dtype=dtype,
            extra_cols=extra_cols,
            storage_offset=storage_offset,
            full_to_swa_dtype=full_to_swa_dtype,
        )
        self.pages_per_req = sizing.pages_per_req
        self.num_pages = sizing.num_pages
        if self.num_pages < 2:
            raise ValueError("num_pages must be >= 2: page 0 is reserved for padding")
        if dtype == torch.int32 and self.num_pages * page_size >= 2**31:
            raise ValueError("the pool's slots do not fit in int32: use dtype=torch.int64")
        self.rng = np.random.default_rng(seed)
        rows, cols = sizing.rows, sizing.cols
        base = torch.zeros(sizing.r2t_entries, dtype=dtype, device=self.device)
        self.req_to_token = base[storage_offset:].view(rows, cols)
        self._row_stride = self.req_to_token.stride(0)
        free_rows = list(range(1, max_reqs + 1))
        # pop() hands out the end of the list first.
        self._free_rows = free_rows if row_order == "high-first" else free_rows[::-1]
        self._free_pages = _PageStack(self._shuffled(self.num_pages))
        # Per-row request state (row 0, the dummy, stays empty).
        self._running = np.zeros(rows, dtype=bool)
        self._length = np.zeros(rows, dtype=np.int64)
        self._n_pages = np.zeros(rows, dtype=np.int64)
        self._page_ids = np.zeros((rows, self.pages_per_req), dtype=np.int64)
        #: Length each row's last finished request held (-1: none yet).
        self._last_length = np.full(rows, -1, dtype=np.int64)
        self.swa = swa
        self.full_to_swa: torch.Tensor | None = None
        if swa:
            self.swa_num_pages = swa_num_pages or self.num_pages
            if full_to_swa_dtype == torch.int32 and self.swa_num_pages * page_size >= 2**31:
                raise ValueError("the SWA pool's slots do not fit in int32: use int64")
            self._free_swa_pages = _PageStack(self._shuffled(self.swa_num_pages))
            self.full_to_swa = torch.zeros(
                sizing.f2s_entries, dtype=full_to_swa_dtype, device=self.device
            )
            # SWA page of each full page (0: unmapped): a whole page maps at once.
            self._swa_of_page = np.zeros(self.num_pages, dtype=np.int64)
            # Scratch of _close's deduplication, one slot a full page.
            self._swa_slot_of_page = np.zeros(self.num_pages, dtype=np.int64)
            self._swa_ids = np.zeros((rows, self.pages_per_req), dtype=np.int64)
            self._swa_first = np.zeros(rows, dtype=np.int64)
        self._r2t_writer = _PageWriter(self.req_to_token, page_size)
        swa_table = cast(torch.Tensor, self.full_to_swa)  # made above when swa
        self._swa_writer = _PageWriter(swa_table, page_size) if swa else None
        self._r2t_runs: list[np.ndarray] = []  # [k, 5] page runs queued for req_to_token
        self._r2t_rows: set[int] = set()  # rows with queued req_to_token runs
        self._swa_touched: list[np.ndarray] = []  # full pages whose mapping changed
        self._queued: Writes = []  # closed groups, applied in order

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

    @property
    def requests(self) -> dict[int, Request]:
        """A snapshot of every running request, by row (built on each access: for tests and
        inspection, not for a loop)."""
        out = {}
        for row in np.flatnonzero(self._running).tolist():
            n = int(self._n_pages[row])
            out[row] = Request(
                row,
                int(self._length[row]),
                self._page_ids[row, :n].tolist(),
                self._swa_ids[row, :n].tolist() if self.swa else [],
                int(self._swa_first[row]) if self.swa else 0,
            )
        return out

    def last_lengths(self, rows: ArrayLike) -> np.ndarray:
        """Length each of ``rows`` held when its last request finished (-1: never used)."""
        return self._last_length[np.asarray(rows, dtype=np.int64)]

    def next_free_row(self) -> int | None:
        """The row the next ``alloc()`` hands out, or ``None`` when none is free."""
        return self._free_rows[-1] if self._free_rows else None

    def next_free_rows(self, n: int) -> list[int]:
        """The rows the next ``n`` allocations hand out, in order (fewer if fewer are free)."""
        return self._free_rows[::-1][:n]

    def lengths_of(self, rows: np.ndarray) -> np.ndarray:
        """Current lengths of the given request rows (int64 array, 0 for a free row)."""
        return cast(np.ndarray, self._length[rows])

    def alloc(self, length: int, row: int | None = None) -> int:
        """A new request of ``length`` tokens; returns its row. ``row`` picks a free row."""
        if not self._free_rows:
            raise PoolExhausted(f"all {self.max_reqs} request rows are in use")
        if row is None:
            row = self._free_rows.pop()
        else:
            self._free_rows.remove(row)
        self._start([row], [length])
        return row

    def alloc_many(self, lengths: list[int]) -> list[int]:
        """``alloc`` of several new requests at once (the rows ``next_free_rows`` named), with
        one vectorised growth: a decode step's arrivals."""
        if len(lengths) > len(self._free_rows):
            raise PoolExhausted(f"all {self.max_reqs} request rows are in use")
        rows = [self._free_rows.pop() for _ in lengths]
        self._start(rows, lengths)
        return rows

    def _start(self, rows: list[int], lengths: ArrayLike) -> None:
        if not self._r2t_rows.isdisjoint(rows):
            # A row's previous request still has queued writes: close them into their own
            # group first, so that no one write group sets an entry twice (a scatter has no
            # defined winner).
            self._close_r2t()
        idx = np.asarray(rows, dtype=np.int64)
        self._running[idx] = True
        self._length[idx] = 0
        self.grow(idx, np.asarray(lengths, dtype=np.int64))

    def extend(self, row: int, k: int) -> None:
        """Grow request ``row`` by ``k`` tokens, allocating pages as it crosses page ends."""
        self.grow(np.asarray([row]), np.asarray([k]))

    def grow(self, rows: np.ndarray, ks: np.ndarray) -> None:
        """Grow request ``rows[i]`` by ``ks[i]`` tokens (distinct running rows), vectorised: a
        decode step grows every running request by one token (plus draft tokens)."""
        rows = np.asarray(rows, dtype=np.int64)
        ks = np.asarray(ks, dtype=np.int64)
        if not self._running[rows].all():
            raise KeyError(f"row {int(rows[np.argmin(self._running[rows])])} is not running")
        old = self._length[rows]
        new = old + ks
        if (new > self.max_context_len).any():
            bad = int(rows[np.argmax(new > self.max_context_len)])
            raise ValueError(
                f"request row {bad}: {int(new.max())} tokens exceed max_context_len="
                f"{self.max_context_len}"
            )
        ps = self.page_size
        need = -(-new // ps) - self._n_pages[rows]
        more = need > 0
        if more.any():
            self._add_pages(rows[more], need[more])
        grown = ks > 0
        if grown.any():
            # One run per page a row's new tokens touch: tokens [max(t0, p*ps), min(t1,
            # (p+1)*ps)) of page p get slots page_ids[row, p] * ps + lane.
            r, t0, t1 = rows[grown], old[grown], new[grown]
            owner, page = _ranges(t0 // ps, (t1 - 1) // ps + 1)
            row_of, t0_of, t1_of = r[owner], t0[owner], t1[owner]
            runs = np.empty((len(page), 5), dtype=np.int64)
            runs[:, 0] = row_of * self._row_stride + page * ps
            runs[:, 1] = self._page_ids[row_of, page] * ps
            runs[:, 2] = 1
            runs[:, 3] = np.maximum(t0_of - page * ps, 0)
            runs[:, 4] = np.minimum(t1_of - page * ps, ps)
            self._r2t_runs.append(runs)
            self._r2t_rows.update(r.tolist())
        self._length[rows] = new

    def _add_pages(self, rows: np.ndarray, need: np.ndarray) -> None:
        """Give ``rows[i]`` ``need[i]`` more pages (and SWA pages), row after row."""
        total = int(need.sum())
        if total > len(self._free_pages):
            raise PoolExhausted(f"need {total} pages, {len(self._free_pages)} free")
        if self.swa and total > len(self._free_swa_pages):
            raise PoolExhausted(f"need {total} SWA pages, {len(self._free_swa_pages)} free")
        owner, j = _ranges(self._n_pages[rows], self._n_pages[rows] + need)
        row_of = rows[owner]
        pages = self._free_pages.take(total)
        self._page_ids[row_of, j] = pages
        self._n_pages[rows] += need
        if self.swa:
            swa = self._free_swa_pages.take(total)
            self._swa_ids[row_of, j] = swa
            self._set_swa(pages, swa)

    def free(self, row: int) -> None:
        """Finish request ``row``: its pages return to the pool, its SWA slots map to 0, its
        ``req_to_token`` row keeps the old entries."""
        self.free_many([row])

    def free_many(self, rows: ArrayLike) -> None:
        """``free`` of several requests (distinct rows), in order."""
        idx = np.asarray(rows, dtype=np.int64)
        if not len(idx):
            return
        if not self._running[idx].all():
            raise KeyError(f"row {int(idx[np.argmin(self._running[idx])])} is not running")
        n = self._n_pages[idx]
        if self.swa:
            self._unmap_swa(idx, self._swa_first[idx], n)
            self._swa_first[idx] = 0
        owner, j = _ranges(np.zeros_like(n), n)
        self._free_pages.push(self._page_ids[idx[owner], j])
        self._free_rows.extend(idx.tolist())
        self._last_length[idx] = self._length[idx]
        self._running[idx] = False
        self._length[idx] = 0
        self._n_pages[idx] = 0

    # -- SWA ------------------------------------------------------------------------------

    def _set_swa(self, pages: np.ndarray, swa_pages: ArrayLike) -> None:
        # The host copy takes every change in order; the writes upload its final state, so a
        # page mapped and evicted before one flush is written once.
        self._swa_of_page[pages] = swa_pages
        self._swa_touched.append(pages)

    def _unmap_swa(self, rows: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> None:
        """Return the SWA pages of full pages ``lo[i]:hi[i]`` of ``rows[i]``; their slots map
        to 0."""
        owner, j = _ranges(lo, hi)
        row_of = rows[owner]
        if not len(j):
            return
        mapped = self._swa_ids[row_of, j]
        self._free_swa_pages.push(mapped[mapped != 0])
        self._swa_ids[row_of, j] = 0
        self._set_swa(self._page_ids[row_of, j], 0)

    def evict_outside_window(self, row: int, window: int) -> int:
        """Free the SWA pages of ``row`` that lie wholly before its last ``window`` tokens, as a
        sliding-window engine does; their slots map to 0. Returns pages evicted."""
        return self.evict_rows_outside_window([row], window)

    def evict_rows_outside_window(self, rows: ArrayLike, window: int) -> int:
        """``evict_outside_window`` for many rows, vectorised; returns pages evicted."""
        idx = np.asarray(rows, dtype=np.int64)
        if not len(idx):
            return 0
        first_kept = np.maximum(self._length[idx] - window, 0) // self.page_size
        first = self._swa_first[idx]
        sel = first_kept > first
        if not sel.any():
            return 0
        idx, first, first_kept = idx[sel], first[sel], first_kept[sel]
        self._unmap_swa(idx, first, first_kept)
        self._swa_first[idx] = first_kept
        return int((first_kept - first).sum())

    def remap_swa(self, row: int) -> None:
        """Move every mapped SWA page of ``row`` to a new SWA page (mapping churn between
        replays): the new pages are taken before the old ones return."""
        lo, hi = int(self._swa_first[row]), int(self._n_pages[row])
        n = hi - lo
        if n > len(self._free_swa_pages):
            raise PoolExhausted(f"need {n} SWA pages, {len(self._free_swa_pages)} free")
        old = self._swa_ids[row, lo:hi].copy()
        swa = self._free_swa_pages.take(n)
        self._swa_ids[row, lo:hi] = swa
        self._set_swa(self._page_ids[row, lo:hi].copy(), swa)
        self._free_swa_pages.push(old[old != 0])

    # -- device tables --------------------------------------------------------------------

    def _close_r2t(self) -> None:
        if self._r2t_runs:
            self._queued.append((self._r2t_writer, np.concatenate(self._r2t_runs)))
            self._r2t_runs.clear()
        self._r2t_rows.clear()

    def _close(self) -> None:
        self._close_r2t()
        if self._swa_touched:
            # Each page once, in its final state. A step touches many pages twice (a finished
            # request's pages unmapped, then mapped again for an arrival that takes them; an
            # arrival's pages mapped, then those behind its window evicted), and each touch's
            # run would otherwise be sent, staged and scattered again.
            pages = np.concatenate(self._swa_touched)
            # Linear, not a sort: each position writes its index into the page's slot (of
            # duplicates, one write stands), and the positions whose write stood are kept.
            at = np.arange(len(pages))
            self._swa_slot_of_page[pages] = at
            pages = pages[self._swa_slot_of_page[pages] == at]
            swa = self._swa_of_page[pages]
            ps = self.page_size
            runs = np.empty((len(pages), 5), dtype=np.int64)
            runs[:, 0] = pages * ps
            runs[:, 1] = swa * ps
            runs[:, 2] = swa != 0  # an unmapped page: every slot maps to 0
            runs[:, 3] = 0
            runs[:, 4] = ps
            self._queued.append((cast(_PageWriter, self._swa_writer), runs))  # an SWA pool's
            self._swa_touched.clear()

    def flush(self) -> None:
        """Apply queued writes to ``req_to_token`` and ``full_to_swa`` (non-blocking copies on
        the current stream; call it between replays, never inside one)."""
        for writer, runs in self.take_writes():
            writer.write(runs)

    def take_writes(self) -> Writes:
        """The queued writes, closed and removed from the queue but not applied: a
        ``WriteAhead`` applies them later, in the order taken."""
        self._close()
        writes, self._queued = self._queued, []
        return writes

    def batch(self, rows: list[int]) -> tuple[list[int], list[int]]:
        """``(req_pool_indices, seq_lens)`` of the given request rows, as host lists."""
        return list(rows), self._length[np.asarray(rows, dtype=np.int64)].tolist()
