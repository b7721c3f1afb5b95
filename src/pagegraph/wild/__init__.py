"""Bugs from the wild: CUDA-graph metadata bugs that public engines shipped, each reproduced as
a buggy builder, reader or runner written from its report, beside its fixed twin, with the
scenario and the property of the bed that must catch it (``pagegraph wild``)."""

from .corpus import entries, entry
from .wild_bug import BUG_CLASSES, Fidelity, NotYetExpressible, Twin, WildBug

__all__ = [
    "BUG_CLASSES",
    "Fidelity",
    "NotYetExpressible",
    "Twin",
    "WildBug",
    "entries",
    "entry",
]
