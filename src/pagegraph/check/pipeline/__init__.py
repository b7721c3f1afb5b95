"""The check pipeline: its phases and replay loop, both beds, and the state they run on.

``run_pipeline`` runs a planned check's phases (device, buffers, workload, capture, replays,
judgment) over a bed: ``TableBed`` for a metadata builder in its graph, ``StepBed`` for a
whole decode step; ``CheckHooks`` and the replay state are what the judges read.
"""

from ...runtime.lazy_exports import lazy_exports

#: public name -> the module of this package that defines it, imported at first use, so
#: that importing one module of the package loads no other.
_DEFINED_IN = {
    "run_pipeline": "phases",
    "TableBed": "table_bed",
    "StepBed": "step_bed",
    "CheckHooks": "state",
    "allocate_check_buffers": "buffers",
}

__all__ = [
    "CheckHooks",
    "StepBed",
    "TableBed",
    "allocate_check_buffers",
    "run_pipeline",
]


__getattr__ = lazy_exports(__name__, _DEFINED_IN)
