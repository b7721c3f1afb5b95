"""Seeded, engine-like decode streams that drive a ``KVPool`` between graph replays.

A ``DecodeWorkload`` step does what a continuous-batching scheduler does between two decode
steps (finishes, arrivals into freed rows, growth by ``1 + draft_tokens``, SWA eviction), then
yields the batch, optionally with out-of-contract values injected as engines' batches carry
them; the order of a step is ``DecodeWorkload``'s docstring.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from .pool import KVPool
from .write_ahead import WriteAhead


@dataclass
class Step:
    """One decode batch: ``req_pool_indices[i]`` and ``seq_lens[i]`` of each batch row, as
    host lists (``DecodeWorkload``) or ``[bs]`` int64 numpy arrays (``ProducedWorkload``)."""

    index: int
    req_pool_indices: list[int] | np.ndarray
    seq_lens: list[int] | np.ndarray

    @property
    def bs(self) -> int:
        return len(self.seq_lens)


@dataclass(frozen=True)
class Injection:
    """Per-step probabilities of values outside (or at the edge of) the builder contract."""

    #: a length past the row's capacity: just past, several pages past, or huge
    overlong: float = 0.0
    #: a negative length
    negative: float = 0.0
    #: a zero length (in the contract: the row writes nothing)
    zero: float = 0.0
    #: a request index outside ``req_to_token`` (negative or past its last row)
    bad_index: float = 0.0

    def any(self) -> bool:
        return bool(self.overlong or self.negative or self.zero or self.bad_index)


class DecodeWorkload:
    """An iterable of ``Step`` over ``pool``. Each step does what a continuous-batching
    scheduler does between two decode steps, in this order:

    1. requests finish: at random (``finish_rate``), and any request at exact capacity;
    2. the batch size follows a seeded random walk over ``min_bs..max_real`` (``max_bs``, or
       the pool's ``max_reqs`` when smaller), so it moves up and down across buckets; new
       requests arrive to reach it, reusing freed rows first, usually with shorter lengths
       than the row held before (a row's length shrinks between replays), and sometimes the
       batch order is shuffled;
    3. every running request grows by ``1 + draft_tokens`` (speculative decoding verifies the
       draft tokens in the same step); a request that would pass ``max_context_len`` grows to
       exactly that length instead, so exact capacity is reached and replayed;
    4. with SWA, pages that left the window are evicted (their mapping becomes 0), and a
       random request's SWA pages are remapped with probability ``swa_churn``;
    5. the pool's queued writes are applied (now, or with the steps generated ahead: see
       ``lookahead``), and the step yields the batch as host lists;
    6. optionally, the batch it yields carries values outside the builder contract, as
       engines' batches do (each with its own probability per step, on one to three rows): a
       length past the row's capacity (just past it, several pages past, or a huge value, as
       a stale or dummy row can carry), a negative length, a request index outside
       ``req_to_token``. Zero lengths, which are in the contract, can be injected the same
       way. The pool itself is not changed: the next step yields the true lengths again.

    Args:
        pool: the pool to drive. Its ``max_reqs`` may be below ``max_bs`` (an engine that
            pads past its request pool): the real batch then never passes ``max_reqs``.
        max_bs: largest bucket; the real batch is at most ``min(max_bs, pool.max_reqs)``.
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
        inject: out-of-contract values to put into the yielded batches (``Injection``).
        capacity: tokens a row can hold in the page tables (default ``max_context_len``):
            an injected overlong length lies past ``max(capacity, max_context_len)``.
        max_len: the largest length the batch's dtype holds (``2**31 - 1`` for int32).
        committed_lengths: yield each row's length without this step's draft tokens (the
            ``seq_lens`` a speculative verify step hands a metadata builder, which adds the
            draft tokens back into ``cache_seqlens``); the draft tokens' slots are in
            ``req_to_token`` already.
        lookahead: iterating generates this many steps at a time ahead of the consumer, and
            their device-table writes are uploaded and expanded together (``WriteAhead``);
            each step's writes are applied just before it is yielded, so the tables a
            consumer sees are those of the step it holds, as with ``0`` (a flush per step).
            The pool's host state then runs up to ``lookahead - 1`` steps ahead.
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
        inject: Injection | None = None,
        capacity: int | None = None,
        max_len: int = 2**31 - 1,
        committed_lengths: bool = False,
        lookahead: int = 0,
    ):
        if not 0 <= draft_tokens <= 64:
            raise ValueError(f"draft_tokens must be in 0..64, got {draft_tokens}")
        self.pool = pool
        self.max_bs = max_bs
        #: the largest real batch: the pool holds no more requests than its rows
        self.max_real = min(max_bs, pool.max_reqs)
        self.steps = steps
        self.finish_rate = finish_rate
        self.draft_tokens = draft_tokens
        lo, hi = initial_len or (1, max(1, pool.max_context_len // 4))
        if not 1 <= lo <= hi <= pool.max_context_len:
            raise ValueError(f"initial_len {(lo, hi)} must lie in 1..{pool.max_context_len}")
        self.initial_len = (lo, hi)
        self.swa_window = swa_window
        self.swa_churn = swa_churn
        self.min_bs = max(1, min(min_bs, self.max_real))
        self.near_capacity = near_capacity
        self.inject = inject or Injection()
        self.limit = max(capacity or pool.max_context_len, pool.max_context_len)
        self.max_len = max_len
        self.committed_lengths = committed_lengths
        if lookahead < 0:
            raise ValueError(f"lookahead must be >= 0, got {lookahead}")
        self.lookahead = lookahead
        self.rng = np.random.default_rng(seed)
        # Injections draw from their own stream, so turning them on leaves the pool's
        # evolution (arrivals, finishes, lengths) exactly as it was.
        self.inject_rng = np.random.default_rng([seed, 1])
        self.running: list[int] = []
        self._target = int(self.rng.integers(self.min_bs, self.max_real + 1))

    def __len__(self) -> int:
        return self.steps

    def __iter__(self) -> Iterator[Step]:
        if not self.lookahead:
            for i in range(self.steps):
                yield self.step(i)
            return
        ahead, made = WriteAhead(), 0
        ready: deque[Step] = deque()
        while ready or made < self.steps:
            if not ready:
                for i in range(made, min(made + self.lookahead, self.steps)):
                    ready.append(self._advance(i))
                    ahead.add(self.pool.take_writes())
                made += len(ready)
            ahead.next()  # this step's table writes, on the stream before the consumer's work
            yield ready.popleft()

    def _arrival_length(self, row_hint: int | None) -> int:
        cap, grow = self.pool.max_context_len, 1 + self.draft_tokens
        if self.rng.random() < self.near_capacity:
            return max(1, cap - grow * int(self.rng.integers(1, 6)))
        lo, hi = self.initial_len
        if row_hint is not None:
            # A reused row: usually shorter than what it held, so its stale tail is exposed.
            old = int(self.pool.last_lengths([row_hint])[0])
            old = hi if old < 0 else old
            hi = max(lo, min(hi, old - 1))
        return int(self.rng.integers(lo, hi + 1))

    def step(self, index: int) -> Step:
        """Advance the pool by one step, apply its table writes now, return the batch."""
        step = self._advance(index)
        self.pool.flush()
        return step

    def _advance(self, index: int) -> Step:
        """One step on the host (its table writes stay queued in the pool)."""
        pool, rng = self.pool, self.rng
        cap = pool.max_context_len
        grow = 1 + self.draft_tokens

        # 1. finishes
        if self.running:
            rows = np.asarray(self.running, dtype=np.int64)
            lengths = pool.lengths_of(rows)
            done = (lengths >= cap) | (rng.random(len(rows)) < self.finish_rate)
            pool.free_many(rows[done])
            self.running = rows[~done].tolist()

        # 2. batch-size random walk and arrivals
        step_size = max(1, self.max_bs // 8)
        self._target = int(
            np.clip(
                self._target + rng.integers(-step_size, step_size + 1), self.min_bs, self.max_real
            )
        )
        leaving = [
            self.running.pop(int(rng.integers(len(self.running))))
            for _ in range(len(self.running) - self._target)
        ]
        pool.free_many(leaving)
        arrivals = self._target - len(self.running)
        if arrivals > 0:
            hints: list[int | None] = list(pool.next_free_rows(arrivals))
            hints += [None] * (arrivals - len(hints))
            wanted = [max(1, min(self._arrival_length(h), cap - grow)) for h in hints]
            self.running.extend(pool.alloc_many(wanted))
        if rng.random() < 0.2:
            rng.shuffle(self.running)

        # 3. growth, to exact capacity at most
        rows = np.asarray(self.running, dtype=np.int64)
        pool.grow(rows, np.minimum(grow, cap - pool.lengths_of(rows)))

        # 4. SWA eviction and churn
        if pool.swa:
            if self.swa_window is not None:
                pool.evict_rows_outside_window(self.running, self.swa_window)
            if self.running and rng.random() < self.swa_churn:
                pool.remap_swa(self.running[int(rng.integers(len(self.running)))])

        # 5. the batch (the caller applies the queued table writes)
        req_pool_indices, seq_lens = pool.batch(self.running)
        if self.committed_lengths and self.draft_tokens:
            seq_lens = [max(n - self.draft_tokens, 0) for n in seq_lens]
        # 6. out-of-contract values in the batch (the pool keeps the true ones)
        if self.inject.any():
            self._inject(req_pool_indices, seq_lens)
        return Step(index, req_pool_indices, seq_lens)

    def _inject(self, req_pool_indices: list[int], seq_lens: list[int]) -> None:
        rng, inj, bs = self.inject_rng, self.inject, len(seq_lens)
        ps = self.pool.page_size

        def rows() -> np.ndarray:
            return rng.choice(bs, size=int(rng.integers(1, min(3, bs) + 1)), replace=False)

        if rng.random() < inj.overlong:
            for i in rows():
                kind = rng.integers(3)
                if kind == 0:  # a speculative step past the end: a few tokens over
                    extra = int(rng.integers(1, ps * (1 + self.draft_tokens) + 1))
                elif kind == 1:  # several pages over
                    extra = ps * int(rng.integers(2, 9)) + int(rng.integers(ps))
                else:  # a huge value, as a stale or dummy row can hold
                    extra = self.max_len - self.limit - int(rng.integers(0, 1000))
                seq_lens[i] = int(min(self.limit + max(extra, 1), self.max_len))
        if rng.random() < inj.negative:
            for i in rows():
                seq_lens[i] = -int(rng.choice([1, ps, 2**20, self.max_len]))
        if rng.random() < inj.zero:
            for i in rows():
                seq_lens[i] = 0
        if rng.random() < inj.bad_index:
            n_rows = self.pool.req_to_token.shape[0]
            for i in rows():
                req_pool_indices[i] = int(
                    n_rows + rng.integers(0, 64) if rng.random() < 0.5 else -rng.integers(1, 64)
                )
