"""Decode-step readers by name, and their loader (``load_reader``): an engine's own
(``pagegraph check --reader vllm:triton_attn``) or a user's (``module:name`` or
``path/to/file.py:name``), with errors that speak of a reader (``ReaderLoadError``).

Each engine reader's name maps to ``"module:attribute"``, a
``pagegraph.consumers.reader.Reader`` that runs the engine's real attention (and its cache
write) from the engine's own files, imported only when asked for: naming one loads that
engine's kernel files, nothing else does. A user's names a ``Reader`` or an attention call
(``paged_decode_attention``'s signature), loaded by a builder's rules
(``pagegraph.kernels.registry``).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from types import ModuleType

from ..consumers.reader import Reader, as_reader
from ..kernels.registry import LoadWords, builder_spec_for_child, load_object

__all__ = [
    "ENGINE_READERS",
    "READER_WORDS",
    "ReaderLoadError",
    "UnknownEngineReader",
    "engine_reader",
    "is_engine_reader_name",
    "load_reader",
    "reader_spec_for_child",
]

#: name -> ``"module:attribute"`` of the ``Reader``.
ENGINE_READERS: dict[str, str] = {
    "vllm:triton_attn": "pagegraph.clients.vllm_attention:TRITON_ATTN",
    "vllm:triton_unified_attention": "pagegraph.clients.vllm_attention:TRITON_ATTN",
    "sglang:triton_decode": "pagegraph.clients.sglang_attention:TRITON_DECODE",
}


class ReaderLoadError(ValueError):
    """A reader that names nothing loadable, or nothing a decode step can read with; the
    message is one line."""


class UnknownEngineReader(ReaderLoadError):
    """An ``engine:name`` that names no engine reader."""


def _readers(module: ModuleType) -> list[str]:
    """The public ``Reader`` objects and functions defined in ``module``, sorted."""
    return sorted(
        name
        for name, value in vars(module).items()
        if name[:1] != "_"
        and (
            isinstance(value, Reader)
            or (callable(value) and getattr(value, "__module__", None) == module.__name__)
        )
    )


#: A reader's words in the loader's errors ("cannot load reader ...").
READER_WORDS = LoadWords("reader", "reader", "--reader", ReaderLoadError, _readers)


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


def load_reader(reader: Reader | Callable[..., object] | str | None) -> Reader | None:
    """A decode step's reader: a ``Reader``, an attention call, or a name of either (an
    engine reader's, ``"module:name"``, ``"path/to/file.py:name"``); None for None.
    ``ReaderLoadError`` (one line) for a name that loads nothing, or loads something that is
    neither."""
    if reader is None:
        return None
    if isinstance(reader, str) and is_engine_reader_name(reader):
        return engine_reader(reader)
    found: object = reader
    if isinstance(reader, str):
        found = load_object(reader, sorted(ENGINE_READERS), READER_WORDS)
    if not isinstance(found, Reader) and not callable(found):
        named = f"{reader!r} ({type(found).__name__} {found!r})" if reader is not found else ""
        raise ReaderLoadError(
            f"reader {named or repr(found)} is neither a Reader nor an attention call"
        )
    return as_reader(found)


def reader_spec_for_child(spec: str) -> str:
    """``spec`` as a child process in another folder loads it: an engine reader's name as it
    is, a user's file or module as ``builder_spec_for_child`` makes a builder's."""
    return spec if is_engine_reader_name(spec) else builder_spec_for_child(spec)
