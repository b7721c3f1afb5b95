"""A ``DecodeWorkload``'s host model in a child process, generating steps ahead of the replays.

The workload's host side (the pool model: finishes, arrivals, page allocation, growth, SWA
eviction, out-of-contract injections) costs a few hundred microseconds of Python a step, more
than a checked replay itself. ``ProducedWorkload`` moves it into a child process that runs the
same seeded ``DecodeWorkload`` over a ``KVPool`` whose tables live on the ``meta`` device (no
memory, no CUDA): the child sends each step's batch and its queued table writes (page runs,
five integers a page) through a bounded queue, and the parent applies the writes to its own
pool's device tables with a ``WriteAhead`` just before it yields the step, as
``DecodeWorkload(lookahead=...)`` does in one process. The parent's pool model is never
advanced: its tables are the only state it keeps.

The stream is the one ``DecodeWorkload`` yields in one process, step for step and write for
write (same seeds, same code): a verdict does not depend on where the workload ran
(``tests/test_producer.py`` compares the two).

The child is started with ``spawn`` (never ``fork``: the parent may hold a CUDA context), so
it costs an interpreter start and a ``torch`` import (a second or two); it starts generating
while the parent captures its graphs. A child that fails sends its exception, which the parent
raises at the step where it happened; a child that dies without a word (killed, out of
memory) is reported with its exit code; a child whose parent is gone exits. ``close()`` (or
the context manager) stops it.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue as queue_mod
import signal
from collections import deque
from collections.abc import Iterator

from .pool import KVPool, WriteAhead
from .workload import DecodeWorkload, Step

#: Steps per message: also how far the parent's ``WriteAhead`` stages at once.
BATCH_STEPS = 16
#: Messages the queue holds: the child runs at most this many batches ahead.
QUEUE_BATCHES = 64
#: Seconds between two checks that the other process is still there, while waiting.
POLL_S = 1.0

# Writer tags in a message: which of the pool's tables a group of runs goes to.
_R2T, _SWA = 0, 1


class ProducerDied(RuntimeError):
    """The child process exited without sending its steps or an exception."""


def _produce(pool_kwargs: dict, workload_kwargs: dict, out: mp.Queue, parent: int) -> None:
    """The child's body: run the workload, send batches of ``(step, tagged writes)``, then
    ``("done", None)``; on an exception, ``("error", exc)``."""
    # Ctrl-C reaches the whole process group: the parent decides when the child stops.
    signal.signal(signal.SIGINT, signal.SIG_IGN)

    def send(item) -> bool:
        while True:
            try:
                out.put(item, timeout=POLL_S)
                return True
            except queue_mod.Full:
                if os.getppid() != parent:  # the parent is gone: nobody will read this
                    return False

    batch = []
    try:
        import torch

        torch.set_num_threads(1)
        pool = KVPool(**pool_kwargs, device="meta")
        workload = DecodeWorkload(pool, **workload_kwargs, lookahead=0)
        tags = {id(pool._r2t_writer): _R2T}
        if pool._swa_writer is not None:
            tags[id(pool._swa_writer)] = _SWA
        for i in range(workload.steps):
            step = workload._advance(i)
            writes = [(tags[id(w)], runs) for w, runs in pool.take_writes()]
            batch.append((step, writes))
            if len(batch) == BATCH_STEPS or i == workload.steps - 1:
                if not send(("steps", batch)):
                    return
                batch = []
        send(("done", None))
    except BaseException as exc:  # noqa: BLE001 - every failure goes to the parent
        # The steps made before the failure first, so that it surfaces at its own step.
        if batch and not send(("steps", batch)):
            return
        try:
            send(("error", exc))
        except Exception:  # noqa: BLE001 - an exception that does not pickle
            send(("error", RuntimeError(f"{type(exc).__name__}: {exc}")))


class ProducedWorkload:
    """The steps of ``DecodeWorkload(pool, **workload_kwargs)``, generated in a child process.

    Args:
        pool: the parent's pool, whose device tables the steps' writes go to. It must be new
            (nothing allocated), made with ``KVPool(**pool_kwargs, device=...)``.
        pool_kwargs: ``KVPool`` arguments except ``device`` (the child uses ``meta``).
        workload_kwargs: ``DecodeWorkload`` arguments except ``pool`` and ``lookahead``.

    Iterating yields ``Step`` objects, each after its table writes were applied (on the current
    stream), as ``DecodeWorkload`` does; it can be iterated once.
    """

    def __init__(self, pool: KVPool, pool_kwargs: dict, workload_kwargs: dict):
        if "device" in pool_kwargs or "lookahead" in workload_kwargs or "pool" in workload_kwargs:
            raise ValueError("pool_kwargs takes no device, workload_kwargs no pool or lookahead")
        if pool.free_rows != pool.max_reqs:
            raise ValueError("the pool must be new: the child starts from an empty pool")
        self.pool = pool
        self.steps = int(workload_kwargs["steps"])
        # Checked here, with DecodeWorkload's own errors, before a process is started (a
        # DecodeWorkload leaves its pool untouched until iterated).
        DecodeWorkload(pool, **workload_kwargs)
        ctx = mp.get_context("spawn")
        self._queue = ctx.Queue(maxsize=QUEUE_BATCHES)
        self._process = ctx.Process(
            target=_produce,
            args=(pool_kwargs, workload_kwargs, self._queue, os.getpid()),
            name="pagegraph-workload",
            daemon=True,
        )
        self._process.start()
        self._iterated = False
        self._closed = False

    def __len__(self) -> int:
        return self.steps

    def __enter__(self) -> ProducedWorkload:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _receive(self):
        while True:
            try:
                return self._queue.get(timeout=POLL_S)
            except queue_mod.Empty:
                if not self._process.is_alive():
                    try:  # a last message may have arrived as it exited
                        return self._queue.get(timeout=POLL_S)
                    except queue_mod.Empty:
                        raise ProducerDied(
                            f"the workload process exited with code {self._process.exitcode} "
                            "before sending every step"
                        ) from None

    def __iter__(self) -> Iterator[Step]:
        if self._iterated:
            raise RuntimeError("a ProducedWorkload can be iterated once")
        self._iterated = True
        writers = {_R2T: self.pool._r2t_writer, _SWA: self.pool._swa_writer}
        ahead, ready = WriteAhead(), deque()
        try:
            while True:
                if not ready:
                    kind, payload = self._receive()
                    if kind == "done":
                        return
                    if kind == "error":
                        raise payload
                    for step, writes in payload:
                        ahead.add([(writers[tag], runs) for tag, runs in writes])
                        ready.append(step)
                ahead.next()  # this step's table writes, before the consumer's work
                yield ready.popleft()
        finally:
            self.close()

    def close(self) -> None:
        """Stop the child (if still running) and release the queue; idempotent."""
        if self._closed:
            return
        self._closed = True
        proc = self._process
        if proc.is_alive():
            proc.terminate()
            proc.join(5)
            if proc.is_alive():
                proc.kill()
                proc.join(5)
        self._queue.close()
        self._queue.cancel_join_thread()
