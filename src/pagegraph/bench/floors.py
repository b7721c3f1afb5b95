"""The two floors no page-table build can beat, and the bytes behind the first.

* **Bandwidth floor**: the bytes that must move (per live page the page-start read, one
  32-byte sector at most, and the 4-byte write; SWA adds a ``full_to_swa`` sector and another
  write) over the device-to-device bandwidth measured in the same run (``measure_bandwidth``).
* **Launch floor**: an empty one-program Triton kernel as a CUDA-graph node
  (``measure_launch_floor``): what any build costs before it reads a byte.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import partial

import torch
import triton

from ..kernels.contract import cdiv
from ..runtime.timing import (
    GRAPH_BUILDS,
    GRAPH_REPLAYS,
    EventClock,
    device_time_us,
    time_interleaved,
)
from .configs import BenchConfig

#: Sector size: a page-start read costs at most one 32-byte sector, whatever the page size.
SECTOR = 32
#: Bytes per copy buffer for the bandwidth measurement.
COPY_BYTES = 2 * 2**30
#: Footprints below this are taken as L2-resident across the builds of one graph (the H200's
#: L2 size; used when the device does not report its own).
DEFAULT_L2_BYTES = 60 * 10**6


def live_pages(lengths: Sequence[int], page_size: int, width: int) -> int:
    """Pages a builder must write: ``sum(min(cdiv(len, page_size), width))``."""
    return sum(min(max(cdiv(n, page_size), 0), width) for n in lengths)


def floor_bytes(pages: int, page_size: int, itemsize: int = 4, swa: bool = False) -> int:
    """Bytes that must move for ``pages`` live pages: the page-start read (one sector at most,
    ``min(32, page_size * itemsize)``) and the 4-byte write; SWA adds a 32-byte
    ``full_to_swa`` sector and another 4-byte write."""
    per_page = min(SECTOR, page_size * itemsize) + 4
    if swa:
        per_page += SECTOR + 4
    return pages * per_page


def expected_live_pages(cfg: BenchConfig) -> int:
    """Expected live pages of a config, from the mean length: ``bs * ceil(mean_len / ps)``
    (uniform), or the one long row plus ``bs - 1`` short ones (skewed)."""
    kind, a, b = cfg.lengths
    ps = cfg.page_size
    if kind == "uniform":
        return cfg.bs * min(math.ceil((a + b) / 2 / ps), cfg.width)
    return min(cdiv(a, ps), cfg.width) + (cfg.bs - 1) * min(cdiv(b, ps), cfg.width)


def expected_floor_bytes(cfg: BenchConfig, itemsize: int = 4) -> int:
    """``floor_bytes`` of ``expected_live_pages``."""
    return floor_bytes(expected_live_pages(cfg), cfg.page_size, itemsize, cfg.swa)


@triton.jit
def _empty_kernel(x_ptr):  # type: ignore[no-untyped-def]  # [1] int32, never touched
    pass


def measure_bandwidth(nbytes: int = COPY_BYTES, copies: int = 10) -> float:
    """Device-to-device bytes per second (read + write) of a large ``dst.copy_(src)``, median
    of ``copies`` event-timed copies after two untimed ones (``time_interleaved``; the buffers
    halve until they fit)."""
    while True:
        try:
            src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
            dst = torch.empty_like(src)
            break
        except torch.OutOfMemoryError:
            if nbytes <= 2**26:
                raise
            nbytes //= 2
    src.fill_(1)
    copy = {"copy": partial(dst.copy_, src)}
    us = time_interleaved(copy, calls=1, repeats=copies, clock=EventClock(), warmup=2)["copy"]
    del src, dst, copy
    torch.cuda.empty_cache()
    return 2 * nbytes / (us * 1e-6)


def measure_launch_floor(builds: int = GRAPH_BUILDS, replays: int = GRAPH_REPLAYS) -> float:
    """Microseconds per graph node of an empty one-program Triton kernel."""
    buf = torch.zeros(1, dtype=torch.int32, device="cuda")
    us, graph = device_time_us(lambda: _empty_kernel[(1,)](buf), builds, replays)
    del graph
    return us
