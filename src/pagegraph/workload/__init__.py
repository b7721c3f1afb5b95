"""The workloads a check replays: a KV pool and the decode batches it serves.

``KVPool`` models an engine's request-to-token pool (its writes queued for the device),
``DecodeWorkload`` generates the steps of a decode run (``Step``, with ``Injection`` of faults),
``ProducedWorkload`` runs it in child processes that hand their batches over shared-memory
rings, and ``EngineBlockTables`` keeps vLLM-style per-request block tables.
"""

from importlib import import_module

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


def __getattr__(name: str) -> object:
    module = _DEFINED_IN.get(name)
    if module is None:  # a submodule not yet imported is found by the import system then
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f".{module}", __name__), name)
    globals()[name] = value  # found once: later lookups do not come here
    return value
