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

from collections.abc import Callable
from dataclasses import dataclass

import torch

from .cache_write import write_new_tokens

__all__ = [
    "PAD_SLOTS",
    "PAD_SLOT_ID",
    "CacheWrite",
    "HostBatch",
    "Reader",
    "StepInputs",
    "as_reader",
]

#: The slot a padded row's new token goes to under ``pad_slot = "skip"``: vLLM's
#: ``PAD_SLOT_ID``, which a cache write skips.
PAD_SLOT_ID = -1
#: Values of ``[consumer] pad_slot``: what a padded row's ``out_cache_loc`` holds. "skip":
#: ``PAD_SLOT_ID`` (vLLM: the write skips it); "null": slot 0, padding's own reserved slot,
#: written like any other (SGLang's ``out_cache_loc`` of padded rows).
PAD_SLOTS = ("skip", "null")


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
class StepInputs:
    """The step's staged inputs, for a reader that builds its own metadata from them (SGLang's
    Triton backend builds its CSR from ``req_to_token``): ``req_to_token`` ``[rows, >= context]``
    int32/int64 (the pool's), ``req_pool_indices`` and ``seq_lens`` ``[bs]`` of the index dtype,
    padded by the scenario's convention (the runner's static buffers, rows ``:bs``)."""

    req_to_token: torch.Tensor
    req_pool_indices: torch.Tensor
    seq_lens: torch.Tensor


@dataclass(frozen=True)
class CacheWrite:
    """What the step's KV-cache write is given for ``bs`` rows (each row one new token).

    ``k_new``, ``v_new`` ``[bs, Hkv, D]`` (the cache's dtype): each row's new token's key and
    value. ``k_cache``, ``v_cache`` ``[num_pages + 2, page_size, Hkv, D]``: the pool's pages,
    then the sentinel page (``num_pages``, which nothing may write) and the discard page
    (``num_pages + 1``). ``out_cache_loc`` ``[bs]`` int64: the slot (``page * page_size +
    offset``) the engine's allocator gave each real row's new token (SGLang's), a padded row's
    by ``pad_slot``: ``PAD_SLOT_ID`` or 0. ``positions`` ``[bs]`` int64: each real row's new
    token's position (``seq_len - 1``), 0 for a padded row. ``idx_mapping`` ``[bs]`` int32:
    ``i`` for a real row, -1 for a padded one (vLLM's padded requests). ``page_table``
    ``[bs, width]`` int32 and ``cache_seqlens`` ``[bs]`` int32: the builder's tables.
    ``discard_slot``: the first slot of the discard page, where a masked write may go (no one
    reads it). ``inputs``: the staged inputs (``StepInputs``)."""

    k_new: torch.Tensor
    v_new: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    out_cache_loc: torch.Tensor
    positions: torch.Tensor
    idx_mapping: torch.Tensor
    page_table: torch.Tensor
    cache_seqlens: torch.Tensor
    page_size: int
    discard_slot: int
    inputs: StepInputs


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
    ``plan=`` keyword (``None``: no such buffers, no ``plan=``). ``plan(host: HostBatch,
    workspace) -> None``: host work that writes the workspace for one step, run eagerly before
    the step's replays (and once before capture, on the capture's batch); it must depend only
    on ``host`` (the bed calls it more than once a step to see which entries it writes).
    ``None``: the reader is not planned (a workspace without a plan is scratch).

    ``write_cache(w: CacheWrite, **launch) -> None``: the step's KV-cache write, captured
    before ``attend`` and given the same launch arguments; ``None``: pagegraph's own
    (``write_new_tokens``). ``inputs``: ``attend`` also takes ``inputs=`` (``StepInputs``)."""

    name: str
    attend: Callable
    launch_args: Callable[[HostBatch], dict] | None = None
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

    def arguments(self, host: HostBatch) -> dict:
        """The keyword arguments of a launch for ``host`` (empty without ``launch_args``)."""
        return {} if self.launch_args is None else dict(self.launch_args(host))


def as_reader(consumer: Callable | Reader) -> Reader:
    """``consumer`` as a ``Reader``: a plain attention call has no launch arguments."""
    if isinstance(consumer, Reader):
        return consumer
    return Reader(getattr(consumer, "__name__", "consumer"), consumer)
