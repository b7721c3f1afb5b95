"""Every kind's mutant zoo, gathered for ``pagegraph mutate`` (``ZOOS``, ``MUTANTS``,
``CONTROLS``).

A mutant is a builder with one realistic bug, named in its docstring's first line, and
``pagegraph mutate`` runs the checker on each and on the controls (correct builders): every
mutant must be reported UNSAFE somewhere, every control SAFE everywhere. A kind without
mutants has no zoo here; ``mutate`` covers the kinds that have one.

``mutant_builder(name)`` finds a mutant's or a control's builder; the same lookup answers
``"pagegraph.mutants.zoo:NAME"`` (the module's ``__getattr__``), so a child process of
``pagegraph mutate`` gets its builder by that path.
"""

from __future__ import annotations

from collections.abc import Callable

from ..kinds import BLOCK_TABLE, CSR, DECODE_METADATA, PAGE_TABLE, SLOT_MAPPING
from . import csr_mutants, decode_metadata_mutants, page_table_mutants, vllm_mutants
from .mutant import Mutant, Zoo

__all__ = ["CONTROLS", "MUTANTS", "ZOOS", "Mutant", "mutant_builder", "reset_caches"]

#: Each kind's zoo by the kind's name, in the kinds' order (a kind without mutants has none).
ZOOS: dict[str, Zoo] = {
    PAGE_TABLE.name: page_table_mutants.ZOO,
    DECODE_METADATA.name: decode_metadata_mutants.ZOO,
    CSR.name: csr_mutants.ZOO,
    BLOCK_TABLE.name: vllm_mutants.BLOCK_TABLE_ZOO,
    SLOT_MAPPING.name: vllm_mutants.SLOT_MAPPING_ZOO,
}

#: Every kind's mutants by name, in the kinds' order.
MUTANTS: dict[str, Mutant] = {name: m for zoo in ZOOS.values() for name, m in zoo.mutants.items()}
#: Every kind's controls by name: each must be SAFE everywhere.
CONTROLS: dict[str, Callable[..., object]] = {
    name: fn for zoo in ZOOS.values() for name, fn in zoo.controls.items()
}


def mutant_builder(name: str) -> Callable[..., object]:
    """The builder of the mutant or control ``name`` (``KeyError`` naming the zoo's
    otherwise)."""
    mutant = MUTANTS.get(name)
    if mutant is not None:
        return mutant.builder
    control = CONTROLS.get(name)
    if control is not None:
        return control
    raise KeyError(f"no mutant or control {name!r} (known: {', '.join([*MUTANTS, *CONTROLS])})")


def __getattr__(name: str) -> Callable[..., object]:
    """``pagegraph.mutants.zoo:NAME`` for a mutant's or a control's builder."""
    try:
        return mutant_builder(name)
    except KeyError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None


def reset_caches() -> None:
    """Forget what the mutants cached (tests run several checks in one process)."""
    for zoo in ZOOS.values():
        zoo.reset()
