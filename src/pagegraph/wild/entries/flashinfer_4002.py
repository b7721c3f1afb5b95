"""FlashInfer #4002: CUDA-graph plans without split-KV launch padded CTAs over scheduler
entries the current plan never wrote (the fix masks them with ``block_valid_mask``).

The reader, planned: ``plan()`` (host, before each step) writes a work list into the workspace,
one item per ``TILE`` tokens of each real row, and the item count; ``run()`` (captured)
launches a static grid over every item slot and combines the items' partial attention per row.
Buggy: every slot is processed, those past the count holding an earlier plan's items. Fixed:
slots past the count are masked.
"""

from __future__ import annotations

import torch

from ...consumers.reader import HostBatch, Reader
from ...kernels.contract import cdiv
from ..range_attention import merge, partials, token_kv
from ..wild_bug import Fidelity, Twin, WildBug

#: Tokens one work item covers.
TILE = 64


def _workspace(
    max_bs: int, width: int, page_size: int, device: torch.device
) -> dict[str, torch.Tensor]:
    """The scheduler's buffers, allocated once: ``items`` ``[max_bs * tiles, 3]`` int32 (row,
    token start, token end; ``tiles`` a row's capacity in ``TILE``s: the padded grid) and
    ``count`` ``[1]`` int32."""
    slots = max_bs * cdiv(width * page_size, TILE)
    return {
        "items": torch.zeros((slots, 3), dtype=torch.int32, device=device),
        "count": torch.zeros(1, dtype=torch.int32, device=device),
    }


def plan_work_list(host: HostBatch, workspace: dict[str, torch.Tensor]) -> None:
    """One item per ``TILE`` tokens of each real row, written from the host; the slots past
    them are left as they were (as the scheduler does)."""
    items = [
        (row, start, min(start + TILE, n))
        for row, n in enumerate(host.lens)
        for start in range(0, n, TILE)
    ]
    dev = workspace["items"].device
    if items:
        values = torch.tensor(items, dtype=torch.int32, device=dev)
        workspace["items"][: len(items)].copy_(values)
    workspace["count"].fill_(len(items))


def _run(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    page_table: torch.Tensor,
    out: torch.Tensor,
    page_size: int,
    ws: dict[str, torch.Tensor],
    masked: bool,
) -> torch.Tensor:
    """The captured run over every item slot (``[slots]``): each item's partial over its token
    range, scattered into a ``[bs, tiles]`` grid by (row, tile) and merged per row. A masked
    (or, with ``masked``, out-of-count) item goes to a dump slot the merge never reads."""
    bs, num_q_heads, head_dim = q.shape
    width, dev = page_table.shape[1], q.device
    tiles = cdiv(width * page_size, TILE)
    items = ws["items"].long()
    slots = items.shape[0]
    rows = items[:, 0].clamp(0, bs - 1)
    start = items[:, 1].clamp(0, width * page_size)
    pos = start[:, None] + torch.arange(TILE, device=dev)
    live = (pos < items[:, 2:3]) & (pos < width * page_size)
    valid = torch.ones(slots, dtype=torch.bool, device=dev)
    if masked:
        valid = torch.arange(slots, device=dev) < ws["count"].long()
    live = live & valid[:, None]
    k, v = token_kv(k_cache, v_cache, page_table, rows, pos, page_size)
    m, total, acc = partials(q[rows], k, v, live, head_dim**-0.5)
    dump = bs * tiles
    dest = torch.where(valid, rows * tiles + (start // TILE).clamp(0, tiles - 1), dump)
    grid_m = torch.full((dump + 1, num_q_heads), float("-inf"), device=dev)
    grid_l = torch.zeros((dump + 1, num_q_heads), device=dev)
    grid_acc = torch.zeros((dump + 1, num_q_heads, head_dim), device=dev)
    grid_m.index_copy_(0, dest, m)
    grid_l.index_copy_(0, dest, total)
    grid_acc.index_copy_(0, dest, acc)
    shape = (bs, tiles, num_q_heads)
    o = merge(
        grid_m[:dump].reshape(shape),
        grid_l[:dump].reshape(shape),
        grid_acc[:dump].reshape(*shape, head_dim),
        dim=1,
    )
    return out.copy_(o)


def run_padded(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    page_table: torch.Tensor,
    cache_seqlens: torch.Tensor,
    out: torch.Tensor,
    *,
    page_size: int,
    workspace: object,
    plan: dict[str, torch.Tensor],
) -> torch.Tensor:
    """Buggy run: every slot of the padded grid is processed."""
    return _run(q, k_cache, v_cache, page_table, out, page_size, plan, masked=False)


def run_masked(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    page_table: torch.Tensor,
    cache_seqlens: torch.Tensor,
    out: torch.Tensor,
    *,
    page_size: int,
    workspace: object,
    plan: dict[str, torch.Tensor],
) -> torch.Tensor:
    """Fixed run: slots past the plan's count are masked (``block_valid_mask``)."""
    return _run(q, k_cache, v_cache, page_table, out, page_size, plan, masked=True)


BUG = WildBug(
    key="flashinfer-4002",
    engine="FlashInfer",
    version="main at 71d31b5a (2026-07-16), FA2 decode/prefill with split-KV off",
    ref="flashinfer-ai/flashinfer#4002",
    state="closed (fix in PR #5176, open)",
    bug_class="a",
    symptom="Illegal memory access in FA2 decode/prefill under CUDA graphs with split-KV off; "
    "correct with a fresh workspace, a crash with one an earlier plan used.",
    cause="The scheduler wrote entries only for the real work and padded the grid; without "
    "split-KV no block_valid_mask existed, so padded CTAs read an earlier plan's entries.",
    prop="reader reads only what the current plan wrote",
    buggy=Twin(
        reader=Reader(
            "FA2 work list, padded grid unmasked",
            run_padded,
            plan=plan_work_list,
            workspace=_workspace,
        )
    ),
    fixed=Twin(
        reader=Reader(
            "FA2 work list, block_valid_mask", run_masked, plan=plan_work_list, workspace=_workspace
        )
    ),
    fidelity=Fidelity(
        modelled="A plan that writes work items for the real work only into a workspace every "
        "plan shares, and a padded grid over every item slot with no valid mask: slots past "
        "the count run an earlier plan's items.",
        stands_in=(
            "plain-torch partial attention over 64-token items for the FA2 kernels",
            "a wrong real-row output for the illegal memory access an earlier plan's item gives",
        ),
        fix="#5176 (open): slots past the plan's count are masked (block_valid_mask) also "
        "without split-KV.",
    ),
)
