"""How a pagegraph package offers its public names without importing its modules up front:
the package's module-level ``__getattr__`` (PEP 562) loads a name's defining module at first
use, so importing one module of a package loads no other."""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from importlib import import_module


def lazy_exports(package: str, defined_in: Mapping[str, str]) -> Callable[[str], object]:
    """The ``__getattr__`` of ``package`` (its ``__name__``): for a public name, the attribute
    of the same name in ``package.<defined_in[name]>``, imported then and kept on the package,
    so later lookups do not come back here; ``AttributeError`` for any other name (a
    submodule not imported yet is then found by the import system)."""

    def load(name: str) -> object:
        module = defined_in.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(import_module(f".{module}", package), name)
        setattr(sys.modules[package], name, value)
        return value

    return load
