"""The mutant zoo: builders of each kind with one realistic bug each, for mutation testing.

One module per kind's zoo (``page_table``, ``decode_metadata``, ``csr``, and ``vllm`` for vLLM's
``block_table`` and ``slot_mapping``), each a ``Zoo`` (``pagegraph.mutants.record``) of
``Mutant`` records and controls. A kind's spec holds its zoo (``KindSpec.zoo``);
``pagegraph.kinds.zoo`` gathers every kind's for ``pagegraph mutate``. The zoo is built on
the kernels' layer only, so a kind can load it.
"""
