"""What every layer of pagegraph may use: the device a check or a job runs on (``pick_device``),
the machine and versions a report or a benchmark row records
(``pagegraph.runtime.environment``, ``PAGEGRAPH_VERSION``), the progress line of a long job
(``Progress``) and the one timing toolkit (``pagegraph.runtime.timing``: device time in CUDA
graphs of N calls between CUDA events, host wall time per call, medians with the warm-up left
out), and how every package offers its public names at first use
(``pagegraph.runtime.lazy_exports``). It imports no other part of pagegraph.
"""

from .lazy_exports import lazy_exports

#: public name -> the module of this package that defines it, imported at first use, so
#: that importing one module of the package loads no other.
_DEFINED_IN = {
    "pick_device": "device",
    "PAGEGRAPH_VERSION": "environment",
    "Progress": "progress",
    "format_seconds": "progress",
    "device_time_us": "timing",
    "time_interleaved": "timing",
    "wall_time_us": "timing",
}

__all__ = [
    "PAGEGRAPH_VERSION",
    "Progress",
    "device_time_us",
    "format_seconds",
    "pick_device",
    "time_interleaved",
    "wall_time_us",
]


__getattr__ = lazy_exports(__name__, _DEFINED_IN)
