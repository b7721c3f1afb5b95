"""Invariant: a builder walked from ``check_replay_safety`` goes down the layers and never
comes back: along every call stack that holds it (in a local, or one or two attributes deep),
no pagegraph module is entered twice, for a table check and a decode-step check alike."""

from __future__ import annotations

import sys

import pytest

from pagegraph.check import checker
from pagegraph.check.config import CheckConfig
from pagegraph.check.pipeline import table_bed
from pagegraph.graph.builder_names import resolve_builder

SMALL = dict(max_bs=4, max_context_len=128, page_size=16, buckets=[4], steps=3, seed=3)


def _holds(frame, target) -> bool:
    """Whether ``frame`` holds ``target``: a local, or an attribute of a local (two deep)."""
    for value in frame.f_locals.values():
        if value is target:
            return True
        for attr in getattr(value, "__dict__", {}).values():
            if attr is target or any(a is target for a in getattr(attr, "__dict__", {}).values()):
                return True
    return False


def reentered_chains(builder, run) -> set[tuple[str, ...]]:
    """The chains of pagegraph modules (outermost first, repeats in a row folded) of every
    call stack that holds ``builder`` while ``run()`` runs, where a module comes back."""
    bad: set[tuple[str, ...]] = set()

    def profile(frame, event, arg):
        if event != "call" or not frame.f_globals.get("__name__", "").startswith("pagegraph"):
            return
        if not _holds(frame, builder):
            return
        chain: list[str] = []
        f = frame
        while f is not None:
            module = f.f_globals.get("__name__", "")
            if module.startswith("pagegraph") and _holds(f, builder) and chain[-1:] != [module]:
                chain.append(module)
            f = f.f_back
        if len(set(chain)) != len(chain):
            bad.add(tuple(reversed(chain)))

    sys.setprofile(profile)
    try:
        run()
    finally:
        sys.setprofile(None)
    return bad


@pytest.mark.parametrize(
    "consumer",
    [None, pytest.param("paged", marks=pytest.mark.cpu_heavy)],
    ids=["tables", "decode-step"],
)
def test_the_builder_enters_no_module_twice(consumer):
    builder = resolve_builder("build_page_table")
    cfg = CheckConfig(**SMALL, consumer=consumer)
    reports = []
    # The default device: the CPU runs the kernels under the interpreter, CUDA compiles them.
    bad = reentered_chains(
        builder, lambda: reports.append(checker.check_replay_safety(builder, cfg))
    )
    assert bad == set()
    assert reports[0].replays == SMALL["steps"], reports[0].format()  # the walk went all the way


def test_a_bench_that_calls_back_into_the_entry_module_is_seen(monkeypatch):
    """Planted: the table bench's replay made a function of ``checker``'s module (as if the
    bench lived beside the entry points again): the walk sees checker entered twice."""
    namespace = {"__name__": checker.__name__, "real": table_bed.TableBed.replay_one}
    exec("def replay_one(self, i):\n    return real(self, i)\n", namespace)  # noqa: S102
    monkeypatch.setattr(table_bed.TableBed, "replay_one", namespace["replay_one"])
    builder = resolve_builder("build_page_table")
    cfg = CheckConfig(**SMALL)
    bad = reentered_chains(builder, lambda: checker.check_replay_safety(builder, cfg))
    assert any(chain.count("pagegraph.check.checker") == 2 for chain in bad)
