"""A decode step's reader: the attention call and the host work an engine does around it.

Engines compute host values for the attention's launch (``max_seqlen_k``, a split count) before
the call, and under a CUDA graph those values are whatever they were at capture. A ``Reader``
names that host work so the bed runs it when an engine does (at capture, at every eager call);
a planned reader splits it as FlashInfer's ``plan()`` / ``run()`` do, the plan writing a
workspace allocated once that the captured ``attend`` reads (docs/WILD.md, "Readers"). A reader
may bring the step's KV-cache write (``write_cache``, captured before ``attend``: each row's new
token's K/V at its slot, as ``CacheWrite`` describes).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

from .cache_write import PAD_SLOT_ID, PAD_SLOTS, CacheWrite, StepInputs, write_new_tokens

__all__ = [
    "PAD_SLOTS",
    "PAD_SLOT_ID",
    "CacheWrite",
    "HostBatch",
    "Reader",
    "StepInputs",
    "as_reader",
    "write_new_tokens",
]


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
    capture, with the capture's lengths.

    ``workspace(max_bs, width, page_size, device) -> dict[str, torch.Tensor]``: the reader's
    buffers, allocated once before capture and given to every call of ``attend`` as its
    ``plan=`` keyword (``None``: no such buffers, no ``plan=``); one that takes ``num_q_heads=``
    and ``head_dim=`` is given them too. Each tensor is handed over as the head of a longer
    allocation whose trailing canary the bed reads back (a write past a tensor's end fails
    "reader stays inside its workspace"). ``plan(host: HostBatch,
    workspace) -> None``: host work that writes the workspace for one step, run eagerly before
    the step's replays (and once before capture, on the capture's batch); it must depend only
    on ``host`` (the bed calls it more than once a step to see which entries it writes).
    ``None``: the reader is not planned (a workspace without a plan is scratch).

    ``write_cache(w: CacheWrite, **launch) -> None``: the step's KV-cache write, captured
    before ``attend`` and given the same launch arguments; ``None``: pagegraph's own
    (``write_new_tokens``). ``inputs``: ``attend`` also takes ``inputs=`` (``StepInputs``)."""

    name: str
    attend: Callable[..., object]
    launch_args: Callable[[HostBatch], Mapping[str, object]] | None = None
    plan: Callable[[HostBatch, dict[str, torch.Tensor]], None] | None = None
    workspace: Callable[..., dict[str, torch.Tensor]] | None = None
    write_cache: Callable[..., None] | None = None
    inputs: bool = False

    def __post_init__(self) -> None:
        if self.plan is not None and self.workspace is None:
            raise ValueError(f"reader {self.name}: a plan needs a workspace to write")

    @property
    def planned(self) -> bool:
        """Whether the bed runs ``plan`` before each step."""
        return self.plan is not None

    @property
    def writer(self) -> Callable[..., None]:
        """The step's cache write: the reader's own, or ``write_new_tokens``."""
        return self.write_cache or write_new_tokens

    def arguments(self, host: HostBatch) -> dict[str, object]:
        """The keyword arguments of a launch for ``host`` (empty without ``launch_args``)."""
        return {} if self.launch_args is None else dict(self.launch_args(host))


def as_reader(consumer: Callable[..., object] | Reader) -> Reader:
    """``consumer`` as a ``Reader``: a plain attention call has no launch arguments."""
    if isinstance(consumer, Reader):
        return consumer
    return Reader(getattr(consumer, "__name__", "consumer"), consumer)
