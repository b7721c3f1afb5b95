"""Builder kinds as specs (``KindSpec``): one module per kind, each holding everything the bed
knows about that kind; the rest of pagegraph asks the spec (``kind_of(builder)``,
``KINDS[name]``) and never compares kind names.

* ``page_table`` (``pagegraph.kinds.page_table_kind``): ``build_page_table``'s contract, in
  the graph.
* ``decode_metadata``: ``build_decode_metadata``'s, in the graph.
* ``csr``: FlashInfer's ``kv_indptr`` / ``kv_indices``, in the graph.
* ``block_table``: vLLM's batch block tables gathered from per-request tables, eagerly before
  the replay, padded rows cleared to the null block.
* ``slot_mapping``: vLLM's per-token slot ids, in the graph, the tail filled with the pad slot.

What a kind reads of the layers above it (the runner's or checker's buffers, the verifier, a
scenario's config) is typed by the protocols of ``pagegraph.kinds.seams``. A kind imports no
layer above it: the mutant zoos (``pagegraph.mutants.zoo``) and the real engines' builders
(``pagegraph.clients``) are found by name a layer up. A kind of one's own is one module with a
``KindSpec`` subclass, added with ``register_kind`` (``load_kind`` for one named by
``module:NAME`` or ``path/file.py:NAME``).
"""

from __future__ import annotations

from ..kernels.batch import BatchContext
from ..kernels.contract import declared_outputs
from ..kernels.registry import load_object
from .base import IO_FIELDS, KindSpec, PaddedRows, VectorSpec
from .block_table_kind import BLOCK_TABLE
from .csr_kind import CSR
from .decode_metadata_kind import DECODE_METADATA
from .page_table_kind import PAGE_TABLE
from .seams import (
    Builder,
    BuilderIO,
    EngineState,
    GroupTable,
    ReplayModel,
    ScenarioConfig,
    VectorVerifier,
)
from .slot_mapping_kind import SLOT_MAPPING

#: Every kind by name, in the order users read them (the built-in ones, then those added
#: with ``register_kind``).
KINDS: dict[str, KindSpec] = {
    k.name: k for k in (PAGE_TABLE, DECODE_METADATA, CSR, BLOCK_TABLE, SLOT_MAPPING)
}
#: The built-in kinds' names (``kind_names()`` includes the registered ones).
OUTPUT_KINDS = tuple(KINDS)

__all__ = [
    "BLOCK_TABLE",
    "CSR",
    "DECODE_METADATA",
    "IO_FIELDS",
    "KINDS",
    "OUTPUT_KINDS",
    "PAGE_TABLE",
    "SLOT_MAPPING",
    "BatchContext",
    "Builder",
    "BuilderIO",
    "EngineState",
    "GroupTable",
    "KindSpec",
    "PaddedRows",
    "ReplayModel",
    "ScenarioConfig",
    "VectorSpec",
    "VectorVerifier",
    "kind_named",
    "kind_names",
    "kind_of",
    "load_kind",
    "presettable_outputs",
    "register_kind",
    "unregister_kind",
    "vector_names",
]


def kind_names() -> tuple[str, ...]:
    """Every kind's name, the registered ones included."""
    return tuple(KINDS)


def vector_names() -> tuple[str, ...]:
    """Every kind's output vectors' names, each once."""
    return tuple(dict.fromkeys(name for spec in KINDS.values() for name in spec.vector_names))


def presettable_outputs() -> tuple[str, ...]:
    """Every output entry an engine may preset (``KindSpec.presets``), over every kind:
    ``CheckConfig.preset_outputs`` names some of these."""
    return tuple(name for spec in KINDS.values() for name in spec.presets)


def register_kind(spec: KindSpec) -> KindSpec:
    """Add the kind ``spec`` (an instance of a ``KindSpec`` subclass) to ``KINDS``: a builder
    declaring its name (``pagegraph_outputs``) and a scenario's ``outputs`` may then name it.
    ``ValueError`` for a name already taken by another spec, a name among the bed's own
    buffer names (``IO_FIELDS``) or a kind without ``name``, ``signature`` or ``reference``."""
    if not isinstance(spec, KindSpec):
        raise ValueError(f"{spec!r} is not a KindSpec instance")
    missing = [a for a in ("name", "signature", "reference") if not hasattr(spec, a)]
    if missing:
        raise ValueError(f"{type(spec).__name__} does not set {', '.join(missing)}")
    if spec.name in IO_FIELDS:
        raise ValueError(f"kind name {spec.name!r} is one of the bed's buffers {IO_FIELDS}")
    taken = KINDS.get(spec.name)
    if taken is not None and taken is not spec:
        raise ValueError(f"a kind named {spec.name!r} exists already ({taken!r})")
    KINDS[spec.name] = spec
    return spec


def unregister_kind(name: str) -> None:
    """Remove a kind added with ``register_kind`` (``ValueError`` for a built-in one)."""
    if name in OUTPUT_KINDS:
        raise ValueError(f"{name!r} is a built-in kind")
    KINDS.pop(name, None)


def load_kind(spec: str) -> KindSpec:
    """Register and return the ``KindSpec`` instance named by ``"package.module:NAME"`` or
    ``"path/to/file.py:NAME"`` (``register_kind``)."""
    found = load_object(spec)
    if not isinstance(found, KindSpec):
        raise ValueError(f"{spec} is {found!r}, not a KindSpec instance")
    return register_kind(found)


def kind_named(name: str) -> KindSpec:
    """The spec of kind ``name`` (``ValueError`` naming the kinds otherwise)."""
    spec = KINDS.get(name)
    if spec is None:
        raise ValueError(f"outputs must be auto or one of {kind_names()}, got {name!r}")
    return spec


def kind_of(builder: Builder, declared: str = "auto") -> KindSpec:
    """The kind ``declared`` names, else what the builder says of itself: a built-in of a
    kind, or its ``pagegraph_outputs`` attribute (default: ``page_table``)."""
    if declared != "auto":
        return kind_named(declared)
    for spec in KINDS.values():
        if any(fn is builder for fn in spec.builders.values()):
            return spec
    declared_name = declared_outputs(builder)
    name = PAGE_TABLE.name if declared_name is None else declared_name
    if not isinstance(name, str) or name not in KINDS:
        raise ValueError(f"{builder!r}.pagegraph_outputs must be one of {kind_names()}")
    return KINDS[name]
