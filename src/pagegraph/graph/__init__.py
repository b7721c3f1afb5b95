"""The graph bed: a builder captured in CUDA graphs and replayed as an engine would.

``GraphRunner`` captures a builder once a bucket (``Buckets``, ``PaddingPolicy``), stages each
batch through a pinned mailbox inside the graph and checks that its static buffers never move;
``EmulatedGraph`` stands in for a CUDA graph on the CPU; ``StepGraphs`` captures a whole decode
step (metadata, cache write and attention).
"""

from importlib import import_module

#: public name -> the module of this package that defines it, imported at first use, so
#: that importing one module of the package loads no other.
_DEFINED_IN = {
    "GraphRunner": "runner",
    "NotCaptured": "runner",
    "StaticBufferMoved": "runner",
    "Buckets": "buckets",
    "PaddingPolicy": "buckets",
    "EmulatedGraph": "emulate",
    "StepGraphs": "step_graphs",
}

__all__ = [
    "Buckets",
    "EmulatedGraph",
    "GraphRunner",
    "NotCaptured",
    "PaddingPolicy",
    "StaticBufferMoved",
    "StepGraphs",
]


def __getattr__(name: str) -> object:
    module = _DEFINED_IN.get(name)
    if module is None:  # a submodule not yet imported is found by the import system then
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f".{module}", __name__), name)
    globals()[name] = value  # found once: later lookups do not come here
    return value
