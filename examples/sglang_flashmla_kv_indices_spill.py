"""SGLang's create_flashmla_kv_indices_triton writes an overlong row's pages into the NEXT row.

Reproducer for an upstream issue, in plain torch with eager calls (no pagegraph):

    python examples/sglang_flashmla_kv_indices_spill.py

Exit status 1 while the bug is there, 0 once it is fixed. On a machine without a GPU it runs
the kernel under Triton's CPU interpreter.

``FlashMLABackend`` fills its CUDA-graph block table ``cuda_graph_kv_indices`` (``[max_bs,
(max_context_len + 64) // 64]`` int32) with ``create_flashmla_kv_indices_triton`` (``sglang/
kernels/ops/attention/kv_indices.py``) on a grid of ``(bs, get_num_kv_index_blocks_flashmla(
row stride, 64))`` programs. Each program writes a block of ``4096 // 64 = 64`` pages at
``row * stride + page``, masked only by ``page < cdiv(seq_len, 64)``: nothing bounds the
writes by the table's width. A row whose ``seq_len`` exceeds ``width * 64`` tokens therefore
writes its extra pages into the first columns of the next row (or past the end of the buffer
for the last row) whenever the width is not a multiple of 64 pages, which SGLang's width
rarely is: a 50,000-token context gives 782 pages. The backend sizes the table so that an
in-contract length fits; a length past it (a stale or dummy row, a miscounted verify step)
then corrupts another request's table instead of failing alone. The trtllm_mha page-table
kernel has the same mask (``examples/sglang_trtllm_page_table_spill.py``); the fused
``update_trtllm_mha_graph_metadata`` clamps pages to ``max_seq_pages``.
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

PAGE_SIZE = 64  # FlashMLA's, and the kernel's default PAGED_SIZE
MAX_CONTEXT_LEN = 50000
# FlashMLABackend.init_cuda_graph_state's width: 782 pages, not a multiple of the kernel's
# 4096 // 64 = 64-page block, so the grid covers 832 columns of each row.
WIDTH = (MAX_CONTEXT_LEN + PAGE_SIZE) // PAGE_SIZE
# The overlong row: 3 pages past the width.
OVERLONG_PAGES = 3
# SGLang pads a CUDA-graph bucket with rows of length 1 (its "fill value").
NEXT_ROW_LEN = 1
POISON = -1


def load_sglang_builder():
    """A builder with pagegraph's positional signature that launches SGLang's
    ``create_flashmla_kv_indices_triton`` exactly as ``FlashMLABackend``'s CUDA-graph path
    does, from SGLang's kernel file loaded by path (the sglang package's ``__init__`` needs
    the whole serving stack, and is never imported)."""
    key = "sglang_kernel_file_kv_indices"
    module = sys.modules.get(key)
    if module is None:
        spec = importlib.util.find_spec("sglang")
        if spec is None or not spec.submodule_search_locations:
            raise SystemExit("sglang is not installed: pip install --no-deps sglang==0.5.23")
        base = Path(next(iter(spec.submodule_search_locations)))
        path = base / "kernels" / "ops" / "attention" / "kv_indices.py"
        file_spec = importlib.util.spec_from_file_location(key, path)
        module = importlib.util.module_from_spec(file_spec)
        sys.modules[key] = module
        file_spec.loader.exec_module(module)

    def build(req_to_token, req_pool_indices, seq_lens, block_kv_indices, page_size):
        blocks = module.get_num_kv_index_blocks_flashmla(block_kv_indices.stride(0), page_size)
        module.create_flashmla_kv_indices_triton[(seq_lens.shape[0], blocks)](
            req_to_token,
            req_pool_indices,
            seq_lens,
            None,
            block_kv_indices,
            req_to_token.stride(0),
            block_kv_indices.stride(0),
            PAGED_SIZE=page_size,
        )

    return build


def _pool(device) -> torch.Tensor:
    """``req_to_token`` ``[3, ctx + 8 pages]`` int32: row 0 the dummy request, rows 1 and 2
    own distinct pages (request r's page p is page ``1000 * r + p``)."""
    cols = (WIDTH + OVERLONG_PAGES + 8) * PAGE_SIZE
    pages = torch.arange(cols // PAGE_SIZE, dtype=torch.int32)
    rows = [(1000 * r + pages) * PAGE_SIZE for r in range(3)]
    slots = torch.stack(rows).repeat_interleave(PAGE_SIZE, dim=1)
    return (slots + torch.arange(cols, dtype=torch.int32) % PAGE_SIZE).to(device)


def reproduce(build_fn, device) -> list[str]:
    """Build a two-row block table with ``build_fn`` (a builder with pagegraph's positional
    signature) and return one line per entry that differs from the correct table: row 0
    (request 1) is 3 pages longer than the width, row 1 (request 2) has length 1, every entry
    starts as -1. ``[]`` for a correct builder."""
    req_to_token = _pool(device)
    req_pool_indices = torch.tensor([1, 2], dtype=torch.int64, device=device)
    seq_lens = torch.tensor(
        [(WIDTH + OVERLONG_PAGES) * PAGE_SIZE, NEXT_ROW_LEN], dtype=torch.int32, device=device
    )
    table = torch.full((2, WIDTH), POISON, dtype=torch.int32, device=device)
    build_fn(req_to_token, req_pool_indices, seq_lens, table, PAGE_SIZE)
    if table.is_cuda:
        torch.cuda.synchronize()

    expected = torch.full((2, WIDTH), POISON, dtype=torch.int32)
    expected[0] = 1000 + torch.arange(WIDTH, dtype=torch.int32)  # clamped to the width
    expected[1, : -(-NEXT_ROW_LEN // PAGE_SIZE)] = 2000
    got = table.cpu()
    found = []
    for row, col in (got != expected).nonzero().tolist():
        value, want = int(got[row, col]), int(expected[row, col])
        origin = ""
        if row == 1 and value - 1000 >= WIDTH:
            origin = f": page {value - 1000} of row 0 (request 1), past its width {WIDTH}"
        found.append(f"block_kv_indices[{row}, {col}] = {value}, expected {want}{origin}")
    return found


def main() -> int:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    build = load_sglang_builder()
    found = reproduce(build, device)
    print(
        f"create_flashmla_kv_indices_triton, page_size {PAGE_SIZE}, block_kv_indices "
        f"[2, {WIDTH}] int32 (max_context_len {MAX_CONTEXT_LEN}; block of "
        f"{4096 // PAGE_SIZE} pages), on {device}:\n"
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
        "Row 0's pages past the width land in row 1 (out offset = pid * kv_indices_ptr_stride "
        "+ page, masked only by seq_len). Column 0 of row 1 is that row's live page and a race "
        "between the two rows' programs: when row 0's program writes last, request 2 attends "
        "to a page of request 1. "
        "Expected: pages clamped to the row (the kernel has kv_indices_ptr_stride; a width "
        "argument, like update_trtllm_mha_graph_metadata's max_seq_pages, would bound them by "
        "the table's width)."
    )
    return 1


if __name__ == "__main__":
    sys.exit(main())
