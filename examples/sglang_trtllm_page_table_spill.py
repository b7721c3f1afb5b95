"""SGLang's build_trtllm_mha_page_table writes an overlong row's pages into the NEXT row.

Reproducer for an upstream issue, in plain torch with eager calls (no pagegraph):

    python examples/sglang_trtllm_page_table_spill.py

Exit status 1 while the bug is there, 0 once it is fixed. On a machine without a GPU it runs
the kernel under Triton's CPU interpreter.

The kernel ``create_trtllm_mha_kv_indices_triton`` (``sglang/kernels/ops/attention/
trtllm_mha_page_table.py``) runs on a grid of ``(bs, cdiv(width, 4096 // page_size))``
programs, each writing a block of ``4096 // page_size`` pages masked only by
``page < cdiv(seq_len, page_size)``. Nothing bounds the writes by the table's width, so a row
whose ``seq_len`` exceeds ``width * page_size`` writes its extra pages at
``row * stride + page``, i.e. into the first columns of the next row of a contiguous table
(or past the end of the buffer when it is the last row), whenever the width is not a
multiple of the block. Lengths past the table happen in practice: speculative decoding adds
draft tokens to ``seq_lens`` (``req_to_token`` is allocated wider than the context for
them), and dummy or stale rows carry arbitrary lengths. The fused graph-metadata kernel in
``trtllm_mha_graph_metadata.py`` clamps pages to ``max_seq_pages``; this one does not.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import torch

if not torch.cuda.is_available():
    # Before Triton is first imported: run the kernel on CPU tensors.
    os.environ.setdefault("TRITON_INTERPRET", "1")

PAGE_SIZE = 64
# 100 pages a row: not a multiple of the kernel's 4096 // 64 = 64-page block, so the grid
# covers 128 columns of each row.
WIDTH = 100
# The overlong row: 3 pages past the width, as a dummy row or a verify step can have.
OVERLONG_PAGES = 3
# SGLang pads a CUDA-graph bucket with rows of length 1 (its "fill value").
NEXT_ROW_LEN = 1
POISON = -1


def load_sglang_builder():
    """``build_trtllm_mha_page_table``, from SGLang's kernel file loaded by path (the sglang
    package's ``__init__`` needs the whole serving stack, and is never imported)."""
    key = "sglang_kernel_file_trtllm_mha_page_table"
    module = sys.modules.get(key)
    if module is None:
        spec = importlib.util.find_spec("sglang")
        if spec is None or not spec.submodule_search_locations:
            raise SystemExit("sglang is not installed: pip install --no-deps sglang==0.5.23")
        base = Path(next(iter(spec.submodule_search_locations)))
        path = base / "kernels" / "ops" / "attention" / "trtllm_mha_page_table.py"
        file_spec = importlib.util.spec_from_file_location(key, path)
        module = importlib.util.module_from_spec(file_spec)
        sys.modules[key] = module
        file_spec.loader.exec_module(module)
    return module.build_trtllm_mha_page_table


def _pool(device) -> torch.Tensor:
    """``req_to_token`` ``[3, ctx + 8 pages]`` int32: row 0 the dummy request, rows 1 and 2
    own distinct pages (request r's page p is page ``1000 * r + p``)."""
    cols = (WIDTH + OVERLONG_PAGES + 8) * PAGE_SIZE
    pages = torch.arange(cols // PAGE_SIZE, dtype=torch.int32)
    rows = [(1000 * r + pages) * PAGE_SIZE for r in range(3)]
    slots = torch.stack(rows).repeat_interleave(PAGE_SIZE, dim=1)
    return (slots + torch.arange(cols, dtype=torch.int32) % PAGE_SIZE).to(device)


def reproduce(build_fn, device) -> list[str]:
    """Build a two-row page table with ``build_fn`` (a builder with SGLang's / pagegraph's
    positional signature) and return one line per entry that differs from the correct table:
    row 0 (request 1) is 3 pages longer than the width, row 1 (request 2) has length 1, every
    entry starts as -1. ``[]`` for a correct builder."""
    req_to_token = _pool(device)
    req_pool_indices = torch.tensor([1, 2], dtype=torch.int32, device=device)
    seq_lens = torch.tensor(
        [(WIDTH + OVERLONG_PAGES) * PAGE_SIZE, NEXT_ROW_LEN], dtype=torch.int32, device=device
    )
    page_table = torch.full((2, WIDTH), POISON, dtype=torch.int32, device=device)
    build_fn(req_to_token, req_pool_indices, seq_lens, page_table, PAGE_SIZE)
    if page_table.is_cuda:
        torch.cuda.synchronize()

    expected = torch.full((2, WIDTH), POISON, dtype=torch.int32)
    expected[0] = 1000 + torch.arange(WIDTH, dtype=torch.int32)  # clamped to the width
    expected[1, : -(-NEXT_ROW_LEN // PAGE_SIZE)] = 2000
    got = page_table.cpu()
    found = []
    for row, col in (got != expected).nonzero().tolist():
        value, want = int(got[row, col]), int(expected[row, col])
        origin = ""
        if row == 1 and value - 1000 >= WIDTH:
            origin = f": page {value - 1000} of row 0 (request 1), past its width {WIDTH}"
        found.append(f"page_table[{row}, {col}] = {value}, expected {want}{origin}")
    return found


def main() -> int:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    build = load_sglang_builder()
    found = reproduce(build, device)
    print(
        f"build_trtllm_mha_page_table, page_size {PAGE_SIZE}, table [2, {WIDTH}] int32 "
        f"(block of {4096 // PAGE_SIZE} pages), on {device}:\n"
        f"  row 0: seq_len {(WIDTH + OVERLONG_PAGES) * PAGE_SIZE} = {WIDTH + OVERLONG_PAGES} "
        f"pages > width {WIDTH}; row 1: seq_len {NEXT_ROW_LEN} (1 page)"
    )
    if not found:
        print("OK: no entry outside row 0's own width was written.")
        return 0
    print(f"BUG: {len(found)} wrong entries:")
    for line in found:
        print("  " + line)
    print(
        "Row 0's pages past the width land in row 1 (out offset = row * stride + page, masked "
        "only by seq_len). Column 0 of row 1 is that row's live page and a race between the "
        "two rows' programs: when row 0's program writes last, request 2 attends to a page of "
        "request 1. "
        "Expected: pages clamped to the table's width, as update_trtllm_mha_graph_metadata "
        "does with max_seq_pages."
    )
    return 1


if __name__ == "__main__":
    sys.exit(main())
