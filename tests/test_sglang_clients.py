"""Invariant: pagegraph's SGLang adapters run SGLang's own kernels and, on in-contract inputs,
write exactly what pagegraph's references write, and nothing outside the live region.

Every output buffer is poisoned and larger than the region a builder may write (extra rows,
extra columns, extra entries), and is compared whole with ``torch.equal``, so a write outside
the live entries is caught as surely as a wrong value. Inputs are small, seeded and random.
Where SGLang's contract differs from pagegraph's (preset ``cu_seqlens_k[0]``, unclamped
negative lengths, the page-table spills, the SWA stride), a test pins the difference down, and
the reproducers in ``examples/`` are shown to flag SGLang's builder and pass pagegraph's.
Without SGLang installed, every test that needs it skips with the reason.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from pagegraph import build_page_table, reference_page_table
from pagegraph.clients import sglang as sg
from pagegraph.kernels.kv_indices import build_kv_indices
from pagegraph.kernels.reference import reference_decode_metadata

ROOT = Path(__file__).resolve().parent.parent
# CUDA where there is a GPU, else CPU tensors under Triton's interpreter (set by pagegraph).
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
REASON = sg.sglang_unavailable_reason()
needs_sglang = pytest.mark.skipif(REASON is not None, reason=f"SGLang unavailable: {REASON}")
POISON = -77


def make_pool(gen, max_reqs: int, cols: int, page_size: int, dtype=torch.int32):
    """``req_to_token`` ``[max_reqs, cols]``: every row owns distinct random pages (>= 1),
    slots consecutive within a page, as a page allocator leaves them."""
    pages_per_row = -(-cols // page_size)
    pages = torch.randperm(max_reqs * pages_per_row + 7, generator=gen)[: max_reqs * pages_per_row]
    starts = (pages + 1).reshape(max_reqs, pages_per_row) * page_size
    slots = starts.repeat_interleave(page_size, dim=1) + torch.arange(page_size).repeat(
        pages_per_row
    )
    return slots[:, :cols].to(dtype).contiguous().to(DEVICE)


def make_batch(gen, bs: int, max_reqs: int, lo: int, hi: int, dtype=torch.int32):
    """Distinct request rows (never the dummy row 0) and lengths in ``[lo, hi]``."""
    rows = (torch.randperm(max_reqs - 1, generator=gen)[:bs] + 1).to(dtype)
    lens = torch.randint(lo, hi + 1, (bs,), generator=gen, dtype=torch.int64).to(dtype)
    return rows.to(DEVICE), lens.to(DEVICE)


def rand(gen, lo: int, hi: int, n: int, dtype=torch.int64):
    """``n`` seeded integers in ``[lo, hi)`` on ``DEVICE``."""
    return torch.randint(lo, hi, (n,), generator=gen, dtype=dtype).to(DEVICE)


def poisoned(*shape, dtype=torch.int32):
    return torch.full(shape, POISON, dtype=dtype, device=DEVICE)


def assert_equal(got: torch.Tensor, want: torch.Tensor, what: str):
    if torch.equal(got, want):
        return
    diff = (got != want).nonzero().tolist()[:6]
    cells = ", ".join(
        f"{tuple(i)}: {got[tuple(i)].item()} != {want[tuple(i)].item()}" for i in diff
    )
    raise AssertionError(f"{what} differs at {cells}")


# -- the loader ------------------------------------------------------------------------------


def test_unavailable_reason_when_sglang_is_not_installed(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "sglang" else real(name, *a)
    )
    reason = sg.sglang_unavailable_reason()
    assert reason is not None and "not installed" in reason
    with pytest.raises(sg.SGLangUnavailable, match="not installed"):
        sg.sglang_kernel_dir()


@needs_sglang
def test_kernel_files_load_once_without_importing_sglang():
    first = sg.load_kernel_file("kv_indices")
    assert sg.load_kernel_file("kv_indices") is first
    assert Path(first.__file__).parent == sg.sglang_kernel_dir()
    # The package __init__ needs SGLang's whole serving stack.
    assert "sglang" not in sys.modules


@needs_sglang
def test_builders_are_named_and_typed_for_the_checker():
    assert sg.SGLANG_BUILDERS == {
        "sglang_trtllm_mha_page_table": sg.trtllm_mha_page_table,
        "sglang_trtllm_mha_graph_metadata": sg.trtllm_mha_graph_metadata,
        "sglang_flashmla_kv_indices": sg.flashmla_page_table,
        "sglang_flashinfer_kv_indices": sg.flashinfer_csr,
        "sglang_flashinfer_kv_indices_blocks": sg.flashinfer_csr_token_blocks,
    }
    assert sg.trtllm_mha_graph_metadata.pagegraph_outputs == "decode_metadata"
    for fn in (sg.trtllm_mha_page_table, sg.flashmla_page_table):
        assert getattr(fn, "pagegraph_outputs", "page_table") == "page_table"
    assert sg.flashinfer_csr.pagegraph_outputs == "csr"
    assert sg.flashinfer_csr_token_blocks.pagegraph_outputs == "csr"


# -- trtllm_mha page table -------------------------------------------------------------------


@needs_sglang
@pytest.mark.parametrize(
    "seed, page_size, bs, width, swa, r2t_dtype",
    [
        (1, 16, 5, 37, False, torch.int32),
        (2, 64, 3, 9, True, torch.int64),
        (3, 1, 4, 70, True, torch.int32),
    ],
)
def test_trtllm_page_table_matches_reference(seed, page_size, bs, width, swa, r2t_dtype):
    gen = torch.Generator().manual_seed(seed)
    max_reqs = bs + 4
    req_to_token = make_pool(gen, max_reqs, width * page_size + 3, page_size, r2t_dtype)
    rows, lens = make_batch(gen, bs, max_reqs, 1, width * page_size)
    full_to_swa = None
    if swa:
        full_to_swa = rand(gen, 1, 10**6, int(req_to_token.max()) + 2)
    outs = {}
    for name, fn in (("sglang", sg.trtllm_mha_page_table), ("reference", reference_page_table)):
        # One extra row and three extra columns: a write outside [bs, width] changes poison.
        table_buf = poisoned(bs + 1, width + 3)
        # SGLang writes the SWA table with the full table's row stride, so both share a layout.
        swa_buf = poisoned(bs + 1, width + 3)
        kw = {}
        if swa:
            kw = {"swa_page_table": swa_buf[:bs, :width], "full_to_swa": full_to_swa}
        fn(req_to_token, rows, lens, table_buf[:bs, :width], page_size, **kw)
        outs[name] = (table_buf, swa_buf)
    assert_equal(outs["sglang"][0], outs["reference"][0], "page_table")
    assert_equal(outs["sglang"][1], outs["reference"][1], "swa_page_table")


# -- trtllm_mha graph metadata ---------------------------------------------------------------


def _metadata_buffers(bs: int, width: int, cu_q: bool, swa: bool, first: int = 0):
    """Poisoned, oversized output buffers; ``cu_seqlens_*[0]`` preset to ``first`` (SGLang's
    allocation sets 0 there)."""
    bufs = {
        "cache_seqlens": poisoned(bs + 2),
        "cu_seqlens_k": poisoned(bs + 3),
        "page_table": poisoned(bs + 1, width + 2),
    }
    bufs["cu_seqlens_k"][0] = first
    if cu_q:
        bufs["cu_seqlens_q"] = poisoned(bs + 3)
        bufs["cu_seqlens_q"][0] = first
    if swa:
        bufs["swa_page_table"] = poisoned(bs + 1, width + 5)
    return bufs


def _metadata_views(bufs: dict, bs: int, width: int) -> dict:
    views = {
        "cache_seqlens": bufs["cache_seqlens"][:bs],
        "cu_seqlens_k": bufs["cu_seqlens_k"][: bs + 1],
        "page_table": bufs["page_table"][:bs, :width],
    }
    if "cu_seqlens_q" in bufs:
        views["cu_seqlens_q"] = bufs["cu_seqlens_q"][: bs + 1]
    if "swa_page_table" in bufs:
        # The graph-metadata kernel takes the SWA table's own row stride: a wider one here.
        views["swa_page_table"] = bufs["swa_page_table"][:bs, :width]
    return views


def _run_metadata(fn, inputs, page_size, draft, full_to_swa, bufs, bs, width):
    req_to_token, rows, lens = inputs
    views = _metadata_views(bufs, bs, width)
    if full_to_swa is not None:
        views["full_to_swa"] = full_to_swa
    fn(req_to_token, rows, lens, page_size, draft_tokens=draft, **views)


@needs_sglang
@pytest.mark.parametrize(
    "seed, page_size, bs, width, draft, cu_q, swa",
    [
        (11, 16, 5, 23, 0, False, False),
        (12, 64, 6, 9, 3, True, True),
        (13, 32, 3, 12, 1, True, False),
    ],
)
def test_trtllm_graph_metadata_matches_reference(seed, page_size, bs, width, draft, cu_q, swa):
    gen = torch.Generator().manual_seed(seed)
    max_reqs = bs + 3
    req_to_token = make_pool(gen, max_reqs, width * page_size + 8, page_size)
    inputs = (req_to_token, *make_batch(gen, bs, max_reqs, 1, width * page_size - draft))
    full_to_swa = None
    if swa:
        full_to_swa = rand(gen, 1, 10**6, int(req_to_token.max()) + 2)
    got = _metadata_buffers(bs, width, cu_q, swa)
    want = _metadata_buffers(bs, width, cu_q, swa)
    _run_metadata(
        sg.trtllm_mha_graph_metadata, inputs, page_size, draft, full_to_swa, got, bs, width
    )
    _run_metadata(reference_decode_metadata, inputs, page_size, draft, full_to_swa, want, bs, width)
    for name in got:
        assert_equal(got[name], want[name], name)


@needs_sglang
def test_trtllm_graph_metadata_leaves_first_prefix_entries_to_allocation():
    # SGLang's contract: cu_seqlens_k[0] and cu_seqlens_q[0] are set once, at allocation.
    gen = torch.Generator().manual_seed(21)
    bs, width, page_size = 4, 6, 16
    req_to_token = make_pool(gen, 6, width * page_size, page_size)
    inputs = (req_to_token, *make_batch(gen, bs, 6, 1, width * page_size - 2))
    bufs = _metadata_buffers(bs, width, cu_q=True, swa=False, first=POISON)
    _run_metadata(sg.trtllm_mha_graph_metadata, inputs, 16, 2, None, bufs, bs, width)
    assert bufs["cu_seqlens_k"][0] == POISON and bufs["cu_seqlens_q"][0] == POISON
    lens = inputs[2].to(torch.int64) + 2
    assert_equal(bufs["cu_seqlens_k"][1 : bs + 1], lens.cumsum(0).to(torch.int32), "cu_seqlens_k")


@needs_sglang
def test_trtllm_graph_metadata_does_not_clamp_negative_lengths():
    gen = torch.Generator().manual_seed(22)
    bs, width, page_size, draft = 3, 5, 16, 2
    req_to_token = make_pool(gen, 5, width * page_size, page_size)
    rows, _ = make_batch(gen, bs, 5, 1, 1)
    lens = torch.tensor([40, -9, 17], dtype=torch.int32, device=DEVICE)
    got = _metadata_buffers(bs, width, cu_q=False, swa=False)
    want = _metadata_buffers(bs, width, cu_q=False, swa=False)
    inputs = (req_to_token, rows, lens)
    _run_metadata(sg.trtllm_mha_graph_metadata, inputs, page_size, draft, None, got, bs, width)
    _run_metadata(reference_decode_metadata, inputs, page_size, draft, None, want, bs, width)
    assert got["cache_seqlens"][:bs].tolist() == [42, -7, 19]  # pagegraph: [42, 2, 19]
    assert want["cache_seqlens"][:bs].tolist() == [42, 2, 19]
    assert got["cu_seqlens_k"][1 : bs + 1].tolist() == [42, 35, 54]
    # Row 1 gets no page from SGLang (cdiv(-7) < 1) and one from pagegraph (length 2).
    assert (got["page_table"][1] == POISON).all()
    want["page_table"][1] = POISON
    assert_equal(got["page_table"], want["page_table"], "page_table")


@needs_sglang
@pytest.mark.parametrize("seed, page_size, draft, swa", [(31, 16, 0, False), (32, 64, 2, True)])
def test_normal_decode_metadata_matches_reference(seed, page_size, draft, swa):
    gen = torch.Generator().manual_seed(seed)
    bs, width = 5, 11
    req_to_token = make_pool(gen, bs + 2, width * page_size, page_size)
    inputs = (req_to_token, *make_batch(gen, bs, bs + 2, 1, width * page_size - draft))
    full_to_swa = None
    if swa:
        full_to_swa = rand(gen, 1, 10**6, int(req_to_token.max()) + 2)
    # This kernel writes cu_seqlens_k[0] itself: poison it too.
    got = _metadata_buffers(bs, width, cu_q=False, swa=swa, first=POISON)
    want = _metadata_buffers(bs, width, cu_q=False, swa=swa, first=POISON)
    _run_metadata(sg.normal_decode_metadata, inputs, page_size, draft, full_to_swa, got, bs, width)
    _run_metadata(reference_decode_metadata, inputs, page_size, draft, full_to_swa, want, bs, width)
    for name in got:
        assert_equal(got[name], want[name], name)
    with pytest.raises(ValueError, match="cu_seqlens_q"):
        sg.normal_decode_metadata(
            req_to_token,
            *inputs[1:],
            page_size,
            cu_seqlens_q=poisoned(bs + 1),
            **_metadata_views(got, bs, width),
        )


# -- kv_indices.py: CSR and FlashMLA ---------------------------------------------------------


@needs_sglang
@pytest.mark.parametrize("seed, starts, token_blocks", [(41, False, 1), (42, True, 3)])
def test_flashinfer_csr_matches_reference(seed, starts, token_blocks):
    gen = torch.Generator().manual_seed(seed)
    bs, max_reqs, cols = 6, 9, 1300
    req_to_token = make_pool(gen, max_reqs, cols, 1)
    rows, lens = make_batch(gen, bs, max_reqs, 1, 1100)
    kw = {}
    if starts:
        kw["kv_start_idx"] = rand(gen, 0, cols - 1100, bs, torch.int32)
    total = int(lens.sum())
    outs = []
    for fn in (sg.flashinfer_kv_indices, sg.reference_flashinfer_kv_indices):
        indptr, indices = poisoned(bs + 4), poisoned(total + 40)
        indptr[0] = 0  # the engine's allocation
        extra = {"token_blocks": token_blocks} if fn is sg.flashinfer_kv_indices else {}
        fn(req_to_token, rows, lens, indptr[: bs + 1], indices, **kw, **extra)
        outs.append((indptr, indices))
    assert_equal(outs[0][0], outs[1][0], "kv_indptr")
    assert_equal(outs[0][1], outs[1][1], "kv_indices")


@needs_sglang
@pytest.mark.parametrize("seed, page_size, width, starts", [(51, 64, 70, False), (52, 16, 9, True)])
def test_flashmla_table_matches_reference(seed, page_size, width, starts):
    gen = torch.Generator().manual_seed(seed)
    bs, max_reqs = 4, 7
    req_to_token = make_pool(gen, max_reqs, (width + 2) * page_size, page_size)
    rows, lens = make_batch(gen, bs, max_reqs, 1, width * page_size)
    kw = {}
    if starts:
        # Page-aligned offsets that keep every row within its width of req_to_token.
        pages = rand(gen, 0, 2, bs, torch.int32)
        kw["kv_start_idx"] = pages * page_size
    outs = []
    for fn in (sg.flashmla_kv_indices, sg.reference_flashmla_kv_indices):
        buf = poisoned(bs + 1, width + 4)
        fn(req_to_token, rows, lens, buf[:bs, :width], page_size, **kw)
        outs.append(buf)
    assert_equal(outs[0], outs[1], "block_kv_indices")


@needs_sglang
@pytest.mark.parametrize(
    "seed, page_size, bs, width, pad, dtype",
    [
        (53, 64, 5, 70, 0, torch.int32),  # 70 pages: not a multiple of the 64-page block
        (54, 64, 3, 130, 9, torch.int64),  # a column slice: the grid follows the row stride
        (55, 16, 4, 9, 3, torch.int32),
    ],
)
def test_flashmla_page_table_matches_references(seed, page_size, bs, width, pad, dtype):
    gen = torch.Generator().manual_seed(seed)
    max_reqs = bs + 3
    req_to_token = make_pool(gen, max_reqs, width * page_size + 4, page_size, dtype)
    rows, lens = make_batch(gen, bs, max_reqs, 0, width * page_size, dtype)
    lens[0] = width * page_size  # a full row: its last page is the table's last column
    outs = []
    for fn in (sg.flashmla_page_table, sg.reference_flashmla_kv_indices, reference_page_table):
        # A canary row and column either side; ``pad`` more columns of row padding.
        buf = poisoned(bs + 2, width + 2 + pad)
        fn(req_to_token, rows, lens, buf[1 : bs + 1, 1 : width + 1], page_size)
        outs.append(buf)
    assert_equal(outs[0], outs[1], "block_kv_indices (kv_indices.py reference)")
    assert_equal(outs[0], outs[2], "page_table (pagegraph's reference)")


def _csr_buffers(bs: int, capacity: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Poisoned ``kv_indptr`` ``[bs + 3]`` (entry 0 preset to 0, as SGLang allocates it) and
    ``kv_indices`` ``[capacity + 2]`` int32; the builder gets ``[: bs + 1]`` and ``[1:-1]``,
    so the ends are canaries."""
    indptr, indices = poisoned(bs + 3), poisoned(capacity + 2)
    indptr[0] = 0
    return indptr, indices


@needs_sglang
@pytest.mark.parametrize(
    "seed, fn_name, bs, cols, dtype",
    [
        (61, "flashinfer_csr", 6, 1300, torch.int32),
        (62, "flashinfer_csr", 1, 700, torch.int64),
        (63, "flashinfer_csr_token_blocks", 4, 20000, torch.int32),
        (64, "flashinfer_csr_token_blocks", 3, 900, torch.int64),
    ],
)
def test_flashinfer_csr_matches_reference_and_writes_nothing_past_the_stream(
    seed, fn_name, bs, cols, dtype
):
    gen = torch.Generator().manual_seed(seed)
    max_reqs = bs + 3
    req_to_token = make_pool(gen, max_reqs, cols, 1, dtype)
    rows, lens = make_batch(gen, bs, max_reqs, 0, cols, dtype)
    lens[0] = cols  # a full row
    # Room for 37 entries past the stream: they must keep their poison.
    capacity = int(lens.sum()) + 37
    got, want = _csr_buffers(bs, capacity), _csr_buffers(bs, capacity)
    fn = getattr(sg, fn_name)
    fn(req_to_token, rows, lens, 1, kv_indptr=got[0][: bs + 1], kv_indices=got[1][1:-1])
    sg.reference_flashinfer_kv_indices(req_to_token, rows, lens, want[0][: bs + 1], want[1][1:-1])
    assert_equal(got[0], want[0], "kv_indptr")
    assert_equal(got[1], want[1], "kv_indices")
    if fn_name == "flashinfer_csr_token_blocks" and cols > 8192:
        # Wide enough that SGLang's grid has several programs a row (TOKEN_BLOCK_PARALLEL).
        assert sg.load_kernel_file("kv_indices").kv_indices_num_token_blocks(cols, bs) > 1


@needs_sglang
@pytest.mark.parametrize("fn", [sg.flashinfer_csr, sg.flashinfer_csr_token_blocks])
def test_flashinfer_csr_refuses_pages(fn):
    req_to_token = torch.zeros(2, 64, dtype=torch.int32, device=DEVICE)
    one = torch.ones(1, dtype=torch.int32, device=DEVICE)
    indptr, indices = _csr_buffers(1, 64)
    with pytest.raises(ValueError, match="token slots"):
        fn(req_to_token, one, one, 16, kv_indptr=indptr[:2], kv_indices=indices)
    assert (indptr[1:] == POISON).all() and (indices == POISON).all()


# -- the reproducers in examples/ ------------------------------------------------------------

EXAMPLES = {
    "spill": ROOT / "examples" / "sglang_trtllm_page_table_spill.py",
    "swa_stride": ROOT / "examples" / "sglang_trtllm_swa_stride.py",
    "flashmla_spill": ROOT / "examples" / "sglang_flashmla_kv_indices_spill.py",
}
#: The adapter each reproducer's bug belongs to.
SGLANG_BUILDER = {
    "spill": sg.trtllm_mha_page_table,
    "swa_stride": sg.trtllm_mha_page_table,
    "flashmla_spill": sg.flashmla_page_table,
}


def _example(name: str):
    key = f"pagegraph_example_{name}"
    if key not in sys.modules:
        spec = importlib.util.spec_from_file_location(key, EXAMPLES[name])
        module = importlib.util.module_from_spec(spec)
        sys.modules[key] = module
        spec.loader.exec_module(module)
    return sys.modules[key]


@needs_sglang
@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_reproducer_passes_pagegraph_and_flags_sglang(name):
    reproduce = _example(name).reproduce
    assert reproduce(build_page_table, DEVICE) == []
    found = reproduce(SGLANG_BUILDER[name], DEVICE)
    assert found, f"{name}: SGLang's builder no longer shows the bug"
    # Each bug puts row 0's pages or SWA pages where row 1's belong.
    assert any("[1, " in line or "padding" in line for line in found), found


@needs_sglang
@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_reproducer_exit_code_follows_its_finding(name):
    expected = 1 if _example(name).reproduce(SGLANG_BUILDER[name], DEVICE) else 0
    done = subprocess.run(
        [sys.executable, str(EXAMPLES[name])], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == expected, done.stdout + done.stderr
    assert ("BUG" in done.stdout) == (expected == 1)
    # A reproducer stands alone: it never imports pagegraph.
    source = EXAMPLES[name].read_text()
    assert "import pagegraph" not in source and "from pagegraph" not in source


OVERFLOW = ROOT / "examples" / "sglang_flashinfer_kv_indices_overflow.py"


@needs_sglang
def test_flashinfer_overflow_reproducer_flags_sglang_and_passes_pagegraph():
    spec = importlib.util.spec_from_file_location("pagegraph_example_overflow", OVERFLOW)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)

    def ours(req_to_token, req_pool_indices, seq_lens, kv_indptr, kv_indices):
        build_kv_indices(
            req_to_token, req_pool_indices, seq_lens, 1, kv_indptr=kv_indptr, kv_indices=kv_indices
        )

    assert example.reproduce(ours, DEVICE) == []
    found = example.reproduce(example.load_sglang_builder(), DEVICE)
    assert any("past the end of the 2000-entry buffer" in line for line in found), found
    done = subprocess.run(
        [sys.executable, str(OVERFLOW)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 1 and "BUG" in done.stdout, done.stdout + done.stderr
    source = OVERFLOW.read_text()
    assert "import pagegraph" not in source and "from pagegraph" not in source
