"""vLLM #20301: FA3's ahead-of-time scheduler asked, at run time, for more splits than the
split buffers captured with the graph hold (the fix passes ``num_splits``, an upper bound, at
capture and at run time alike).

The reader, planned as FA3's AoT scheduling under full CUDA graphs: ``plan()`` (host, before
each step, as vLLM's metadata builder calls ``get_scheduler_metadata``) picks ``num_splits``
from the host lengths and writes it into the scheduler's buffer; the split partials
(``out_accum``, ``m_accum``, ``l_accum``, split axis first as FA3's ``out_accum``) are sized
once, at capture, for the split count the heuristic gave the capture's batch. The captured run
is persistent over the most splits a row could ask for: split ``s`` of every row, live while
``s < num_splits`` (a device value), covers ``cdiv(len, num_splits)`` tokens and writes its
partial at ``s * stride`` of the split buffers, unmasked against their size, as a kernel's
pointer arithmetic does; the combine reads the partials back. Buggy: the heuristic's count,
uncapped, against buffers sized for the capture's one split. Fixed (#20301): the buffers sized
for ``MAX_NUM_SPLITS`` and the scheduler capped at it.
"""

from __future__ import annotations

import torch

from ...consumers.reader import HostBatch, Reader
from ...kernels.contract import cdiv
from ..range_attention import merge, partials, token_kv
from ..wild_bug import Fidelity, Twin, WildBug

#: Tokens of the longest row the heuristic gives one split (FA3's heuristic picks more splits
#: for longer rows when the batch is small).
SPLIT_TOKENS = 64
#: The upper bound the fix passes at capture and at run time (vLLM's
#: ``_DEFAULT_MAX_NUM_SPLITS_FOR_CUDA_GRAPH`` then).
MAX_NUM_SPLITS = 16


def heuristic_splits(host: HostBatch) -> int:
    """FA3's split heuristic, as modelled: one split per ``SPLIT_TOKENS`` of the longest row
    (one at capture, whose rows hold one token)."""
    return max(1, cdiv(host.max_len, SPLIT_TOKENS))


def _split_buffers(
    splits: int, max_bs: int, num_q_heads: int, head_dim: int, device: torch.device
) -> dict[str, torch.Tensor]:
    f32 = torch.float32
    return {
        "num_splits": torch.ones(1, dtype=torch.int32, device=device),
        "out_accum": torch.zeros((splits, max_bs, num_q_heads, head_dim), dtype=f32, device=device),
        "m_accum": torch.zeros((splits, max_bs, num_q_heads), dtype=f32, device=device),
        "l_accum": torch.zeros((splits, max_bs, num_q_heads), dtype=f32, device=device),
    }


def workspace_at_capture_splits(
    max_bs: int,
    width: int,
    page_size: int,
    device: torch.device,
    *,
    num_q_heads: int,
    head_dim: int,
) -> dict[str, torch.Tensor]:
    """Buggy: split buffers for the splits the heuristic gives the capture's batch."""
    capture = HostBatch((1,) * max_bs, max_bs, page_size, width)
    return _split_buffers(heuristic_splits(capture), max_bs, num_q_heads, head_dim, device)


def workspace_for_upper_bound(
    max_bs: int,
    width: int,
    page_size: int,
    device: torch.device,
    *,
    num_q_heads: int,
    head_dim: int,
) -> dict[str, torch.Tensor]:
    """Fixed: split buffers for ``MAX_NUM_SPLITS``, the bound passed at capture."""
    return _split_buffers(MAX_NUM_SPLITS, max_bs, num_q_heads, head_dim, device)


def plan_uncapped(host: HostBatch, workspace: dict[str, torch.Tensor]) -> None:
    """Buggy scheduler: the heuristic's split count for this batch."""
    workspace["num_splits"].fill_(heuristic_splits(host))


def plan_capped(host: HostBatch, workspace: dict[str, torch.Tensor]) -> None:
    """Fixed scheduler: the heuristic's split count, at most ``MAX_NUM_SPLITS``."""
    workspace["num_splits"].fill_(min(heuristic_splits(host), MAX_NUM_SPLITS))


def _pointer(t: torch.Tensor) -> torch.Tensor:
    """A flat view from ``t``'s first entry to the end of its allocation: what a kernel's
    pointer into ``t`` can address (the bed's canary after a workspace tensor included)."""
    n = t.untyped_storage().nbytes() // t.element_size() - t.storage_offset()
    return t.as_strided((n,), (1,), t.storage_offset())


def _slot(t: torch.Tensor, s: int, bs: int) -> torch.Tensor | None:
    """Rows ``:bs`` of split ``s`` of a split buffer ``t`` (split axis first), addressed as
    ``s * t.stride(0)`` from its start whatever ``t``'s size; None past its allocation (on a
    GPU an illegal address, not modelled)."""
    ptr, stride = _pointer(t), t.stride(0)
    if (s + 1) * stride > ptr.numel():
        return None
    return ptr[s * stride : (s + 1) * stride].view(t.shape[1:])[:bs]


def fa3_aot_run(
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
    """The captured run (shapes as ``paged_decode_attention``'s; ``workspace``, pagegraph's
    split-K buffers, unused; ``plan``: the scheduler's buffers, module docstring)."""
    bs, num_q_heads, head_dim = q.shape
    width, dev = page_table.shape[1], q.device
    capacity = width * page_size
    slots = cdiv(capacity, SPLIT_TOKENS)  # the most splits a schedule asks for: the grid
    n = plan["num_splits"].long()  # [1], on the device
    lens = cache_seqlens[:bs].long().clamp(0, capacity)
    chunk = (lens + n - 1) // n
    rows = torch.arange(bs, device=dev)
    span = torch.arange(capacity, device=dev)
    ms, ls, accs = [], [], []
    for s in range(slots):
        start = s * chunk
        pos = start[:, None] + span[None, :]
        live_split = n > s  # [1]
        live = (pos < torch.minimum(start + chunk, lens)[:, None]) & live_split[:, None]
        k, v = token_kv(k_cache, v_cache, page_table, rows, pos, page_size)
        m, total, acc = partials(q, k, v, live, head_dim**-0.5)
        parts = []
        for name, new in (("m_accum", m), ("l_accum", total), ("out_accum", acc)):
            slot = _slot(plan[name], s, bs)
            if slot is None:
                break
            mask = live_split.reshape((1,) * new.dim())
            slot.copy_(torch.where(mask, new, slot))  # split s writes only while s < n
            parts.append(slot)
        if len(parts) < 3:
            break
        # The combine reads the partials back; a split past num_splits holds no token.
        ms.append(torch.where(live_split[:, None], parts[0], float("-inf")))
        ls.append(torch.where(live_split[:, None], parts[1], 0.0))
        accs.append(torch.where(live_split[:, None, None], parts[2], 0.0))
    o = merge(torch.stack(ms, 1), torch.stack(ls, 1), torch.stack(accs, 1), dim=1)
    return out.copy_(o)


BUG = WildBug(
    key="vllm-20301",
    engine="vLLM",
    version="V1, mid-2025 (FlashAttention-3 AoT scheduling under full CUDA graphs)",
    ref="vllm-project/vllm#20301",
    state="merged",
    bug_class="b",
    symptom="Illegal memory access with full CUDA graphs and FA3 ahead-of-time scheduling, "
    "which had been disabled under full graphs for it.",
    cause="The split buffers were sized at capture for the heuristic's split count on the "
    "capture's batch; at run time the AoT scheduler asked for more splits, written past them.",
    prop="reader stays inside its workspace",
    buggy=Twin(
        reader=Reader(
            "FA3 AoT, run-time num_splits past the capture's",
            fa3_aot_run,
            plan=plan_uncapped,
            workspace=workspace_at_capture_splits,
        )
    ),
    fixed=Twin(
        reader=Reader(
            "FA3 AoT, num_splits upper bound at capture and run time",
            fa3_aot_run,
            plan=plan_capped,
            workspace=workspace_for_upper_bound,
        )
    ),
    fidelity=Fidelity(
        modelled="split buffers sized at capture for the capture batch's split count, a "
        "run-time schedule (planned on the host each step, read on the device) asking for "
        "more splits, and split partials written at split * stride past the buffers' end",
        stands_in=(
            "one split per 64 tokens of the longest row for FA3's SM-occupancy heuristic",
            "a persistent torch loop over the most splits a row can ask for for FA3's "
            "dynamic tile scheduler",
            "the bed's workspace canary for the memory after out_accum (an illegal address "
            "on a GPU)",
        ),
        fix="vllm-project/vllm#20301: num_splits (an upper bound, 16) passed at capture and "
        "at run time, so the buffers captured hold every split the scheduler may ask for",
        refs=("vllm-project/vllm#25495", "vllm-project/vllm#25274"),
    ),
)
