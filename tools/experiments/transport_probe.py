"""How fast can a workload child hand its batches of page runs to the checker?

``ProducedWorkload`` sends each batch of ``BATCH_STEPS`` steps (with their page runs, five
int64 a page) through a ``multiprocessing`` queue: pickled in the child's feeder thread,
written to a pipe, read and unpickled here. This measures, for batches the size of the
shipped soak scenarios', the steady interval between two batches received:

* ``queue``: the array put on a queue as it is today;
* ``shared``: the array written into a ``SharedMemory`` ring of slots, the slot number sent
  through a queue, the batch copied out here (as staging would) and the slot handed back
  through a second queue.

It also prints the real sizes: the pickled batch of sglang-h200 and swa-hybrid and their page
runs a step. Runs on a CPU (no GPU needed).

Usage: PYTHONPATH=src python tools/experiments/transport_probe.py
"""

from __future__ import annotations

import multiprocessing as mp
import pickle
import time
from multiprocessing import shared_memory

import numpy as np

from pagegraph.workload.producer import BATCH_STEPS

SLOTS = 8
MESSAGES = 60


def _queue_child(out, size: int) -> None:
    runs = np.arange(size // 8, dtype=np.int64)
    for _ in range(MESSAGES):
        out.put(("steps", [runs]))
    out.put(("done", None))


def _shared_child(out, free, name: str, size: int) -> None:
    shm = shared_memory.SharedMemory(name=name)
    ring = np.ndarray((SLOTS, size // 8), dtype=np.int64, buffer=shm.buf)
    runs = np.arange(size // 8, dtype=np.int64)
    for _ in range(MESSAGES):
        slot = free.get()
        ring[slot] = runs
        out.put(("steps", slot))
    out.put(("done", None))
    del ring
    shm.close()


def _interval(out, on_message) -> float:
    """Seconds between two messages received, after the first (start-up excluded)."""
    on_message(out.get()[1])
    t0, got = time.perf_counter(), 0
    while True:
        kind, payload = out.get()
        if kind == "done":
            return (time.perf_counter() - t0) / got
        on_message(payload)
        got += 1


def queue_interval(ctx, size: int) -> float:
    out = ctx.Queue(maxsize=64)
    child = ctx.Process(target=_queue_child, args=(out, size))
    child.start()
    dt = _interval(out, lambda _: None)
    child.join()
    return dt


def shared_interval(ctx, size: int) -> float:
    shm = shared_memory.SharedMemory(create=True, size=SLOTS * size)
    try:
        # In a dict so that the view can be dropped before the segment is closed.
        views = {"ring": np.ndarray((SLOTS, size // 8), dtype=np.int64, buffer=shm.buf)}
        out, free = ctx.Queue(), ctx.Queue()
        for slot in range(SLOTS):
            free.put(slot)
        staged = np.empty(size // 8, dtype=np.int64)

        def receive(slot: int) -> None:
            staged[:] = views["ring"][slot]
            free.put(slot)

        child = ctx.Process(target=_shared_child, args=(out, free, shm.name, size))
        child.start()
        dt = _interval(out, receive)
        child.join()
        views.clear()
        return dt
    finally:
        shm.close()
        shm.unlink()


def batch_sizes() -> list[tuple[str, int, float]]:
    """``(scenario, pickled bytes of a batch, page runs a step)`` of the soak scenarios."""
    from pagegraph.check.pipeline.workload_setup import pool_kwargs
    from pagegraph.check.scenario import load_scenario
    from pagegraph.workload.producer import _batches

    found = []
    for path in ("graphs/sglang-h200.toml", "graphs/swa-hybrid.toml"):
        loaded = load_scenario(path)
        cfg = (loaded.config if hasattr(loaded, "config") else loaded[1]).replace(steps=320)
        workload = dict(
            max_bs=cfg.max_bs, steps=cfg.steps, seed=cfg.seed + 1, finish_rate=cfg.finish_rate,
            draft_tokens=cfg.draft_tokens, initial_len=cfg.initial_len,
            swa_window=cfg.swa_window, swa_churn=cfg.swa_churn,
            near_capacity=cfg.near_capacity, inject=cfg.injection(),
            capacity=cfg.width * cfg.page_size, max_len=2**31 - 1, committed_lengths=False,
        )  # fmt: skip
        batches = list(_batches(pool_kwargs(cfg), workload))
        blob = sum(len(pickle.dumps(("steps", b), pickle.HIGHEST_PROTOCOL)) for b in batches)
        runs = sum(len(r) for b in batches for _, writes in b for _, r in writes)
        found.append((path, blob // len(batches), runs / cfg.steps))
    return found


def main() -> None:
    ctx = mp.get_context("spawn")
    for path, size, runs in batch_sizes():
        size = size // 8 * 8
        q = queue_interval(ctx, size)
        s = shared_interval(ctx, size)
        print(
            f"{path}: batch {size / 1e6:.2f} MB ({runs:.0f} runs a step); queue "
            f"{q * 1e3:.2f} ms a batch ({q / BATCH_STEPS * 1e6:.0f} us a step), shared memory "
            f"{s * 1e3:.2f} ms ({s / BATCH_STEPS * 1e6:.0f} us a step)"
        )


if __name__ == "__main__":
    main()
