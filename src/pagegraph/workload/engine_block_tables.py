"""An engine's per-request block tables kept between steps, as vLLM's ``BlockTables`` keeps
them: ``EngineBlockTables``, the input of a ``"block_table"`` builder.

``update`` brings the batch's slots up to date from the pool's ``req_to_token`` with a few
launches and no host read of a device value: grown slots get their new blocks appended, a
shrunk slot (a new request) is rewritten from block 0, and entries past ``num_blocks`` keep
whatever they held, as vLLM leaves them.
"""

from __future__ import annotations

import numpy as np
import torch
from numpy.typing import ArrayLike

__all__ = ["EngineBlockTables"]

#: Pinned staging buffers: one is refilled only after the copy that read it has completed.
RING = 4


def _ranges(lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Every ``(i, j)`` with ``lo[i] <= j < hi[i]``, as two int64 arrays."""
    count = np.maximum(hi - lo, 0)
    owner = np.repeat(np.arange(len(lo)), count)
    first = np.repeat(np.cumsum(count) - count, count)
    return owner, lo[owner] + (np.arange(int(count.sum())) - first)


class EngineBlockTables:
    """Per-request block tables of ``max_reqs`` slots, ``width`` blocks each, pages of
    ``page_size`` tokens, on ``device``::

        block_table  [max_reqs, width]  int32   block ids of each request slot
        num_blocks   [max_reqs]         int32   live blocks of each request slot

    and a host copy of ``num_blocks`` (``host_num_blocks``) with each slot's last length, from
    which the next step's writes are planned without reading the device."""

    def __init__(
        self, max_reqs: int, width: int, page_size: int, device: str | torch.device = "cpu"
    ) -> None:
        if max_reqs < 1 or width < 1 or page_size < 1:
            raise ValueError(
                f"max_reqs, width and page_size must be >= 1, got {max_reqs}, {width}, {page_size}"
            )
        self.max_reqs, self.width, self.page_size = max_reqs, width, page_size
        self.device = torch.device(device)
        # One spare row past the last slot: a builder that trusts an injected ``num_blocks``
        # past the width (``inject_num_blocks``, by at most a row) reads into the next slot's
        # row, and from the last slot into this one, never past the allocation.
        rows = torch.zeros((max_reqs + 1, width), dtype=torch.int32, device=self.device)
        self.block_table = rows[:max_reqs]
        self.num_blocks = torch.zeros(max_reqs, dtype=torch.int32, device=self.device)
        self.host_num_blocks = np.zeros(max_reqs, dtype=np.int64)
        self.host_lengths = np.zeros(max_reqs, dtype=np.int64)
        self._ring: list[torch.Tensor] = []
        self._done: list[torch.cuda.Event] = []
        self._next = 0

    # -- staging ----------------------------------------------------------------------------

    def _upload(self, packed: np.ndarray) -> torch.Tensor:
        """``packed`` (int64) on the device. On a GPU through a ring of pinned buffers, grown
        when too small, so that the copy neither waits for the device nor for its queue."""
        if self.device.type != "cuda":
            return torch.from_numpy(packed)
        slot = self._next
        self._next = (slot + 1) % RING
        if len(self._ring) < RING:
            self._ring.append(torch.empty(0, dtype=torch.int64))
            self._done.append(torch.cuda.Event())
        self._done[slot].synchronize()  # the copy that last read this buffer, RING ago
        if self._ring[slot].numel() < packed.size:
            self._ring[slot] = torch.empty(2 * packed.size, dtype=torch.int64, pin_memory=True)
        host = self._ring[slot][: packed.size]
        host.numpy()[:] = packed
        staged = host.to(self.device, non_blocking=True)
        self._done[slot].record(torch.cuda.current_stream(self.device))
        return staged

    # -- steps ------------------------------------------------------------------------------

    def update(
        self,
        req_pool_indices: ArrayLike,
        seq_lens: ArrayLike,
        req_to_token: torch.Tensor,
        new: ArrayLike | None = None,
    ) -> None:
        """Bring the batch's request slots up to date from the pool's ``req_to_token``.

        A slot whose length grew gets only its new blocks appended (``block_table[r,
        old:need]``), a slot whose length shrank holds a new request and is rewritten from
        block 0 (vLLM's overwrite), and entries past ``num_blocks`` keep whatever they held, as
        vLLM leaves them. Afterwards ``block_table[r, p] == req_to_token[r, p * page_size] //
        page_size`` for ``p < num_blocks[r]``. The device work is a few launches whatever the
        batch (a copy of the planned indices from pinned memory, a gather, two scatters); no
        host read of a device value, no Python loop over device tensors.

        Args:
            req_pool_indices: ``[bs]`` host ints (a list, numpy array or CPU tensor), the
                request slot of each batch row. A slot repeated (padding that repeats a
                stale slot) takes the last row's length.
            seq_lens: ``[bs]`` host ints, each row's length in tokens (negative as 0).
            req_to_token: the pool's ``[>= max_reqs, >= (width - 1) * page_size + 1]`` int32
                or int64 device table of token slots, indexed by request slot.
            new: optional ``[bs]`` host bools: rows that hold a new request in their slot
                (rewritten from 0 even when not shorter than the slot's last length).
        """
        rows = np.asarray(req_pool_indices, dtype=np.int64).reshape(-1)
        lens = np.asarray(seq_lens, dtype=np.int64).reshape(-1)
        if rows.shape != lens.shape:
            raise ValueError(f"{rows.size} request slots, {lens.size} lengths")
        if rows.size and (rows.min() < 0 or rows.max() >= self.max_reqs):
            raise ValueError(f"request slots must be in [0, {self.max_reqs})")
        ps = self.page_size
        if req_to_token.shape[0] < self.max_reqs or req_to_token.shape[1] <= (self.width - 1) * ps:
            raise ValueError(
                f"req_to_token {tuple(req_to_token.shape)} cannot fill {self.max_reqs} rows "
                f"of {self.width} pages of {ps}"
            )
        fresh = np.zeros(rows.size, bool) if new is None else np.asarray(new, bool).reshape(-1)
        # The last row of a repeated slot wins.
        _, last = np.unique(rows[::-1], return_index=True)
        keep = rows.size - 1 - last
        rows, lens, fresh = rows[keep], lens[keep], fresh[keep]
        need = np.minimum(-(-np.maximum(lens, 0) // ps), self.width)  # cdiv, by row
        overwrite = fresh | (lens < self.host_lengths[rows])
        start = np.where(overwrite, 0, np.minimum(self.host_num_blocks[rows], need))
        owner, cols = _ranges(start, need)
        k = owner.size
        staged = self._upload(np.concatenate([rows[owner], cols, rows, need]))
        if k:
            r, c = staged[:k], staged[k : 2 * k]
            ids = req_to_token[r, c * ps].to(torch.int64) // ps
            self.block_table.index_put_((r, c), ids.to(torch.int32))
        if rows.size:
            u = rows.size
            slots, counts = staged[2 * k : 2 * k + u], staged[2 * k + u :]
            self.num_blocks.index_put_((slots,), counts.to(torch.int32))
        self.host_num_blocks[rows] = need
        self.host_lengths[rows] = lens

    def buffers(self) -> dict[str, torch.Tensor]:
        """The device state a builder reads, by name (the runner watches their addresses)."""
        return {"block_table": self.block_table, "num_blocks": self.num_blocks}

    def reset(self, row: int) -> None:
        """A finished request's slot: no live blocks (its entries stay, stale, as in vLLM)."""
        if not 0 <= row < self.max_reqs:
            raise ValueError(f"row {row} outside [0, {self.max_reqs})")
        self.host_num_blocks[row] = 0
        self.host_lengths[row] = 0
        self.num_blocks[row : row + 1].zero_()

    # -- hostile inputs ---------------------------------------------------------------------

    def inject_num_blocks(self, rows: ArrayLike, values: ArrayLike) -> None:
        """Break the host guarantee ``0 <= num_blocks <= width``: set the device ``num_blocks``
        of slots ``rows`` to ``values`` (say, ``width + 3`` or ``-1``; at most ``2 * width``,
        which the spare row keeps inside the allocation) without touching the host copy, as a
        corrupted engine would; ``restore_num_blocks`` undoes it."""
        rows = np.asarray(rows, dtype=np.int64).reshape(-1)
        values = np.asarray(values, dtype=np.int64).reshape(-1)
        if rows.shape != values.shape:
            raise ValueError(f"{rows.size} request slots, {values.size} values")
        if rows.size and (rows.min() < 0 or rows.max() >= self.max_reqs):
            raise ValueError(f"request slots must be in [0, {self.max_reqs})")
        if values.size and values.max() > 2 * self.width:
            raise ValueError(
                f"num_blocks past {2 * self.width} (twice the width) would read past the tables"
            )
        staged = self._upload(np.concatenate([rows, values]))
        self.num_blocks.index_put_((staged[: rows.size],), staged[rows.size :].to(torch.int32))

    def restore_num_blocks(self) -> None:
        """The device ``num_blocks`` from the host copy again (undoes ``inject_num_blocks``)."""
        self.num_blocks.copy_(self._upload(self.host_num_blocks.copy()))
