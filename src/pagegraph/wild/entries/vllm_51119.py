"""vLLM #51119: on ROCm, the AITER Gluon MLA decode sized its split-KV parallelism
(``NUM_KV_SPLITS``) from the host ``min_kv_seq_len``; FULL graphs were captured with dummy rows
of one token, so every replay ran the one-split grid the capture recorded, whatever the real
lengths (the PR uses a saturated split bucket under graphs; ROCm/aiter#4507 sizes the splits from
the page table, a static bound).

Modelled as a split-KV decode reader whose split count is a launch argument: ``min(MAX_SPLITS,
cdiv(min_len, BLOCK_N))`` from the batch's shortest host length (buggy: one split at capture,
more in an eager call on the same rows), or from the page table's capacity (fixed: the same at
capture and at every call). Each split covers an equal share of its row's key blocks and the
partials merge; both counts are correct attention, in another order (each split's
probabilities rounded to bf16 against its own max for the PV product, as a tensor-core kernel
does). Property
"replay equals eager, bitwise" (the scenario declares ``bitwise = true``).
"""

from __future__ import annotations

import torch

from ...consumers.reader import HostBatch, Reader
from ...kernels.contract import cdiv
from ..range_attention import merge, partials, token_kv
from ..wild_bug import Fidelity, Twin, WildBug

#: Tokens of one key block (the kernel's BLOCK_N).
BLOCK_N = 16
#: The most splits the workspace holds.
MAX_SPLITS = 8


def split_kv_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    page_table: torch.Tensor,
    cache_seqlens: torch.Tensor,
    out: torch.Tensor,
    *,
    page_size: int,
    workspace: object,
    num_kv_splits: int,
) -> torch.Tensor:
    """Split ``s`` of row ``i`` covers key blocks ``[s * nb_i, (s + 1) * nb_i)``, ``nb_i =
    cdiv(cdiv(len_i, BLOCK_N), num_kv_splits)``, below the row's length; the partials merge
    per row (``num_kv_splits``: a host int, the launch's grid)."""
    bs, num_q_heads, head_dim = q.shape
    dev, width = q.device, page_table.shape[1]
    cap = width * page_size
    splits = num_kv_splits
    span = cdiv(cdiv(cap, BLOCK_N), splits) * BLOCK_N
    lens = cache_seqlens[:bs].long().clamp(0, cap)
    per_split = torch.div(lens + BLOCK_N - 1, BLOCK_N, rounding_mode="floor")
    per_split = torch.div(per_split + splits - 1, splits, rounding_mode="floor") * BLOCK_N
    s = torch.arange(splits, device=dev)[None, :, None]
    t = torch.arange(span, device=dev)[None, None, :]
    pos = s * per_split[:, None, None] + t
    live = (t < per_split[:, None, None]) & (pos < lens[:, None, None])
    rows = torch.arange(bs, device=dev).repeat_interleave(splits)
    k, v = token_kv(k_cache, v_cache, page_table, rows, pos.reshape(bs * splits, span), page_size)
    live = live.reshape(bs * splits, span)
    # Each split's probabilities rounded to the cache's dtype for the PV product, as the
    # MFMA takes them: the result depends on the split's own max.
    m, total, acc = partials(q[rows], k, v, live, head_dim**-0.5, pv_dtype=k_cache.dtype)
    shape = (bs, splits, num_q_heads)
    o = merge(m.reshape(shape), total.reshape(shape), acc.reshape(*shape, head_dim), dim=1)
    return out.copy_(o)


def _splits_for(tokens: int) -> int:
    return max(1, min(MAX_SPLITS, cdiv(tokens, BLOCK_N)))


def splits_from_min_kv_seq_len(host: HostBatch) -> dict[str, int]:
    """Buggy: the split count from the shortest row on the host (one token at capture)."""
    return {"num_kv_splits": _splits_for(min(host.lens, default=1))}


def splits_from_page_table(host: HostBatch) -> dict[str, int]:
    """Fixed: the split count from the page table's capacity, a static bound."""
    return {"num_kv_splits": _splits_for(host.capacity)}


BUG = WildBug(
    key="vllm-51119",
    engine="vLLM",
    version="ROCm build with AITER Gluon MLA, August 2026 (Kimi-K3 TP8, FULL CUDA graphs)",
    ref="vllm-project/vllm#51119",
    state="closed (unmerged; ROCm/aiter#4507 proposed sizing the splits from the page table)",
    bug_class="b",
    symptom="Under FULL CUDA graphs the MLA decode always runs one KV split (a grid of "
    "batch_size workgroups, 3% occupancy at long context): replays run another schedule than "
    "an eager call on the same batch would.",
    cause="The AITER wrapper picked NUM_KV_SPLITS from the host min_kv_seq_len, which the "
    "capture's dummy rows set to 1; the captured grid, workspace and stage topology stay, and "
    "replays never call the wrapper again.",
    prop="replay equals eager, bitwise",
    buggy=Twin(
        reader=Reader("splits from min_kv_seq_len", split_kv_decode, splits_from_min_kv_seq_len)
    ),
    fixed=Twin(
        reader=Reader("splits from the page table", split_kv_decode, splits_from_page_table)
    ),
    fidelity=Fidelity(
        modelled="a split-KV decode whose split count (the launch's grid) comes from a host "
        "length of the batch, one token at capture: replays keep the capture's one split while "
        "an eager call on the same rows splits by the real lengths",
        stands_in=(
            "plain-torch split attention (BLOCK_N 16, at most 8 splits) for the Gluon MLA "
            "kernel's two stages; its PV product rounds each split's probabilities to bf16, as "
            "an MFMA with bf16 inputs would (assumed, not read from the kernel)",
            "the bitwise difference of replay and eager for the latency upstream measured (both "
            "schedules compute the same attention, in another order)",
        ),
        fix="the fixed twin follows ROCm/aiter#4507: NUM_KV_SPLITS from the page table's width "
        "(host-known, static, capture-safe); #51119 itself first forced a saturated "
        "min_kv_seq_len under graphs, later runtime buckets with MLA run eagerly",
        refs=("ROCm/aiter#4507",),
    ),
)
