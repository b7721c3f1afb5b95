"""A decode step's reader: the attention call and the host work an engine does around it.

Engines do not only hand the metadata to the attention kernel: they compute host values for
its launch (``max_seqlen_k``, a split count) before the call. Under a CUDA graph those values
are whatever the engine computed when it captured, so a reader whose launch depends on them
is wrong once the lengths grow. A ``Reader`` names that host work, so the bed can run it at
the moments an engine does (at capture, and at every eager call) and show what a graph froze.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["HostBatch", "Reader", "as_reader"]


@dataclass(frozen=True)
class HostBatch:
    """What the engine knows on the host when it prepares a step's launch.

    ``lens``: each real row's length (host ints; at capture, the lengths captured with: one
    token a row); ``bucket``: the batch size the graph was captured for; ``page_size`` and
    ``width`` (pages a table row holds): the static shapes."""

    lens: tuple[int, ...]
    bucket: int
    page_size: int
    width: int

    @property
    def max_len(self) -> int:
        """The longest real row (0 for an empty batch): what ``max_seqlen_k`` is made of."""
        return max(self.lens, default=0)

    @property
    def capacity(self) -> int:
        """Tokens a table row holds: the static worst case of any length."""
        return self.width * self.page_size


@dataclass(frozen=True)
class Reader:
    """The attention call of a decode step and its host launch arguments.

    ``attend``: ``paged_decode_attention``'s signature (``csr_decode_attention``'s for the CSR
    format), taking the keyword arguments ``launch_args`` returns besides its own.
    ``launch_args(host: HostBatch) -> dict``: host values the engine computes before each
    launch; ``None``: none. Under a CUDA graph (real or emulated) they are computed once, at
    capture, with the capture's lengths."""

    name: str
    attend: Callable
    launch_args: Callable[[HostBatch], dict] | None = None

    def arguments(self, host: HostBatch) -> dict:
        """The keyword arguments of a launch for ``host`` (empty without ``launch_args``)."""
        return {} if self.launch_args is None else dict(self.launch_args(host))


def as_reader(consumer: Callable | Reader) -> Reader:
    """``consumer`` as a ``Reader``: a plain attention call has no launch arguments."""
    if isinstance(consumer, Reader):
        return consumer
    return Reader(getattr(consumer, "__name__", "consumer"), consumer)
