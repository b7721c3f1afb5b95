"""The metadata formats a decode step's attention reads: a page table with ``cache_seqlens``
(TensorRT-LLM's MHA, FlashAttention-3), or FlashInfer's CSR page list."""

__all__ = ["CONSUMERS", "CSR_CONSUMERS"]

#: Values of a check's ``consumer``: the format its decode step's attention reads.
CONSUMERS = ("paged", "csr")
#: The formats that read FlashInfer's page list instead of the table.
CSR_CONSUMERS = CONSUMERS[1:]
