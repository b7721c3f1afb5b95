"""pagegraph: sync-free, CUDA-graph-safe attention page tables, and the proof that they are.

On a machine without CUDA, importing pagegraph sets ``TRITON_INTERPRET=1`` (unless it is
already set) before any kernel is defined, so the Triton kernels run on CPU tensors under the
interpreter.
"""

import os
from typing import Any

if "TRITON_INTERPRET" not in os.environ:
    import torch

    if not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"

#: public name -> the module that defines it, imported at first use (``__getattr__``): importing
#: pagegraph alone (``pagegraph trace``, ``--help``, a child process) loads none of them.
_LAZY = {
    "CheckConfig": "check.config",
    "Report": "check.reports.report",
    "check_replay_safety": "check.checker",
    "DetectorUnavailable": "detect.sync",
    "DeviceSyncError": "detect.sync",
    "no_device_sync": "detect.sync",
    "Buckets": "graph.buckets",
    "PaddingPolicy": "graph.buckets",
    "GraphRunner": "graph.runner",
    "NotCaptured": "graph.runner",
    "StaticBufferMoved": "graph.runner",
    "PAGEGRAPH_VERSION": "runtime.environment",
    "ERROR_KINDS": "kernels.contract",
    "BuffersChanged": "kernels.page_table",
    "PreparedBuild": "kernels.page_table",
    "build_page_table": "kernels.page_table",
    "prepare_build": "kernels.page_table",
    "host_max_gather": "kernels.reference",
    "reference_page_table": "kernels.reference",
    "static_width_gather": "kernels.reference",
    "DecodeWorkload": "workload.decode",
    "KVPool": "workload.pool",
}


def __getattr__(name: str) -> Any:
    defined = "PAGEGRAPH_VERSION" if name == "__version__" else name
    module = _LAZY.get(defined)
    if module is None:
        raise AttributeError(f"module 'pagegraph' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f".{module}", __name__), defined)
    globals()[name] = value  # found once: later lookups do not come here
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY, "__version__"})


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
