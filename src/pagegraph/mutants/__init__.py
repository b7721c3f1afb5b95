"""The mutant zoo: builders of each kind with one realistic bug each, for mutation testing.

One module per kind's zoo (``page_table``, ``decode_metadata``, ``csr``, and ``vllm`` for vLLM's
``block_table`` and ``slot_mapping``), each a ``Zoo`` (``pagegraph.mutants.mutant``) of
``Mutant`` records and controls; ``pagegraph.mutants.zoo`` gathers them by kind (``ZOOS``)
for ``pagegraph mutate``. The zoos sit above the kinds (a kind never loads its mutants): a
kind without mutants is a kind all the same, and ``mutate`` covers the kinds that have a zoo.

"""

from ..runtime.lazy_exports import lazy_exports

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


__getattr__ = lazy_exports(__name__, _DEFINED_IN)
