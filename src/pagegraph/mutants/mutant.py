"""``Mutant``: one builder of the zoo with one realistic bug, and what must catch it; ``Zoo``: a
kind's mutants, its controls (correct builders, SAFE everywhere) and how to forget what the
mutants cached.

A mutant says whether it can die without a GPU (under the Triton interpreter), which property
should kill it, and the properties whose failure counts as catching its bug (``kills``): a
crash recorded under another property is not its bug caught.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["GRAPH", "OUTSIDE", "SPILL", "WRONG", "Mutant", "Zoo"]

# The properties that catch each family of bug (``Mutant.kills``).
WRONG = ("correct",)
#: an overlong row's spill lands in the next row
SPILL = ("row containment", "correct")
OUTSIDE = ("bounded writes", "row containment")
GRAPH = ("correct", "graph-safe (captured short, replayed long)")


@dataclass(frozen=True)
class Mutant:
    name: str
    builder: Callable[..., object]
    #: can die under the Triton interpreter on a machine without a GPU
    cpu: bool
    #: the property (or crash) that should kill it, for the reader
    killed_by: str
    #: the one sync detector that can see it (its bug is a sync no other detector reports),
    #: or None
    needs_detector: str | None = None
    #: the properties whose failure is this bug caught (every mutant has some): failing only
    #: others (a crash under "capture" for a wrong value, say) is not catching this bug
    kills: tuple[str, ...] = ()
    #: why a mutant that cannot die on a CPU needs a GPU (for the kill table)
    gpu_only: str = ""

    @property
    def bug(self) -> str:
        return (self.builder.__doc__ or "").strip().splitlines()[0]


def _nothing_cached() -> None:
    pass


@dataclass(frozen=True)
class Zoo:
    """One kind's mutants by name, its controls by name, and ``reset``: forget what the
    mutants cached between calls (tests and ``mutate`` run several checks in one process)."""

    mutants: dict[str, Mutant]
    controls: dict[str, Callable[..., object]]
    reset: Callable[[], None] = _nothing_cached
