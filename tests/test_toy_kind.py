"""Invariant: adding a builder kind is one module plus a scenario.

A toy kind (a ``KindSpec`` subclass with one vector of its own, ``toy_lengths``, and no
mutants) is written as one module in a temporary folder, with a scenario file that names it;
``pagegraph.kinds.load_kind`` registers it, and ``check_replay_safety`` judges a correct toy
builder SAFE and a planted broken one UNSAFE on "correct". The runner takes the toy's vector
by name, and refuses another kind's vector with the toy's listed.
"""

from __future__ import annotations

import textwrap

import pytest
import torch

from pagegraph import check_replay_safety
from pagegraph.check.scenario import load_scenario
from pagegraph.graph.runner import GraphRunner
from pagegraph.kinds import KINDS, kind_names, load_kind, presettable_outputs, unregister_kind

TOY_KIND = '''
"""A toy kind: each row's length, clamped at 0, in its own vector ``toy_lengths``."""

import torch

from pagegraph.kernels.contract import declare_outputs
from pagegraph.kinds import KindSpec, VectorSpec


class ToyKind(KindSpec):
    name = "toy"
    signature = "build(req_to_token, req_pool_indices, seq_lens, page_size, *, toy_lengths)"
    positional = 4
    keywords = ("toy_lengths",)
    writes_tables = False
    swa = False
    feeds_consumer = False
    vectors = (VectorSpec("toy_lengths", torch.int32, lambda max_bs, width, d: max_bs),)
    presets = {"toy_lengths[0]": (0, 1)}
    error_kinds = ()
    reference = "toy_reference"

    def load_builders(self):
        return {"toy_reference": toy_reference}

    def call(self, builder, io, bs, extra):
        builder(
            io.req_to_token,
            io.req_pool_indices[:bs],
            io.seq_lens[:bs],
            io.page_size,
            toy_lengths=io.vectors["toy_lengths"][:bs],
            **extra,
        )

    def vector_fields(self, verifier, model):
        """``toy_lengths[i] = max(len, 0)`` for the bucket's rows, poison elsewhere."""
        M, poison = verifier.max_bs, verifier.poison_value
        exp = verifier.expected_vectors
        exp.fill_(poison)
        lengths = model.sl.clamp(0, 2**31 - 1)
        exp[:, 0, 1 : 1 + M] = torch.where(model.in_bucket, lengths, poison)
        return verifier.vector_masks(exp, exp != poison)


TOY = ToyKind()


def toy_reference(req_to_token, req_pool_indices, seq_lens, page_size, *, toy_lengths):
    """The toy contract, sync-free."""
    torch.clamp(seq_lens, min=0, out=toy_lengths)


def toy_off_by_one(req_to_token, req_pool_indices, seq_lens, page_size, *, toy_lengths):
    """Each row's length plus one: a planted bug."""
    torch.clamp(seq_lens, min=0, out=toy_lengths)
    toy_lengths.add_(1)


declare_outputs(toy_reference, "toy")
declare_outputs(toy_off_by_one, "toy")
'''

SCENARIO = """name = "toy"
description = "The toy kind on a small CPU bed."
[graph]
buckets = [1, 2, 4]
max_bs = 4
max_context_len = 64
page_size = 4
[workload]
steps = 4
seed = 3
initial_len = [1, 60]
[check]
builder = "{module}:{builder}"
outputs = "toy"
detectors = "none"
"""


@pytest.fixture
def toy(tmp_path):
    """The toy kind's module, registered, and a scenario file for ``builder``."""
    module = tmp_path / "toy_kind.py"
    module.write_text(textwrap.dedent(TOY_KIND))
    spec = load_kind(f"{module}:TOY")

    def scenario(builder: str):
        path = tmp_path / f"toy-{builder}.toml"
        path.write_text(SCENARIO.format(module=module, builder=builder))
        return load_scenario(path)

    yield spec, scenario
    unregister_kind("toy")


def test_a_toy_kind_is_registered_with_its_presets(toy):
    spec, _ = toy
    assert KINDS["toy"] is spec and "toy" in kind_names()
    assert "toy_lengths[0]" in presettable_outputs()


def test_a_correct_toy_builder_is_safe(toy):
    _, scenario = toy
    scn = scenario("toy_reference")
    report = check_replay_safety(scn.builder, scn.config)
    assert report.verdict == "SAFE", report.format()
    assert report.property("correct").status == "pass"


def test_a_broken_toy_builder_fails_correct(toy):
    _, scenario = toy
    scn = scenario("toy_off_by_one")
    report = check_replay_safety(scn.builder, scn.config)
    assert report.verdict == "UNSAFE", report.format()
    failure = report.property("correct").first_failure
    assert report.property("correct").status == "FAIL"
    assert "toy_lengths[" in str(failure)


def test_the_runner_takes_the_toy_vector_and_refuses_another_kinds(toy):
    spec, _ = toy
    r2t = torch.arange(5 * 64, dtype=torch.int32).view(5, 64)
    own = torch.zeros(4, dtype=torch.int32)
    args = dict(max_bs=4, max_context_len=64, page_size=4, buckets=[1, 2, 4], outputs="toy")
    runner = GraphRunner(r2t, builder=spec.builders["toy_reference"], toy_lengths=own, **args)
    assert runner.vectors["toy_lengths"].data_ptr() == own.data_ptr()
    assert runner.static_buffers()["toy_lengths"] is runner.vectors["toy_lengths"]
    with pytest.raises(ValueError, match=r"'kv_indptr'.*toy builder.*its vectors: toy_lengths"):
        GraphRunner(
            r2t,
            builder=spec.builders["toy_reference"],
            kv_indptr=torch.zeros(5, dtype=torch.int32),
            **args,
        )
    # A misspelt vector is no kind's vector: an unexpected keyword, as Python says it.
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'toy_lenghts'"):
        GraphRunner(r2t, builder=spec.builders["toy_reference"], toy_lenghts=None, **args)


def test_a_registered_kind_name_cannot_shadow_another(toy):
    from pagegraph.kinds import CSR, register_kind

    spec, _ = toy
    assert register_kind(spec) is spec  # the same spec again: a no-op

    class Other(type(spec)):  # type: ignore[misc]
        pass

    with pytest.raises(ValueError, match="exists already"):
        register_kind(Other())
    with pytest.raises(ValueError, match="built-in"):
        unregister_kind(CSR.name)
