"""The bottom layer: the Triton metadata builders and everything they rest on.

The builders (``build_page_table``, ``build_decode_metadata``, ``build_kv_indices``, vLLM's
``gather_block_tables`` and ``compute_slot_mappings``), their contract (argument checks, error
kinds, ``POISON``, ``cdiv``), the compiled launcher, the host references and baselines they are
judged and timed against, and the registry that loads a builder by name or file
(``load_builder``). Nothing here imports another pagegraph layer.
"""

from ..runtime.lazy_exports import lazy_exports

#: public name -> the module of this package that defines it, imported at first use, so
#: that importing one module of the package loads no other.
_DEFINED_IN = {
    "BuffersChanged": "page_table",
    "PreparedBuild": "page_table",
    "build_page_table": "page_table",
    "prepare_build": "page_table",
    "build_decode_metadata": "decode_metadata",
    "build_kv_indices": "kv_indices",
    "gather_block_tables": "block_table",
    "PAD_SLOT_ID": "slot_mapping",
    "compute_slot_mappings": "slot_mapping",
    "ERROR_KINDS": "contract",
    "POISON": "contract",
    "cdiv": "contract",
    "check_builder_args": "contract",
    "interpreter_active": "contract",
    "BatchContext": "batch",
    "expected_tables": "table_reference",
    "host_max_gather": "reference",
    "reference_page_table": "reference",
    "static_width_gather": "reference",
    "block_grid": "baselines",
    "BuilderDeclaration": "declarations",
    "declaration_of": "declarations",
    "declare_builder": "declarations",
    "declare_runner_factory": "declarations",
    "BuilderLoadError": "registry",
    "load_builder": "registry",
}

__all__ = [
    "BatchContext",
    "BuilderDeclaration",
    "BuffersChanged",
    "BuilderLoadError",
    "ERROR_KINDS",
    "PAD_SLOT_ID",
    "POISON",
    "PreparedBuild",
    "block_grid",
    "build_decode_metadata",
    "build_kv_indices",
    "build_page_table",
    "cdiv",
    "check_builder_args",
    "declaration_of",
    "declare_builder",
    "declare_runner_factory",
    "compute_slot_mappings",
    "expected_tables",
    "gather_block_tables",
    "host_max_gather",
    "interpreter_active",
    "load_builder",
    "prepare_build",
    "reference_page_table",
    "static_width_gather",
]


__getattr__ = lazy_exports(__name__, _DEFINED_IN)
