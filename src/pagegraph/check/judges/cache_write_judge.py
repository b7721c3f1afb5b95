"""The step's KV-cache write, judged from the host model (``CacheModel``; the judge is
``step_judges.CacheWriteExact``).

Before a step's first replay the bed stages each row's new token (``k_new`` / ``v_new``,
``out_cache_loc``, ``positions``) and the model takes the cache as it stands, with every real
row's new K/V put at the slot the pool gives its new token: that is what the step must leave.
After a replay the whole pool is compared with it bit for bit, so a write at a wrong slot, a
missing one, or one from a padded row into a live slot shows, never judged from what the replay
itself left. The reference attention reads the model's cache, not the replayed one.
docs/ARCHITECTURE.md ("The decode step end to end") walks through it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import torch

from ...consumers.reader import PAD_SLOT_ID
from ...graph.step_graphs import StepGraphs
from ...kernels.contract import bit_view, cdiv
from ...workload.pool import Request

__all__ = [
    "CACHE_WRITE",
    "CacheDiff",
    "CacheModel",
    "describe_diff",
    "new_token_slot",
    "pad_slot_value",
    "slot_owners",
]

#: The property this module judges.
CACHE_WRITE = "cache write exact"
#: Slots named in a failure.
SHOWN_SLOTS = 4


def pad_slot_value(pad_slot: str) -> int:
    """The ``out_cache_loc`` of a padded row under ``[consumer] pad_slot``: ``PAD_SLOT_ID``
    ("skip") or slot 0 ("null", padding's own reserved slot)."""
    return PAD_SLOT_ID if pad_slot == "skip" else 0


def new_token_slot(pages: list[int], length: int, page_size: int) -> int:
    """The slot of a row's new token (its last, position ``length - 1``) through its pages."""
    pos = length - 1
    return pages[pos // page_size] * page_size + pos % page_size


@dataclass
class CacheDiff:
    """Where the replayed cache differs from the model: real rows whose new token's slot does
    not hold their new K/V (``missed``: row indices), and other pool slots that changed
    (``stray``: slot ids), after replay ``replay`` ("A", or the step's last)."""

    replay: str
    missed: list[int] = field(default_factory=list)
    stray: list[int] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.missed or self.stray)


class CacheModel:
    """What the step's cache write must leave (module docstring).

    ``before(graphs, slots, pad_slot)``: the pool's K and V as they are now, with row ``i``'s
    ``k_new[i]`` / ``v_new[i]`` at ``slots[i]`` (real rows ``:len(slots)``). Slots the step may
    write with any values (the discard page; slot 0 where padded rows write it) are compared
    with neither side and restored by ``restore``."""

    def __init__(self, graphs: StepGraphs, slots: list[int], pad_slot: str) -> None:
        self.graphs, self.slots = graphs, slots
        s = graphs.shape
        self.page_size, self.num_pages = s.page_size, s.num_pages
        n = len(slots)
        self.k = graphs.k_cache.clone()
        self.v = graphs.v_cache.clone()
        if n:
            idx = torch.tensor(slots, device=graphs.device)
            for model, new in ((self.k, graphs.k_new), (self.v, graphs.v_new)):
                flat = model.view(-1, *model.shape[2:])
                flat[idx] = new[:n]
        #: pool slots whose values the step may set freely (padded rows' null slot)
        self.free = [0] if pad_slot == "null" else []
        self._saved = [
            (cache, pages, cache[pages].clone())
            for cache in (graphs.k_cache, graphs.v_cache)
            for pages in (slice(0, 1), slice(self.num_pages + 1, self.num_pages + 2))
        ]

    def renew(self, pages: torch.Tensor, offsets: torch.Tensor) -> None:
        """Copy the graphs' K and V at ``(pages, offsets)`` into the model (the bed renewed
        them between replays)."""
        g = self.graphs
        self.k[pages, offsets] = g.k_cache[pages, offsets]
        self.v[pages, offsets] = g.v_cache[pages, offsets]

    def compare(self, replay: str) -> CacheDiff:
        """The pool's pages ``0 .. num_pages - 1`` of the graphs' K and V against the model."""
        g, ps, pool = self.graphs, self.page_size, self.num_pages
        changed = torch.zeros(pool * ps, dtype=torch.bool, device=g.device)
        for cache, model in ((g.k_cache, self.k), (g.v_cache, self.v)):
            now, want = bit_view(cache[:pool]), bit_view(model[:pool])
            changed |= (now != want).reshape(pool * ps, -1).any(1)
        for slot in self.free:
            changed[slot] = False
        wrong = set(np.flatnonzero(changed.cpu().numpy()).tolist())
        mine = {s: i for i, s in enumerate(self.slots)}
        missed = sorted(i for s, i in mine.items() if s in wrong)
        stray = sorted(s for s in wrong if s not in mine)
        return CacheDiff(replay, missed, stray)

    def restore(self) -> None:
        """Page 0 and the discard page back as they were before the step (the NaN a stale
        read of them shows)."""
        for cache, pages, values in self._saved:
            cache[pages] = values


def describe_diff(
    diff: CacheDiff, where: list[str], slots: list[int], owners: Mapping[int, tuple[int, int]]
) -> str:
    """One failure's text: the first missed row (``where[i]`` names row ``i``, ``slots[i]`` its
    new token's slot), else the first stray slots and who holds them (``owners``)."""
    if diff.missed:
        i = diff.missed[0]
        return (
            f"{where[i]}: after replay {diff.replay} its new token's K/V is not at slot "
            f"{slots[i]}, where the pool put it; {len(diff.missed)} real row(s) missed"
        )
    shown = ", ".join(_slot_owner(s, owners) for s in diff.stray[:SHOWN_SLOTS])
    return (
        f"after replay {diff.replay}: slot(s) {shown} changed, which no real row of the step "
        f"writes (a padded row's write must be discarded); {len(diff.stray)} slot(s) changed"
    )


def _slot_owner(slot: int, owners: Mapping[int, tuple[int, int]]) -> str:
    """``slot`` with who holds it: a running request's position, or no request."""
    owner = owners.get(slot)
    if owner is None:
        return f"{slot} (held by no running request)"
    req, pos = owner
    return f"{slot} (request {req}'s token {pos})"


def slot_owners(
    requests: Mapping[int, Request], pages: set[int], page_size: int
) -> dict[int, tuple[int, int]]:
    """``slot -> (request slot, position)`` for the slots of ``pages`` that running requests
    hold (what a failure names)."""
    owners: dict[int, tuple[int, int]] = {}
    for row, req in requests.items():
        for p_idx, page in enumerate(req.pages[: cdiv(max(req.length, 1), page_size)]):
            if page in pages:
                for off in range(page_size):
                    owners[page * page_size + off] = (row, p_idx * page_size + off)
    return owners
