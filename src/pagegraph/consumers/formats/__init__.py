"""The metadata formats a decode step's attention reads, one module each, registered into
``FORMATS`` (``spec.ReaderFormat``): ``paged`` (a page table with ``cache_seqlens``:
TensorRT-LLM's MHA, FlashAttention-3) and ``csr`` (FlashInfer's page list, built in the graph
from the table). A new format is a module that builds a ``ReaderFormat`` and calls
``register_format``, imported below; nothing else names a format.
"""

from .spec import FORMATS, Metadata, ReaderFormat, Row, reader_format, register_format

# isort: split
# The registration order is ``FORMATS``' order (the consumer floor's columns).
from .paged_format import PAGED

# isort: split
from .csr_format import CSR

__all__ = [
    "CSR",
    "DEFAULT_FORMAT",
    "FORMATS",
    "PAGED",
    "Metadata",
    "ReaderFormat",
    "Row",
    "reader_format",
    "register_format",
]

#: The format of a decode-step check that names none.
DEFAULT_FORMAT = PAGED.name
