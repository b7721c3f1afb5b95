"""vLLM 0.34.0's _compute_slot_mappings_kernel reads past a ring group's row (vLLM #53982).

Reproducer for an upstream report, in plain torch with eager calls (no pagegraph):

    python examples/vllm_slot_mapping_ring_row.py [FOLDER]

``FOLDER`` (optional) holds ``vllm/v1/worker/gpu/block_table.py``; without it the script uses
an installed ``vllm`` (located, never imported) or the ``.venv/vllm-lite`` / ``.device/vllm-lite``
folders of this repository. Exit status 1 while the kernel reads a block id from outside the
request's own row, 0 once it does not, 2 when vLLM's files are not found. On a machine
without a GPU it runs the kernel under Triton's CPU interpreter.

The launch is ``BlockTables.compute_slot_mappings``'s over two KV-cache groups in one grid
``(2, num_reqs + 1)``: group 0 a full-attention group (16-token blocks, 4 a row), group 1 a
ring of one 8-token block a request (as vLLM's ``CircularBufferSpec`` and ``KpoolTailSpec``:
``max_num_blocks_per_req == 1``), both with their slot mapping enabled, ``BlockTables``'
default (``slot_mapping_enabled=None``). A request longer than 8 tokens has positions past
the ring's row: the kernel takes ``pos // block_size`` as the column with no ``< row width``
mask and loads the next requests' blocks. With ``slot_mapping_enabled=[True, False]`` (the
runner's opt-out, vLLM #53781, #57317) the ring group gets ``PAD_SLOT_ID`` and nothing is read;
the script shows both.
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
BLOCK_SIZES = (16, 8)  # group 0: full attention; group 1: the ring
WIDTHS = (4, 1)  # max_num_blocks of each group: the ring holds one block a request
IDX_MAPPING = (0, 1)  # batch row -> request slot
POSITIONS = (20, 5)  # one decode token a row: row 0 is past the ring's 8 tokens
MAX_NUM_TOKENS = 4
PAD_SLOT_ID = -1


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
        raise NotImplementedError(f"{name} is stubbed: only the slot-mapping kernel runs here")

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


def load_vllm_slot_mappings(folder: str | Path | None = None):
    """vLLM's ``_compute_slot_mappings_kernel``, from ``block_table.py`` loaded by path (with
    ``buffer_utils.py``, whose ``_load_ptr`` it calls). The names the two files import from
    the rest of vLLM, which the kernel never touches, are answered by small stand-ins while
    the files run; the ``vllm`` package itself is never imported."""
    key = "vllm_kernel_file_block_table_slots"
    if key in sys.modules:
        return sys.modules[key]._compute_slot_mappings_kernel
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
        # vLLM's value (the kernel's PAD_ID).
        "vllm.v1.attention.backends.utils": _stub(
            "vllm.v1.attention.backends.utils", PAD_SLOT_ID=-1
        ),
    }
    with _modules(stand_ins):
        helpers = _exec_file("vllm_kernel_file_buffer_utils", root / HELPER_FILE)
        with _modules({"vllm.v1.worker.gpu.buffer_utils": helpers}):
            module = _exec_file(key, root / KERNEL_FILE)
    return module._compute_slot_mappings_kernel


def compute_slot_mappings(kernel, tables, idx_mapping, positions, enabled):
    """``slot_mappings`` ``[2, MAX_NUM_TOKENS]`` int64 from ``kernel`` launched as
    ``BlockTables.compute_slot_mappings`` does (no context parallelism)."""
    device = tables[0].device
    ptrs = torch.tensor([t.data_ptr() for t in tables], dtype=torch.uint64, device=device)
    strides = torch.tensor([t.stride(0) for t in tables], dtype=torch.int64, device=device)
    sizes = torch.tensor(BLOCK_SIZES, dtype=torch.int32, device=device)
    enabled = torch.tensor(enabled, dtype=torch.bool, device=device)
    sharded = torch.ones(len(tables), dtype=torch.bool, device=device)
    qsl = torch.arange(len(IDX_MAPPING) + 1, dtype=torch.int32, device=device)  # 1 token a row
    out = torch.full((len(tables), MAX_NUM_TOKENS), -7, dtype=torch.int64, device=device)
    kernel[(len(tables), len(IDX_MAPPING) + 1)](
        MAX_NUM_TOKENS,
        idx_mapping,
        qsl,
        positions,
        ptrs,
        strides,
        sizes,
        enabled,
        sharded,
        out,
        out.stride(0),
        0,
        CP_SIZE=1,
        CP_INTERLEAVE=1,
        PAD_ID=PAD_SLOT_ID,
        TRITON_BLOCK_SIZE=1024,
    )
    if out.is_cuda:
        torch.cuda.synchronize()
    return out.cpu()


def reproduce(kernel, device, enabled=(True, True)) -> tuple[list[str], list[str]]:
    """Map the batch with both groups (``enabled``: each group's ``slot_mapping_enabled``);
    return the lines of slots whose block came from outside the request's own row, and a
    line a token of what each group's mapping holds. Request slot ``r`` of group ``g`` owns
    blocks ``1000 * (g + 1) + 100 * r + p``."""
    tables = [
        (1000 * (g + 1) + 100 * torch.arange(MAX_NUM_REQS).view(-1, 1) + torch.arange(w))
        .to(torch.int32)
        .to(device)
        for g, w in enumerate(WIDTHS)
    ]
    idx = torch.tensor(IDX_MAPPING, dtype=torch.int32, device=device)
    pos = torch.tensor(POSITIONS, dtype=torch.int64, device=device)
    got = compute_slot_mappings(kernel, tables, idx, pos, list(enabled))
    bad, shown = [], []
    for g, (size, width) in enumerate(zip(BLOCK_SIZES, WIDTHS)):
        for t, (slot, p) in enumerate(zip(IDX_MAPPING, POSITIONS)):
            value = int(got[g, t])
            own = tables[g][slot].cpu().tolist()
            ring = own[(p // size) % width] * size + p % size
            shown.append(
                f"group {g}, token {t} (request slot {slot}, position {p}): {value}"
                f" (the group's own mapping: {ring})"
            )
            if value != PAD_SLOT_ID and value // size not in own:
                bad.append(
                    f"group {g}, token {t}: slot {value} is block {value // size}, not in "
                    f"request slot {slot}'s row {own} (column {p // size} of a row "
                    f"{width} wide)"
                )
    return bad, shown


def main() -> int:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    folder = vllm_folder(sys.argv[1] if len(sys.argv) > 1 else None)
    kernel = load_vllm_slot_mappings(folder)
    print(
        f"vLLM {VLLM_VERSION} _compute_slot_mappings_kernel ({folder / KERNEL_FILE}) on {device}:"
        f" two KV-cache groups, block sizes {list(BLOCK_SIZES)}, rows {list(WIDTHS)} blocks wide"
        f" (group 1 a one-block ring); idx_mapping {list(IDX_MAPPING)}, positions "
        f"{list(POSITIONS)}."
    )
    opted_out, _ = reproduce(kernel, device, enabled=(True, False))
    print(
        f"  ring group disabled (slot_mapping_enabled=[True, False]): "
        f"{'reads outside its row' if opted_out else 'PAD, nothing read past the row'}"
    )
    found, shown = reproduce(kernel, device)
    print("  both groups enabled (BlockTables' default, slot_mapping_enabled=None):")
    for line in shown:
        print("    " + line)
    if not found:
        print("OK: every slot's block comes from its request's own row.")
        return 0
    print(f"BUG: {len(found)} slot(s) read a block from outside the request's own row:")
    for line in found:
        print("  " + line)
    print(
        "The kernel loads block_table[req, pos // block_size] masked by token validity only: "
        "for a group narrower than the sequence the column runs past the row into the next "
        "requests' rows (vLLM #53982; the guard of PR #54296, block_indices < "
        "block_table_stride with PAD_SLOT_ID, is not in this version). A ring's slot is its "
        "own mapping, modulo its width; the generic kernel must not map it (#56469, #57317)."
    )
    return 1


if __name__ == "__main__":
    sys.exit(main())
