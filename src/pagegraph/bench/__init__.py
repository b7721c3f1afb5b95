"""Benchmark suite: the page-table builders against the two floors they cannot beat.

Run: ``pagegraph bench`` (what ``make bench`` runs) or ``python -m pagegraph.bench``;
``--quick``, ``--configs NAME...``, ``--only SECTION...``, ``--tune`` for the kernel-parameter
sweep. ``--consumer-floor`` (the second half of ``make bench-decode``) measures the builders'
consumer instead: paged and CSR decode attention on the ``sglang-h200`` shapes against a DRAM
floor measured in the same process (``consumer_floor``; ``consumer-floor.md`` and ``.json``).
Sections, in the order they run (``bench_runner.SECTIONS``):

* ``builders``, per (config, builder) row (``rows``):

  * **device time per build** (``device_us``): a CUDA graph of ``N`` back-to-back builds,
    median of ``R`` event-timed replays, over ``N`` (``timing``). The page starts one build
    reads fit in the L2 cache for most configs, so the ``N`` builds of a graph cycle over
    several ``req_to_token`` tables holding the same requests on other pages
    (``input_sets``, together four times the L2; ``inputs``): in a serving engine the model's
    forward pass between two decode steps evicts them too. ``device_warm_us`` reads one
    table every build; ``l2_resident`` says whether one build's footprint alone would fit.
  * **the bandwidth floor** (``floor_us``): the bytes that must move (per live page, the
    page-start read ``min(32, page_size * itemsize)`` bytes, i.e. one sector at most, and
    the 4-byte write; SWA adds a 32-byte ``full_to_swa`` sector and another 4-byte write)
    over the device-to-device bandwidth measured in the same run (``floors``).
  * **the launch floor** (``launch_floor_us``): an empty one-program Triton kernel captured
    ``N`` times in a graph, per node.
  * **eager wall time** (``eager_us``): host time of one call (Python + launch), median of
    many, with the queue drained outside the timed region now and then; for
    ``build_page_table`` also ``eager_prepared_us`` (a ``PreparedBuild`` call).
  * **replay wall time** (``replay_us``, ``replay_host_us``), for ``build_page_table``
    only: one ``GraphRunner.replay()`` including staging, from device tensors and from host
    lists.

  ``host_max_gather`` cannot be captured correctly (its ``.item()`` freezes the width at
  capture), so it has eager wall time only. ``block_grid`` (``pagegraph.kernels.baselines``) is the
  rejected design, kept as a baseline: a fixed ``(bs, cdiv(width, 64))`` grid of page
  blocks over the whole static width. Before timing, every builder's output is checked
  once, exactly, against ``pagegraph.check.table_reference.expected_tables`` on the live
  entries (``exact``), and again after a graph replay (``graph_exact``).
* ``replay``: ``GraphRunner.replay()`` host time against a bare ``CUDAGraph.replay()``
  (``replay_overhead``).
* ``metadata``: ``build_decode_metadata`` against ``build_page_table`` and the unfused chain,
  device and eager time, per config (``decode_bench``).
* ``sweeps``: device time against batch size and context, and their plots (``sweeps``).
* ``checker``: checked replays per second of ``check_replay_safety`` (``checker_rate``).

Without CUDA only a smoke run under the Triton interpreter is possible: tiny shapes, eager
wall times of the interpreter, exactness, and ``None`` for every device field.

Modules: ``configs`` (shapes), ``inputs`` (inputs, L2 rotation, outputs and the exactness
check), ``floors``, ``timing`` (graph and wall-clock timing, settings), ``rows``,
``decode_bench``, ``replay_overhead``, ``checker_rate``, ``sweeps`` (and ``--tune``),
``bench_report`` (targets, Markdown, plots), ``bench_runner`` (``run_bench`` and the command
line), ``consumer_floor`` (``--consumer-floor``) and ``pytest_bench`` (the pytest-benchmark
timings that ``benchmarks/test_bench.py`` runs). What is imported here is the public surface.
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
