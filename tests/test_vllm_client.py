"""Invariant: pagegraph's vLLM adapters run vLLM 0.34.0's own block-table kernels (loaded by
path, a few imports stubbed, no ``vllm`` module ever made) and, on in-contract inputs, write
exactly what the oracles and pagegraph's builders write, and nothing outside the contract's
region; their pointer tensors are made once per set of buffers; where vLLM's kernels assume
more than the contracts, a test pins the difference down next to pagegraph's builder passing
the same input; the standalone reproducer in ``examples/`` of the gather's overrun (outside
vLLM's contract) is shown to flag vLLM's kernel, pass pagegraph's builder and exit 1.

Without vLLM's files, every test that needs them skips with the reason.
"""

from __future__ import annotations

import ast
import importlib.util
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch.overrides import TorchFunctionMode

from pagegraph.clients import vllm as vl
from pagegraph.clients import vllm_files as vf
from pagegraph.kernels.block_table import gather_block_tables
from pagegraph.kernels.slot_mapping import PAD_SLOT_ID, compute_slot_mappings
from pagegraph.kernels.vllm_reference import reference_block_table, reference_slot_mapping
from pagegraph.kinds import BatchContext

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
REASON = vl.vllm_unavailable_reason()
needs_vllm = pytest.mark.skipif(REASON is not None, reason=f"vLLM unavailable: {REASON}")
CANARY = -31337
M = 4  # canary rows (entries) around each output: a view M rows in stays 16-byte aligned


# -- the loader ----------------------------------------------------------------------------


def test_unavailable_reason_names_the_places_tried(monkeypatch, tmp_path):
    monkeypatch.setenv(vf.ENV_VAR, str(tmp_path))
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a)
    )
    monkeypatch.setattr(vf, "_ROOT", tmp_path)
    reason = vf.vllm_unavailable_reason()
    assert reason is not None and "\n" not in reason
    assert str(tmp_path) in reason and "fetch_vllm_files.sh" in reason
    assert not vf.vllm_available()
    with pytest.raises(vf.VLLMUnavailable, match="not found"):
        vf.vllm_root()


@needs_vllm
def test_env_var_folder_is_searched_first(monkeypatch, tmp_path):
    found = vf.vllm_root()
    monkeypatch.setenv(vf.ENV_VAR, str(found))
    assert vf.vllm_root() == found
    # A folder without the files is passed over, and the next place is used.
    monkeypatch.setenv(vf.ENV_VAR, str(tmp_path))
    assert vf.vllm_root() == found


def test_pad_slot_id_is_read_from_vllms_file(tmp_path):
    target = tmp_path / vf.PAD_SLOT_FILE
    assert vf.pad_slot_id(tmp_path) == -1  # missing file
    target.parent.mkdir(parents=True)
    target.write_text("import vllm.config\nPAD_SLOT_ID = -7\n")
    assert vf.pad_slot_id(tmp_path) == -7


@needs_vllm
def test_kernels_load_once_and_never_make_a_vllm_module():
    first = vf.load_vllm_kernels()
    again = vf.load_vllm_kernels()
    assert again.gather is first.gather and again.slot_mappings is first.slot_mappings
    assert first.pad_slot_id == vf.pad_slot_id(first.root) == -1
    assert not [k for k in sys.modules if k == "vllm" or k.startswith("vllm.")]
    assert sys.modules["pagegraph_vllm_file_block_table"].__file__.startswith(str(first.root))


@needs_vllm
def test_stubbed_imports_are_exactly_what_the_files_import_from_vllm():
    """Every ``from vllm.X import name`` of the two files is stubbed or is the other file."""
    imported = set()
    for rel in vf.KERNEL_FILES:
        tree = ast.parse((vf.vllm_root() / rel).read_text())
        for node in tree.body:
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("vllm"):
                imported |= {f"{node.module}.{a.name}" for a in node.names}
    own = {n for n in imported if n.startswith("vllm.v1.worker.gpu.buffer_utils.")}
    assert imported - own == set(vf.STUBBED_IMPORTS)
    assert vl.STUBBED_IMPORTS is vf.STUBBED_IMPORTS


def test_importer_never_uses_sys_modules_for_vllm(monkeypatch):
    """A planted ``vllm.triton_utils`` in ``sys.modules`` is not what the files get, an
    unstubbed vLLM import fails naming the module, and other imports pass through."""
    answer = SimpleNamespace(tl="stub")
    monkeypatch.setitem(sys.modules, "vllm.triton_utils", SimpleNamespace(tl="planted"))
    importer = vf._importer({"vllm.triton_utils": answer})
    assert importer("vllm.triton_utils", fromlist=("tl",)) is answer
    with pytest.raises(ImportError, match="vllm.platforms"):
        importer("vllm.platforms", fromlist=("current_platform",))
    with pytest.raises(ImportError, match="vllm"):
        importer("vllm")
    assert importer("math") is sys.modules["math"]


@needs_vllm
def test_builders_are_named_and_typed_for_the_checker():
    assert vl.VLLM_BUILDERS == {
        "vllm_gather_block_tables": vl.vllm_gather_block_tables,
        "vllm_compute_slot_mappings": vl.vllm_compute_slot_mappings,
    }
    assert vl.vllm_gather_block_tables.pagegraph_outputs == "block_table"
    assert vl.vllm_compute_slot_mappings.pagegraph_outputs == "slot_mapping"
    assert vl.TESTED_VERSION == "0.34.0"


# -- gather: agreement ---------------------------------------------------------------------


def gather_case(seed, num_reqs, num_rows, width, stride=None):
    """Seeded inputs with both tables of row stride ``stride`` (the width by default) and
    ``out`` inside ``M`` canary rows above and below (and canary columns past the width)."""
    gen = torch.Generator().manual_seed(seed)
    stride = stride or width
    max_bs, max_reqs = num_rows + 3, num_rows + 8
    src = torch.randint(1, 1 << 24, (max_reqs, stride), generator=gen, dtype=torch.int32)
    table = src.to(DEVICE)[:, :width]
    counts = torch.randint(0, width + 1, (max_reqs,), generator=gen, dtype=torch.int32)
    counts[:2] = torch.tensor([0, width])
    idx = torch.randperm(max_reqs, generator=gen)[:max_bs].to(torch.int32)
    big = torch.full((max_bs + 2 * M, stride), CANARY, dtype=torch.int32)
    big[M:-M, :width] = torch.randint(1, 1 << 24, (max_bs, width), generator=gen, dtype=torch.int32)
    big = big.to(DEVICE)
    out = big[M:-M, :width]
    batch = BatchContext(num_reqs, num_rows, max_bs)
    return table, counts.to(DEVICE), idx.to(DEVICE), big, out, batch


@needs_vllm
@pytest.mark.parametrize(
    "seed, num_reqs, num_rows, width",
    [(1, 3, 4, 5), (2, 7, 8, 300), (3, 13, 16, 1300), (4, 0, 2, 2100), (5, 13, 13, 1025)],
)
def test_vllm_gather_matches_oracle_and_builder(seed, num_reqs, num_rows, width):
    table, counts, idx, big, out, batch = gather_case(seed, num_reqs, num_rows, width)
    results = {}
    for name, fn in (
        ("vllm", vl.vllm_gather_block_tables),
        ("pagegraph", gather_block_tables),
        ("oracle", reference_block_table),
    ):
        buf = big.clone()
        fn(table, counts, idx, buf[M:-M, : out.shape[1]], batch=batch)
        results[name] = buf
    assert torch.equal(results["vllm"], results["oracle"])
    assert torch.equal(results["pagegraph"], results["oracle"])
    assert torch.all(results["vllm"][:M] == CANARY) and torch.all(results["vllm"][-M:] == CANARY)


@needs_vllm
def test_vllm_gather_refuses_unequal_strides():
    table, counts, idx, _, out, batch = gather_case(6, 3, 4, 9, stride=12)
    narrow = torch.zeros((out.shape[0], 9), dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match="requires equal row strides.*12 and 9"):
        vl.vllm_gather_block_tables(table, counts, idx, narrow, batch=batch)


@needs_vllm
def test_vllm_adapters_refuse_tables_off_16_byte_boundaries():
    table, counts, idx, big, out, batch = gather_case(12, 3, 4, 5)
    off = big[1:-1, :5]  # 20 bytes past the buffer's start
    with pytest.raises(ValueError, match="out to start on a 16-byte boundary"):
        vl.vllm_gather_block_tables(table, counts, idx, off[: out.shape[0]], batch=batch)
    base = torch.zeros(table.shape[0] + 1, 5, dtype=torch.int32, device=DEVICE)
    shifted = base[1:]
    shifted.copy_(table)
    with pytest.raises(ValueError, match="block_table to start on a 16-byte boundary"):
        vl.vllm_gather_block_tables(shifted, counts, idx, out, batch=batch)
    args, slots = slots_case(12, 3, 16, 5)
    with pytest.raises(ValueError, match="block_table to start on a 16-byte boundary"):
        vl.vllm_compute_slot_mappings(shifted, *args[1:], slots[M:-M], 16)
    # The aligned twins run.
    vl.vllm_gather_block_tables(table, counts, idx, out, batch=batch)
    vl.vllm_compute_slot_mappings(*args, slots[M:-M], 16)


# -- gather: where vLLM assumes more than the contract -------------------------------------


@needs_vllm
def test_vllm_gather_zeroes_padded_rows_up_to_the_stride():
    """Tables with padding columns (stride > width): vLLM's padded rows are zeroed over the
    whole stride, past the width; pagegraph's builder writes only the width."""
    width, stride = 9, 12
    table, counts, idx, big, out, batch = gather_case(7, 3, 5, width, stride=stride)
    got = {}
    for name, fn in (("vllm", vl.vllm_gather_block_tables), ("pagegraph", gather_block_tables)):
        buf = big.clone()
        fn(table, counts, idx, buf[M:-M, :width], batch=batch)
        got[name] = buf[M:-M, width:]  # the padding columns
    assert torch.all(got["pagegraph"] == CANARY)
    assert torch.all(got["vllm"][3:5] == 0) and torch.all(got["vllm"][:3] == CANARY)
    assert torch.all(got["vllm"][5:] == CANARY)


@needs_vllm
def test_vllm_gather_trusts_num_blocks():
    """A count past the width (a broken host guarantee) on the last real row: vLLM copies past
    the request's row (into the next slot's) and writes past the batch row, into the first
    row past ``num_rows``; pagegraph's builder clamps the count to the width."""
    width = 9
    table, counts, idx, big, out, batch = gather_case(8, 3, 3, width)
    slot = next(s for s in range(table.shape[0] - 1) if s not in idx[:2].tolist())
    idx[2] = slot
    counts[slot] = width + 4
    want = big.clone()
    reference_block_table(table, counts, idx, want[M:-M, :width], batch=batch)
    got = {}
    for name, fn in (("vllm", vl.vllm_gather_block_tables), ("pagegraph", gather_block_tables)):
        buf = big.clone()
        fn(table, counts, idx, buf[M:-M, :width], batch=batch)
        got[name] = buf
    assert torch.equal(got["pagegraph"], want)
    spilled = got["vllm"] != want
    assert spilled.nonzero().tolist() == [[M + 3, c] for c in range(4)]
    assert torch.equal(got["vllm"][M + 3, :4], table[slot + 1, :4])


# -- the reproducer in examples/ -------------------------------------------------------------

OVERRUN = Path(__file__).resolve().parents[1] / "examples" / "vllm_gather_block_tables_overrun.py"


def _overrun_example():
    key = "pagegraph_example_vllm_overrun"
    if key not in sys.modules:
        spec = importlib.util.spec_from_file_location(key, OVERRUN)
        module = importlib.util.module_from_spec(spec)
        sys.modules[key] = module
        spec.loader.exec_module(module)
    return sys.modules[key]


@needs_vllm
def test_overrun_reproducer_flags_vllm_and_passes_pagegraph():
    """The reproducer's gather is vLLM's own kernel, loaded by the script's own loader from the
    files pagegraph found: it writes the next batch row; pagegraph's builder stays in its row;
    and the script's stand-ins for vLLM's imports are gone once the files are loaded."""
    example = _overrun_example()

    def ours(block_table, num_blocks, idx_mapping, out, num_rows):
        batch = BatchContext(idx_mapping.shape[0], num_rows, out.shape[0])
        gather_block_tables(block_table, num_blocks, idx_mapping, out, batch=batch)

    assert example.reproduce(ours, DEVICE) == []
    found = example.reproduce(example.vllm_gather(example.load_vllm_gather(vf.vllm_root())), DEVICE)
    assert found and all(line.startswith("out[2, ") for line in found), found
    assert len(found) == example.OVERRUN
    assert not [k for k in sys.modules if k == "vllm" or k.startswith("vllm.")]


@needs_vllm
def test_overrun_reproducer_exits_1_and_stands_alone():
    done = subprocess.run(
        [sys.executable, str(OVERRUN), str(vf.vllm_root())],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "BUG" in done.stdout and "Outside vLLM's contract" in done.stdout
    source = OVERRUN.read_text()
    assert "import pagegraph" not in source and "from pagegraph" not in source


# -- slot mapping ----------------------------------------------------------------------------


def slots_case(seed, rows, page_size, width, long_row=0, spare=29):
    gen = torch.Generator().manual_seed(seed)
    max_reqs = rows + 4
    table = torch.randint(1, 1 << 24, (max_reqs, width), generator=gen, dtype=torch.int32)
    counts = torch.randint(0, 7, (rows,), generator=gen)
    if long_row:
        counts[rows // 2] = long_row
    qsl = torch.cat([torch.zeros(1, dtype=torch.int64), counts.cumsum(0)]).to(torch.int32)
    idx = torch.randperm(max_reqs, generator=gen)[:rows].to(torch.int32)
    idx[-1] = -1
    if rows > 3:
        idx[0] = -1
    total = int(qsl[-1])
    positions = torch.randint(0, width * page_size, (total,), generator=gen)
    big = torch.full((total + spare + 2 * M,), CANARY, dtype=torch.int64)
    big[M:-M] = torch.randint(0, 1 << 30, (total + spare,), generator=gen)
    args = [t.to(DEVICE) for t in (table, idx, qsl, positions)]
    return args, big.to(DEVICE)


@needs_vllm
@pytest.mark.parametrize(
    "seed, rows, page_size, width, long_row",
    [(1, 3, 16, 5, 0), (2, 7, 1, 300, 0), (3, 13, 16, 1300, 1500), (4, 13, 1, 2100, 2200)],
)
def test_vllm_slot_mapping_matches_oracle_and_builder(seed, rows, page_size, width, long_row):
    args, big = slots_case(seed, rows, page_size, width, long_row)
    results = {}
    for name, fn in (
        ("vllm", vl.vllm_compute_slot_mappings),
        ("pagegraph", compute_slot_mappings),
        ("oracle", reference_slot_mapping),
    ):
        buf = big.clone()
        fn(*args, buf[M:-M], page_size)
        results[name] = buf
    assert torch.equal(results["vllm"], results["oracle"])
    assert torch.equal(results["pagegraph"], results["oracle"])
    assert torch.all(results["vllm"][:M] == CANARY) and torch.all(results["vllm"][-M:] == CANARY)
    assert torch.all(results["vllm"][M + int(args[2][-1]) : -M] == PAD_SLOT_ID)


@needs_vllm
def test_vllm_slot_mapping_writes_past_a_short_slot_mapping():
    """``query_start_loc[rows] > max_num_tokens`` (a broken host guarantee): vLLM writes the
    rows' tokens past the end of ``slot_mapping``; pagegraph's builder stops at its end."""
    args, big = slots_case(9, 5, 16, 9, long_row=20, spare=0)
    total = int(args[2][-1])
    got = {}
    for name, fn in (("vllm", vl.vllm_compute_slot_mappings), ("pagegraph", compute_slot_mappings)):
        buf = big.clone()
        fn(*args, buf[M : M + total - M], 16)  # M entries short: they are the canary's
        got[name] = buf
    assert torch.all(got["pagegraph"][M + total - M :] == big[M + total - M :])
    assert not torch.equal(got["vllm"][M + total - M :], big[M + total - M :])


# -- cached launch arguments -----------------------------------------------------------------


class AllocationCounter(TorchFunctionMode):
    """Counts torch calls whose output owns a storage none of their inputs owns (a factory
    such as ``torch.tensor``, or an operator with a fresh result; a view is not one)."""

    def __init__(self):
        super().__init__()
        self.allocations: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        seen = {
            a.untyped_storage().data_ptr()
            for a in torch.utils._pytree.tree_leaves((args, kwargs))
            if isinstance(a, torch.Tensor)
        }
        for o in torch.utils._pytree.tree_leaves(out):
            if isinstance(o, torch.Tensor) and o.untyped_storage().data_ptr() not in seen:
                self.allocations.append(getattr(func, "__name__", str(func)))
        return out


class RecordingKernel:
    """Stands in for a Triton kernel: records each launch's grid and arguments."""

    def __init__(self):
        self.launches: list[tuple] = []

    def __getitem__(self, grid):
        return lambda *args, **kw: self.launches.append((grid, args, kw))


@needs_vllm
def test_adapters_build_launch_tensors_once(monkeypatch):
    kernels = SimpleNamespace(
        gather=RecordingKernel(), slot_mappings=RecordingKernel(), pad_slot_id=-1
    )
    monkeypatch.setattr(vl, "load_vllm_kernels", lambda: kernels)
    vl.clear_launch_args()
    table, counts, idx, _, out, batch = gather_case(10, 3, 4, 11)
    args, big = slots_case(10, 4, 16, 11)
    calls = [
        lambda: vl.vllm_gather_block_tables(table, counts, idx, out, batch=batch),
        lambda: vl.vllm_compute_slot_mappings(*args, big[M:-M], 16),
    ]
    # Positions of the cached tensors in each kernel's arguments.
    cached = ((1, 2, 3, 7, 8, 9), (4, 5, 6, 7, 8))
    for call, kernel, at in zip(calls, (kernels.gather, kernels.slot_mappings), cached):
        with AllocationCounter() as first:
            call()
        with AllocationCounter() as second:
            call()
        # The first call makes vLLM's pointer/stride/size tensors (the twin that must fire).
        assert len(first.allocations) >= 5, first.allocations
        assert second.allocations == []
        (grid1, args1, kw1), (grid2, args2, kw2) = kernel.launches
        assert grid1 == grid2 and kw1 == kw2
        assert all(args1[i] is args2[i] for i in at)
        assert all(isinstance(args1[i], torch.Tensor) for i in at)
    g_grid, g_args, g_kw = kernels.gather.launches[0]
    assert g_grid == (1, batch.num_rows)
    assert g_kw == {"MASK_SLIDING_WINDOW": False, "BLOCK_SIZE": 1024}
    assert g_args[1].tolist() == [table.data_ptr()] and g_args[1].dtype == torch.uint64
    assert g_args[2].tolist() == [out.data_ptr()] and g_args[3].tolist() == [table.stride(0)]
    assert tuple(g_args[4].shape) == (1, counts.shape[0]) and g_args[6] == batch.num_reqs
    s_grid, s_args, s_kw = kernels.slot_mappings.launches[0]
    assert s_grid == (1, args[1].shape[0] + 1)
    assert s_kw == {"CP_SIZE": 1, "CP_INTERLEAVE": 1, "PAD_ID": -1, "TRITON_BLOCK_SIZE": 1024}
    assert s_args[0] == big.shape[0] - 2 * M and tuple(s_args[9].shape) == (1, s_args[0])
    assert s_args[6].tolist() == [16] and s_args[7].tolist() == [True]
    # A new set of buffers gets its own tensors.
    other = out.clone()
    vl.vllm_gather_block_tables(table, counts, idx, other, batch=batch)
    assert kernels.gather.launches[-1][1][2].tolist() == [other.data_ptr()]
    vl.clear_launch_args()


@needs_vllm
@pytest.mark.parametrize("seed", range(200, 216))
def test_seeded_sweep_vllm_matches_oracle(seed):
    """Random in-contract sizes for both kernels: vLLM's writes equal the oracle's, whole
    buffers."""
    gen = torch.Generator().manual_seed(seed)

    def draw(lo: int, hi: int) -> int:
        return int(torch.randint(lo, hi + 1, (1,), generator=gen))

    width = draw(1, 2300)
    num_rows = draw(0, 15)
    table, counts, idx, big, out, batch = gather_case(seed, draw(0, num_rows), num_rows, width)
    got, want = big.clone(), big.clone()
    vl.vllm_gather_block_tables(table, counts, idx, got[M:-M, :width], batch=batch)
    reference_block_table(table, counts, idx, want[M:-M, :width], batch=batch)
    assert torch.equal(got, want)
    page_size = [1, 16, 64][seed % 3]
    args, big = slots_case(seed, draw(1, 15), page_size, width, draw(0, 1) * draw(0, 2100))
    got, want = big.clone(), big.clone()
    vl.vllm_compute_slot_mappings(*args, got[M:-M], page_size)
    reference_slot_mapping(*args, want[M:-M], page_size)
    assert torch.equal(got, want)
