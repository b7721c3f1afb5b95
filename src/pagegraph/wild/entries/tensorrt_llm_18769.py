"""TensorRT-LLM #18769: a FlashInfer decode wrapper's plan is refreshed only in the forward
path, which a CUDA-graph replay never runs (the fix re-plans every graph wrapper before each
replay).

The reader, planned: the plan writes each row's tile count (``TILE`` tokens a tile) into a
workspace allocated once; the captured run reduces only the planned tiles of each row. Buggy:
the plan runs in the forward path (the attend body) on the warm-up batch, so a graph keeps its
writes with the warm-up values. Fixed: the bed runs the same plan before every step.
"""

from __future__ import annotations

import torch

from ...consumers.reader import HostBatch, Reader
from ...kernels.contract import cdiv
from ..range_attention import split_attention
from ..wild_bug import Fidelity, Twin, WildBug

#: Tokens one tile of the split-KV schedule covers.
TILE = 64


def _workspace(
    max_bs: int, width: int, page_size: int, device: torch.device
) -> dict[str, torch.Tensor]:
    """The wrapper's schedule, allocated once: ``tiles`` ``[max_bs]`` int32, each row's tile
    count."""
    return {"tiles": torch.zeros(max_bs, dtype=torch.int32, device=device)}


def plan_tiles(host: HostBatch, workspace: dict[str, torch.Tensor]) -> None:
    """Each row of the bucket its tile count (padded rows none), one host value a fill: a
    write a graph can record, as the wrapper's copies from its host buffers are."""
    tiles = workspace["tiles"]
    for row in range(host.bucket):
        n = host.lens[row] if row < len(host.lens) else 0
        tiles[row].fill_(cdiv(n, TILE))


def run(
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
    """The captured run: split-KV over the table's capacity in ``TILE`` splits, each row
    reducing only the tiles its plan gave it (shapes as ``paged_decode_attention``'s)."""
    bs, splits = q.shape[0], cdiv(page_table.shape[1] * page_size, TILE)
    planned = torch.arange(splits, device=q.device) < plan["tiles"][:bs, None].long()
    o = split_attention(
        q,
        k_cache,
        v_cache,
        page_table,
        cache_seqlens,
        page_size=page_size,
        splits=splits,
        split_tokens=TILE,
        live_splits=planned,
    )
    return out.copy_(o)


def _warmup_batch(host: HostBatch) -> HostBatch:
    """The engine's warm-up dummies: a max_seq_len request in slot 0, one token elsewhere."""
    lens = (host.capacity, *(1 for _ in range(host.bucket - 1)))
    return HostBatch(lens, host.bucket, host.page_size, host.width)


def forward_planned(
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
    host: HostBatch,
) -> torch.Tensor:
    """Buggy: ``forward_impl`` plans (on the warm-up batch: it runs at warm-up and capture
    only), then runs."""
    plan_tiles(_warmup_batch(host), plan)
    return run(
        q,
        k_cache,
        v_cache,
        page_table,
        cache_seqlens,
        out,
        page_size=page_size,
        workspace=workspace,
        plan=plan,
    )


def _host(host: HostBatch) -> dict[str, HostBatch]:
    """The host batch the forward path sees (at capture, the capture's)."""
    return {"host": host}


BUG = WildBug(
    key="tensorrt-llm-18769",
    engine="TensorRT-LLM",
    version="not stated (FlashInfer FA2 decode wrappers; #19037 mentions FlashInfer 0.6.18)",
    ref="NVIDIA/TensorRT-LLM#18769",
    state="merged",
    bug_class="b",
    symptom="Wrong attention outputs and accuracy loss for mixed sliding-window/full models "
    "under CUDA graphs; batch size 1 looked correct.",
    cause="Wrappers whose page tuple prepare() did not record were re-planned only in "
    "forward_impl, which replays never reach: every replay ran the warm-up plan.",
    prop="output correct through the consumer",
    buggy=Twin(
        reader=Reader(
            "decode wrapper planned in forward", forward_planned, _host, workspace=_workspace
        )
    ),
    fixed=Twin(
        reader=Reader(
            "decode wrapper planned by prepare()", run, plan=plan_tiles, workspace=_workspace
        )
    ),
    fidelity=Fidelity(
        modelled="A decode wrapper re-planned only in the forward path, which replays never "
        "run: every replay reduces with the warm-up plan's tile counts.",
        stands_in=("a per-row tile count in a workspace for FlashInfer's FA2 decode plan",),
        fix="The merged fix re-plans every graph wrapper in prepare(), before each replay (the "
        "bed's plan hook, run eagerly before every step).",
    ),
)
