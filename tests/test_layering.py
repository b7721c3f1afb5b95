"""Invariant: pagegraph's imports flow one way, with no cycle, and the layers are the folders.

Each subpackage of ``src/pagegraph`` is a layer, and its layer number is written once, below:
a module may import its own subpackage or any subpackage of a lower layer, never a higher one,
and across subpackages only public names (no leading underscore).

* 0, the bottom: ``runtime`` (the device choice, the machine a report records, the progress
  line, the one timing toolkit), ``kernels`` (the Triton builders, their contract, references,
  launcher, loading a user's builder), ``consumers`` (paged attention that reads the tables)
  and ``detect`` (sync detectors, NVTX ranges, the trace analyzer);
* 1, ``kinds``: the builder kinds as specs, and what a builder takes; a kind imports neither
  its mutants nor the clients;
* 2, ``clients``: real engines' builders behind the kinds' contracts (the kernels' registry
  never imports one), and ``mutants``: the mutant zoo, builders with one bug each, gathered
  by kind (``mutants/zoo.py``);
* 3, the graph bed's parts: ``graph`` (builders by name, pagegraph's and the clients';
  buckets, staging, the runner) and ``workload`` (the pool, its writes, the decode workload
  and its producers, the engine's block tables);
* 4, the checker: ``check``, and ``wild``: public engines' bugs reproduced as twins the
  checker judges;
* 5, process supervision: ``supervise`` (checks in child processes, warm workers); the
  checker never imports it;
* 6, the jobs: ``jobs`` (check, profile, mutate) and ``bench``;
* 7, the front: ``cli``, ``__main__`` and ``pytest_plugin``, modules at the package's top.

Inside the checker the rooms (its subpackages, and each of its own modules) import one way
too, from the top down: ``checker`` -> ``pipeline`` -> ``judges`` -> ``run_end`` ->
``reports`` -> ``config`` (``signals`` beside ``run_end``; ``plan`` and ``scenario`` on
``config``): the pipeline calls the judges, and the judges never import the pipeline.

Every module under ``src/pagegraph`` is parsed with ``ast``; every pagegraph-internal import,
at module level or inside a function, is an edge. The package ``__init__`` re-exports the
public API from several layers and is left out of the layering (it is never imported by name
from inside the package; the test checks that too).
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

import pagegraph

SRC = Path(pagegraph.__file__).resolve().parent
PACKAGE = "pagegraph"

SUBPACKAGE_LAYERS = {
    "runtime": 0,
    "kernels": 0,
    "detect": 0,
    "consumers": 0,
    "kinds": 1,
    "clients": 2,
    "mutants": 2,
    "graph": 3,
    "workload": 3,
    "check": 4,
    "wild": 4,
    "supervise": 5,
    "jobs": 6,
    "bench": 6,
}
TOP_LAYER = 7
LAYER_NAMES = (
    "bottom",
    "kinds",
    "clients and mutants",
    "graph bed",
    "checker",
    "supervision",
    "jobs",
    "front",
)


def layers() -> dict[str, int]:
    """The layering unit (a subpackage, or a top-level module) to its layer, from the tree."""
    found: dict[str, int] = {}
    for path in sorted(SRC.iterdir()):
        if path.is_dir() and (path / "__init__.py").exists():
            found[path.name] = SUBPACKAGE_LAYERS.get(path.name, -1)
        elif path.suffix == ".py" and path.name != "__init__.py":
            found[path.stem] = TOP_LAYER
    return found


LAYERS = layers()


def module_name(path: Path, root: Path = SRC) -> str:
    """``pagegraph.runtime.timing`` for ``SRC/runtime/timing.py``, ``pagegraph.bench`` for its
    ``__init__.py``."""
    parts = [PACKAGE, *path.relative_to(root).with_suffix("").parts]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules(root: Path = SRC) -> dict[str, Path]:
    return {module_name(p, root): p for p in sorted(root.rglob("*.py"))}


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
            # "import pagegraph.runtime.timing" or a name inside a module: the longest known one.
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target.startswith(PACKAGE) and target != name:
                found.add(target)
    return found


def import_graph(root: Path = SRC) -> dict[str, set[str]]:
    """Each module of the tree at ``root`` -> the pagegraph modules it imports (a copy: the
    source tree's is parsed once a process)."""
    if root != SRC:
        return _parse_graph(root)
    return {name: set(targets) for name, targets in _source_graph().items()}


def _parse_graph(root: Path) -> dict[str, set[str]]:
    mods = modules(root)
    known = set(mods)
    return {name: imports_of(name, path, known) for name, path in mods.items()}


@functools.cache
def _source_graph() -> dict[str, set[str]]:
    return _parse_graph(SRC)


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
    assert "pagegraph.kernels.contract" in graph["pagegraph.kernels.page_table"]
    # inside a function
    assert "pagegraph.kernels.decode_metadata" in graph["pagegraph.kernels.reference"]
    # from ..detect import trace as _trace
    assert "pagegraph.detect.trace" in graph["pagegraph.jobs.profile"]
    assert "pagegraph.runtime.timing" in graph["pagegraph.bench.floors"]
    assert (
        "pagegraph.kernels.table_reference" in graph["pagegraph.bench.inputs"]
    )  # from ..kernels.x
    assert "pagegraph.bench.bench_runner" in graph["pagegraph.bench"]


def test_no_import_cycle():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_every_subpackage_has_a_layer():
    missing = sorted(name for name, layer in LAYERS.items() if layer < 0)
    assert not missing, f"subpackages with no layer in tests/test_layering.py: {missing}"


def test_no_module_but_the_front_sits_at_the_top():
    top = sorted(name for name, layer in LAYERS.items() if layer == TOP_LAYER)
    assert top == ["__main__", "cli", "pytest_plugin"], top


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


def private_cross_imports(root: Path = SRC) -> list[str]:
    """``from ..other import _name`` across subpackages, and ``other._name`` on a module of
    another subpackage imported as a module."""
    mods = modules(root)
    known = set(mods)
    bad = []
    for name, path in mods.items():
        is_package = path.name == "__init__.py"
        tree = ast.parse(path.read_text(), str(path))
        module_aliases: dict[str, str] = {}
        for node in ast.walk(tree):
            if not isinstance(node, ast.ImportFrom):
                continue
            base = resolve(node, name, is_package)
            for alias in node.names:
                full = f"{base}.{alias.name}"
                if full in known:
                    module_aliases[alias.asname or alias.name] = full
                elif (
                    alias.name.startswith("_")
                    and base.startswith(PACKAGE)
                    and top_module(base) != top_module(name)
                ):
                    bad.append(f"{name} imports {base}.{alias.name}")
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in module_aliases
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
            ):
                target = module_aliases[node.value.id]
                if top_module(target) != top_module(name):
                    bad.append(f"{name} reads {target}.{node.attr}")
    return sorted(set(bad))


def test_private_names_across_subpackages_are_found(tmp_path):
    """A planted tree: a private name imported from another subpackage, and one read off a
    module of another subpackage, are both reported; the same within a subpackage is not."""
    for pkg in ("kernels", "check"):
        (tmp_path / pkg).mkdir()
        (tmp_path / pkg / "__init__.py").write_text("")
    (tmp_path / "kernels" / "launch.py").write_text("def _hidden():\n    pass\n")
    (tmp_path / "kernels" / "user.py").write_text("from .launch import _hidden\n")
    (tmp_path / "check" / "a.py").write_text("from ..kernels.launch import _hidden\n")
    (tmp_path / "check" / "b.py").write_text("from ..kernels import launch\nlaunch._hidden()\n")
    assert private_cross_imports(tmp_path) == [
        "pagegraph.check.a imports pagegraph.kernels.launch._hidden",
        "pagegraph.check.b reads pagegraph.kernels.launch._hidden",
    ]


def test_only_public_names_cross_subpackages():
    bad = private_cross_imports()
    assert not bad, "\n".join(bad)


def test_trace_analyzer_needs_only_the_bottom_layer():
    graph = import_graph()
    above = sorted(t for t in graph["pagegraph.detect.trace"] if LAYERS[top_module(t)] > 0)
    assert not above, f"pagegraph.detect.trace imports {above}"


def units_imported(unit: str, graph: dict[str, set[str]]) -> set[str]:
    """The other layering units the modules of ``unit`` import."""
    return {
        top_module(target)
        for name, targets in graph.items()
        if top_module(name) == unit
        for target in targets
    } - {unit}


def test_units_imported_finds_a_planted_import():
    graph = {
        "pagegraph.bench.a": {"pagegraph.bench.b", "pagegraph.jobs.progress"},
        "pagegraph.jobs.x": {"pagegraph.check.scenario"},
    }
    assert units_imported("bench", graph) == {"jobs"}
    assert units_imported("check", graph) == set()


def test_the_bench_imports_no_job():
    """``bench`` and ``jobs`` share a layer; the bench still runs without any job's module
    (what both use lives lower: ``runtime``, ``check.scenario``)."""
    assert "jobs" not in units_imported("bench", import_graph())


def test_the_runtime_imports_no_other_part_of_pagegraph():
    imported = units_imported("runtime", import_graph())
    assert not imported, f"pagegraph.runtime imports {sorted(imported)}"


@pytest.mark.parametrize("leaf", ["pytest_plugin", "cli"])
def test_top_modules_are_not_imported_from_inside(leaf):
    users = sorted(
        name
        for name, targets in import_graph().items()
        if f"pagegraph.{leaf}" in targets and name != "pagegraph.__main__"
    )
    assert not users, f"pagegraph.{leaf} is imported by {users}"


#: The package whose rooms are layered among themselves (``unit_cycle``).
CHECK = f"{PACKAGE}.check"


def unit_graph(graph: dict[str, set[str]], package: str = CHECK) -> dict[str, set[str]]:
    """The imports between the rooms of ``package``, each of its subpackages (every module
    in it) and each of its own modules one node: ``judges`` for
    ``pagegraph.check.judges.verify``, ``config`` for ``pagegraph.check.config``. The
    package's ``__init__`` (lazy re-exports) is left out."""

    def unit(name: str) -> str | None:
        if not name.startswith(package + "."):
            return None
        return name[len(package) + 1 :].split(".")[0]

    units: dict[str, set[str]] = {}
    for importer, targets in graph.items():
        here = unit(importer)
        if here is None:
            continue
        units.setdefault(here, set())
        for target in targets:
            there = unit(target)
            if there is not None and there != here:
                units[here].add(there)
    return units


def unit_cycle(graph: dict[str, set[str]], package: str = CHECK) -> list[str] | None:
    """One cycle between the rooms of ``package`` (``unit_graph``), or ``None``."""
    return find_cycle(unit_graph(graph, package))


def test_a_cycle_between_the_checkers_rooms_is_found(tmp_path):
    """Planted: a judge importing the pipeline that imports the judges is a cycle between
    the rooms, though no module imports itself back; without the judge's import there is
    none, and imports inside one room never count."""
    for folder in ("check", "check/judges", "check/pipeline"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "__init__.py").write_text("")
    (tmp_path / "check" / "config.py").write_text("")
    (tmp_path / "check" / "judges" / "verify.py").write_text("from ..config import x\n")
    (tmp_path / "check" / "judges" / "summary.py").write_text(
        "from ..pipeline import phases\nfrom . import verify\n"
    )
    (tmp_path / "check" / "pipeline" / "phases.py").write_text("from ..judges.verify import y\n")
    graph = import_graph(tmp_path)
    assert find_cycle(graph) is None  # module by module, no cycle
    assert unit_cycle(graph) == ["judges", "pipeline", "judges"]
    (tmp_path / "check" / "judges" / "summary.py").write_text("from . import verify\n")
    assert unit_cycle(import_graph(tmp_path)) is None


def test_the_checkers_rooms_import_one_way():
    """Inside ``check``, the rooms' imports go one way, from the top down: ``checker`` (the
    entry points) imports ``pipeline`` (the phases, the loop, both benches), which imports
    ``judges`` (every judgment), which import ``run_end`` (what an early end leaves
    unfinished) and ``reports``; ``signals`` imports ``reports``; ``reports``, ``plan`` and
    ``scenario`` import ``config`` alone. The judges read what the pipeline measured through
    typed values they own (``judges/table_replays.py``), never the pipeline's modules."""
    graph = import_graph()
    cycle = unit_cycle(graph)
    assert cycle is None, "import cycle between check's rooms: " + " -> ".join(cycle)
    units = unit_graph(graph)
    assert "pipeline" in units["checker"] and "judges" in units["pipeline"]
    assert "pipeline" not in units["judges"] and "judges" not in units["reports"]
