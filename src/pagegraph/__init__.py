"""pagegraph: sync-free, CUDA-graph-safe attention page tables, and the proof that they are.

On a machine without CUDA, importing pagegraph sets ``TRITON_INTERPRET=1`` (unless it is
already set) before any kernel is defined, so the Triton kernels run on CPU tensors under the
interpreter.
"""

import os

if "TRITON_INTERPRET" not in os.environ:
    import torch

    if not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"

from .check.checker import CheckConfig, Report, check_replay_safety  # noqa: E402
from .detect.sync import DetectorUnavailable, DeviceSyncError, no_device_sync  # noqa: E402
from .graph.buckets import Buckets, PaddingPolicy  # noqa: E402
from .graph.runner import GraphRunner, NotCaptured, StaticBufferMoved  # noqa: E402
from .jobs.environment import PAGEGRAPH_VERSION  # noqa: E402
from .kernels.contract import ERROR_KINDS  # noqa: E402
from .kernels.page_table import BuffersChanged, PreparedBuild, build_page_table, prepare_build  # noqa: E402
from .kernels.reference import (  # noqa: E402
    host_max_gather,
    reference_page_table,
    static_width_gather,
)
from .workload.decode import DecodeWorkload  # noqa: E402
from .workload.pool import KVPool  # noqa: E402

__all__ = [
    "ERROR_KINDS",
    "Buckets",
    "BuffersChanged",
    "CheckConfig",
    "DecodeWorkload",
    "DetectorUnavailable",
    "DeviceSyncError",
    "GraphRunner",
    "KVPool",
    "NotCaptured",
    "PaddingPolicy",
    "PreparedBuild",
    "Report",
    "StaticBufferMoved",
    "build_page_table",
    "check_replay_safety",
    "host_max_gather",
    "no_device_sync",
    "prepare_build",
    "reference_page_table",
    "static_width_gather",
]
__version__ = PAGEGRAPH_VERSION
