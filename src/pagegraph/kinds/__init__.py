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
scenario's config) is typed by the protocols of ``pagegraph.kinds.seams``.
"""

from __future__ import annotations

from ..kernels.batch import BatchContext
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

#: Every kind by name, in the order users read them.
KINDS: dict[str, KindSpec] = {
    k.name: k for k in (PAGE_TABLE, DECODE_METADATA, CSR, BLOCK_TABLE, SLOT_MAPPING)
}
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
    "kind_of",
]


def kind_named(name: str) -> KindSpec:
    """The spec of kind ``name`` (``ValueError`` naming the kinds otherwise)."""
    spec = KINDS.get(name)
    if spec is None:
        raise ValueError(f"outputs must be auto or one of {OUTPUT_KINDS}, got {name!r}")
    return spec


def kind_of(builder: Builder, declared: str = "auto") -> KindSpec:
    """The kind ``declared`` names, else what the builder says of itself: a built-in of a
    kind, or its ``pagegraph_outputs`` attribute (default: ``page_table``)."""
    if declared != "auto":
        return kind_named(declared)
    for spec in KINDS.values():
        if any(fn is builder for fn in spec.builders.values()):
            return spec
    name = getattr(builder, "pagegraph_outputs", PAGE_TABLE.name)
    if name not in KINDS:
        raise ValueError(f"{builder!r}.pagegraph_outputs must be one of {OUTPUT_KINDS}")
    return KINDS[name]
