"""The mutant zoo: builders of each kind with one realistic bug each, for mutation testing.

One module per kind's zoo (``page_table``, ``decode_metadata``, ``csr``, and ``vllm`` for vLLM's
``block_table`` and ``slot_mapping``), each a ``Zoo`` (``pagegraph.mutants.mutant``) of
``Mutant`` records and controls; ``pagegraph.mutants.zoo`` gathers them by kind (``ZOOS``)
for ``pagegraph mutate``. The zoos sit above the kinds (a kind never loads its mutants): a
kind without mutants is a kind all the same, and ``mutate`` covers the kinds that have a zoo.

"""

from importlib import import_module

#: public name -> the module of this package that defines it, imported at first use, so
#: that importing one module of the package loads no other.
_DEFINED_IN = {
    "Mutant": "mutant",
    "Zoo": "mutant",
}

__all__ = [
    "Mutant",
    "Zoo",
]


def __getattr__(name: str) -> object:
    module = _DEFINED_IN.get(name)
    if module is None:  # a submodule not yet imported is found by the import system then
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f".{module}", __name__), name)
    globals()[name] = value  # found once: later lookups do not come here
    return value
