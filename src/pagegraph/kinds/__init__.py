"""Builder kinds: the contracts pagegraph checks builders against, one module each."""

from .batch import BatchContext

__all__ = ["BatchContext"]
