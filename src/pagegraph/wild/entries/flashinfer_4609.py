"""FlashInfer #4609: ``trtllm_ragged_attention_deepseek`` decided whether any row of the batch was
empty by reading its lengths off the device with ``.item()``, a host sync inside the captured
attention call (#3779 added the check and a guard refusing capture without CPU length mirrors,
which #4609 reports; #4703 skips the device readback in capture).

Modelled as a decode step's reader: before the attention it asks whether any row has no key to
attend (its empty-row path zeroes those rows), either through ``.item()`` on the device lengths
(buggy) or from the host lengths the engine already holds (fixed: the CPU mirrors
``q_seq_lens_cpu`` / ``kv_seq_lens_cpu`` the API takes, computed before the launch). Property
"sync-free reader": the device readback is named by file:line on the CPU and on CUDA.
"""

from __future__ import annotations

import torch

from ...consumers import DecodeWorkspace, paged_decode_attention
from ...consumers.reader import HostBatch, Reader
from ..wild_bug import Fidelity, Twin, WildBug


def _attend(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    page_table: torch.Tensor,
    cache_seqlens: torch.Tensor,
    out: torch.Tensor,
    page_size: int,
    workspace: DecodeWorkspace | None,
    empty_rows: bool,
) -> None:
    """Paged decode attention; with ``empty_rows`` (a host bool) the rows without a key are
    zeroed after it (the empty-row path, with static shapes)."""
    paged_decode_attention(
        q, k_cache, v_cache, page_table, cache_seqlens, out, page_size=page_size,
        workspace=workspace,
    )  # fmt: skip
    if empty_rows:
        active = (cache_seqlens[: q.shape[0]] > 0)[:, None, None]
        out.copy_(torch.where(active, out, torch.zeros((), dtype=out.dtype, device=out.device)))


def empty_rows_read_on_device(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    page_table: torch.Tensor,
    cache_seqlens: torch.Tensor,
    out: torch.Tensor,
    *,
    page_size: int,
    workspace: DecodeWorkspace | None,
) -> None:
    """Buggy: whether a row is empty read back from the device lengths (``.item()``)."""
    active = cache_seqlens[: q.shape[0]] > 0
    empty_rows = bool((~active).any().item())
    _attend(q, k_cache, v_cache, page_table, cache_seqlens, out, page_size, workspace, empty_rows)


def empty_rows_from_host(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    page_table: torch.Tensor,
    cache_seqlens: torch.Tensor,
    out: torch.Tensor,
    *,
    page_size: int,
    workspace: DecodeWorkspace | None,
    empty_rows: bool,
) -> None:
    """Fixed: whether a row is empty given by the host (the CPU length mirrors)."""
    _attend(q, k_cache, v_cache, page_table, cache_seqlens, out, page_size, workspace, empty_rows)


def _host_mirrors(host: HostBatch) -> dict[str, bool]:
    """The empty-row test on the host lengths the engine holds before the launch."""
    return {"empty_rows": any(n <= 0 for n in host.lens)}


BUG = WildBug(
    key="flashinfer-4609",
    engine="FlashInfer",
    version="main at d898ed0 through 4fa40ae (B300 / GB300, BatchPrefillWithRaggedKVCacheWrapper)",
    ref="flashinfer-ai/flashinfer#4609",
    state="closed (fixed by #4703)",
    bug_class="c",
    symptom="CUDA graph capture of the ragged-KV attention raises 'q_seq_lens_cpu and "
    "kv_seq_lens_cpu must be provided during CUDA graph capture' (fine at d69ab74).",
    cause="The empty-row compaction added in #3779 read q_lens / kv_lens off the device and "
    "called .item() to decide whether any row was empty: a device-to-host sync in the "
    "attention call, illegal in capture, so capture without CPU mirrors was refused.",
    prop="sync-free reader",
    buggy=Twin(reader=Reader("empty rows read back with .item()", empty_rows_read_on_device)),
    fixed=Twin(
        reader=Reader("empty rows from the host mirrors", empty_rows_from_host, _host_mirrors)
    ),
    fidelity=Fidelity(
        modelled="the attention wrapper's own device-to-host readback (.item() on the device "
        "lengths) deciding whether any row is empty, on every call, inside the captured step",
        stands_in=(
            "paged decode attention for the TRT-LLM ragged (prefill) kernel; kv lengths only "
            "(a decode row's query length is 1)",
            "zeroing the empty rows with static shapes for the compaction of the active rows",
        ),
        fix="#4703 skips the readback inside capture when no CPU mirrors are given (all rows "
        "taken as active); the fixed twin takes the route #3779 keeps for callers that pass "
        "q_seq_lens_cpu / kv_seq_lens_cpu: the test made on host lengths, no readback",
        refs=("flashinfer-ai/flashinfer#4703",),
    ),
)
