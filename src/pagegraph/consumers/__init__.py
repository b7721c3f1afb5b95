"""Consumers of pagegraph's attention metadata: paged decode attention kernels (page-table
and CSR formats) and their torch reference."""

from .attention_reference import reference_csr_decode_attention, reference_decode_attention
from .cache_write import write_new_tokens
from .paged_attention import (
    DecodeWorkspace,
    csr_decode_attention,
    default_num_splits,
    paged_decode_attention,
    prepare_decode_attention,
)

__all__ = [
    "DecodeWorkspace",
    "csr_decode_attention",
    "default_num_splits",
    "paged_decode_attention",
    "prepare_decode_attention",
    "reference_csr_decode_attention",
    "reference_decode_attention",
    "write_new_tokens",
]
