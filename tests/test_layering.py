"""Invariant: pagegraph's imports flow one way, with no cycle.

Layers, top to bottom (a module may import its own layer or any layer below, never above):

* the command line: ``cli`` (and ``__main__``); ``pytest_plugin``, a leaf nobody imports;
* the jobs: ``check_job``, ``bench`` (the package), ``profile``, ``mutate``, ``trace`` (the
  trace analyzer, which needs only the bottom layer);
* the test bed: ``pool``, ``workload``, ``producer``, ``batch_ring``, ``staging``, ``runner``,
  ``verify``, ``checker``, ``scenario``, ``mutants``, ``isolate``;
* the bottom: the kernels, the contract, the references and what they need.

Every module under ``src/pagegraph`` is parsed with ``ast``; every pagegraph-internal import,
at module level or inside a function, is an edge. The package ``__init__`` re-exports the
public API from several layers and is left out of the layering (it is never imported by name
from inside the package; the test checks that too).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import pagegraph

SRC = Path(pagegraph.__file__).resolve().parent
PACKAGE = "pagegraph"

BOTTOM = {
    "contract",
    "kernel",
    "page_writes",
    "cudart",
    "metadata",
    "reference",
    "baselines",
    "ranges",
    "sync",
    "environment",
    "builders",
    "buckets",
}
TEST_BED = {
    "pool",
    "workload",
    "producer",
    "batch_ring",
    "staging",
    "runner",
    "verify",
    "checker",
    "scenario",
    "mutants",
    "isolate",
}
JOBS = {"check_job", "bench", "profile", "mutate", "trace"}
TOP = {"cli", "__main__", "pytest_plugin"}
LAYERS = {name: 0 for name in BOTTOM} | {name: 1 for name in TEST_BED}
LAYERS |= {name: 2 for name in JOBS} | {name: 3 for name in TOP}
LAYER_NAMES = ("bottom", "test bed", "jobs", "command line")


def module_name(path: Path) -> str:
    """``pagegraph.bench.timing`` for ``SRC/bench/timing.py``, ``pagegraph.bench`` for its
    ``__init__.py``."""
    parts = [PACKAGE, *path.relative_to(SRC).with_suffix("").parts]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(SRC.rglob("*.py"))}


def resolve(node: ast.ImportFrom, importer: str, is_package: bool) -> str:
    """The absolute module an ``ImportFrom`` names (``from ..x import y`` -> ``pagegraph.x``)."""
    if node.level == 0:
        return node.module or ""
    base = importer.split(".")
    # A package's own __init__ is its package: one level up fewer.
    base = base[: len(base) - node.level + (1 if is_package else 0)]
    return ".".join([*base, *([node.module] if node.module else [])])


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The pagegraph modules ``name`` imports, anywhere in its body."""
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = resolve(node, name, is_package)
            # "from . import trace" names a module; "from .kernel import x" names attributes.
            targets = [
                f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names
            ]
        else:
            continue
        for target in targets:
            # "import pagegraph.bench.timing" or a name inside a module: the longest known one.
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target.startswith(PACKAGE) and target != name:
                found.add(target)
    return found


def import_graph() -> dict[str, set[str]]:
    mods = modules()
    known = set(mods)
    return {name: imports_of(name, path, known) for name, path in mods.items()}


def top_module(name: str) -> str:
    """The layering unit: ``bench`` for every module of the bench package."""
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else ""


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a path ``[a, b, ..., a]``, or ``None``."""
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state:
                cycle = visit(nxt)
                if cycle:
                    return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            cycle = visit(node)
            if cycle:
                return cycle
    return None


def test_the_graph_sees_every_kind_of_import():
    graph = import_graph()
    # module level, function level, "from . import x", relative imports inside a package
    assert "pagegraph.contract" in graph["pagegraph.kernel"]
    assert "pagegraph.metadata" in graph["pagegraph.reference"]  # inside a function
    assert "pagegraph.trace" in graph["pagegraph.profile"]  # from . import trace as _trace
    assert "pagegraph.bench.timing" in graph["pagegraph.bench.floors"]
    assert "pagegraph.checker" in graph["pagegraph.bench.inputs"]  # from ..checker import
    assert "pagegraph.bench.runner" in graph["pagegraph.bench"]


def test_no_import_cycle():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_every_module_has_a_layer():
    units = {top_module(name) for name in modules()} - {"", "__init__"}
    missing = sorted(units - set(LAYERS))
    assert not missing, f"modules with no layer in tests/test_layering.py: {missing}"


def test_imports_flow_downwards():
    bad = []
    for importer, targets in import_graph().items():
        unit = top_module(importer)
        if unit not in LAYERS:
            continue  # the package __init__
        for target in targets:
            other = top_module(target)
            if other == unit:
                continue
            if other == "":
                bad.append(f"{importer} imports the package pagegraph itself")
            elif LAYERS[other] > LAYERS[unit]:
                bad.append(
                    f"{importer} ({LAYER_NAMES[LAYERS[unit]]}) imports {target} "
                    f"({LAYER_NAMES[LAYERS[other]]})"
                )
    assert not bad, "\n".join(bad)


def test_trace_analyzer_needs_only_the_bottom_layer():
    graph = import_graph()
    above = sorted(t for t in graph["pagegraph.trace"] if LAYERS[top_module(t)] > 0)
    assert not above, f"pagegraph.trace imports {above}"


@pytest.mark.parametrize("leaf", ["pytest_plugin", "cli"])
def test_top_modules_are_not_imported_from_inside(leaf):
    users = sorted(
        name
        for name, targets in import_graph().items()
        if f"pagegraph.{leaf}" in targets and name != "pagegraph.__main__"
    )
    assert not users, f"pagegraph.{leaf} is imported by {users}"
