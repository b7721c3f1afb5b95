"""The expected tables of a batch, in plain torch: a vectorised ``reference_page_table`` that
tests and benchmarks compare builders with (the checker's own verification, on the device and
batched, is ``pagegraph.check.judges.verify.TableVerifier``)."""

from __future__ import annotations

import torch

from .contract import POISON, cdiv


def expected_tables(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    width: int,
    page_size: int,
    full_to_swa: torch.Tensor | None = None,
    fill: int = POISON,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Vectorised ``reference_page_table`` into fresh ``[bs, width]`` int32 tables filled with
    ``fill`` outside the live entries (tested equal to the row-by-row oracle).

    ``req_to_token``: ``[max_reqs, cols]`` int32/int64; ``req_pool_indices``, ``seq_lens``:
    ``[bs]`` int32/int64; ``full_to_swa``: ``[slots + 1]`` int32/int64 or None. Returns the
    page table and the SWA page table (None without ``full_to_swa``)."""
    bs = seq_lens.shape[0]
    dev = req_to_token.device
    cap = min(width, cdiv(req_to_token.shape[1], page_size))
    n = ((seq_lens.to(torch.int64).clamp(min=0) + page_size - 1) // page_size).clamp(max=cap)
    rows = req_pool_indices.to(torch.int64).clamp(0, req_to_token.shape[0] - 1)
    cols = torch.arange(cap, device=dev)
    live = cols[None, :] < n[:, None]
    slots = req_to_token[rows[:, None], (cols * page_size)[None, :]].to(torch.int64)
    table = torch.full((bs, width), fill, dtype=torch.int32, device=dev)
    table[:, :cap] = torch.where(live, slots // page_size, fill).to(torch.int32)
    swa = None
    if full_to_swa is not None:
        swa_slots = full_to_swa[slots.clamp(0, full_to_swa.shape[0] - 1)].to(torch.int64)
        swa = torch.full((bs, width), fill, dtype=torch.int32, device=dev)
        swa[:, :cap] = torch.where(live, swa_slots // page_size, fill).to(torch.int32)
    return table, swa
