"""Workload steps generated ahead of the replays: in child processes, and in interleaved streams.

A workload's host model takes longer a step than a checked replay, so ``ProducedWorkload``
runs it apart from the device tables: each stream's ``DecodeWorkload`` over a ``meta``-device
pool, in a child process that sends batches of steps (page runs through ``batch_ring``) or here
on demand, each step's writes applied to the caller's tables just before it is yielded, and
``streams=K`` seeded workloads taking turns. The steps and tables are the same wherever the
workload runs (docs/ARCHITECTURE.md, "Steps generated ahead").
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue as queue_mod
import signal
import time
from collections import deque
from collections.abc import Callable, Generator, Iterator
from multiprocessing.context import SpawnContext
from typing import Any, TypeAlias, cast

import numpy as np
import torch

from .batch_ring import RING_BYTES, RING_SUPPORTED, ReaderGone, RingReader, RingWriter
from .decode import DecodeWorkload, Step
from .lifetime import die_with_parent
from .pool import KVPool, Runs, _PageWriter
from .write_ahead import WriteAhead

#: A step's page runs: ``(tag, runs)`` groups, the tag naming the table they go to.
Tagged: TypeAlias = list[tuple[int, Runs]]
#: Steps made together, each with its page runs.
Batch: TypeAlias = list[tuple[Step, Tagged]]
#: What a child sends: ``(kind, payload)`` (see ``_pack`` and ``_produce``).
Message: TypeAlias = tuple[str, Any]

#: Steps per batch (a child's message): also how far ``WriteAhead`` stages at once.
BATCH_STEPS = 16
#: Steps of one stream before the next stream's turn (a multiple of ``BATCH_STEPS``).
SEGMENT_STEPS = 256
#: Streams at most.
MAX_STREAMS = 64
#: Stream ``k``'s pool and workload seeds are stream 0's plus ``k`` times this.
STREAM_SEED_STRIDE = 1_000_003
#: Batches a child's queue holds: a child runs at most this many batches ahead.
QUEUE_BATCHES = 64
#: Seconds between two checks that the other process is still there, while waiting.
POLL_S = 1.0

# Writer tags in a batch: which of the pool's tables a group of runs goes to.
_R2T, _SWA = 0, 1
_TAGS = (_R2T, _SWA)


class ProducerDied(RuntimeError):
    """A child process exited without sending its steps or an exception."""


def stream_kwargs(
    pool_kwargs: dict[str, Any], workload_kwargs: dict[str, Any], k: int, steps: int
) -> tuple[dict[str, Any], dict[str, Any]]:
    """``KVPool`` and ``DecodeWorkload`` arguments of stream ``k``, ``steps`` steps long."""
    shift = k * STREAM_SEED_STRIDE
    return (
        dict(pool_kwargs, seed=pool_kwargs.get("seed", 0) + shift),
        dict(workload_kwargs, seed=workload_kwargs.get("seed", 0) + shift, steps=steps),
    )


def stream_steps(steps: int, streams: int, segment: int) -> list[int]:
    """Steps each stream contributes to ``steps`` interleaved ones."""
    cycle = streams * segment
    full, rest = divmod(steps, cycle)
    return [full * segment + min(max(rest - k * segment, 0), segment) for k in range(streams)]


def streams_with_steps(steps: int, streams: int, segment: int) -> int:
    """How many of ``streams`` contribute steps to ``steps`` interleaved ones (a prefix of
    them; at least one): the streams a run starts and parks tables for."""
    return max(1, sum(1 for n in stream_steps(steps, streams, segment) if n))


def _batches(
    pool_kwargs: dict[str, Any], workload_kwargs: dict[str, Any]
) -> Generator[Batch, None, None]:
    """One stream's steps in batches of ``BATCH_STEPS``: ``(Step, [(tag, runs), ...])`` each,
    the step's batch as two ``[bs]`` int64 arrays. A failure is raised after the batch of the
    steps made before it, so that it surfaces at its own step."""
    pool = KVPool(**pool_kwargs, device="meta")
    workload = DecodeWorkload(pool, **workload_kwargs)
    tags = {id(pool._r2t_writer): _R2T}
    if pool._swa_writer is not None:
        tags[id(pool._swa_writer)] = _SWA
    batch: Batch = []
    try:
        for i in range(workload.steps):
            step = workload._advance(i)
            # Arrays, converted here rather than by the consumer: they pickle as one buffer,
            # and the checker's model and the runner's post copy them without a Python loop
            # (a list would cost the consumer a Python loop each time).
            step = Step(
                i,
                np.asarray(step.req_pool_indices, dtype=np.int64),
                np.asarray(step.seq_lens, dtype=np.int64),
            )
            batch.append((step, [(tags[id(w)], runs) for w, runs in pool.take_writes()]))
            if len(batch) == BATCH_STEPS:
                yield batch
                batch = []
    except Exception:  # not GeneratorExit: a closed generator must not yield again
        if batch:
            yield batch
        raise
    if batch:
        yield batch


def _pack(batch: Batch, ring: RingWriter | None, alive: Callable[[], bool]) -> Message:
    """A child's message for ``batch``: ``("ring", (start, runs, fields, steps))`` with the
    batch's page runs written into ``ring`` (``steps``: each step with its ``(tag, count)``
    groups), or ``("steps", batch)`` whole when there is no ring or the runs do not fit it.
    In the ring the runs go table by table (every step's ``req_to_token`` runs, then every
    step's ``full_to_swa`` runs), so that the runs a stage uploads to one table are adjacent.
    Raises ``ReaderGone`` if the parent went away while the ring was full."""
    runs = [r for tag in _TAGS for _, writes in batch for t, r in writes if t == tag]
    if ring is None or not runs:
        return ("steps", batch)
    block = np.ascontiguousarray(np.concatenate(runs), dtype=np.int64)
    start = ring.put(block, alive)
    if start is None:
        return ("steps", batch)
    steps = [(step, [(tag, len(r)) for tag, r in writes]) for step, writes in batch]
    return ("ring", (start, block.shape[0], block.shape[1], steps))


def _unpack(payload: tuple[Any, ...], ring: RingReader, borrow: bool = False) -> Batch:
    """The batch a ``("ring", payload)`` message stands for, its runs copied out of ``ring``
    (which is then free for the child's next ones), or with ``borrow`` read in place: the
    caller then releases the block (``ring.release(_block_end(payload))``) once it has no more
    use for the runs (once the device copies reading them completed). Borrowed from a ring
    registered with CUDA (``ring.tensor``), the runs are ``[k, 5]`` int64 CPU tensors over the
    ring's page-locked bytes; else numpy arrays."""
    start, count, fields, steps = payload
    nbytes = count * fields * 8
    if borrow and ring.tensor is not None:
        at = ring.offset(start, nbytes)
        block: Runs = ring.tensor[at : at + nbytes].view(torch.int64).view(count, fields)
    else:
        raw = ring.borrow(start, nbytes) if borrow else ring.take(start, nbytes)
        block = raw.view(np.int64).reshape(count, fields)
    # Where each table's runs begin in the block (table by table, see _pack).
    totals = dict.fromkeys(_TAGS, 0)
    for _, groups in steps:
        for tag, k in groups:
            totals[tag] += k
    at, offsets = 0, dict[int, int]()
    for tag in _TAGS:
        offsets[tag] = at
        at += totals[tag]
    batch: Batch = []
    for step, groups in steps:
        writes: Tagged = []
        for tag, k in groups:
            o = offsets[tag]
            writes.append((tag, block[o : o + k]))
            offsets[tag] = o + k
        batch.append((step, writes))
    return batch


def _block_end(payload: tuple[Any, ...]) -> int:
    """The ring counter just past the runs of a ``("ring", payload)`` message."""
    start, count, fields, _ = payload
    end: int = start + count * fields * 8
    return end


def _produce(
    pool_kwargs: dict[str, Any],
    workload_kwargs: dict[str, Any],
    out: mp.Queue[Message],
    parent: int,
    ring_path: str | None = None,
    ring_bytes: int = 0,
) -> None:
    """A child's body: send ``("steps", batch)`` or ``("ring", ...)`` messages (see
    ``_pack``), then ``("done", None)``; on an exception, ``("error", exc)``."""
    # Ctrl-C reaches the whole process group: the parent decides when the child stops. A
    # parent that ends without stopping it (killed) takes it along.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    die_with_parent(parent)
    torch.set_num_threads(1)

    def alive() -> bool:
        return os.getppid() == parent

    def send(item: Message) -> bool:
        while True:
            try:
                out.put(item, timeout=POLL_S)
                return True
            except queue_mod.Full:
                if not alive():  # the parent is gone: nobody will read this
                    return False

    ring: RingWriter | None = None
    try:
        if ring_path is not None:
            try:
                ring = RingWriter(ring_path, ring_bytes)
            except (OSError, ValueError):  # no ring: every batch goes through the queue
                ring = None
        for batch in _batches(pool_kwargs, workload_kwargs):
            if not send(_pack(batch, ring, alive)):
                break
        else:
            send(("done", None))
    except ReaderGone:
        pass
    except BaseException as exc:  # noqa: BLE001 - every failure goes to the parent
        try:
            send(("error", exc))
        except Exception:  # noqa: BLE001 - an exception that does not pickle
            send(("error", RuntimeError(f"{type(exc).__name__}: {exc}")))
    if not alive():
        # Nobody reads the queue: exit without waiting for its feeder thread, which may be
        # blocked on a full pipe forever.
        out.cancel_join_thread()


class _ChildStream:
    """One stream's batches, from a child process (the page runs through a ring of
    ``ring_bytes``, if not 0 and the machine supports it)."""

    def __init__(
        self,
        ctx: SpawnContext,
        pool_kwargs: dict[str, Any],
        workload_kwargs: dict[str, Any],
        k: int,
        ring_bytes: int,
    ) -> None:
        self.queue: mp.Queue[Message] = ctx.Queue(maxsize=QUEUE_BATCHES)
        self.ring: RingReader | None = None
        self._borrowed: int | None = None  # ring counter past the last batch read in place
        self._received = False  # whether anything came from the child yet
        self._first: Message | None = None  # its first message, once wait_first() took it
        if ring_bytes and RING_SUPPORTED:
            try:
                self.ring = RingReader(ring_bytes)
            except OSError:  # no room for a ring: the queue carries everything
                self.ring = None
        self.process = ctx.Process(
            target=_produce,
            args=(
                pool_kwargs,
                workload_kwargs,
                self.queue,
                os.getpid(),
                self.ring.path if self.ring is not None else None,
                ring_bytes,
            ),
            name=f"pagegraph-workload-{k}",
            daemon=True,
        )
        try:
            self.process.start()
        except BaseException:
            if self.ring is not None:
                self.ring.close()
            raise

    def wait_first(self, should_stop: Callable[[], bool] | None = None) -> None:
        """Wait for the child's first message (its start-up), kept for ``next_batch``: a batch,
        or the child's exception, raised there as ever (at its stream's first step)."""
        if not self._received:
            self._first = self._receive(should_stop=should_stop)

    def _receive(
        self,
        before_wait: Callable[[], object] | None = None,
        should_stop: Callable[[], bool] | None = None,
    ) -> Message:
        if self._first is not None:
            item, self._first = self._first, None
            return item
        try:
            item = self.queue.get(block=False)
        except queue_mod.Empty:
            if before_wait is not None:
                before_wait()  # e.g. give back ring space the child may be waiting for
            item = self._wait_for_item(should_stop)
        self._received = True
        if self.ring is not None:
            self.ring.unlink()  # the child maps the ring before it sends anything
        return item

    def _wait_for_item(self, should_stop: Callable[[], bool] | None = None) -> Message:
        while True:
            if should_stop is not None and should_stop():
                raise KeyboardInterrupt("stopped while waiting for a workload process")
            try:
                return self.queue.get(timeout=POLL_S)
            except queue_mod.Empty:
                if not self.process.is_alive():
                    try:  # a last message may have arrived as it exited
                        return self.queue.get(timeout=POLL_S)
                    except queue_mod.Empty:
                        raise ProducerDied(
                            f"the workload process {self.process.name} exited with code "
                            f"{self.process.exitcode} before sending every step"
                        ) from None

    def next_batch(self, before_wait: Callable[[], object] | None = None) -> Batch:
        """The next batch (``before_wait()`` is called first if the child has not sent it
        yet). Its runs may lie in the ring, read in place (borrowed): they stay valid until
        the caller gives their space back (``take_borrowed``, then ``ring.release``)."""
        kind, payload = self._receive(before_wait)
        if kind == "error":
            raise payload
        if kind == "done":  # more steps asked for than the stream was made with
            raise ProducerDied(f"the workload process {self.process.name} ran out of steps")
        if kind == "ring":
            ring = cast(RingReader, self.ring)  # runs come in a ring only where there is one
            batch = _unpack(payload, ring, borrow=True)
            self._borrowed = _block_end(payload)
            return batch
        return cast(Batch, payload)

    def take_borrowed(self) -> int | None:
        """The ring counter past the runs of the batches returned since the last call (to
        release once nothing reads them any more), or None if none lay in the ring."""
        end, self._borrowed = self._borrowed, None
        return end

    def close(self) -> None:
        proc = self.process
        if proc.is_alive():
            proc.terminate()
            proc.join(5)
            if proc.is_alive():
                proc.kill()
                proc.join(5)
        self.queue.close()
        self.queue.cancel_join_thread()
        if self.ring is not None:
            self.ring.close()


class _LocalStream:
    """One stream's batches, made in this process when asked for."""

    def __init__(self, pool_kwargs: dict[str, Any], workload_kwargs: dict[str, Any]) -> None:
        self.batches = _batches(pool_kwargs, workload_kwargs)

    def next_batch(self, before_wait: Callable[[], object] | None = None) -> Batch:
        return next(self.batches)

    def take_borrowed(self) -> None:
        return None

    def close(self) -> None:
        self.batches.close()


class ProducedWorkload:
    """The steps of ``streams`` interleaved ``DecodeWorkload`` streams (see the module
    docstring), applied to ``pool``'s device tables; with one stream, those of
    ``DecodeWorkload(pool, **workload_kwargs)``.

    Args:
        pool: the pool whose device tables the steps' writes go to. It must be new (nothing
            allocated), made with ``KVPool(**pool_kwargs, device=...)``.
        pool_kwargs: ``KVPool`` arguments except ``device`` (the host models use ``meta``).
        workload_kwargs: ``DecodeWorkload`` arguments except ``pool`` and ``lookahead``.
        streams: independently seeded streams, ``1..MAX_STREAMS``.
        processes: generate each stream in a child process.
        segment: steps of one stream before the next one's turn (a multiple of
            ``BATCH_STEPS``; default ``SEGMENT_STEPS``).
        ring_bytes: with ``processes``, bytes of each child's shared-memory ring for its page
            runs (0: none, everything through the queue; a batch larger than half the ring
            goes through the queue too).

    Iterating yields ``Step`` objects numbered ``0..steps-1``, each after its table writes were
    applied (on the current stream); it can be iterated once. A step's ``req_pool_indices``
    and ``seq_lens`` are ``[bs]`` int64 numpy arrays (``DecodeWorkload``'s values, as
    arrays). With several streams, the parked tables take ``streams`` times the pool's
    ``req_to_token`` and ``full_to_swa``, allocated here.
    """

    def __init__(
        self,
        pool: KVPool,
        pool_kwargs: dict[str, Any],
        workload_kwargs: dict[str, Any],
        *,
        streams: int = 1,
        processes: bool = False,
        segment: int | None = None,
        ring_bytes: int = RING_BYTES,
    ) -> None:
        if "device" in pool_kwargs or "lookahead" in workload_kwargs or "pool" in workload_kwargs:
            raise ValueError("pool_kwargs takes no device, workload_kwargs no pool or lookahead")
        segment = SEGMENT_STEPS if segment is None else segment
        if not 1 <= streams <= MAX_STREAMS:
            raise ValueError(f"streams must be in 1..{MAX_STREAMS}, got {streams}")
        if segment < BATCH_STEPS or segment % BATCH_STEPS:
            raise ValueError(f"segment must be a positive multiple of {BATCH_STEPS}, got {segment}")
        if ring_bytes and (ring_bytes < 64 or ring_bytes % 8):
            raise ValueError(
                f"ring_bytes must be 0 or a multiple of 8, at least 64, got {ring_bytes}"
            )
        if pool.free_rows != pool.max_reqs:
            raise ValueError("the pool must be new: every stream starts from an empty pool")
        # Checked here, with DecodeWorkload's own errors, before anything starts (a
        # DecodeWorkload leaves its pool untouched until iterated).
        DecodeWorkload(pool, **workload_kwargs)
        self.pool = pool
        self.steps = int(workload_kwargs["steps"])
        self.segment = segment
        counts = stream_steps(self.steps, streams, segment)
        self.streams = streams_with_steps(self.steps, streams, segment)
        self._live = [pool.req_to_token]
        if pool.full_to_swa is not None:
            self._live.append(pool.full_to_swa)
        # Every stream starts from an empty pool: zeroed tables, as a new KVPool's.
        self._parked = (
            [[torch.zeros_like(t) for t in self._live] for _ in range(self.streams)]
            if self.streams > 1
            else []
        )
        self._sources: list[_ChildStream | _LocalStream] = []
        self._closed = False
        self._iterated = False
        #: Seconds the iteration spent getting batches after the first one: waiting for a
        #: child and taking its runs out of the ring (with ``processes``), or generating
        #: them (without). Where it nears the consumer's time a step, the workload is what
        #: limits the rate.
        self.receive_s = 0.0
        # Ring blocks given back once the device copies reading them complete.
        #: ``(event, [(child stream, ring counter), ...])``, oldest first
        self._held: deque[tuple[torch.cuda.Event | None, list[tuple[Any, int]]]] = deque()
        self._device = pool.req_to_token.device
        #: Whether some child's ring is registered with CUDA (its runs are copied to the device
        #: straight from the ring).
        self._pinned = False
        ctx = mp.get_context("spawn") if processes else None
        try:
            for k in range(self.streams):
                pk, wk = stream_kwargs(pool_kwargs, workload_kwargs, k, counts[k])
                self._sources.append(
                    _ChildStream(cast(SpawnContext, ctx), pk, wk, k, ring_bytes)
                    if processes
                    else _LocalStream(pk, wk)
                )
            if self._device.type == "cuda":
                with torch.cuda.device(self._device):
                    for source in self._sources:
                        ring = getattr(source, "ring", None)
                        if ring is not None and ring.pin_for_cuda():
                            self._pinned = True
        except BaseException:
            self.close()
            raise

    def __len__(self) -> int:
        return self.steps

    def __enter__(self) -> ProducedWorkload:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def wait_started(self, should_stop: Callable[[], bool] | None = None) -> float:
        """Wait until every child has sent its first batch; returns the seconds waited.

        A child's start-up (an interpreter, ``torch``, its first steps) takes seconds, and the
        children start together with the caller's own start-up (a capture, say), which may end
        first. A consumer that measures a steady rate calls this before it starts the clock,
        so that no child's start-up lands inside the measurement as a stall at that stream's
        first turn. Without children it returns at once. ``should_stop()`` is asked before
        each wait of up to ``POLL_S`` seconds; when it says so, ``KeyboardInterrupt`` is raised
        (a stop asked for by a signal, say)."""
        children = [s for s in self._sources if isinstance(s, _ChildStream)]
        if not children:
            return 0.0
        t0 = time.perf_counter()
        for child in children:
            child.wait_first(should_stop)
        return time.perf_counter() - t0

    def _switch(self, old: int, new: int) -> None:
        """Park the live tables as stream ``old``'s and bring stream ``new``'s in."""
        for live, out, back in zip(self._live, self._parked[old], self._parked[new]):
            out.copy_(live)
            live.copy_(back)

    def __iter__(self) -> Iterator[Step]:
        if self._iterated:
            raise RuntimeError("a ProducedWorkload can be iterated once")
        self._iterated = True
        # No SWA runs come without an SWA pool, whose writer alone may be None.
        writers = cast(
            dict[int, _PageWriter], {_R2T: self.pool._r2t_writer, _SWA: self.pool._swa_writer}
        )
        ahead = WriteAhead()
        ready: deque[Step] = deque()
        active = 0
        try:
            for index in range(self.steps):
                if not ready:
                    # Every step received so far was applied: the ring space of its runs goes
                    # back to the children once the device copies reading it have completed.
                    self._hold_borrowed()
                    self._release_held(wait=False)
                    # Batches never straddle a segment, so every write staged before a
                    # switch was applied: the switch moves whole, current tables.
                    k = (index // self.segment) % self.streams
                    if k != active:
                        self._switch(active, k)
                        active = k
                    t0 = time.perf_counter()
                    batch = self._sources[k].next_batch(before_wait=self._release_all)
                    if index:  # the first batch waits for the children's start-up
                        self.receive_s += time.perf_counter() - t0
                    for step, writes in batch:
                        ahead.add([(writers[tag], runs) for tag, runs in writes])
                        ready.append(step)
                ahead.next()  # this step's table writes, before the consumer's work
                step = ready.popleft()
                yield Step(index, step.req_pool_indices, step.seq_lens)
        finally:
            self.close()

    def _hold_borrowed(self) -> None:
        """Hold the ring blocks of the batches received so far (all their steps applied)
        until the device copies that read them complete: an event on the current stream,
        where those copies were enqueued."""
        blocks = [(s, end) for s in self._sources if (end := s.take_borrowed()) is not None]
        if not blocks:
            return
        event: torch.cuda.Event | None = None
        if self._pinned:
            event = torch.cuda.Event()
            event.record(torch.cuda.current_stream(self._device))
        self._held.append((event, blocks))

    def _release_held(self, wait: bool) -> None:
        """Give held ring blocks back to their children: those whose copies are done, or (with
        ``wait``) all of them, waiting for the device (outside any replay)."""
        held = self._held
        while held:
            event, blocks = held[0]
            if event is not None and not event.query():
                if not wait:
                    return
                event.synchronize()
            held.popleft()
            for source, end in blocks:
                source.ring.release(end)

    def _release_all(self) -> None:
        # About to wait for a child, which may itself wait for ring space: give it all back.
        self._hold_borrowed()
        self._release_held(wait=True)

    def close(self) -> None:
        """Stop the child processes (if any still run); idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._pinned:
            # Copies still reading a ring (steps staged, not yet applied) end before the rings
            # are unregistered and unmapped.
            try:
                torch.cuda.synchronize(self._device)
            except Exception:  # noqa: BLE001 - a CUDA context a builder broke: nothing runs
                pass
        for source in self._sources:
            source.close()

    @property
    def _processes(self) -> list[mp.process.BaseProcess]:
        """The child processes (for tests)."""
        return [s.process for s in self._sources if isinstance(s, _ChildStream)]
