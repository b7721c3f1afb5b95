"""Builders by name: the built-in ones, or a user's own as ``module:function``."""

from __future__ import annotations

import importlib
from collections.abc import Callable

from .kernel import build_page_table
from .reference import host_max_gather, reference_page_table, static_width_gather

BUILDERS: dict[str, Callable] = {
    "build_page_table": build_page_table,
    "static_width_gather": static_width_gather,
    "host_max_gather": host_max_gather,
    "reference_page_table": reference_page_table,
}


def resolve_builder(spec: str | Callable) -> Callable:
    """A callable with the builder signature, from a callable, a built-in name, or
    ``"package.module:function"``; ``ValueError`` with the known names otherwise."""
    if callable(spec):
        return spec
    if spec in BUILDERS:
        return BUILDERS[spec]
    if ":" in spec:
        module_name, _, attr = spec.partition(":")
        try:
            fn = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as exc:
            raise ValueError(f"cannot load builder {spec!r}: {exc}") from exc
        if not callable(fn):
            raise ValueError(f"builder {spec!r} is not callable")
        return fn
    known = ", ".join(sorted(BUILDERS))
    raise ValueError(f"unknown builder {spec!r}: use one of {known} or 'module:function'")


def builder_name(builder: Callable) -> str:
    for name, fn in BUILDERS.items():
        if fn is builder:
            return name
    return f"{getattr(builder, '__module__', '?')}:{getattr(builder, '__qualname__', builder)}"
