"""SGLang's create_flashinfer_kv_indices_triton copies an overlong row whole: past the end of
kv_indices, and from past the end of the request's req_to_token row.

Reproducer for an upstream issue, in plain torch with eager calls (no pagegraph):

    python examples/sglang_flashinfer_kv_indices_overflow.py

Exit status 1 while the bug is there, 0 once it is fixed. On a machine without a GPU it runs
the kernel under Triton's CPU interpreter.

SGLang's FlashInfer backend builds a decode step's CSR in its CUDA graph as
``kv_indptr[1 : bs + 1] = cumsum(seq_lens)`` followed by ``create_flashinfer_kv_indices_triton
[(bs,)]`` (``sglang/kernels/ops/attention/kv_indices.py``), into a ``kv_indices`` buffer of
``max_bs * max_context_len`` entries. Each program copies ``req_to_token[req, 0 : seq_len]``
to ``kv_indices[kv_indptr[i] :]``, masked only by ``seq_len``: nothing bounds a length by the
request's row of ``req_to_token`` nor the batch's total by the buffer. One length past the
context (a stale or dummy row, a miscounted verify step) reads the next request's slots and,
in a full batch, writes past the end of ``kv_indices``; a length near 2^31 writes gigabytes
past it (an illegal memory access on the GPU). The row-by-row page-table kernels bound their
writes by the row's width, the fused ``update_trtllm_mha_graph_metadata`` by
``max_seq_pages``.
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

MAX_CONTEXT_LEN = 1000
BS = 2
# SGLang's req_to_token rows are 4 tokens longer than the context (extra_max_context_len).
R2T_COLS = MAX_CONTEXT_LEN + 4
# Row 1 is this many tokens past its request's req_to_token row.
OVERLONG = 6
GUARD = 64  # entries after kv_indices, in the same allocation: must stay untouched
POISON = -1


def _interpreter_accepts_loaded_bounds() -> None:
    """Under Triton's CPU interpreter a scalar the kernel loads is a one-element array, and
    the interpreter's ``range`` bound goes through ``int(array)``, which NumPy 2.4 refuses:
    convert through ``.item()`` instead (a GPU run never comes here)."""
    import numpy as np

    try:
        int(np.ones(1, dtype=np.int32))
        return
    except TypeError:
        pass
    from triton.runtime import interpreter

    original = interpreter._patch_lang_tensor

    def patch(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.item()))

    interpreter._patch_lang_tensor = patch


def load_sglang_builder():
    """A builder ``build(req_to_token, req_pool_indices, seq_lens, kv_indptr, kv_indices)``
    that does what SGLang's FlashInfer backend does for a decode step (the cumsum, then the
    kernel on a ``(bs,)`` grid), from SGLang's kernel file loaded by path (the sglang
    package's ``__init__`` needs the whole serving stack, and is never imported)."""
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
    if os.environ.get("TRITON_INTERPRET") == "1":
        _interpreter_accepts_loaded_bounds()

    def build(req_to_token, req_pool_indices, seq_lens, kv_indptr, kv_indices):
        bs = seq_lens.shape[0]
        kv_indptr[1 : bs + 1] = torch.cumsum(seq_lens, dim=0)
        module.create_flashinfer_kv_indices_triton[(bs,)](
            req_to_token,
            req_pool_indices,
            seq_lens,
            kv_indptr,
            None,
            kv_indices,
            req_to_token.stride(0),
        )

    return build


def reproduce(build_fn, device) -> list[str]:
    """Build the CSR of a full two-row batch with ``build_fn`` (the signature
    ``load_sglang_builder`` returns) and return one line per problem: an entry of the guard
    after ``kv_indices`` written, or a live entry that is not the row's own slot. Row 0
    (request 1) is at the context length, row 1 (request 2) ``OVERLONG`` tokens past its
    request's ``req_to_token`` row. ``[]`` for a builder that bounds both."""
    # Request r owns slots 100000 * r + t; row 3 is a request that is not in the batch.
    slots = torch.arange(R2T_COLS, dtype=torch.int32)
    req_to_token = torch.stack([100000 * r + slots for r in range(4)]).to(device)
    req_pool_indices = torch.tensor([1, 2], dtype=torch.int32, device=device)
    lengths = [MAX_CONTEXT_LEN, R2T_COLS + OVERLONG]
    seq_lens = torch.tensor(lengths, dtype=torch.int32, device=device)
    capacity = BS * MAX_CONTEXT_LEN  # SGLang's cuda_graph_kv_indices: max_bs * context
    storage = torch.full((capacity + GUARD,), POISON, dtype=torch.int32, device=device)
    kv_indptr = torch.zeros(BS + 1, dtype=torch.int32, device=device)
    build_fn(req_to_token, req_pool_indices, seq_lens, kv_indptr, storage[:capacity])
    if storage.is_cuda:
        torch.cuda.synchronize()
    got = storage.cpu()
    found = []
    for j in (got[capacity:] != POISON).nonzero().flatten().tolist():
        value = int(got[capacity + j])
        found.append(
            f"kv_indices[{capacity + j}] = {value}: {j + 1} entries past the end of the "
            f"{capacity}-entry buffer (request {value // 100000}'s slot {value % 100000})"
        )
    start = MAX_CONTEXT_LEN
    for t in range(min(lengths[1], capacity - start)):
        value = int(got[start + t])
        if value // 100000 != 2:
            found.append(
                f"kv_indices[{start + t}] = {value}: row 1's token {t} is request "
                f"{value // 100000}'s slot {value % 100000}, read past request 2's row"
            )
    return found


def main() -> int:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    found = reproduce(load_sglang_builder(), device)
    print(
        f"create_flashinfer_kv_indices_triton on {device}: req_to_token rows of {R2T_COLS} "
        f"slots, kv_indices of {BS} x {MAX_CONTEXT_LEN} entries (max_bs x context, as SGLang "
        f"sizes it); row 0: seq_len {MAX_CONTEXT_LEN}, row 1: seq_len {R2T_COLS + OVERLONG} "
        f"({OVERLONG} past its request's row)"
    )
    if not found:
        print("OK: nothing read past a request's row, nothing written past kv_indices.")
        return 0
    print(f"BUG: {len(found)} problem(s):")
    for line in found[:12]:
        print("  " + line)
    if len(found) > 12:
        print(f"  ... {len(found) - 12} more")
    print(
        "Each program copies seq_len slots masked only by seq_len. Expected: lengths clamped "
        "to the request's row (req_to_token's width) and the batch cut at the end of "
        "kv_indices, as the page-table kernels bound rows by their width."
    )
    return 1


if __name__ == "__main__":
    sys.exit(main())
