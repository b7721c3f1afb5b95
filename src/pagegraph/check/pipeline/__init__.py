"""The check pipeline: its phases and replay loop, both beds, and the state they run on.

``run_pipeline`` runs a planned check's phases (device, buffers, workload, capture, replays,
judgment) over a bed: ``TableBed`` for a metadata builder in its graph, ``StepBed`` for a
whole decode step; ``CheckHooks`` and the replay state are what the judges read.
"""

from importlib import import_module

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


def __getattr__(name: str) -> object:
    module = _DEFINED_IN.get(name)
    if module is None:  # a submodule not yet imported is found by the import system then
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f".{module}", __name__), name)
    globals()[name] = value  # found once: later lookups do not come here
    return value
