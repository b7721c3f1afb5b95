"""SGLang's build_trtllm_mha_page_table writes the SWA page table with the FULL table's stride.

Reproducer for an upstream issue, in plain torch with eager calls (no pagegraph):

    python examples/sglang_trtllm_swa_stride.py

Exit status 1 while the bug is there, 0 once it is fixed. On a machine without a GPU it runs
the kernel under Triton's CPU interpreter.

``build_trtllm_mha_page_table(..., swa_page_table=, full_to_swa=)`` passes only
``page_table.stride(0)`` to the kernel, which stores row ``i`` of both tables at
``i * page_table_stride + page``. An SWA table with its own row stride (here a
``[bs, width]`` column slice of a buffer 8 columns wider, as a table padded for alignment or
shared with a wider layout would be; equally a separate allocation of another width) gets
every row after the first at the wrong address: row 1's SWA pages land in row 0's padding,
and its own row keeps stale values. Nothing asserts that the strides match. SGLang's
backends today allocate both tables alike, so this is latent, but the function's signature
accepts any pair of tables, and a smaller SWA stride than the full one writes past the SWA
buffer's end.
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

PAGE_SIZE = 16
WIDTH = 10
SWA_PAD = 8  # the SWA table's row stride is WIDTH + SWA_PAD
LENS = (4 * PAGE_SIZE, 3 * PAGE_SIZE - 5)
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


def reproduce(build_fn, device) -> list[str]:
    """Build full and SWA tables for two rows with ``build_fn`` (SGLang's / pagegraph's
    signature, SWA by keyword) and return one line per SWA-buffer entry that differs from the
    correct one, padding included. ``[]`` for a correct builder."""
    cols = (WIDTH + 2) * PAGE_SIZE
    # Request r's page p is page 100 * r + p; full slot s maps to SWA slot s + 7 * PAGE_SIZE.
    slots = [(100 * r * PAGE_SIZE + torch.arange(cols)) for r in range(3)]
    req_to_token = torch.stack(slots).to(torch.int32).to(device)
    full_to_swa = (torch.arange(3 * 100 * PAGE_SIZE + 1) + 7 * PAGE_SIZE).to(device)
    req_pool_indices = torch.tensor([1, 2], dtype=torch.int32, device=device)
    seq_lens = torch.tensor(LENS, dtype=torch.int32, device=device)
    page_table = torch.full((2, WIDTH), POISON, dtype=torch.int32, device=device)
    swa_buffer = torch.full((2, WIDTH + SWA_PAD), POISON, dtype=torch.int32, device=device)
    swa_page_table = swa_buffer[:, :WIDTH]
    build_fn(
        req_to_token,
        req_pool_indices,
        seq_lens,
        page_table,
        PAGE_SIZE,
        swa_page_table=swa_page_table,
        full_to_swa=full_to_swa,
    )
    if swa_buffer.is_cuda:
        torch.cuda.synchronize()

    expected = torch.full((2, WIDTH + SWA_PAD), POISON, dtype=torch.int32)
    for row, length in enumerate(LENS):
        n = -(-length // PAGE_SIZE)
        expected[row, :n] = 100 * (row + 1) + 7 + torch.arange(n, dtype=torch.int32)
    got = swa_buffer.cpu()
    found = []
    for row, col in (got != expected).nonzero().tolist():
        where = "padding" if col >= WIDTH else "table"
        found.append(
            f"swa buffer[{row}, {col}] ({where}) = {int(got[row, col])}, "
            f"expected {int(expected[row, col])}"
        )
    return found


def main() -> int:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    build = load_sglang_builder()
    found = reproduce(build, device)
    print(
        f"build_trtllm_mha_page_table with SWA, page_size {PAGE_SIZE}, on {device}:\n"
        f"  page_table [2, {WIDTH}] contiguous (row stride {WIDTH}); swa_page_table "
        f"[2, {WIDTH}] with row stride {WIDTH + SWA_PAD}; seq_lens {list(LENS)}"
    )
    if not found:
        print("OK: the SWA table was written at its own row stride.")
        return 0
    print(f"BUG: {len(found)} wrong entries in the SWA buffer:")
    for line in found:
        print("  " + line)
    print(
        "Row 1 of the SWA table was written at 1 * page_table.stride(0), inside row 0's "
        "padding, and its own entries were left stale. Expected: the kernel takes "
        "swa_page_table.stride(0), or the wrapper asserts the two strides are equal."
    )
    return 1


if __name__ == "__main__":
    sys.exit(main())
