"""The corpus: every entry module of ``pagegraph.wild.entries``, each defining ``BUG``."""

from __future__ import annotations

import importlib
import pkgutil

from . import entries as _entries_package
from .wild_bug import BUG_CLASSES, WildBug

__all__ = ["entries", "entry"]


def entries() -> list[WildBug]:
    """Every entry, by class, then engine, then key."""
    found = []
    for info in pkgutil.iter_modules(_entries_package.__path__):
        module = importlib.import_module(f"{_entries_package.__name__}.{info.name}")
        bug = getattr(module, "BUG", None)
        if not isinstance(bug, WildBug):
            raise TypeError(f"{module.__name__} defines no BUG (a WildBug)")
        if bug.bug_class not in BUG_CLASSES:
            raise ValueError(f"{bug.key}: unknown class {bug.bug_class!r}")
        found.append(bug)
    return sorted(found, key=lambda b: (b.bug_class, b.engine.lower(), b.key))


def entry(key: str) -> WildBug:
    """The entry ``key`` (``ValueError`` naming the known ones otherwise)."""
    by_key = {b.key: b for b in entries()}
    if key not in by_key:
        raise ValueError(f"no entry {key!r} (known: {', '.join(sorted(by_key))})")
    return by_key[key]
