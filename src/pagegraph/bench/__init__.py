"""Benchmark suite: the page-table builders against the two floors they cannot beat.

``pagegraph bench`` (``make bench``) runs the sections of ``bench_runner.SECTIONS``: the
builders' device time (rotated out of the L2) against the bandwidth and launch floors and their
eager time, the runner's replay overhead, the decode-metadata builder against the unfused
chain, sweeps, and the checker's rate; ``--consumer-floor`` times paged decode attention
against a DRAM floor. Each section's method and row fields: docs/ARCHITECTURE.md, "The bench".
Imported here are the names the command line, the pytest benchmarks and their tests use: the
run (``run``, ``run_bench``, ``add_arguments``, ``failures``), the configs, the inputs and
their exact check, and the pytest-benchmark entries; everything else is imported from the
module that defines it.
"""

from __future__ import annotations

from .bench_runner import SECTIONS, add_arguments, failures, main, run, run_bench
from .configs import CONFIG_NAMES, CONFIGS, BenchConfig, get_config, smoke_config
from .inputs import BenchInputs, Check, make_inputs, make_outputs
from .pytest_bench import (
    PYTEST_CONFIGS,
    PYTEST_EAGER_BUILDERS,
    PYTEST_REPLAY_CONFIG,
    InputCache,
    time_eager,
    time_replay,
)

__all__ = [
    "CONFIGS",
    "CONFIG_NAMES",
    "PYTEST_CONFIGS",
    "PYTEST_EAGER_BUILDERS",
    "PYTEST_REPLAY_CONFIG",
    "SECTIONS",
    "BenchConfig",
    "BenchInputs",
    "Check",
    "InputCache",
    "add_arguments",
    "failures",
    "get_config",
    "main",
    "make_inputs",
    "make_outputs",
    "run",
    "run_bench",
    "smoke_config",
    "time_eager",
    "time_replay",
]
