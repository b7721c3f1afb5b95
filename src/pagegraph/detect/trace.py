"""Which ranges of a trace synchronize with the host, and how: ``pagegraph trace FILE``.

An Nsight Systems SQLite export or a torch.profiler JSON trace is read into one model
(``trace_model``, ``trace_loaders``), calls and GPU work are attributed to ranges
(``trace_stats``), and ``--forbid-sync PATTERN`` fails a matching range that holds a
host-blocking sync or a device-to-host copy, or exits 2 when no range matches (``trace_check``).
This module gathers the public names the rest of pagegraph uses.
"""

from __future__ import annotations

import sys

from .sync_calls import api_base_name, is_sync_api
from .trace_check import CheckResult, Violation, check, find_violations
from .trace_loaders import SQLITE_MAGIC, load_trace
from .trace_model import ApiCall, GpuActivity, Range, Trace, TraceError
from .trace_report import add_arguments, format_markdown, main, run
from .trace_stats import (
    RangeStats,
    TraceSummary,
    analyze,
    is_d2h_copy,
    is_graph_launch,
    is_host_blocking_sync,
    summarize,
)

__all__ = [
    "SQLITE_MAGIC",
    "ApiCall",
    "CheckResult",
    "GpuActivity",
    "Range",
    "RangeStats",
    "Trace",
    "TraceError",
    "TraceSummary",
    "Violation",
    "add_arguments",
    "analyze",
    "api_base_name",
    "check",
    "find_violations",
    "format_markdown",
    "is_d2h_copy",
    "is_graph_launch",
    "is_host_blocking_sync",
    "is_sync_api",
    "load_trace",
    "main",
    "run",
    "summarize",
]

if __name__ == "__main__":
    sys.exit(main())
