"""Invariant: every script under ``tools/experiments/`` still fits the package: it compiles,
and every name it imports from pagegraph exists (a moved or renamed module or function shows
here, before someone reruns an experiment on a GPU); and each is documented in the folder's
README with where its answer is recorded."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXPERIMENTS = sorted((ROOT / "tools" / "experiments").glob("*.py"))


def pagegraph_imports(tree: ast.AST) -> list[tuple[str, str | None]]:
    """``(module, name)`` of each ``from pagegraph... import name`` and ``import pagegraph...``
    in ``tree`` (``name`` None for a plain import)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("pagegraph"):
            found += [(node.module, alias.name) for alias in node.names]
        elif isinstance(node, ast.Import):
            found += [(a.name, None) for a in node.names if a.name.startswith("pagegraph")]
    return found


@pytest.mark.parametrize("path", EXPERIMENTS, ids=lambda p: p.name)
def test_each_experiment_compiles_and_its_imports_exist(path):
    tree = ast.parse(path.read_text(), filename=str(path))
    compile(tree, str(path), "exec")
    for module, name in pagegraph_imports(tree):
        mod = importlib.import_module(module)
        if name is not None and not hasattr(mod, name):
            importlib.import_module(f"{module}.{name}")  # a submodule, else ImportError


@pytest.mark.parametrize("path", EXPERIMENTS, ids=lambda p: p.name)
def test_each_experiment_is_documented(path):
    readme = (ROOT / "tools" / "experiments" / "README.md").read_text()
    assert f"`{path.name}`" in readme


def test_a_missing_import_is_found():
    tree = ast.parse("from pagegraph.check.checker import no_such_name\n")
    ((module, name),) = pagegraph_imports(tree)
    with pytest.raises(ImportError):
        if not hasattr(importlib.import_module(module), name):
            importlib.import_module(f"{module}.{name}")
