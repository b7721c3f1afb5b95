"""Builders by name: the built-in ones, or a user's own as ``module:function``.

Two kinds of builder plug into the test bed, told apart by their outputs:

* ``"page_table"``: the builder contract of ``pagegraph.contract`` (``build_page_table``'s
  signature): page tables only.
* ``"decode_metadata"``: ``pagegraph.metadata.build_decode_metadata``'s signature: the
  page tables plus ``cache_seqlens``, ``cu_seqlens_k`` and ``cu_seqlens_q``.

A user's function declares the second kind with an attribute, ``fn.pagegraph_outputs =
"decode_metadata"``, or the check is told so (``CheckConfig(outputs="decode_metadata")``).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from .baselines import block_grid
from .decode_metadata import build_decode_metadata
from .page_table import build_page_table
from .reference import (
    host_max_gather,
    reference_decode_metadata,
    reference_page_table,
    static_width_gather,
    unfused_decode_metadata,
)

OUTPUT_KINDS = ("page_table", "decode_metadata")

BUILDERS: dict[str, Callable] = {
    "build_page_table": build_page_table,
    "static_width_gather": static_width_gather,
    "host_max_gather": host_max_gather,
    "reference_page_table": reference_page_table,
    # The rejected fixed-grid design (pagegraph.baselines): exact, its cost follows the width.
    "block_grid": block_grid,
}

#: Builders with ``build_decode_metadata``'s signature and outputs.
METADATA_BUILDERS: dict[str, Callable] = {
    "build_decode_metadata": build_decode_metadata,
    "reference_decode_metadata": reference_decode_metadata,
    "unfused_decode_metadata": unfused_decode_metadata,
}


def resolve_builder(spec: str | Callable) -> Callable:
    """A callable with a builder signature, from a callable, a built-in name, or
    ``"package.module:function"``; ``ValueError`` with the known names otherwise."""
    if callable(spec):
        return spec
    if spec in BUILDERS:
        return BUILDERS[spec]
    if spec in METADATA_BUILDERS:
        return METADATA_BUILDERS[spec]
    if ":" in spec:
        module_name, _, attr = spec.partition(":")
        try:
            fn = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as exc:
            raise ValueError(f"cannot load builder {spec!r}: {exc}") from exc
        if not callable(fn):
            raise ValueError(f"builder {spec!r} is not callable")
        return fn
    known = ", ".join(sorted([*BUILDERS, *METADATA_BUILDERS]))
    raise ValueError(f"unknown builder {spec!r}: use one of {known} or 'module:function'")


def builder_kind(builder: Callable, declared: str = "auto") -> str:
    """``"page_table"`` or ``"decode_metadata"``: what ``declared`` says, else what the
    builder says of itself (a built-in, or its ``pagegraph_outputs`` attribute)."""
    if declared != "auto":
        if declared not in OUTPUT_KINDS:
            raise ValueError(f"outputs must be auto or one of {OUTPUT_KINDS}, got {declared!r}")
        return declared
    if any(fn is builder for fn in METADATA_BUILDERS.values()):
        return "decode_metadata"
    kind = getattr(builder, "pagegraph_outputs", "page_table")
    if kind not in OUTPUT_KINDS:
        raise ValueError(f"{builder!r}.pagegraph_outputs must be one of {OUTPUT_KINDS}")
    return kind


def builder_name(builder: Callable) -> str:
    for name, fn in (*BUILDERS.items(), *METADATA_BUILDERS.items()):
        if fn is builder:
            return name
    return f"{getattr(builder, '__module__', '?')}:{getattr(builder, '__qualname__', builder)}"
