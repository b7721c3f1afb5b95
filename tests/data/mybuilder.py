"""The README's example builder, ``mybuilder.py`` (a plain-torch page-table builder), as a
user would save it."""

import torch

_work = {}


def _buf(name, shape, dtype, device):
    key = (name, shape, dtype, device)
    if key not in _work:
        _work[key] = torch.empty(shape, dtype=dtype, device=device)
    return _work[key]


def _write(table, live, slots, page_size):
    """table = slots // page_size where live; every other entry is written back unchanged."""
    ids = _buf("ids", tuple(slots.shape), torch.int64, table.device)
    ids.copy_(slots).div_(page_size, rounding_mode="floor")
    torch.where(live, ids, table, out=ids)
    table.copy_(ids)


def build(
    req_to_token,
    req_pool_indices,
    seq_lens,
    page_table,
    page_size,
    *,
    swa_page_table=None,
    full_to_swa=None,
):
    bs, width = page_table.shape
    dev, i64 = page_table.device, torch.int64
    # live[i, p] = p < cdiv(seq_lens[i], page_size): nothing for seq_len <= 0 or past the width
    cols = torch.arange(width, out=_buf("cols", (width,), i64, dev))
    pages = _buf("pages", (bs, 1), i64, dev).copy_(seq_lens[:bs, None])
    pages.add_(page_size - 1).div_(page_size, rounding_mode="floor")
    live = torch.lt(cols, pages, out=_buf("live", (bs, width), torch.bool, dev))
    # each row's slot at every page start (a request index outside req_to_token is clamped)
    rows = _buf("rows", (bs,), i64, dev).copy_(req_pool_indices[:bs])
    rows.clamp_(0, req_to_token.shape[0] - 1)
    starts = req_to_token[:, ::page_size][:, :width]  # a view, not a copy
    slots = torch.index_select(starts, 0, rows, out=_buf("slots", (bs, width), starts.dtype, dev))
    _write(page_table, live, slots, page_size)
    if full_to_swa is not None:
        idx = _buf("idx", (bs, width), i64, dev).copy_(slots).clamp_(0, len(full_to_swa) - 1)
        swa = _buf("swa", (bs * width,), full_to_swa.dtype, dev)
        torch.index_select(full_to_swa, 0, idx.view(-1), out=swa)
        _write(swa_page_table, live, swa.view(bs, width), page_size)
