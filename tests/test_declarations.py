"""Invariant: what a builder, a runner factory or a kind declares is typed, and read in one
place.

* ``declare_builder`` records a builder's page sizes and capabilities (a
  ``BuilderDeclaration``); the contract check refuses another page size, and a loose
  attribute of a declaration's names is refused with the declaration to use.
* ``declare_runner_factory`` records the vectors a factory allocates itself.
* The presettable outputs are the kinds' ``presets``; a vector's untouched entries and an
  entry's owner are its kind's words in a report.
* The runner takes its kind's vectors by name, refusing another's.
"""

from __future__ import annotations

import pytest
import torch

from pagegraph.check.pipeline.buffers import engine_buffers
from pagegraph.check.reports.report import Failure
from pagegraph.detect.probes import BuilderProbe, CompileCounter
from pagegraph.graph.builder_names import signature_problem
from pagegraph.graph.runner import GraphRunner
from pagegraph.kernels.declarations import (
    BuilderDeclaration,
    declaration_of,
    declare_builder,
    declare_runner_factory,
)
from pagegraph.kinds import CSR, DECODE_METADATA, PAGE_TABLE, presettable_outputs
from pagegraph.kinds.builders import builder_capabilities, supported_page_sizes


def csr_build(req_to_token, req_pool_indices, seq_lens, page_size, *, kv_indptr, kv_indices):
    pass


csr_build.pagegraph_outputs = "csr"  # type: ignore[attr-defined]


def test_declared_page_sizes_refuse_another_page_size():
    declare_builder(csr_build, page_sizes=(1,))
    assert supported_page_sizes(csr_build) == (1,)
    assert signature_problem(csr_build, CSR, page_size=1) is None
    problem = signature_problem(csr_build, CSR, page_size=16)
    assert problem is not None and "takes page_size 1 only" in problem


def test_an_undeclared_builder_takes_any_page_size_and_its_signatures_capabilities():
    def build(req_to_token, req_pool_indices, seq_lens, page_table, page_size, *, errors=None):
        pass

    assert declaration_of(build) == BuilderDeclaration()
    assert supported_page_sizes(build) is None
    caps = builder_capabilities(build)
    assert caps.errors and not caps.swa and not caps.batch
    declare_builder(build, errors=False, batch=True)
    caps = builder_capabilities(build)
    assert not caps.errors and not caps.swa and caps.batch


@pytest.mark.parametrize(
    "attribute, value",
    [("pagegraph_page_sizes", (1,)), ("pagegraph_capabilities", {"errors": False})],
)
def test_a_loose_attribute_is_refused_with_the_declaration_to_use(attribute, value):
    def build(*args, **kwargs):
        pass

    setattr(build, attribute, value)
    with pytest.raises(ValueError, match=rf"\.build sets {attribute}, .*declare_builder"):
        builder_capabilities(build)


@pytest.mark.parametrize("sizes", [(), (0,), (1.5,), (True,)])
def test_bad_page_sizes_are_refused(sizes):
    with pytest.raises(ValueError, match="page_sizes"):
        declare_builder(csr_build, page_sizes=sizes)


def test_a_runner_factory_declares_its_engine_buffers():
    def factory(*args, **kwargs):
        pass

    assert engine_buffers(factory) == ()
    declare_runner_factory(factory, engine_buffers=("kv_indptr",))
    assert engine_buffers(factory) == ("kv_indptr",)
    with pytest.raises(ValueError, match="engine_buffers"):
        declare_runner_factory(factory, engine_buffers="kv_indptr")  # type: ignore[arg-type]
    factory.pagegraph_engine_buffers = ("kv_indptr",)  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="declare_runner_factory"):
        engine_buffers(factory)


def test_the_presettable_outputs_are_the_kinds_presets():
    assert presettable_outputs() == ("cu_seqlens_k[0]", "cu_seqlens_q[0]", "kv_indptr[0]")


def test_a_vectors_untouched_entries_are_its_kinds_words():
    indices, indptr = CSR.vector("kv_indices"), CSR.vector("kv_indptr")
    poisoned = Failure(0, 4, 9, 0, -1, 3, "kv_indices", vector=True, poison=-1)
    poisoned.untouched = indices.untouched
    assert poisoned.meaning() == (
        "the poison: an entry past kv_indptr[bucket], or a canary, must stay untouched"
    )
    other = Failure(0, 4, 9, 0, -1, 3, "kv_indptr", vector=True, poison=-1)
    other.untouched = indptr.untouched
    assert other.meaning() == "the poison: an entry past the batch must stay untouched"
    with pytest.raises(ValueError, match="its vectors: kv_indptr, kv_indices"):
        CSR.vector("cache_seqlens")


def test_a_csr_entrys_owner_is_its_row_and_page():
    # Rows of 3, 0 and 2 pages (page size 4), capacity 8: entries 0..4 are theirs.
    args = ([10, 0, 5], 4, 16, 8)
    assert CSR.entry_owner("kv_indices", 0, *args) == "row 0's page 0"
    assert CSR.entry_owner("kv_indices", 4, *args) == "row 2's page 1"
    assert CSR.entry_owner("kv_indices", 5, *args) == "past kv_indptr[3] = 5"
    assert CSR.entry_owner("kv_indices", 8, *args) == "past the end of kv_indices (8 entries)"
    assert CSR.entry_owner("kv_indptr", 1, *args) == ""
    assert CSR.entry_owner("kv_indices", -1, *args) == ""
    assert PAGE_TABLE.entry_owner("kv_indices", 0, *args) == ""


def test_a_probe_records_its_kinds_rows():
    table = torch.zeros(3, 8, dtype=torch.int32)
    probe = BuilderProbe(lambda *a, **k: None, torch.device("cpu"), CompileCounter(), {})
    probe(None, None, None, table, 4)
    assert probe.calls[-1].bs == -1  # no kind: unknown
    probe = BuilderProbe(
        lambda *a, **k: None,
        torch.device("cpu"),
        CompileCounter(),
        {"errors": False},
        PAGE_TABLE.call_rows,
    )
    probe(None, None, None, table, 4)
    probe(None, None, None, 4, page_table=table[:2])
    assert [c.bs for c in probe.calls] == [3, 2]
    assert not builder_capabilities(probe).errors


def _r2t() -> torch.Tensor:
    return torch.arange(5 * 64, dtype=torch.int32).view(5, 64)


RUNNER = dict(max_bs=4, max_context_len=64, page_size=4, buckets=[1, 2, 4])


def test_the_runner_holds_its_kinds_vectors_by_name():
    own = torch.zeros(4, dtype=torch.int32)
    runner = GraphRunner(
        _r2t(), builder="build_decode_metadata", cache_seqlens=own, kv_indices=None, **RUNNER
    )
    assert tuple(runner.vectors) == DECODE_METADATA.vector_names
    assert runner.vectors["cache_seqlens"].data_ptr() == own.data_ptr()
    assert runner.cache_seqlens is runner.vectors["cache_seqlens"]
    names = set(runner.static_buffers())
    assert set(DECODE_METADATA.vector_names) <= names and "kv_indices" not in names


def test_the_runner_refuses_a_vector_of_another_kind():
    with pytest.raises(ValueError, match=r"'kv_indices'.*page_table builder.*its vectors: none"):
        GraphRunner(_r2t(), kv_indices=torch.zeros(16, dtype=torch.int32), **RUNNER)
    with pytest.raises(ValueError, match=r"'kv_indptr'.*its vectors: cache_seqlens"):
        GraphRunner(
            _r2t(),
            builder="build_decode_metadata",
            vectors={"kv_indptr": torch.zeros(5, dtype=torch.int32)},
            **RUNNER,
        )


def test_a_misspelt_runner_argument_is_a_type_error_not_a_vector():
    """A keyword that is no kind's vector is what Python says of any unexpected keyword; a
    real vector name of another kind keeps the kinds' message (above)."""
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'paddng'"):
        GraphRunner(_r2t(), paddng="vllm", **RUNNER)
    runner = GraphRunner(_r2t(), padding="vllm", **RUNNER)  # spelt right: accepted
    assert runner.padding.name == "vllm"
