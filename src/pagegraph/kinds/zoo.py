"""Every kind's mutant zoo, gathered for ``pagegraph mutate`` (``MUTANTS``, ``CONTROLS``).

The zoos live with their kinds (``KindSpec.zoo``, built in ``pagegraph.mutants``): a mutant is a
builder with one realistic bug, named in its docstring's first line, and ``pagegraph mutate``
runs the checker on each and on the controls (correct builders): every mutant must be
reported UNSAFE somewhere, every control SAFE everywhere.

Each mutant and control is also an attribute of this module, so
``"pagegraph.kinds.zoo:NAME"`` resolves anywhere (a child process of ``pagegraph mutate``
gets its builder that way).
"""

from __future__ import annotations

from collections.abc import Callable

from ..mutants.mutant import Mutant
from . import KINDS

__all__ = ["CONTROLS", "MUTANTS", "Mutant", "reset_caches"]

#: Every kind's mutants by name, in the kinds' order.
MUTANTS: dict[str, Mutant] = {
    name: m for kind in KINDS.values() for name, m in kind.zoo.mutants.items()
}
#: Every kind's controls by name: each must be SAFE everywhere.
CONTROLS: dict[str, Callable[..., object]] = {
    name: fn for kind in KINDS.values() for name, fn in kind.zoo.controls.items()
}

globals().update({name: m.builder for name, m in MUTANTS.items()})
globals().update(CONTROLS)


def reset_caches() -> None:
    """Forget what the mutants cached (tests run several checks in one process)."""
    for kind in KINDS.values():
        kind.zoo.reset()
