"""The exact verification of a replay's outputs on the device: ``TableVerifier``.

docs/ARCHITECTURE.md ("Inside the checker") has the details.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import torch

from ...kernels.contract import ERROR_KINDS, POISON, cdiv
from ...kernels.cudart import HostToDevice
from ...kinds import KindSpec
from .batch_model import IN_BUCKET, OUT_OF_CONTRACT, REAL, BatchModel, ModelStep

__all__ = [
    "CANARY_ROWS",
    "IN_BUCKET",
    "OUT_OF_CONTRACT",
    "REAL",
    "BatchModel",
    "ModelStep",
    "TableVerifier",
    "batch_size",
    "preset_views",
    "read_mask",
    "read_previous",
    "replay_bytes",
    "vector_replay_bytes",
]

INT32_MAX = 2**31 - 1


#: Canary rows above and below the rows of every table allocation.
CANARY_ROWS = 1
#: Replays verified by one launch, at most (see ``TableVerifier``).
MAX_BATCH = 16
#: Device memory a batch's verification may take.
BATCH_BYTES = 256 << 20
#: Pinned buffers ``upload`` fills in turn: a buffer is refilled ``UPLOAD_RING`` uploads later,
#: so a caller that keeps at most ``UPLOAD_RING - 1`` replays in flight never overwrites one a
#: pending copy still reads.
UPLOAD_RING = 4

_E = len(ERROR_KINDS)
#: Offsets into a record.
#: Fields a mask writes into a record: count, flat index of the first entry, expected, got.
MASK_FIELDS = 4


def preset_views(
    vectors: torch.Tensor | None, names: tuple[str, ...], kind: KindSpec
) -> list[torch.Tensor]:
    """One-entry views of ``vectors`` for the presettable outputs ``names`` of a builder of
    ``kind`` (``KindSpec.presets``), set to their value (0) here, as an engine sets them at
    allocation; ``[]`` without vectors."""
    if vectors is None:
        return []
    entries = kind.presets
    views = [vectors[v, e : e + 1] for v, e in (entries[n] for n in names)]
    for view in views:
        view.fill_(0)
    return views


def replay_bytes(tables: int, rows: int, padded_width: int, max_bs: int, cap: int) -> int:
    """Device bytes the verification of one replay takes in a batch (an upper estimate): its
    snapshot of the tables and of the reference's gathers, the expected tables, the boolean
    masks over them, the gathers as int64, the live mask and the previous replay's tables (what
    a stale failure compares with)."""
    entries = tables * rows * padded_width
    # + the snapshot of the gathers (at most int64) and their int64 copies in the computation
    return entries * (4 + 4 + 4 + 12 + 2) + max_bs * cap * (16 * tables + 9)


def vector_replay_bytes(vector_entries: int, csr_capacity: int = 0) -> int:
    """Device bytes a replay's output vectors take in a verification batch (an upper
    estimate): ``vector_entries`` int32 entries snapshotted, expected and masked (12 bytes an
    entry, twice for the intermediates), and for a CSR builder the int64 steps of the
    ``csr_capacity``-entry index computation."""
    return vector_entries * 12 * 2 + csr_capacity * 8 * 8


def batch_size(per_replay: int, chunk: int) -> int:
    """Replays a verification launch covers: as many as ``BATCH_BYTES`` holds at
    ``per_replay`` bytes each, at most ``MAX_BATCH`` and ``chunk``, at least one."""
    return max(1, min(MAX_BATCH, chunk, BATCH_BYTES // max(per_replay, 1)))


class TableVerifier:
    """Verify replays on the device (see the module docstring).

    Args:
        tables: ``[T, max_bs + 2, width + pad]`` int32, the allocation the runner's page
            tables are views of (``tables[t, 1 : 1 + max_bs, :width]``).
        width: pages per table row.
        req_to_token, full_to_swa: the pool's tables (``full_to_swa`` with ``T == 2``).
        page_size: tokens per page.
        staged: the runner's static ``(req_pool_indices, seq_lens)`` ``[max_bs]``.
        errors: the runner's ``errors`` buffer, or ``None``.
        chunk: replays between two read-backs (records in the ring).
        use_graph: capture the snapshot and the verification as CUDA graphs (CUDA only).
        vectors: for a metadata builder, ``[3, max_bs + 3]`` int32, the allocation its
            ``cache_seqlens`` (``vectors[0, 1 : 1 + max_bs]``), ``cu_seqlens_k`` and
            ``cu_seqlens_q`` (``vectors[k, 1 : 2 + max_bs]``) are views of; for a CSR builder
            (``kind="csr"``), ``[2, L]`` int32, holding ``kv_indptr`` (``vectors[0, 1 : 2 +
            max_bs]``) and ``kv_indices`` (``vectors[1, 1 : 1 + csr_capacity]``).
        kind: the builder's kind (``pagegraph.kinds.KindSpec``): whether it writes tables,
            its vectors and how they are verified (``KindSpec.vector_fields``).
        row_strides: each table view's row stride in its ``[rows, padded width]`` slab of
            ``tables`` (default: the padded width; an SWA table with its own, smaller, row
            stride has its rows packed closer, and the rest of its slab is canary).
        csr_capacity: entries of the kind's engine-sized vector (a CSR builder's
            ``kv_indices``).
        draft_tokens: the metadata builder's ``draft_tokens``.
        error_kinds: counters of the ``errors`` buffer that are checked.
        batch: replays verified by one launch (default: as many as ``BATCH_BYTES`` holds, at
            most ``MAX_BATCH`` and ``chunk``).

    Per replay, ``verify()`` snapshots what the replay left (the tables, the vectors, the
    staged inputs, the error counters, with the model) into ring entry ``slot % batch`` and
    poisons the tables again: a small graph. Every ``batch`` replays, and before a read, one
    launch of the verification graph compares all ``batch`` entries at once and writes each
    one's record: its launch, tens of kernels, costs the host tens of microseconds, now paid
    once a batch rather than once a replay. Entries not refreshed since the last batch are
    verified again and rewrite their own (already judged or not yet read) records with the
    same values; entries never written point at a scratch record.
    """

    def __init__(
        self,
        *,
        tables: torch.Tensor,
        width: int,
        req_to_token: torch.Tensor,
        full_to_swa: torch.Tensor | None,
        page_size: int,
        staged: tuple[torch.Tensor, torch.Tensor],
        errors: torch.Tensor | None,
        chunk: int,
        use_graph: bool,
        vectors: torch.Tensor | None = None,
        draft_tokens: int = 0,
        error_kinds: int = _E,
        batch: int | None = None,
        preset_outputs: tuple[str, ...] = (),
        kind: KindSpec,
        csr_capacity: int = 0,
        row_strides: tuple[int, ...] | None = None,
    ):
        dev = tables.device
        self.vectors = vectors
        self.kind = kind
        self.vector_names = kind.vector_names
        #: entries of the kind's engine-sized vector (``kv_indices``), 0 for other kinds
        self.engine_capacity = self.csr_capacity = csr_capacity
        self.poison_value = POISON
        self._preset = preset_views(vectors, preset_outputs, kind)
        self.draft_tokens = draft_tokens
        self.E = error_kinds
        self.device = dev
        self.tables = tables
        self.T, rows, self.padded_width = tables.shape
        self.row_strides = tuple(row_strides or (self.padded_width,) * self.T)
        if len(self.row_strides) != self.T or not all(
            width <= s <= self.padded_width for s in self.row_strides
        ):
            raise ValueError(
                f"row_strides {self.row_strides} must be T values in width..padded width"
            )
        self._flat_indices: dict[tuple[int, int], torch.Tensor] = {}
        self.max_bs = rows - 2 * CANARY_ROWS
        self.width = width
        self.page_size = page_size
        self.r2t = req_to_token
        self.f2s = full_to_swa
        self.staged = staged
        self.errors = errors
        self.chunk = chunk
        # Pages of a row the reference gathers: a table row's, or a CSR row's (no table width).
        row_pages = cdiv(req_to_token.shape[1], page_size)
        self.cap = min(width, row_pages) if kind.writes_tables else row_pages
        #: the null value a padded row is cleared to over its width, or None (padded rows
        #: are built from the padding's values like real rows)
        self.cleared = kind.padded_rows.null if kind.padded_rows.cleared else None
        if self.cleared is not None and self.cap != width:
            raise ValueError(
                f"a {kind.name} builder clears padded rows over the width ({width} pages), "
                f"wider than req_to_token's rows ({row_pages} pages)"
            )
        self._lay_out_record(vectors is not None)
        M, cap = self.max_bs, self.cap
        if batch is None:
            per = replay_bytes(self.T, rows, self.padded_width, M, cap)
            if vectors is not None:
                per += vector_replay_bytes(vectors.numel(), csr_capacity)
            batch = batch_size(per, chunk)
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            raise ValueError(f"batch must be a positive integer, got {batch!r}")
        self.batch = batch

        # Inputs uploaded per replay: the model's state, then the record slot.
        self.model = torch.zeros(3 * M + 1, dtype=torch.int64, device=dev)
        # Records of a chunk, and a scratch row for ring entries never written.
        self.records = torch.zeros((chunk + 1, self.record_size), dtype=torch.int64, device=dev)
        cuda = dev.type == "cuda"
        self._ring = [
            torch.zeros(3 * M + 1, dtype=torch.int64, pin_memory=cuda) for _ in range(UPLOAD_RING)
        ]
        self._ring_np = [t.numpy() for t in self._ring]
        self._ring_ptrs = [t.data_ptr() for t in self._ring]
        self._ring_next = 0
        # The upload as one cudaMemcpyAsync (no torch dispatch; see cudart), or None.
        self._upload_copy = HostToDevice.make(self.model) if cuda else None
        self._host_records = torch.zeros(
            (chunk, self.record_size), dtype=torch.int64, pin_memory=cuda
        )
        self._allocate_ring(rows)
        self.graph: torch.cuda.CUDAGraph | None = None
        self.snapshot_graph: torch.cuda.CUDAGraph | None = None
        if use_graph:
            self._capture()

    def _lay_out_record(self, has_vectors: bool) -> None:
        """Where each field of a replay's record lies: the masks (wrong and outside for each
        table, then, for a metadata builder, for the vectors), the staged rows, the error
        counters, then what the previous replay left."""
        self.masks = 2 * self.T + (2 if has_vectors else 0)
        self.staged_at = self.masks * MASK_FIELDS
        self.errors_at = self.staged_at + 4
        #: What the previous replay left where this one's first failures are: whether the
        #: previous ring entry holds the replay just before (1) or not (0), then each table's
        #: value at its "correct" mask's first entry, then the staged request index and length
        #: at the first staged row that differs (``read_previous``).
        self.previous_at = self.errors_at + 2 * self.E
        #: the replay judged last (the host's record of the ring's previous entry)
        self.previous_step: ModelStep | None = None
        self.record_size = self.previous_at + 3 + self.T

    def _allocate_ring(self, rows: int) -> None:
        """The snapshot ring of ``batch`` entries and the computation's buffers and
        constants (``rows``: rows of a table allocation, canaries included)."""
        K, M, cap, dev = self.batch, self.max_bs, self.cap, self.device
        # The snapshot ring: what each of the last ``batch`` replays left.
        self._models = torch.zeros((K, 3 * M + 1), dtype=torch.int64, device=dev)
        self._models[:, 3 * M] = self.chunk  # the scratch record
        self._snap_tables = torch.zeros(
            (K, *self.tables.shape), dtype=self.tables.dtype, device=dev
        )
        self._snap_staged = tuple(
            torch.zeros((K, M), dtype=t.dtype, device=dev) for t in self.staged
        )
        self._snap_errors = (
            torch.zeros((K, self.E), dtype=self.errors.dtype, device=dev)
            if self.errors is not None
            else None
        )
        self.snap_vectors = (
            torch.zeros((K, *self.vectors.shape), dtype=self.vectors.dtype, device=dev)
            if self.vectors is not None
            else None
        )
        # The reference's gathers, taken at the replay: the workload's next steps rewrite
        # req_to_token and full_to_swa before the batch is verified.
        self._snap_slots = torch.zeros((K, M, cap), dtype=self.r2t.dtype, device=dev)
        self._snap_swa: torch.Tensor | None = None
        if self.T == 2:
            assert self.f2s is not None, "an SWA table is verified against full_to_swa"
            self._snap_swa = torch.zeros((K, M, cap), dtype=self.f2s.dtype, device=dev)
        self._unverified = 0
        # Constants of the computation.
        self._col_tokens = torch.arange(cap, device=dev, dtype=torch.int64) * self.page_size
        self._cols = torch.arange(cap, device=dev, dtype=torch.int64)
        self._mask_table = torch.arange(2 * self.T, device=dev, dtype=torch.int64) % self.T
        self._expected = torch.empty((K, *self.tables.shape), dtype=self.tables.dtype, device=dev)
        if self.vectors is not None:
            self.expected_vectors = torch.empty(
                (K, *self.vectors.shape), dtype=self.vectors.dtype, device=dev
            )
            self.vector_index = torch.arange(M + 1, device=dev, dtype=torch.int64)
            self.capacity_index = torch.arange(self.engine_capacity, device=dev, dtype=torch.int64)
        self._live = torch.zeros((K, self.T, rows, self.padded_width), dtype=torch.bool, device=dev)
        self._ooc = torch.zeros_like(self._live)
        for t, stride in enumerate(self.row_strides):  # the packed tables' entries, flat
            if stride != self.padded_width:
                for n in (self.cap, self.width):
                    rows_n = torch.arange(self.max_bs, device=dev) + CANARY_ROWS
                    cols_n = torch.arange(n, device=dev)
                    flat = (rows_n[:, None] * stride + cols_n[None, :]).reshape(-1)
                    self._flat_indices[t, n] = flat

    # -- per replay -----------------------------------------------------------------------

    def upload(self, model: BatchModel, slot: int) -> None:
        """Stage the model's state for the next verification, without a host sync (a pinned
        ring and a non-blocking copy; the caller keeps at most ``UPLOAD_RING - 1`` replays in
        flight)."""
        if not 0 <= slot < self.chunk:
            raise ValueError(f"record slot {slot} outside 0..{self.chunk - 1}")
        i = self._ring_next
        self._ring_next = (i + 1) % len(self._ring)
        host = self._ring_np[i]
        host[:-1] = model.state
        host[-1] = slot
        if self._upload_copy is not None:
            self._upload_copy(self._ring_ptrs[i])
        else:
            self.model.copy_(self._ring[i], non_blocking=self.device.type == "cuda")

    def poison(self) -> None:
        self.tables.fill_(POISON)
        if self.vectors is not None:
            self.vectors.fill_(POISON)
            for entry in self._preset:  # set once at allocation by the engine, kept
                entry.fill_(0)
        if self.errors is not None:
            self.errors.zero_()

    def verify(self) -> None:
        """Snapshot this replay and poison the tables again; verify the batch when full.
        Records are written in slots ``0..chunk-1`` in order, each batch of consecutive
        slots (the caller reads them back with ``read`` before starting again at 0)."""
        if self.snapshot_graph is not None:
            self.snapshot_graph.replay()
        else:
            self._snapshot()
        self._unverified += 1
        if self._unverified == self.batch:
            self._verify_batch()

    def read(self, count: int) -> np.ndarray:
        """The records of the last ``count`` replays (slots ``0..count-1``): waits for them."""
        if self._unverified:
            self._verify_batch()
        if self.device.type == "cuda":
            self._host_records[:count].copy_(self.records[:count], non_blocking=True)
            torch.cuda.current_stream(self.device).synchronize()
            return self._host_records[:count].numpy().copy()
        return self.records[:count].numpy().copy()

    def _verify_batch(self) -> None:
        self._unverified = 0
        if self.graph is not None:
            self.graph.replay()
        else:
            self._compute()

    # -- the computation ------------------------------------------------------------------

    def _capture(self) -> None:
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            self._compute()  # warm-up: the caching allocator sees every size once
        torch.cuda.current_stream(self.device).wait_stream(side)
        torch.cuda.synchronize(self.device)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self._compute()
        with torch.cuda.stream(side):
            self._snapshot()  # warm-up (it poisons the tables, as the caller does next)
        torch.cuda.current_stream(self.device).wait_stream(side)
        torch.cuda.synchronize(self.device)
        self.snapshot_graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.snapshot_graph):
            self._snapshot()
        torch.cuda.synchronize(self.device)
        self.records.zero_()
        self._models.zero_()
        self._models[:, 3 * self.max_bs] = self.chunk  # every entry at the scratch record

    def _snapshot(self) -> None:
        """Copy what the replay left into ring entry ``slot % batch`` (the slot is on the
        device, in the uploaded model), with the reference's gathers from ``req_to_token``
        and ``full_to_swa`` as they are now, then poison the tables for the next replay."""
        M = self.max_bs
        entry = self.model[3 * M :] % self.batch
        self._models.index_copy_(0, entry, self.model.view(1, -1))
        # The page start of every column of every row (request index clamped into the table).
        rows = self.model[:M].clamp(0, self.r2t.shape[0] - 1)
        slots = self.r2t[rows.unsqueeze(-1), self._col_tokens]  # [M, cap]
        self._snap_slots.index_copy_(0, entry, slots.unsqueeze(0))
        if self._snap_swa is not None:
            assert self.f2s is not None  # _snap_swa is allocated with full_to_swa (T == 2)
            swa = self.f2s[slots.clamp(0, self.f2s.shape[0] - 1)]
            self._snap_swa.index_copy_(0, entry, swa.unsqueeze(0))
        self._snap_tables.index_copy_(0, entry, self.tables.unsqueeze(0))
        for snap, t in zip(self._snap_staged, self.staged):
            snap.index_copy_(0, entry, t[:M].view(1, -1))
        if self._snap_errors is not None:
            assert self.errors is not None  # _snap_errors is allocated with errors
            self._snap_errors.index_copy_(0, entry, self.errors[: self.E].view(1, -1))
        if self.snap_vectors is not None:
            assert self.vectors is not None  # snap_vectors is allocated with vectors
            self.snap_vectors.index_copy_(0, entry, self.vectors.unsqueeze(0))
        self.poison()

    def _compute(self) -> None:
        """Verify every ring entry (``K`` replays): one record each, written at its slot."""
        M, cap, ps, W, K = self.max_bs, self.cap, self.page_size, self.width, self.batch
        models = self._models
        rpi, sl, flags = models[:, :M], models[:, M : 2 * M], models[:, 2 * M : 3 * M]
        slot = models[:, 3 * M]
        in_bucket = (flags & IN_BUCKET) != 0  # [K, M]
        ooc = (flags & OUT_OF_CONTRACT) != 0

        # The reference: n = min(cdiv(max(len, 0), ps), cap) live pages a row, each the page
        # of the slot at the page's first token (request index clamped into req_to_token).
        # A metadata builder builds its tables for cache_seqlens = max(len, 0) + draft tokens.
        tokens = torch.where(in_bucket, sl.clamp(min=0) + self.draft_tokens, 0)
        n_pages = ((tokens + (ps - 1)) // ps).clamp(max=cap)
        live = self._cols < n_pages.unsqueeze(-1)  # [K, M, cap]
        slots = self._snap_slots.to(torch.int64)  # gathered at the replay (see _snapshot)
        pages = slots // ps
        if self.cleared is not None:  # padded rows: the null value over the whole width
            padded = (in_bucket & ((flags & REAL) == 0)).unsqueeze(-1)
            live = live | padded
            pages = torch.where(padded, self.cleared, pages)
        expected = self._expected
        expected.fill_(POISON)
        self._live.zero_()
        if self.kind.writes_tables:  # else the builder gets no table: it must keep the poison
            self._place(expected, 0, torch.where(live, pages, POISON))
            if self.T == 2:
                assert self._snap_swa is not None  # allocated for T == 2
                swa_slots = self._snap_swa.to(torch.int64)
                self._place(expected, 1, torch.where(live, swa_slots // ps, POISON))
            for t in range(self.T):
                self._place(self._live, t, live)
        self._ooc.zero_()
        ooc_rows = ooc.unsqueeze(-1).expand(K, M, W)
        for t in range(self.T):
            self._place(self._ooc, t, ooc_rows)
        tables = self._snap_tables
        diff = tables != expected  # [K, T, rows, padded width]
        judged = diff & ~self._ooc  # an out-of-contract row may hold anything
        live_t = self._live
        masks = torch.cat([judged & live_t, judged & ~live_t], dim=1).view(K, 2 * self.T, -1)
        counts = masks.sum(-1)  # [K, 2T]
        first = masks.to(torch.uint8).argmax(-1)
        flat = self._mask_table * masks.shape[-1] + first
        mask_fields = torch.stack(
            [
                counts,
                first,
                expected.view(K, -1).gather(1, flat).long(),
                tables.view(K, -1).gather(1, flat).long(),
            ],
            dim=-1,
        ).view(K, -1)
        if self.vectors is not None:
            model = SimpleNamespace(
                n_pages=n_pages,
                slots=slots,
                sl=sl,
                in_bucket=in_bucket,
                ooc=ooc & in_bucket,
                real=(flags & REAL) != 0,
            )
            fields = self.kind.vector_fields(self, model)
            mask_fields = torch.cat([mask_fields, fields], dim=1)

        got_rpi, got_sl = (t.to(torch.int64) for t in self._snap_staged)
        bad = in_bucket & ((got_rpi != rpi) | (got_sl != sl))
        # gather, not got[bad_row]: indexing with a 0-dim tensor reads it on the host.
        bad_row = bad.to(torch.uint8).argmax(-1, keepdim=True)  # [K, 1]
        staged_fields = torch.cat(
            [
                bad.sum(-1, keepdim=True),
                bad_row,
                got_rpi.gather(1, bad_row),
                got_sl.gather(1, bad_row),
            ],
            dim=1,
        )

        error_fields = self._error_fields(rpi, sl, in_bucket, live, slots)
        # What the previous replay left (ring entry k - 1, when it holds the replay just before
        # entry k's: consecutive slots), where this replay's first failures are.
        prev_slot = torch.roll(slot, 1)
        valid = (torch.arange(K, device=slot.device) >= 1) & (slot - prev_slot == 1)
        prev_tables = torch.roll(tables, 1, dims=0).view(K, -1)
        prev_fields = torch.cat(
            [
                valid.long().unsqueeze(-1),
                prev_tables.gather(1, flat[:, : self.T]).long(),
                torch.roll(got_rpi, 1, dims=0).gather(1, bad_row),
                torch.roll(got_sl, 1, dims=0).gather(1, bad_row),
            ],
            dim=1,
        )
        record = torch.cat([mask_fields, staged_fields, error_fields, prev_fields], dim=1)
        self.records.index_copy_(0, slot, record)

    def _error_fields(
        self,
        rpi: torch.Tensor,
        sl: torch.Tensor,
        in_bucket: torch.Tensor,
        live: torch.Tensor,
        slots: torch.Tensor,
    ) -> torch.Tensor:
        """``[K, 2 * E]`` int64: the error counts the model expects (rows over capacity,
        negative lengths, request indices outside ``req_to_token``, SWA slots outside
        ``full_to_swa``, running sums past int32), then the builder's; zeros without errors."""
        K = self.batch
        if self.errors is None:
            return torch.zeros((K, 2 * self.E), dtype=torch.int64, device=self.device)
        cap_tokens = self.cap * self.page_size
        r2t_rows = self.r2t.shape[0]
        parts = [
            (in_bucket & (sl.clamp(min=0) + self.draft_tokens > cap_tokens)).sum(-1),
            (in_bucket & (sl < 0)).sum(-1),
            (in_bucket & ((rpi < 0) | (rpi >= r2t_rows))).sum(-1),
        ]
        if self.T == 2:
            assert self.f2s is not None  # given with T == 2 (_allocate_ring)
            f2s_len = self.f2s.shape[0]
            parts.append((live & ((slots < 0) | (slots >= f2s_len))).sum((-2, -1)))
        else:
            parts.append(torch.zeros(K, dtype=torch.int64, device=self.device))
        if self.E > _E:  # cu_seqlens_k entries whose true running sum passed int32
            overflowed = self.running_sums(sl, in_bucket) > INT32_MAX
            parts.append((overflowed & in_bucket).sum(-1))
        assert self._snap_errors is not None  # allocated with errors
        return torch.cat([torch.stack(parts, dim=1), self._snap_errors.to(torch.int64)], dim=1)

    def _place(self, dst: torch.Tensor, t: int, values: torch.Tensor) -> None:
        """Write ``values`` (``[K, max_bs, n]``) at table ``t``'s entries ``[row, :n]`` in
        ``dst`` (``[K, T, rows, padded width]``, laid out as ``tables``), by its row
        stride."""
        n = values.shape[-1]
        if self.row_strides[t] == self.padded_width:
            dst[:, t, CANARY_ROWS : CANARY_ROWS + self.max_bs, :n] = values
        else:
            flat = dst.view(dst.shape[0], self.T, -1)
            flat[:, t, self._flat_indices[t, n]] = values.reshape(dst.shape[0], -1).to(dst.dtype)

    def running_sums(self, sl: torch.Tensor, in_bucket: torch.Tensor) -> torch.Tensor:
        """``[K, max_bs]`` int64 true running sums of ``cache_seqlens`` over the bucket's
        rows."""
        cache = (sl.clamp(min=0) + self.draft_tokens).clamp(max=INT32_MAX)
        return torch.cumsum(torch.where(in_bucket, cache, 0), -1)

    def vector_masks(
        self, exp: torch.Tensor, live: torch.Tensor, judged: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The two vector masks' fields (``[K, 8]``): entries of ``live`` that differ from
        ``exp``, then entries outside it that differ (and are ``judged``, when given)."""
        K = self.batch
        vectors = self.snap_vectors
        assert vectors is not None, "vector masks are for a kind with vectors"
        diff = vectors != exp
        outside = diff & ~live if judged is None else diff & ~live & judged
        masks = torch.stack([diff & live, outside], dim=1).view(K, 2, -1)
        counts = masks.sum(-1)
        first = masks.to(torch.uint8).argmax(-1)
        return torch.stack(
            [
                counts,
                first,
                exp.view(K, -1).gather(1, first).long(),
                vectors.view(K, -1).gather(1, first).long(),
            ],
            dim=-1,
        ).view(K, -1)


def read_previous(record: np.ndarray, verifier: TableVerifier) -> tuple[list[int], int, int] | None:
    """What the previous replay left at this record's first failures: each table's value at
    its "correct" mask's first entry, and the staged request index and length at the first
    staged row that differs; ``None`` when the record's previous ring entry does not hold the
    replay just before."""
    at = verifier.previous_at
    if not record[at]:
        return None
    tables = [int(v) for v in record[at + 1 : at + 1 + verifier.T]]
    return tables, int(record[at + 1 + verifier.T]), int(record[at + 2 + verifier.T])


def read_mask(record: np.ndarray, mask: int) -> tuple[int, int, int, int] | None:
    """``(count, flat index, expected, got)`` of mask ``mask`` in a record, ``None`` when it
    found nothing. The flat index is into the table (``[rows + 2, padded width]``) or the
    vectors' allocation the mask covers."""
    base = mask * MASK_FIELDS
    count = int(record[base])
    if not count:
        return None
    return count, int(record[base + 1]), int(record[base + 2]), int(record[base + 3])
