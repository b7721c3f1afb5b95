"""Invariant: every package of pagegraph says what it offers: a docstring, and an ``__all__``
whose every name resolves (a re-export whose defining module moved or renamed it shows here).
A package's re-exports are imported at first use, so importing one module loads no other."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

import pagegraph

SRC = Path(pagegraph.__file__).resolve().parent
PACKAGES = sorted(
    ".".join(("pagegraph", *path.parent.relative_to(SRC).parts))
    for path in SRC.rglob("__init__.py")
)


@pytest.mark.parametrize("name", PACKAGES)
def test_each_package_has_a_docstring_and_its_public_names(name):
    package = importlib.import_module(name)
    assert (package.__doc__ or "").strip(), f"{name} has no docstring"
    public = getattr(package, "__all__", None)
    assert public, f"{name} has no __all__"
    assert len(public) == len(set(public)), f"{name}.__all__ repeats a name"
    for attr in public:
        if not hasattr(package, attr):
            importlib.import_module(f"{name}.{attr}")  # a submodule, else ImportError


def test_a_subpackage_module_loads_no_sibling_it_does_not_import():
    code = "import sys, pagegraph.graph.buckets; print('pagegraph.graph.runner' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_a_package_loads_a_public_name_once_and_refuses_an_unknown_one():
    code = (
        "import sys, pagegraph.check as c\n"
        "assert 'pagegraph.check.config' not in sys.modules\n"
        "assert 'CheckConfig' not in vars(c)\n"
        "cfg = c.CheckConfig\n"
        "assert vars(c)['CheckConfig'] is cfg and 'pagegraph.check.config' in sys.modules\n"
        "try:\n"
        "    c.no_such_name\n"
        "except AttributeError as e:\n"
        "    print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "module 'pagegraph.check' has no attribute 'no_such_name'"
