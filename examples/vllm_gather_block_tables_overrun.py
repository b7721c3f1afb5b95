"""vLLM's _gather_block_tables_kernel writes past a batch row when num_blocks passes the width.

Reproducer for an upstream hardening report, in plain torch with eager calls (no pagegraph):

    python examples/vllm_gather_block_tables_overrun.py [FOLDER]

``FOLDER`` (optional) holds ``vllm/v1/worker/gpu/block_table.py``; without it the script uses
an installed ``vllm`` (located, never imported) or the ``.venv/vllm-lite`` / ``.device/vllm-lite``
folders of this repository. Exit status 1 while the kernel writes past the row, 0 once it
does not, 2 when vLLM's files are not found. On a machine without a GPU it runs the kernel
under Triton's CPU interpreter.

The input is OUTSIDE vLLM's contract. vLLM's host never lets a request's ``num_blocks`` pass
its row's capacity: ``BlockTables.append_block_ids`` raises ``RuntimeError`` first, and the
kernel relies on that (``max_num_blocks = stride``, and the copy loop is bounded by the
loaded ``num_blocks`` alone). This is no bug under vLLM's own rules; it shows what the kernel
does when that guarantee breaks (a host-side bug elsewhere, a stale or corrupted count, a
future caller with another layout): the copy runs past the request's source row into the
next request's blocks, and past the batch row into the next row of the persistent batch
table (or past the end of the buffer for its last row). Bounding the loop by the stride the
kernel already loads would keep a broken count inside its own row, as the padded-row branch
of the same kernel already does.

The launch is ``BlockTables.gather_block_tables``'s for one KV-cache group: grid
``(1, num_rows)``, the tables as ``[1]`` uint64 pointer tensors, their row stride as a ``[1]``
int64 tensor, ``num_blocks`` as ``[1, max_num_reqs]`` int32, no sliding-window masking,
``BLOCK_SIZE=1024``.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import sys
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

import torch

if not torch.cuda.is_available():
    # Before Triton is first imported: run the kernel on CPU tensors.
    os.environ.setdefault("TRITON_INTERPRET", "1")

VLLM_VERSION = "0.34.0"
KERNEL_FILE = "vllm/v1/worker/gpu/block_table.py"
HELPER_FILE = "vllm/v1/worker/gpu/buffer_utils.py"  # vLLM's _load_ptr, which the kernel calls
REPO = Path(__file__).resolve().parent.parent
LOCAL_FOLDERS = (REPO / ".device" / "vllm-lite", REPO / ".venv" / "vllm-lite")

MAX_NUM_REQS = 4  # request slots of the per-request block tables
WIDTH = 8  # max_num_blocks: the row stride of both tables
OVERRUN = 3  # blocks past the width in the broken count
# Batch row -> request slot, and each slot's num_blocks. The broken row is the batch's last
# real row, so what it writes past its row lands in the next row of the batch table, which
# this step does not use: no other program writes there, and the result is deterministic.
IDX_MAPPING = (2, 1)
NUM_BLOCKS = (3, WIDTH + OVERRUN, 5, 2)
BROKEN_ROW = 1
POISON = -1


def vllm_folder(given: str | None = None) -> Path:
    """The folder holding ``vllm/`` with both files: ``given`` alone when there is one, else an
    installed vllm, then this repository's local copies. ``SystemExit(2)`` naming the places
    tried when none has them."""
    if given:
        candidates = [Path(given)]
    else:
        spec = importlib.util.find_spec("vllm")  # does not run vllm's __init__
        found = (spec.submodule_search_locations or []) if spec is not None else []
        candidates = [Path(p).parent for p in found] + list(LOCAL_FOLDERS)
    for folder in candidates:
        if (folder / KERNEL_FILE).is_file() and (folder / HELPER_FILE).is_file():
            return folder
    print(
        f"vLLM {VLLM_VERSION}'s {KERNEL_FILE} not found (tried "
        f"{', '.join(str(c) for c in candidates)}): pip install --no-deps vllm=={VLLM_VERSION}",
        file=sys.stderr,
    )
    raise SystemExit(2)


def _interpreter_reads_loaded_scalars() -> None:
    """Triton's CPU interpreter turns a loaded scalar into a Python int (a loop bound) with
    ``int()`` on a one-element array, which NumPy 2.4 rejects; go through ``.item()`` instead.
    Nothing changes where NumPy still accepts it, nor on a GPU."""
    import numpy as np

    try:
        int(np.zeros(1, dtype=np.int64))
        return
    except TypeError:
        pass
    from triton.runtime import interpreter

    patch = interpreter._patch_lang_tensor
    if getattr(patch, "reads_items", False):
        return

    def patch_with_item(tensor, scope):
        patch(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    patch_with_item.reads_items = True
    interpreter._patch_lang_tensor = patch_with_item


def _stub(name: str, **attrs) -> ModuleType:
    module = ModuleType(name)
    module.__dict__.update(attrs)
    return module


def _not_used(name: str):
    def stand_in(*args, **kwargs):
        raise NotImplementedError(f"{name} is stubbed: only the gather kernel runs here")

    return stand_in


@contextmanager
def _modules(stand_ins: dict[str, ModuleType]):
    """``stand_ins`` in ``sys.modules`` while vLLM's files are executed, then whatever was
    there before (nothing, or a real vllm's modules) is put back."""
    saved = {name: sys.modules.get(name) for name in stand_ins}
    sys.modules.update(stand_ins)
    try:
        yield
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module


def _exec_file(key: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(key, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[key] = module  # under a private name only, never as vllm.*
    spec.loader.exec_module(module)
    return module


def load_vllm_gather(folder: str | Path | None = None):
    """vLLM's ``_gather_block_tables_kernel``, from ``block_table.py`` loaded by path (with
    ``buffer_utils.py``, whose ``_load_ptr`` it calls). The names the two files import from
    the rest of vLLM, which the kernel never touches, are answered by small stand-ins while
    the files run; the ``vllm`` package itself is never imported."""
    key = "vllm_kernel_file_block_table"
    if key in sys.modules:
        return sys.modules[key]._gather_block_tables_kernel
    root = Path(folder) if folder else vllm_folder()
    import triton
    import triton.language as tl

    if os.environ.get("TRITON_INTERPRET") == "1":
        _interpreter_reads_loaded_scalars()
    stand_ins = {
        "vllm.triton_utils": _stub("vllm.triton_utils", triton=triton, tl=tl),
        "vllm.logger": _stub("vllm.logger", init_logger=logging.getLogger),
        "vllm.utils.platform_utils": _stub(
            "vllm.utils.platform_utils",
            is_pin_memory_available=lambda: False,
            is_uva_available=lambda: False,
        ),
        "vllm.utils.torch_utils": _stub(
            "vllm.utils.torch_utils",
            TORCH_DTYPE_TO_ARRAY_TYPECODE={},
            get_accelerator_view_from_cpu_tensor=_not_used("get_accelerator_view_from_cpu_tensor"),
        ),
        "vllm.v1.conf_compute_utils": _stub(
            "vllm.v1.conf_compute_utils",
            register_inplace_h2d_target=_not_used("register_inplace_h2d_target"),
        ),
        # Read only by the slot-mapping kernel; vLLM's value.
        "vllm.v1.attention.backends.utils": _stub(
            "vllm.v1.attention.backends.utils", PAD_SLOT_ID=-1
        ),
    }
    with _modules(stand_ins):
        helpers = _exec_file("vllm_kernel_file_buffer_utils", root / HELPER_FILE)
        with _modules({"vllm.v1.worker.gpu.buffer_utils": helpers}):
            module = _exec_file(key, root / KERNEL_FILE)
    return module._gather_block_tables_kernel


def vllm_gather(kernel):
    """``gather(block_table, num_blocks, idx_mapping, out, num_rows)`` launching ``kernel`` as
    ``BlockTables.gather_block_tables`` does for one KV-cache group (``num_reqs`` is
    ``idx_mapping``'s length; rows ``num_reqs <= i < num_rows`` are padding)."""

    def gather(block_table, num_blocks, idx_mapping, out, num_rows):
        device = block_table.device
        assert block_table.stride(0) == out.stride(0), "vLLM's kernel has one stride for both"
        src_ptrs = torch.tensor([block_table.data_ptr()], dtype=torch.uint64, device=device)
        dst_ptrs = torch.tensor([out.data_ptr()], dtype=torch.uint64, device=device)
        strides = torch.tensor([block_table.stride(0)], dtype=torch.int64, device=device)
        reach = torch.zeros(1, dtype=torch.int32, device=device)  # no sliding window
        block_sizes = torch.full((1,), 16, dtype=torch.int32, device=device)  # not read
        counts = num_blocks.view(1, -1)  # [num_kv_cache_groups, max_num_reqs]
        kernel[(1, num_rows)](
            idx_mapping,
            src_ptrs,
            dst_ptrs,
            strides,
            counts,
            counts.stride(0),
            idx_mapping.shape[0],
            reach,
            reach,
            block_sizes,
            MASK_SLIDING_WINDOW=False,
            BLOCK_SIZE=1024,
        )

    return gather


def reproduce(gather_fn, device) -> list[str]:
    """Gather a two-row batch with ``gather_fn`` (the signature ``vllm_gather`` returns) into
    the first rows of a ``[MAX_NUM_REQS, WIDTH]`` batch table whose entries all start as -1,
    and return one line per entry written where nothing may be: in a batch row other than
    the broken one, a value other than its blocks; in a row past the batch, anything; in the
    per-request tables, anything. The broken row's own ``[0, WIDTH)`` may hold any value.
    ``[]`` for a gather that keeps the broken count inside its row."""
    # Request slot r owns blocks 100 * (r + 1) + p.
    blocks = 100 * torch.arange(1, MAX_NUM_REQS + 1).view(-1, 1) + torch.arange(WIDTH)
    source = blocks.to(torch.int32)
    block_table = source.to(device)
    num_blocks = torch.tensor(NUM_BLOCKS, dtype=torch.int32, device=device)
    idx_mapping = torch.tensor(IDX_MAPPING, dtype=torch.int32, device=device)
    out = torch.full((MAX_NUM_REQS, WIDTH), POISON, dtype=torch.int32, device=device)
    gather_fn(block_table, num_blocks, idx_mapping, out, len(IDX_MAPPING))
    if out.is_cuda:
        torch.cuda.synchronize()

    expected = torch.full((MAX_NUM_REQS, WIDTH), POISON, dtype=torch.int32)
    for row, slot in enumerate(IDX_MAPPING):
        n = min(NUM_BLOCKS[slot], WIDTH)
        expected[row, :n] = source[slot, :n]
    got = out.cpu()
    found = []
    for row, col in (got != expected).nonzero().tolist():
        if row == BROKEN_ROW:
            continue  # the broken row's own entries: out of contract, anything goes
        value = int(got[row, col])
        origin = ""
        if row == BROKEN_ROW + 1 and value // 100 >= 1:
            block = (row - BROKEN_ROW) * WIDTH + col
            origin = (
                f": block {block} of batch row {BROKEN_ROW}, read from request slot "
                f"{value // 100 - 1}'s row"
            )
        found.append(f"out[{row}, {col}] = {value}, expected {int(expected[row, col])}{origin}")
    if not torch.equal(block_table.cpu(), source):
        found.append("the per-request block table was written")
    return found


def main() -> int:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    folder = vllm_folder(sys.argv[1] if len(sys.argv) > 1 else None)
    found = reproduce(vllm_gather(load_vllm_gather(folder)), device)
    slot = IDX_MAPPING[BROKEN_ROW]
    print(
        f"vLLM {VLLM_VERSION} _gather_block_tables_kernel ({folder / KERNEL_FILE}), one KV-cache "
        f"group, tables [{MAX_NUM_REQS}, {WIDTH}] int32 (row stride {WIDTH} = max_num_blocks), "
        f"on {device}:\n"
        f"  batch of {len(IDX_MAPPING)} rows, idx_mapping {list(IDX_MAPPING)}; num_blocks of "
        f"request slot {slot} (batch row {BROKEN_ROW}, the last) = {NUM_BLOCKS[slot]}, "
        f"{OVERRUN} past the row stride.\n"
        "  Outside vLLM's contract: BlockTables.append_block_ids refuses such a count, so vLLM's "
        "own host never launches this; a hardening report, not a bug under vLLM's rules."
    )
    if not found:
        print(f"OK: nothing was written outside batch row {BROKEN_ROW}'s own [0, {WIDTH}).")
        return 0
    print(f"BUG: {len(found)} entries written outside batch row {BROKEN_ROW}'s own row:")
    for line in found:
        print("  " + line)
    print(
        "The copy loop runs to the loaded num_blocks (mask offset < num_blocks): it reads past "
        "the request's source row into the next request's blocks and writes past the batch "
        "row into the next row of the batch table (past the buffer for its last row). "
        "Expected, as defence in depth: the count bounded by max_num_blocks (the stride the "
        "kernel already loads), e.g. num_blocks = tl.minimum(num_blocks, max_num_blocks), "
        "as the padded-row branch bounds its stores."
    )
    return 1


if __name__ == "__main__":
    sys.exit(main())
