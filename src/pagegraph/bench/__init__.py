"""Benchmark suite: the page-table builders against the two floors they cannot beat.

``pagegraph bench`` (``make bench``) runs the sections of ``bench_runner.SECTIONS``: the
builders' device time (rotated out of the L2) against the bandwidth and launch floors and their
eager time, the runner's replay overhead, the decode-metadata builder against the unfused
chain, sweeps, and the checker's rate; ``--consumer-floor`` times paged decode attention
against a DRAM floor. Each section's method and row fields: docs/ARCHITECTURE.md, "The bench".
What is imported here is the public surface.
"""

from __future__ import annotations

from ..kernels.baselines import BLOCK_GRID_PAGES, BLOCK_GRID_WARPS, block_grid
from ..kernels.page_table import build_page_table
from .bench_report import format_markdown, format_tune_markdown, targets
from .bench_runner import SECTIONS, add_arguments, failures, main, run, run_bench
from .checker_rate import bench_checker
from .configs import (
    CONFIG_NAMES,
    CONFIGS,
    SMOKE_BS,
    SMOKE_CONTEXT,
    TUNE_CONFIGS,
    BenchConfig,
    K,
    get_config,
    smoke_config,
)
from .decode_bench import bench_decode_config, decode_summary, first_difference
from .floors import (
    COPY_BYTES,
    DEFAULT_L2_BYTES,
    SECTOR,
    expected_floor_bytes,
    expected_live_pages,
    floor_bytes,
    live_pages,
    measure_bandwidth,
    measure_launch_floor,
)
from .inputs import (
    BenchInputs,
    Check,
    Rotation,
    make_inputs,
    make_outputs,
    poison,
    rotate_out_of_l2,
    rotated_copies,
    rotation_count,
)
from .pytest_bench import (
    PYTEST_CONFIGS,
    PYTEST_EAGER_BUILDERS,
    PYTEST_REPLAY_CONFIG,
    PYTEST_ROUNDS,
    PYTEST_WARMUP_ROUNDS,
    InputCache,
    time_eager,
    time_replay,
)
from .replay_overhead import bench_replay_overhead, interleaved_wall_us
from .rows import BUILDERS, GRAPH_SAFE, bench_config, single_bucket_runner
from .sweeps import SWEEP_BS, SWEEP_BUILDERS, SWEEP_CONTEXT, run_sweeps, sweep_kernel_params
from .timing import (
    EAGER_CALLS,
    GRAPH_BUILDS,
    GRAPH_REPLAYS,
    REPLAY_CALLS,
    SYNC_EVERY,
    Settings,
    bench_environment,
    device_time_us,
    wall_time_us,
)

# Aliases of the public names above under their older private spellings, for scripts that
# still use those.
_Check = Check
_outputs = make_outputs
_poison = poison
_env = bench_environment

__all__ = [
    "BLOCK_GRID_PAGES",
    "BLOCK_GRID_WARPS",
    "BUILDERS",
    "CONFIGS",
    "CONFIG_NAMES",
    "COPY_BYTES",
    "DEFAULT_L2_BYTES",
    "EAGER_CALLS",
    "GRAPH_BUILDS",
    "GRAPH_REPLAYS",
    "GRAPH_SAFE",
    "K",
    "PYTEST_CONFIGS",
    "PYTEST_EAGER_BUILDERS",
    "PYTEST_REPLAY_CONFIG",
    "PYTEST_ROUNDS",
    "PYTEST_WARMUP_ROUNDS",
    "REPLAY_CALLS",
    "SECTIONS",
    "SECTOR",
    "SMOKE_BS",
    "SMOKE_CONTEXT",
    "SWEEP_BS",
    "SWEEP_BUILDERS",
    "SWEEP_CONTEXT",
    "SYNC_EVERY",
    "TUNE_CONFIGS",
    "BenchConfig",
    "BenchInputs",
    "Check",
    "InputCache",
    "Rotation",
    "Settings",
    "add_arguments",
    "bench_checker",
    "bench_config",
    "bench_decode_config",
    "bench_environment",
    "bench_replay_overhead",
    "block_grid",
    "build_page_table",
    "decode_summary",
    "device_time_us",
    "expected_floor_bytes",
    "expected_live_pages",
    "failures",
    "first_difference",
    "floor_bytes",
    "format_markdown",
    "format_tune_markdown",
    "get_config",
    "interleaved_wall_us",
    "live_pages",
    "main",
    "make_inputs",
    "make_outputs",
    "measure_bandwidth",
    "measure_launch_floor",
    "poison",
    "rotate_out_of_l2",
    "rotated_copies",
    "rotation_count",
    "run",
    "run_bench",
    "run_sweeps",
    "single_bucket_runner",
    "smoke_config",
    "sweep_kernel_params",
    "targets",
    "time_eager",
    "time_replay",
    "wall_time_us",
]
