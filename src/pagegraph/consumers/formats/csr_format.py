"""The "csr" reader format: FlashInfer's ``kv_indptr`` / ``kv_indices`` / ``kv_last_page_len``,
built in the step's graph from the builder's page table and ``cache_seqlens`` by torch ops
(``build_csr``), read by ``csr_decode_attention``. ``kv_indices`` past every row's span keeps
what it held: the stale entries the bench poisons beside the table's tails.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..attention_reference import csr_rows
from ..paged_attention import csr_decode_attention
from .spec import Metadata, ReaderFormat, Row, register_format

__all__ = ["CSR", "build_csr"]


def build_csr(
    page_table: torch.Tensor,
    cache_seqlens: torch.Tensor,
    page_size: int,
    *,
    kv_pages: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    kv_last_page_len: torch.Tensor,
) -> None:
    """FlashInfer's CSR metadata from a page table, with torch ops only (no sync).

    page_table       ``[bs, width]`` int32, contiguous rows; row ``i``'s first
                     ``cdiv(cache_seqlens[i], page_size)`` entries (clamped to the width) live
    cache_seqlens    ``[bs]`` int32
    kv_pages         ``[>= bs]`` int32 scratch: each row's page count
    kv_indptr        ``[>= bs + 1]`` int32; entry 0 is 0 from allocation, entries
                     ``1..bs`` get the running sum of the page counts
    kv_indices       ``[max_bs * width + 1]`` int32: the live page ids, row after row; the
                     last entry is where the non-live entries of the table are scattered,
                     past every span a consumer is given
    kv_last_page_len ``[>= bs]`` int32: tokens in each row's last page (``1..page_size``)
    """
    bs, width = page_table.shape
    pages = kv_pages[:bs]
    torch.add(cache_seqlens[:bs], page_size - 1, out=pages)
    pages.div_(page_size, rounding_mode="floor").clamp_(0, width)
    torch.cumsum(pages, 0, dtype=torch.int32, out=kv_indptr[1 : bs + 1])
    last = kv_last_page_len[:bs]
    torch.sub(pages, 1, out=last)
    last.mul_(-page_size).add_(cache_seqlens[:bs])
    # The scatter's index and source are temporaries: inside a capture they come from the
    # graph's own pool, so the step allocates nothing at replay.
    cols = torch.arange(width, device=page_table.device)
    dest = kv_indptr[:bs, None].long() + cols[None, :]
    dump = kv_indices.shape[0] - 1
    dest = torch.where(cols[None, :] < pages[:, None], dest, dump)
    kv_indices.scatter_(0, dest.reshape(-1), page_table.reshape(-1))


def _allocate(max_bs: int, width: int, device: torch.device) -> Metadata:
    """``kv_pages`` (scratch) and ``kv_last_page_len`` ``[max_bs]``, ``kv_indptr``
    ``[max_bs + 1]`` (entry 0 stays 0) and ``kv_indices`` ``[max_bs * width + 1]`` (the last
    entry the scatter's dump) int32."""
    i32 = torch.int32
    return {
        "kv_pages": torch.zeros(max_bs, dtype=i32, device=device),
        "kv_indptr": torch.zeros(max_bs + 1, dtype=i32, device=device),
        "kv_indices": torch.zeros(max_bs * width + 1, dtype=i32, device=device),
        "kv_last_page_len": torch.zeros(max_bs, dtype=i32, device=device),
    }


def _build(
    meta: Metadata, page_table: torch.Tensor, cache_seqlens: torch.Tensor, page_size: int
) -> None:
    build_csr(
        page_table,
        cache_seqlens,
        page_size,
        kv_pages=meta["kv_pages"],
        kv_indptr=meta["kv_indptr"],
        kv_indices=meta["kv_indices"],
        kv_last_page_len=meta["kv_last_page_len"],
    )


def _given_indices(meta: Metadata) -> torch.Tensor:
    """What the consumer is given of ``kv_indices``: every entry but the scatter's dump."""
    return meta["kv_indices"][:-1]


def _arguments(
    meta: Metadata, page_table: torch.Tensor, cache_seqlens: torch.Tensor
) -> tuple[torch.Tensor, ...]:
    bs = page_table.shape[0]
    return (
        meta["kv_indptr"][: bs + 1],
        _given_indices(meta),
        meta["kv_last_page_len"][:bs],
    )


def _rows(args: Sequence[torch.Tensor], page_size: int, bs: int) -> list[Row]:
    kv_indptr, kv_indices, kv_last_page_len = args
    return csr_rows(kv_indptr, kv_indices, kv_last_page_len, page_size, bs)


def _stale(meta: Metadata) -> tuple[torch.Tensor, ...]:
    return (_given_indices(meta),)


def _overread_visible(lens: Sequence[int], page_size: int, width: int) -> bool:
    """``kv_indices`` past the last span names the NaN page whatever the lengths."""
    return True


CSR = register_format(
    ReaderFormat(
        name="csr",
        kernel=csr_decode_attention,
        arguments=_arguments,
        rows=_rows,
        overread_visible=_overread_visible,
        past_row="CSR's kv_indices past its span",
        allocate=_allocate,
        build=_build,
        stale=_stale,
    )
)
