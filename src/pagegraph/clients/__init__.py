"""Real engines' metadata builders behind pagegraph's builder contracts.

Each client module loads an engine's own kernel files (never a copy of them) and exposes thin
adapters with pagegraph's signatures, so the checker and the tests can run the engine's code
exactly as its serving stack does. An engine that is not installed makes its adapters raise
its ``*Unavailable`` error with the reason; importing the client module never fails.

* ``pagegraph.clients.sglang``: SGLang's trtllm_mha page-table and fused graph-metadata
  kernels, its FlashMLA index builder as a ``"page_table"`` builder
  (``sglang_flashmla_kv_indices``), and its FlashInfer decode CSR build as ``"csr"`` builders
  (``sglang_flashinfer_kv_indices``, one program a row, and
  ``sglang_flashinfer_kv_indices_blocks``, its token-block grid); ``SGLANG_BUILDERS`` names
  those the checker knows. ``make sglang`` runs them on every scenario of their kind.
* ``pagegraph.clients.vllm``: vLLM's GPU block-table kernels (model runner v2), its batch
  block-table gather as a ``"block_table"`` builder (``vllm_gather_block_tables``) and its slot
  mapping as a ``"slot_mapping"`` builder (``vllm_compute_slot_mappings``); ``VLLM_BUILDERS``
  names them. ``pagegraph.clients.vllm_files`` finds and loads vLLM's files, with the few
  imports they reach stubbed (``STUBBED_IMPORTS``).
"""

from collections.abc import Callable


def CLIENT_BUILDERS() -> dict[str, Callable]:  # noqa: N802 - reads as the table it returns
    """Every engine's adapters by name (those of an engine whose files are missing still
    resolve, and raise its ``*Unavailable`` error with the reason when called)."""
    from .sglang import SGLANG_BUILDERS
    from .vllm import VLLM_BUILDERS

    return {**SGLANG_BUILDERS, **VLLM_BUILDERS}
