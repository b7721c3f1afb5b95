"""The bottom layer's detectors: proof that a region of host code never waits on the device.

The sync detectors (torch's sync-debug mode, CPU stacks, CUPTI) behind ``no_device_sync`` and
``parse_detectors``, the NVTX ranges the bed marks its phases with (``phase``), the probes of a
builder's calls (compiles, allocations, eager calls), and the trace analyzer behind ``pagegraph
trace`` (``pagegraph.detect.trace``, which needs nothing above this layer).
"""

from ..runtime.lazy_exports import lazy_exports

#: public name -> the module of this package that defines it, imported at first use, so
#: that importing one module of the package loads no other.
_DEFINED_IN = {
    "DetectorUnavailable": "sync",
    "DeviceSyncError": "sync",
    "available_detectors": "sync",
    "no_device_sync": "sync",
    "parse_detectors": "sync",
    "phase": "ranges",
    "AllocationCounter": "probes",
    "BuilderProbe": "probes",
    "CompileCounter": "probes",
}

__all__ = [
    "AllocationCounter",
    "BuilderProbe",
    "CompileCounter",
    "DetectorUnavailable",
    "DeviceSyncError",
    "available_detectors",
    "no_device_sync",
    "parse_detectors",
    "phase",
]


__getattr__ = lazy_exports(__name__, _DEFINED_IN)
