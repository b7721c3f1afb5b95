"""Where ``GraphRunner.replay()``'s host time goes, against a bare ``CUDAGraph.replay()``.

Questions:

1. Does the mailbox's back-pressure (``staging.SLOTS`` posts ahead of the device) make a burst
   of runner replays wait for the device? Runner and bare replays are timed in alternating
   rounds (as the bench does) with ``SLOTS`` 16 and 1024, counting the mailbox's waits.
2. What does the device take per replay (events around a burst of back-to-back replays)?
   If it is more than the host's per-call time, a long burst is device-bound.
3. What do the runner's pieces cost the host, each alone: the address check, a post (taken
   back; the short path replay() takes for device tensors, and the general one), an NVTX
   push/pop pair, the bucket lookup, the views, the batch's shapes.

Run from the repository root on a GPU:
``PYTHONPATH=src python tools/experiments/replay_breakdown.py`` (``--json OUT`` keeps the figures).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from pagegraph.bench.configs import get_config
from pagegraph.bench.inputs import make_inputs
from pagegraph.bench.rows import single_bucket_runner
from pagegraph.bench.timing import interleaved_wall_us
from pagegraph.detect.ranges import pop, push
from pagegraph.graph import staging


def per_call_us(fn, calls: int = 2000) -> float:
    """Median host microseconds of ``fn`` over ``calls`` calls, in blocks of 100."""
    for _ in range(100):
        fn()
    blocks = []
    for _ in range(calls // 100):
        t0 = time.perf_counter_ns()
        for _ in range(100):
            fn()
        blocks.append((time.perf_counter_ns() - t0) / 100 / 1e3)
    return statistics.median(blocks)


def device_us(fn, calls: int = 500) -> float:
    """Device microseconds per call of a burst of ``calls`` back-to-back calls."""
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(calls):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / calls


def measure(inp, slots: int, waits: list, result: dict) -> dict:
    """One runner with ``staging.SLOTS = slots``: runner against bare replays, device time per
    replay in a burst, and (with 1024 slots) the pieces of a replay one by one."""
    cfg = inp.config
    rpi, lens = inp.req_pool_indices, inp.seq_lens
    staging.SLOTS = slots
    runner = single_bucket_runner(inp)
    runner.capture()
    graph = runner.graphs[cfg.bs]
    runner.replay(rpi, lens)
    torch.cuda.synchronize()
    waits[0] = 0
    times = interleaved_wall_us(
        {"runner": lambda: runner.replay(rpi, lens), "bare": graph.replay}, 400
    )
    row = {
        "slots": slots,
        "runner_us": round(times["runner"], 2),
        "bare_us": round(times["bare"], 2),
        "ratio": round(times["runner"] / times["bare"], 2),
        "mailbox_waits": waits[0],
        "device_us_runner": round(device_us(lambda: runner.replay(rpi, lens)), 2),
        "device_us_bare": round(device_us(graph.replay), 2),
    }
    torch.cuda.synchronize()
    print(row, flush=True)
    if slots == 1024:
        mb = runner._mailbox

        def short_post_withdraw():
            assert mb.try_post_tensors(rpi, lens, cfg.bs, runner._device_index)
            mb.withdraw()

        def post_withdraw():
            mb.post_each(rpi, lens, cfg.bs, runner._device_index)
            mb.withdraw()

        def push_pop():
            push("replay", cfg.bs)
            pop()

        pieces = {
            "check_addresses": runner.check_addresses,
            "short post+withdraw": short_post_withdraw,
            "general post+withdraw": post_withdraw,
            "push+pop": push_pop,
            "bucket lookup": lambda: runner._bucket_of[cfg.bs],
            "views_of": lambda: runner._views_of(cfg.bs),
            "shapes": lambda: (rpi.shape == lens.shape, lens.shape[0]),
            "getDevice": torch._C._cuda_getDevice,
        }
        result["pieces_us"] = {k: round(per_call_us(f), 3) for k, f in pieces.items()}
        print(result["pieces_us"], flush=True)
    runner.close()
    staging.SLOTS = 16
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="decode-mid")
    ap.add_argument("--json")
    args = ap.parse_args()
    cfg = get_config(args.config)
    inp = make_inputs(cfg, "cuda")
    result: dict = {"config": cfg.name, "bs": cfg.bs}
    waits = [0]
    wait = staging.Mailbox._wait

    def counted(self, k):
        waits[0] += 1
        return wait(self, k)

    staging.Mailbox._wait = counted
    for slots in (16, 1024, 16, 1024):
        result.setdefault("slots", []).append(measure(inp, slots, waits, result))
    staging.SLOTS = 16
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
