"""The graph bed: a builder captured in CUDA graphs and replayed as an engine would.

``GraphRunner`` captures a builder once a bucket (``Buckets``, ``PaddingPolicy``), stages each
batch through a pinned mailbox inside the graph and checks that its static buffers never move;
``EmulatedGraph`` stands in for a CUDA graph on the CPU; ``StepGraphs`` captures a whole decode
step (metadata, cache write and attention).
"""

from ..runtime.lazy_exports import lazy_exports

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


__getattr__ = lazy_exports(__name__, _DEFINED_IN)
