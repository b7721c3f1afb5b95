"""Engines' own decode-step readers by name (``pagegraph check --reader vllm:triton_attn``).

Each name maps to ``"module:attribute"``, a ``pagegraph.consumers.reader.Reader`` that runs the
engine's real attention (and its cache write) from the engine's own files, imported only when
asked for: naming one loads that engine's kernel files, nothing else does.
"""

from __future__ import annotations

import importlib

from ..consumers.reader import Reader

__all__ = ["ENGINE_READERS", "UnknownEngineReader", "engine_reader", "is_engine_reader_name"]

#: name -> ``"module:attribute"`` of the ``Reader``.
ENGINE_READERS: dict[str, str] = {
    "vllm:triton_attn": "pagegraph.clients.vllm_attention:TRITON_ATTN",
    "vllm:triton_unified_attention": "pagegraph.clients.vllm_attention:TRITON_ATTN",
    "sglang:triton_decode": "pagegraph.clients.sglang_attention:TRITON_DECODE",
}


class UnknownEngineReader(ValueError):
    """An ``engine:name`` that names no engine reader."""


def is_engine_reader_name(name: str) -> bool:
    """Whether ``name`` is spelled as an engine reader (``engine:reader``, no path or module
    dots before the colon)."""
    engine, _, rest = name.partition(":")
    return bool(rest) and engine in {key.partition(":")[0] for key in ENGINE_READERS}


def engine_reader(name: str) -> Reader:
    """The engine reader ``name`` (``UnknownEngineReader``, one line, for another name)."""
    target = ENGINE_READERS.get(name)
    if target is None:
        known = ", ".join(sorted(ENGINE_READERS)) or "none"
        raise UnknownEngineReader(f"reader {name!r} is no engine reader (known: {known})")
    module, _, attribute = target.partition(":")
    reader = getattr(importlib.import_module(module), attribute)
    if not isinstance(reader, Reader):
        raise TypeError(f"{target} is not a Reader")
    return reader
