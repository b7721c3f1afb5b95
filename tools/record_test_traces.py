"""Record the small real traces the analyzer's tests use (run on a GPU machine).

Usage (``tools/gpu_validate.sh OUT traces`` runs all three)::

    python tools/record_test_traces.py clean    # 20 sync-free replays
    python tools/record_test_traces.py planted  # the same, with one .item() inside a replay range
    python tools/record_test_traces.py torch OUT_DIR  # both, as torch.profiler JSON traces

Run the first two under ``nsys profile -t cuda,nvtx --sample=none --cpuctxsw=none
--cuda-graph-trace=node`` and export to SQLite; the third records torch.profiler traces
in-process (ranges then also open ``record_function``, since torch.profiler does not show NVTX).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from pagegraph import GraphRunner, KVPool
from pagegraph.detect.ranges import phase, set_record_function
from pagegraph.workload.decode import DecodeWorkload


def replays(planted: bool, steps: int = 20) -> None:
    pool = KVPool(max_reqs=33, max_context_len=4096, page_size=16, device="cuda", seed=0)
    runner = GraphRunner(
        pool.req_to_token, max_bs=32, max_context_len=4096, page_size=16, buckets="pow2"
    )
    runner.capture()
    for step in DecodeWorkload(pool, max_bs=32, steps=steps, seed=1):
        runner.replay(step.req_pool_indices, step.seq_lens)
        if planted and step.index == steps // 2:
            with phase("replay", runner.last_bucket):
                runner.page_table[0, 0].item()  # the planted sync
        with phase("verify"):
            torch.cuda.synchronize()
    runner.close()


def main() -> int:
    mode = sys.argv[1]
    if mode in ("clean", "planted"):
        replays(mode == "planted")
        return 0
    out = Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    from torch.profiler import ProfilerActivity, profile

    set_record_function(True)
    for name in ("clean", "planted"):
        replays(False, 4)  # warm-up outside the trace
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            replays(name == "planted")
        prof.export_chrome_trace(str(out / f"torch_{name}.json"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
