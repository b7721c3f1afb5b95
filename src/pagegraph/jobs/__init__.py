"""The jobs the command line runs: check, kernel table, profile, mutate, the engines' runs.

``run_check`` (``pagegraph check`` and ``kernel-table``) and ``run_mutate`` (``pagegraph
mutate``).
"""

from ..runtime.lazy_exports import lazy_exports

#: public name -> the module of this package that defines it, imported at first use, so
#: that importing one module of the package loads no other.
_DEFINED_IN = {
    "run_check": "check_job",
    "run_mutate": "mutate",
}

__all__ = [
    "run_check",
    "run_mutate",
]


__getattr__ = lazy_exports(__name__, _DEFINED_IN)
