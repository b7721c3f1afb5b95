"""The jobs the command line runs: check, kernel table, profile, mutate, the engines' runs.

``run_check`` (``pagegraph check`` and ``kernel-table``) and ``run_mutate`` (``pagegraph
mutate``).
"""

from importlib import import_module

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


def __getattr__(name: str) -> object:
    module = _DEFINED_IN.get(name)
    if module is None:  # a submodule not yet imported is found by the import system then
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f".{module}", __name__), name)
    globals()[name] = value  # found once: later lookups do not come here
    return value
