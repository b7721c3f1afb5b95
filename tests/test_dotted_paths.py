"""Invariant: every dotted path ``pagegraph.x.y`` that the README, the docs and the package's
own text (docstrings and comments) name resolves: a module, or a name inside one. A renamed
or moved module or function cannot leave a stale reference behind.

A path resolves when its longest importable prefix is a module and each remaining part is an
attribute of what came before. A planted stale path is found by the same resolver.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

import pagegraph

ROOT = Path(__file__).resolve().parents[1]
SRC = Path(pagegraph.__file__).resolve().parent
DOTTED = re.compile(r"\bpagegraph(?:\.[A-Za-z_][A-Za-z0-9_]*)+")


def resolves(path: str) -> bool:
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            if not hasattr(obj, name):
                return False
            obj = getattr(obj, name)
        return True
    return False


def texts() -> list[Path]:
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    return docs + sorted(SRC.rglob("*.py"))


def stale_paths(text: str) -> list[str]:
    found = {m.group(0).rstrip(".") for m in DOTTED.finditer(text)}
    # A trailing file suffix (``pagegraph.kernels.page_table.py``) names a file, not a path.
    found = {p.removesuffix(".py") for p in found}
    return sorted(p for p in found if not resolves(p))


@pytest.mark.parametrize("path", texts(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_dotted_path_resolves(path):
    assert stale_paths(path.read_text()) == []


def test_a_stale_path_is_found():
    text = "see ``pagegraph.kernels.registry.builder_kind`` and pagegraph.kinds.kind_of"
    assert stale_paths(text) == ["pagegraph.kernels.registry.builder_kind"]
    assert resolves("pagegraph.check.checker.check_replay_safety")
    assert not resolves("pagegraph.nowhere.at_all")


def test_every_public_name_of_the_package_resolves():
    """``from pagegraph import X`` works for every name the package exports lazily (each
    ``_LAZY`` entry names the module that defines it, which moves with it)."""
    missing = []
    for name, module in pagegraph._LAZY.items():
        if not resolves(f"pagegraph.{module}.{name}"):
            missing.append(f"{name} -> pagegraph.{module}")
    assert missing == []
    assert set(pagegraph.__all__) <= set(pagegraph._LAZY) | {"__version__"} | set(vars(pagegraph))
    # Planted: an entry whose module moved is not found by the same resolver.
    assert not resolves("pagegraph.check.report.Report")
