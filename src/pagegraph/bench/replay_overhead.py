"""The "replay" section: what ``GraphRunner.replay()`` costs the host over a bare
``CUDAGraph.replay()``.

A single-bucket runner is captured for ``decode-mid``, and the two calls are timed in
alternating rounds of ``SYNC_EVERY`` calls, each after a drained queue, so a drift of the host's
speed weighs on both alike; their ratio is the runner's overhead (target: at most 2x). The
runner's output is checked exactly before and after. Without CUDA only the check runs.
"""

from __future__ import annotations

from typing import Any

from ..detect.ranges import phase
from ..runtime.timing import interleaved_wall_us, sync
from .bench_settings import Settings, error, recover
from .configs import get_config, smoke_config
from .inputs import Check, make_inputs, poison
from .rows import single_bucket_runner

REPLAY_OVERHEAD_CONFIG = "decode-mid"
#: Target: a runner replay costs the host at most this many bare graph replays.
REPLAY_OVERHEAD_TARGET = 2.0


def overhead_row(config: str, bs: int) -> dict[str, Any]:
    """The replay-overhead result with every field present, the measured ones ``None``."""
    return {
        "config": config,
        "bs": bs,
        "bucket": None,
        "calls": None,
        "runner_replay_us": None,
        "bare_replay_us": None,
        "ratio": None,
        "target": REPLAY_OVERHEAD_TARGET,
        "exact": None,
        "skipped": None,
        "error": None,
    }


def bench_replay_overhead(s: Settings, config: str = REPLAY_OVERHEAD_CONFIG) -> dict[str, Any]:
    """Runner replay vs bare graph replay, host wall time per call (see the module
    docstring); a failure is recorded in ``error``, never raised."""
    cfg = get_config(config)
    if not s.cuda:
        cfg = smoke_config(cfg)
    row = overhead_row(cfg.name, cfg.bs)
    runner = None
    try:
        with phase("bench", cfg.bs):
            inp = make_inputs(cfg, "cuda" if s.cuda else "cpu")
            check = Check(inp)
            runner = single_bucket_runner(inp)
            runner.capture()
        rpi, lens = inp.req_pool_indices, inp.seq_lens
        bucket = runner.buckets.bucket_for(cfg.bs)
        row["bucket"] = bucket

        def exact() -> bool:
            poison(runner.page_table, runner.swa_page_table)
            pt, swa = runner.replay(rpi, lens)
            sync(s.cuda)
            mismatch = check.compare(pt, swa)
            if mismatch:
                row["error"] = f"replay: {mismatch}"
            return mismatch is None

        row["exact"] = exact()
        if not s.cuda:
            row["skipped"] = "no CUDA: the runner builds eagerly, there is no graph to time"
            return row
        graph = runner.graphs[bucket]
        # runner.replay() last staged this very batch: a bare replay rebuilds the same tables.
        times = interleaved_wall_us(
            {"runner": lambda: runner.replay(rpi, lens), "bare": graph.replay},
            s.replay_calls,
            cuda=True,
        )
        row["calls"] = s.replay_calls
        row["runner_replay_us"] = times["runner"]
        row["bare_replay_us"] = times["bare"]
        if times["bare"] > 0:
            row["ratio"] = times["runner"] / times["bare"]
        row["exact"] = row["exact"] and exact()
    except Exception as exc:  # noqa: BLE001
        row["error"] = error(exc)
    finally:
        if runner is not None:
            runner.close()
        recover(s.cuda)
    return row
