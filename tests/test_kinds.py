"""Invariant: builder kinds are specs (``pagegraph.kinds``): everything about a kind lives in
its module, and the rest of pagegraph asks the spec instead of comparing kind names.

* Outside ``src/pagegraph/kinds/`` no kind name is compared as a string (a planted comparison
  is found by the same scanner).
* Each spec's own builders resolve to it, bind its contract, and name it.
* A declared kind that does not exist is refused with the known kinds.
* The generic bed (graph, check, workload, jobs, bench, supervise, detect) names no kind and
  no kind's vector, in code (``KNOWN_NAMES`` lists the few left, each with its reason; a
  planted name is found by the same scan).
"""

from __future__ import annotations

import ast
import inspect
import io
import re
import tokenize
from collections.abc import Iterable
from pathlib import Path

import pytest

import pagegraph
from pagegraph.graph.builder_names import resolve_builder, signature_problem
from pagegraph.kinds import (
    IO_FIELDS,
    KINDS,
    OUTPUT_KINDS,
    PAGE_TABLE,
    BatchContext,
    EngineState,
    kind_named,
    kind_of,
)

SRC = Path(pagegraph.__file__).resolve().parent
NAMES = "|".join(OUTPUT_KINDS)
# A kind name on either side of ==, !=, in or not in.
COMPARED = re.compile(
    rf"""(==|!=|\bin)\s*\(?\s*["']({NAMES})["']|["']({NAMES})["']\s*(==|!=|\bin\b)"""
)


def kind_comparisons(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if COMPARED.search(line)]


def test_no_kind_name_is_compared_outside_the_kinds_folder():
    found = {}
    for path in sorted(SRC.rglob("*.py")):
        if "kinds" in path.relative_to(SRC).parts:
            continue
        hits = kind_comparisons(path.read_text())
        if hits:
            found[str(path.relative_to(SRC))] = hits
    assert not found, f"kind names compared outside pagegraph/kinds: {found}"


@pytest.mark.parametrize(
    "line",
    [
        'if kind == "csr":',
        'metadata = outputs != "decode_metadata"',
        'if "csr" == kind:',
        'if name in ("page_table", "csr"):',
        "ok = fmt != 'decode_metadata'",
    ],
)
def test_the_scanner_finds_a_planted_comparison(line):
    assert kind_comparisons(f"x = 1\n    {line}\n") == [line]


def test_the_scanner_passes_names_that_are_not_compared():
    text = 'fn.pagegraph_outputs = "csr"\ntable = kwargs["page_table"]\nkind = kind_of(fn)\n'
    assert kind_comparisons(text) == []


@pytest.mark.parametrize("name", list(KINDS))
def test_a_kinds_builders_resolve_to_it_and_bind_its_contract(name):
    spec = KINDS[name]
    assert spec.reference in spec.builders
    for builder_name, fn in spec.builders.items():
        assert resolve_builder(builder_name) is fn
        assert kind_of(fn) is spec
        assert signature_problem(fn, spec) is None, builder_name
        assert builder_name in spec.builders
    # Every kind's signature text names the arguments the bed binds.
    for keyword in spec.keywords:
        assert keyword in spec.signature


def test_a_builder_of_one_kind_does_not_bind_another_kinds_contract():
    fn = PAGE_TABLE.builders["build_page_table"]
    others = [spec for spec in KINDS.values() if spec.positional != PAGE_TABLE.positional]
    assert others
    for spec in others:
        assert "cannot be called as" in signature_problem(fn, spec)


def test_an_unknown_kind_is_refused_with_the_known_ones():
    with pytest.raises(ValueError, match="page_table"):
        kind_named("page_tables")

    def build(*args, **kwargs):
        pass

    build.pagegraph_outputs = "tables"
    with pytest.raises(ValueError, match="pagegraph_outputs"):
        kind_of(build)
    assert kind_of(build, "csr") is KINDS["csr"]


def test_a_batch_context_is_checked():
    assert BatchContext(3, 4, 8).num_reqs == 3
    assert BatchContext(None, 4, 8).num_rows == 4
    with pytest.raises(ValueError, match="num_reqs <= num_rows"):
        BatchContext(5, 4, 8)
    with pytest.raises(ValueError, match="num_rows <= max_bs"):
        BatchContext(1, 9, 8)
    with pytest.raises(TypeError):
        BatchContext(1.0, 4, 8)


def test_signatures_in_the_kinds_match_the_builders_they_document():
    # The contract line of each kind lists the positional arguments its built-ins take.
    for spec in KINDS.values():
        fn = next(iter(spec.builders.values()))
        params = [
            p
            for p in inspect.signature(fn).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty
        ]
        assert len(params) >= spec.positional, (spec.name, params)


# -- no kind name and no kind vector name in the generic bed ----------------------------------

#: The generic bed: these folders (and the front's modules) never name a kind or one of its
#: vectors. Kernels, clients, mutants, consumers and the wild entries implement a specific
#: kind's or engine's kernels and name their own buffers.
GENERIC_BED = ("graph", "check", "workload", "jobs", "bench", "supervise", "detect")
#: Names a kind shares with the bed's own buffers (``IO_FIELDS``: the page table every kind is
#: handed; the engine state's ``block_table``): naming those is naming the buffer.
BED_BUFFERS = frozenset(IO_FIELDS) | {
    name for name, member in vars(EngineState).items() if isinstance(member, property)
}
#: (file under src/pagegraph, name) -> why it still names a kind's vector or a kind. Each
#: entry must still occur (a stale one fails), so the list only shrinks.
KNOWN_NAMES = {
    **{
        (f"bench/{f}", n): "the decode-metadata kernels' own benchmark"
        for f, names in {
            "decode_bench.py": ("cache_seqlens", "cu_seqlens_k", "cu_seqlens_q"),
            "bench_report.py": ("decode_metadata",),
            "bench_runner.py": ("decode_metadata",),
        }.items()
        for n in names
    },
}


def _docstring_lines(tree: ast.Module) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            for st in node.body:
                if (
                    isinstance(st, ast.Expr)
                    and isinstance(st.value, ast.Constant)
                    and isinstance(st.value.value, str)
                ):
                    lines.update(range(st.lineno, (st.end_lineno or st.lineno) + 1))
    return lines


def kind_name_hits(
    text: str, kinds: Iterable[str], vectors: Iterable[str], presets: Iterable[str] = ()
) -> list[tuple[int, str]]:
    """``(line, name)`` where ``text`` (Python source) names a kind or a kind's vector or
    preset as a whole string literal (``"csr"``, ``'kv_indices'``, ``"kv_indptr[0]"``), or a
    vector as an identifier (``runner.kv_indices``, ``kv_indices=``). Comments and docstrings
    are prose, and are not read; names of the bed's own buffers are not kinds'."""
    quoted = (set(kinds) | set(vectors) | set(presets)) - BED_BUFFERS
    idents = set(vectors) - BED_BUFFERS
    docs = _docstring_lines(ast.parse(text))
    hits = []
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.start[0] in docs:
            continue
        if tok.type == tokenize.STRING:
            try:
                value = ast.literal_eval(tok.string)
            except (ValueError, SyntaxError):  # an f-string, say
                continue
            if isinstance(value, str) and value in quoted:
                hits.append((tok.start[0], value))
        elif tok.type == tokenize.NAME and tok.string in idents:
            hits.append((tok.start[0], tok.string))
    return hits


def generic_bed_hits(root: Path = SRC) -> dict[tuple[str, str], list[int]]:
    """(file, name) -> lines, over the generic bed's modules under ``root``."""
    kinds = list(KINDS)
    vectors = [v for spec in KINDS.values() for v in spec.vector_names]
    presets = [p for spec in KINDS.values() for p in spec.presets]
    found: dict[tuple[str, str], list[int]] = {}
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if len(rel.parts) > 1 and rel.parts[0] not in GENERIC_BED:
            continue
        for line, name in kind_name_hits(path.read_text(), kinds, vectors, presets):
            found.setdefault((rel.as_posix(), name), []).append(line)
    return found


def test_the_generic_bed_names_no_kind_and_no_kind_vector():
    found = generic_bed_hits()
    new = {k: v for k, v in found.items() if k not in KNOWN_NAMES}
    assert not new, "kind or kind-vector names in the generic bed:\n" + "\n".join(
        f"{f}:{lines} {name}" for (f, name), lines in sorted(new.items())
    )
    stale = sorted(k for k in KNOWN_NAMES if k not in found)
    assert not stale, f"KNOWN_NAMES entries that no longer occur (remove them): {stale}"


def test_the_name_scan_finds_planted_names(tmp_path):
    (tmp_path / "check").mkdir()
    (tmp_path / "kinds").mkdir()
    (tmp_path / "check" / "planted.py").write_text(
        '"""Docstrings may say kv_indices and "csr"."""\n'
        "# so may comments: kv_indptr\n"
        'if name == "kv_indices":\n'
        "    note = runner.kv_indptr\n"
        'presets = ("kv_indptr[0]",)\n'
        'kind = "csr"\n'
        'table = kwargs["page_table"]\n'
    )
    (tmp_path / "kinds" / "own.py").write_text('name = "csr"\n')
    assert generic_bed_hits(tmp_path) == {
        ("check/planted.py", "kv_indices"): [3],
        ("check/planted.py", "kv_indptr"): [4],
        ("check/planted.py", "kv_indptr[0]"): [5],
        ("check/planted.py", "csr"): [6],
    }
