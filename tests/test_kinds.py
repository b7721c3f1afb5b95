"""Invariant: builder kinds are specs (``pagegraph.kinds``): everything about a kind lives in
its module, and the rest of pagegraph asks the spec instead of comparing kind names.

* Outside ``src/pagegraph/kinds/`` no kind name is compared as a string (a planted comparison
  is found by the same scanner).
* Each spec's own builders resolve to it, bind its contract, and name it.
* A declared kind that does not exist is refused with the known kinds.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

import pagegraph
from pagegraph.graph.builder_names import resolve_builder, signature_problem
from pagegraph.kinds import KINDS, OUTPUT_KINDS, PAGE_TABLE, BatchContext, kind_named, kind_of

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
