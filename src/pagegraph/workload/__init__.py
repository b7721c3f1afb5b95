"""The workloads a check replays: a KV pool and the decode batches it serves.

``KVPool`` models an engine's request-to-token pool (its writes queued for the device),
``DecodeWorkload`` generates the steps of a decode run (``Step``, with ``Injection`` of faults),
``ProducedWorkload`` runs it in child processes that hand their batches over shared-memory
rings, and ``EngineBlockTables`` keeps vLLM-style per-request block tables.
"""

from ..runtime.lazy_exports import lazy_exports

#: public name -> the module of this package that defines it, imported at first use, so
#: that importing one module of the package loads no other.
_DEFINED_IN = {
    "KVPool": "pool",
    "Request": "pool",
    "DecodeWorkload": "decode",
    "Injection": "decode",
    "Step": "decode",
    "ProducedWorkload": "producer",
    "EngineBlockTables": "engine_block_tables",
}

__all__ = [
    "DecodeWorkload",
    "EngineBlockTables",
    "Injection",
    "KVPool",
    "ProducedWorkload",
    "Request",
    "Step",
]


__getattr__ = lazy_exports(__name__, _DEFINED_IN)
