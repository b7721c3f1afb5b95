"""Which ranges of a trace synchronize with the host, and how: ``pagegraph trace FILE``.

Reads either recorder the project uses and turns it into one model, in integer nanoseconds
(:mod:`.trace_model`, read by :mod:`.trace_loaders`):

* an Nsight Systems SQLite export (``nsys export --type sqlite``), whose NVTX ranges are the
  ``nvtx`` annotations pagegraph puts around every ``replay()``;
* a torch.profiler Chrome/Perfetto JSON trace (``prof.export_chrome_trace``, optionally
  gzipped), whose ``record_function`` ranges (``user_annotation`` events) play the same role.

:mod:`.trace_stats` attributes calls and GPU work to ranges (the rules are in its doc);
:mod:`.trace_check` holds the invariant checked by ``--forbid-sync PATTERN``: no range
matching the glob holds a host-blocking synchronization (a sync API call, as
:mod:`.sync_calls` lists them, or a blocking sync record) or a device-to-host copy; a check
that cannot see any matching range fails with exit code 2 instead of passing.
:mod:`.trace_report` writes the table and runs the command line.

This module gathers their public names, the ones the rest of pagegraph uses.
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
