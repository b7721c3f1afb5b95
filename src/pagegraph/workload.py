"""Seeded, engine-like decode streams that drive a ``KVPool`` between graph replays.

Each step of a ``DecodeWorkload`` does what a continuous-batching scheduler does between two
decode steps, in this order:

1. requests finish: at random (``finish_rate``), and any request at exact capacity;
2. the batch size follows a seeded random walk over ``1..max_bs`` (so it moves up and down
   across buckets); new requests arrive to reach it, reusing freed rows first, usually with
   shorter lengths than the row held before (a row's length shrinks between replays), and
   sometimes the batch order is shuffled;
3. every running request grows by ``1 + draft_tokens`` (speculative decoding verifies the
   draft tokens in the same step); a request that would pass ``max_context_len`` grows to
   exactly that length instead, so exact capacity is reached and replayed;
4. with SWA, pages that left the window are evicted (their mapping becomes 0), and a random
   request's SWA pages are remapped with probability ``swa_churn``;
5. the pool's queued writes are flushed, and the step yields the batch as host lists.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from .pool import KVPool


@dataclass
class Step:
    """One decode batch: ``req_pool_indices[i]`` and ``seq_lens[i]`` of each batch row."""

    index: int
    req_pool_indices: list[int]
    seq_lens: list[int]

    @property
    def bs(self) -> int:
        return len(self.seq_lens)


class DecodeWorkload:
    """An iterable of ``Step`` over ``pool``; see the module docstring for what a step does.

    Args:
        pool: the pool to drive (its ``max_reqs`` must be at least ``max_bs``).
        max_bs: largest batch.
        steps: number of steps.
        seed: everything random here.
        finish_rate: probability that a running request finishes at a step.
        draft_tokens: extra tokens per step (speculative decoding), ``0`` for plain decode.
        initial_len: ``(lo, hi)`` tokens of an arriving request (default 1 to a quarter of
            ``max_context_len``).
        swa_window: evict SWA pages older than this many tokens (``None``: no eviction).
        swa_churn: probability per step of remapping one request's SWA pages.
        min_bs: smallest batch of the random walk.
        near_capacity: fraction of arrivals that start a few steps short of
            ``max_context_len`` (long prompts), so exact capacity is reached and replayed.
    """

    def __init__(
        self,
        pool: KVPool,
        *,
        max_bs: int,
        steps: int,
        seed: int = 0,
        finish_rate: float = 0.05,
        draft_tokens: int = 0,
        initial_len: tuple[int, int] | None = None,
        swa_window: int | None = None,
        swa_churn: float = 0.0,
        min_bs: int = 1,
        near_capacity: float = 0.1,
    ):
        if pool.max_reqs < max_bs:
            raise ValueError(f"pool has {pool.max_reqs} request rows, fewer than max_bs={max_bs}")
        if not 0 <= draft_tokens <= 64:
            raise ValueError(f"draft_tokens must be in 0..64, got {draft_tokens}")
        self.pool = pool
        self.max_bs = max_bs
        self.steps = steps
        self.finish_rate = finish_rate
        self.draft_tokens = draft_tokens
        lo, hi = initial_len or (1, max(1, pool.max_context_len // 4))
        if not 1 <= lo <= hi <= pool.max_context_len:
            raise ValueError(f"initial_len {(lo, hi)} must lie in 1..{pool.max_context_len}")
        self.initial_len = (lo, hi)
        self.swa_window = swa_window
        self.swa_churn = swa_churn
        self.min_bs = max(1, min(min_bs, max_bs))
        self.near_capacity = near_capacity
        self.rng = np.random.default_rng(seed)
        self.running: list[int] = []
        self._target = self.rng.integers(self.min_bs, max_bs + 1)

    def __len__(self) -> int:
        return self.steps

    def __iter__(self) -> Iterator[Step]:
        for i in range(self.steps):
            yield self.step(i)

    def _arrival_length(self, row_hint: int | None) -> int:
        cap, grow = self.pool.max_context_len, 1 + self.draft_tokens
        if self.rng.random() < self.near_capacity:
            return int(max(1, cap - grow * self.rng.integers(1, 6)))
        lo, hi = self.initial_len
        if row_hint is not None:
            # A reused row: usually shorter than what it held, so its stale tail is exposed.
            old = self.pool.requests_history.get(row_hint, hi)
            hi = max(lo, min(hi, old - 1))
        return int(self.rng.integers(lo, hi + 1))

    def step(self, index: int) -> Step:
        pool, rng = self.pool, self.rng
        cap = pool.max_context_len
        grow = 1 + self.draft_tokens

        # 1. finishes
        keep = []
        for row in self.running:
            length = pool.requests[row].length
            if length >= cap or rng.random() < self.finish_rate:
                pool.free(row)
            else:
                keep.append(row)
        self.running = keep

        # 2. batch-size random walk and arrivals
        step_size = max(1, self.max_bs // 8)
        self._target = int(
            np.clip(
                self._target + rng.integers(-step_size, step_size + 1), self.min_bs, self.max_bs
            )
        )
        while len(self.running) > self._target:
            pool.free(self.running.pop(int(rng.integers(len(self.running)))))
        while len(self.running) < self._target:
            hint = pool.next_free_row()
            length = max(1, min(self._arrival_length(hint), cap - grow))
            self.running.append(pool.alloc(length))
        if rng.random() < 0.2:
            rng.shuffle(self.running)

        # 3. growth, to exact capacity at most
        for row in self.running:
            pool.extend(row, min(grow, cap - pool.requests[row].length))

        # 4. SWA eviction and churn
        if pool.swa:
            if self.swa_window is not None:
                for row in self.running:
                    pool.evict_outside_window(row, self.swa_window)
            if self.running and rng.random() < self.swa_churn:
                pool.remap_swa(self.running[int(rng.integers(len(self.running)))])

        # 5. device tables
        pool.flush()
        rows, lens = pool.batch(self.running)
        return Step(index, rows, lens)
