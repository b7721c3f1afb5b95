"""The jobs the command line runs: check, kernel table, profile, mutate, the engines' runs.

``run_check`` (``pagegraph check`` and ``kernel-table``), ``run_mutate`` (``pagegraph mutate``),
the shipped scenarios by name (``scenario_path``, ``DEFAULT_SCENARIO``), the progress line
(``Progress``) and the version of the environment a report records (``PAGEGRAPH_VERSION``).
"""

from importlib import import_module

#: public name -> the module of this package that defines it, imported at first use, so
#: that importing one module of the package loads no other.
_DEFINED_IN = {
    "run_check": "check_job",
    "run_mutate": "mutate",
    "DEFAULT_SCENARIO": "scenario_paths",
    "scenario_path": "scenario_paths",
    "Progress": "progress",
    "PAGEGRAPH_VERSION": "environment",
}

__all__ = [
    "DEFAULT_SCENARIO",
    "PAGEGRAPH_VERSION",
    "Progress",
    "run_check",
    "run_mutate",
    "scenario_path",
]


def __getattr__(name: str) -> object:
    module = _DEFINED_IN.get(name)
    if module is None:  # a submodule not yet imported is found by the import system then
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f".{module}", __name__), name)
    globals()[name] = value  # found once: later lookups do not come here
    return value
