"""Invariant: paged decode attention reads only the KV a row's length covers, matches the torch
reference within the derived tolerances, writes only ``out`` (and its workspace), and launches
a grid fixed by host metadata, with no allocation and no device read (CUDA-graph capturable).

Inputs are poisoned so that a wrong read shows: every page-table row's stale tail holds OTHER
live page ids (poison pages whose values are about 1000 times the live ones, and other rows'
pages), the slots of a partial last page past the length hold poison values, and the CSR
``kv_indices`` buffer runs on past ``kv_indptr[bs]`` with poison pages. Consumers planted with
each kind of over-read must fail the comparison that the real one passes.

Under the Triton interpreter (no GPU) the shapes are tiny: 4 query heads over 2 KV heads,
head_dim 16, tiles of 16 tokens and 4 splits, so a row of 97 tokens spans every split and
several tiles of one. The kernels are also compiled for sm_90 in a child process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zlib
from dataclasses import dataclass

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import pagegraph  # noqa: F401  (sets TRITON_INTERPRET=1 without a GPU)
from pagegraph.consumers import (
    csr_decode_attention,
    paged_decode_attention,
    prepare_decode_attention,
    reference_csr_decode_attention,
    reference_decode_attention,
)
from pagegraph.consumers import paged_attention as pa
from pagegraph.consumers.attention_reference import csr_rows, live_kv, table_rows, tolerances

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
PAGE_SIZES = [1, 4, 16]
POISON = 1000.0
SENTINEL = 7.0
SPLITS, BLOCK = 4, 16
#: The interpreter's CPU tensors here; the GPU where there is one (make test on the H200).
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


@dataclass
class Case:
    q: torch.Tensor  # [bs, Hq, D]
    k: torch.Tensor  # [num_pages, page_size, Hkv, D]
    v: torch.Tensor
    table: torch.Tensor  # [bs, width] int32, poisoned stale tails
    lens: torch.Tensor  # [bs] int32
    indptr: torch.Tensor  # [bs + 1] int32
    indices: torch.Tensor  # [nnz + padding] int32, poisoned padding
    last: torch.Tensor  # [bs] int32
    page_size: int
    sentinel: int  # a page no row may touch


def lengths_for(page_size: int) -> list[int]:
    """0, 1, a partial last page (for page_size > 1) and a row spanning every split."""
    return [0, 1, 2 * page_size + page_size // 2 + 1, 97]


def make_case(seed: int, dtype, page_size: int, lens: list[int], heads=(4, 2), dim=16) -> Case:
    gen = torch.Generator().manual_seed(seed)
    hq, hkv = heads
    bs = len(lens)
    width = -(-max(lens) // page_size) + 3  # every row keeps a stale tail of 3 or more
    counts = [-(-n // page_size) for n in lens]
    n_poison = 6
    num_pages = sum(counts) + n_poison + 1
    perm = torch.randperm(num_pages, generator=gen).tolist()
    poison, sentinel, live = perm[:n_poison], perm[n_poison], perm[n_poison + 1 :]
    shape = (num_pages, page_size, hkv, dim)
    k = torch.randn(shape, generator=gen)
    v = torch.randn(shape, generator=gen)
    v[poison] += POISON
    k[sentinel] = v[sentinel] = SENTINEL
    table = torch.empty(bs, width, dtype=torch.int32)
    rows, at = [], 0
    for i, n in enumerate(counts):
        rows.append(live[at : at + n])
        at += n
        if lens[i] % page_size:  # the slots of the last page past the length
            v[rows[i][-1], lens[i] % page_size :] += POISON
    for i, own in enumerate(rows):
        others = [p for j, r in enumerate(rows) if j != i for p in r]
        # The first stale entry is a poison page, then poison and other rows' pages by turns.
        tail = [
            poison[t % n_poison] if t % 2 == 0 or not others else others[t % len(others)]
            for t in range(width - len(own))
        ]
        table[i] = torch.tensor(own + tail, dtype=torch.int32)
    indptr = torch.tensor([0] + torch.tensor(counts).cumsum(0).tolist(), dtype=torch.int32)
    indices = torch.tensor([p for r in rows for p in r] + poison[:3], dtype=torch.int32)
    last = torch.tensor([(n - 1) % page_size + 1 for n in lens], dtype=torch.int32)
    q = torch.randn(bs, hq, dim, generator=gen).to(dtype)
    lens_t = torch.tensor(lens, dtype=torch.int32)
    k, v = k.to(dtype), v.to(dtype)
    on = [t.to(DEVICE) for t in (q, k, v, table, lens_t, indptr, indices, last)]
    return Case(*on, page_size, sentinel)


def run_table(c: Case, lens=None, out=None, **kw) -> torch.Tensor:
    out = torch.empty_like(c.q) if out is None else out
    kw = {"num_splits": SPLITS, "block_n": BLOCK, **kw}
    lens = c.lens if lens is None else lens
    return paged_decode_attention(c.q, c.k, c.v, c.table, lens, out, page_size=c.page_size, **kw)


def run_csr(c: Case, indptr=None, last=None, **kw) -> torch.Tensor:
    indptr = c.indptr if indptr is None else indptr
    last = c.last if last is None else last
    out = torch.empty_like(c.q)
    return csr_decode_attention(
        c.q,
        c.k,
        c.v,
        indptr,
        c.indices,
        last,
        out,
        page_size=c.page_size,
        num_splits=SPLITS,
        block_n=BLOCK,
    )


def bad_rows(got, want, atol, rtol) -> list[int]:
    """Rows where ``got`` leaves ``|got - want| <= atol[row] + rtol |want|`` (or is not
    finite)."""
    got, want = got.float().cpu(), want.float().cpu()
    err = (got - want).abs() - rtol * want.abs()
    over = ~torch.isfinite(got) | (err > atol[:, None, None])
    return sorted(set(over.nonzero()[:, 0].tolist()))


def table_tol(c: Case, lens=None):
    rows = table_rows(c.table, c.lens if lens is None else lens, c.page_size)
    return tolerances(c.q, live_kv(c.k, c.v, rows, c.page_size))


def assert_close(got, want, tol, what: str) -> None:
    atol, rtol = tol
    bad = bad_rows(got, want, atol, rtol)
    if bad:
        r = bad[0]
        err = float((got[r].float() - want[r].float()).abs().max())
        raise AssertionError(
            f"{what}: rows {bad} differ; row {r}: max error {err:.3g}, "
            f"atol {float(atol[r]):.3g}, rtol {rtol:.3g}"
        )


def seed_of(*parts) -> int:
    """A fixed seed per test and parameters (``hash`` of a str changes between runs)."""
    return zlib.crc32(repr(parts).encode())


@pytest.mark.parametrize("page_size", PAGE_SIZES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_table_matches_reference(dtype, page_size):
    c = make_case(
        seed_of("table", dtype, page_size), DTYPES[dtype], page_size, lengths_for(page_size)
    )
    got = run_table(c)
    want = reference_decode_attention(c.q, c.k, c.v, c.table, c.lens, page_size=page_size)
    assert_close(got, want, table_tol(c), f"{dtype} page_size {page_size}")
    assert torch.equal(got[0], torch.zeros_like(got[0])), "a row of length 0 writes zeros"


@pytest.mark.parametrize("page_size", PAGE_SIZES)
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_csr_matches_reference_and_the_table_format(dtype, page_size):
    c = make_case(
        seed_of("csr", dtype, page_size), DTYPES[dtype], page_size, lengths_for(page_size)
    )
    got = run_csr(c)
    want = reference_csr_decode_attention(
        c.q, c.k, c.v, c.indptr, c.indices, c.last, page_size=page_size
    )
    assert_close(got, want, table_tol(c), f"csr {dtype} page_size {page_size}")
    # The same tokens in the same tiles and splits: the two formats agree bit for bit.
    assert torch.equal(got, run_table(c))


@pytest.mark.parametrize("page_size", PAGE_SIZES)
def test_planted_over_reads_fail_and_the_real_consumer_passes(page_size):
    c = make_case(seed_of("poison", page_size), torch.bfloat16, page_size, lengths_for(page_size))
    want = reference_decode_attention(c.q, c.k, c.v, c.table, c.lens, page_size=page_size)
    atol, rtol = table_tol(c)
    assert bad_rows(run_table(c), want, atol, rtol) == []
    assert bad_rows(run_csr(c), want, atol, rtol) == []
    # Reads the static width (every page-table entry): every row, the empty one too, fails.
    full = torch.full_like(c.lens, c.table.shape[1] * page_size)
    assert bad_rows(run_table(c, lens=full), want, atol, rtol) == [0, 1, 2, 3]
    # Reads the whole last page: the rows with a partial last page fail.
    partial = [i for i, n in enumerate(c.lens.tolist()) if n % page_size]
    if partial:
        rounded = -(-c.lens // page_size) * page_size
        assert bad_rows(run_table(c, lens=rounded), want, atol, rtol) == partial
        whole_last = torch.full_like(c.last, page_size)
        assert bad_rows(run_csr(c, last=whole_last), want, atol, rtol) == partial
    # Reads kv_indices past kv_indptr[bs] (the buffer's padding) as the last row's pages.
    past_end = c.indptr.clone()
    past_end[-1] = c.indices.shape[0]
    assert bad_rows(run_csr(c, indptr=past_end), want, atol, rtol) == [3]


def test_writes_only_out():
    c = make_case(seed_of("writes"), torch.float16, 4, lengths_for(4))
    before = [t.clone() for t in (c.q, c.k, c.v, c.table, c.lens, c.indptr, c.indices, c.last)]
    sentinel = c.k[c.sentinel].clone(), c.v[c.sentinel].clone()
    canary = -12345.0
    big = torch.full(
        (c.q.shape[0] + 2, c.q.shape[1] + 1, c.q.shape[2] * 2),
        canary,
        dtype=c.q.dtype,
        device=DEVICE,
    )
    out = big[1:-1, :-1, 3 : 3 + c.q.shape[2]]  # a strided view inside canaries
    run_table(c, out=out)
    run_csr(c)
    after = (c.q, c.k, c.v, c.table, c.lens, c.indptr, c.indices, c.last)
    for name, b, a in zip("q k v table lens indptr indices last".split(), before, after):
        assert torch.equal(a, b), f"{name} was written"
    assert torch.equal(c.k[c.sentinel], sentinel[0]) and torch.equal(c.v[c.sentinel], sentinel[1])
    big[1:-1, :-1, 3 : 3 + c.q.shape[2]] = canary
    assert bool((big == canary).all()), "a write landed outside out"


@pytest.mark.parametrize("splits", [1, 3, 16])
def test_split_counts_agree(splits):
    """One split, a count that is no power of two, and more splits than the longest row has
    tiles (most of them empty): the same result within fp32 tolerance."""
    c = make_case(seed_of("splits"), torch.float32, 4, [97, 5, 0, 40])
    want = reference_decode_attention(c.q, c.k, c.v, c.table, c.lens, page_size=4)
    assert_close(run_table(c, num_splits=splits), want, table_tol(c), f"{splits} splits")


@pytest.mark.parametrize("heads", [(2, 2), (8, 1), (6, 2)], ids=["mha", "mqa", "group3"])
def test_head_layouts_and_strided_q(heads):
    c = make_case(seed_of("heads", heads), torch.float16, 4, [9, 33, 0], heads=heads, dim=32)
    packed = torch.randn(c.q.shape[0], heads[0], 3 * 32).to(torch.float16).to(DEVICE)
    packed[:, :, 32:64] = c.q  # q as a slice of a packed qkv projection
    q = packed[:, :, 32:64]
    out = torch.empty_like(c.q)
    paged_decode_attention(
        q, c.k, c.v, c.table, c.lens, out, page_size=4, num_splits=2, block_n=BLOCK
    )
    want = reference_decode_attention(c.q, c.k, c.v, c.table, c.lens, page_size=4)
    assert_close(out, want, table_tol(c), f"heads {heads}")


def test_out_of_contract_lengths_are_clamped():
    """A length past ``width * page_size`` reads only its own row (clamped to the width), a
    negative one reads nothing; CSR spans and last-page lengths are clamped likewise."""
    c = make_case(seed_of("clamp"), torch.float16, 4, [13, 97, 6, 30])
    width = c.table.shape[1]
    lens = torch.tensor([width * 4 + 50, -5, 6, 30], dtype=torch.int32, device=DEVICE)
    got = run_table(c, lens=lens)
    want = reference_decode_attention(c.q, c.k, c.v, c.table, lens, page_size=4)
    assert_close(got, want, table_tol(c, lens), "clamped table lengths")
    assert torch.equal(got[1], torch.zeros_like(got[1]))
    # Rows: 4 pages, empty, reversed, past the end of kv_indices.
    indptr = torch.tensor([0, 4, 4, 2, 10**6], dtype=torch.int32, device=DEVICE)
    last = torch.tensor([9, 1, 3, 2], dtype=torch.int32, device=DEVICE)
    got = run_csr(c, indptr=indptr, last=last)
    rows = csr_rows(indptr, c.indices, last, 4, 4)
    assert [n for _, n in rows] == [16, 0, 0, (c.indices.shape[0] - 3) * 4 + 2]
    want = reference_csr_decode_attention(c.q, c.k, c.v, indptr, c.indices, last, page_size=4)
    assert_close(got, want, tolerances(c.q, live_kv(c.k, c.v, rows, 4)), "clamped CSR spans")


class _Recorder(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


def test_launch_reads_no_device_value_and_allocates_nothing(monkeypatch):
    """With a workspace, the launcher runs no tensor op at all (no allocation, no ``.item()``),
    and both grids are the same whatever the lengths hold."""
    grids = []

    class Stub:
        def __getitem__(self, grid):
            grids.append(grid)
            return lambda *args, **kwargs: None

    monkeypatch.setattr(pa, "_split_kernel", Stub())
    monkeypatch.setattr(pa, "_combine_kernel", Stub())
    c = make_case(seed_of("capture"), torch.bfloat16, 4, lengths_for(4))
    ws = prepare_decode_attention(4, 4, 16, device=DEVICE, num_splits=SPLITS)
    out = torch.empty_like(c.q)
    for lens in (c.lens, torch.tensor([999, 0, 0, -1], dtype=torch.int32, device=DEVICE)):
        with _Recorder() as rec:
            paged_decode_attention(c.q, c.k, c.v, c.table, lens, out, page_size=4, workspace=ws)
            csr_decode_attention(
                c.q, c.k, c.v, c.indptr, c.indices, c.last, out, page_size=4, workspace=ws
            )
        assert rec.ops == []
    assert set(grids) == {(4, 2, SPLITS), (4, 4)}


@pytest.mark.parametrize(
    "change, error",
    [
        ({"page_table": lambda c: c.table.long()}, TypeError),
        ({"q": lambda c: c.q.float()}, TypeError),
        ({"page_size": lambda c: 8}, ValueError),
        ({"q": lambda c: c.q[:, :3]}, ValueError),  # 3 query heads over 2 KV heads
        (
            {
                "workspace": lambda c: prepare_decode_attention(
                    2, 4, 16, device=DEVICE, num_splits=2
                )
            },
            ValueError,
        ),
    ],
    ids=["int64-table", "dtype-mix", "page-size", "heads", "workspace-too-small"],
)
def test_rejects_out_of_contract_arguments(change, error):
    c = make_case(seed_of("reject"), torch.float16, 4, [5, 9, 1])
    args = {"q": c.q, "page_table": c.table, "page_size": 4, "workspace": None}
    args.update({k: f(c) for k, f in change.items()})
    out = torch.empty(args["q"].shape, dtype=c.q.dtype, device=DEVICE)
    with pytest.raises(error):
        paged_decode_attention(
            args["q"],
            c.k,
            c.v,
            args["page_table"],
            c.lens,
            out,
            page_size=args["page_size"],
            workspace=args["workspace"],
        )


def fill_batch(gen, bs: int, width: int, page_size: int, live: list, poison: list, max_len: int):
    """Random lengths (0, 1 and the full width among them), each row's live pages drawn from
    ``live``, stale tails of poison pages, and the CSR form of the same batch (host tensors)."""
    lens = torch.randint(0, max_len + 1, (bs,), generator=gen)
    lens[:3] = torch.tensor([0, 1, width * page_size])
    table = torch.tensor(poison, dtype=torch.int32)[
        torch.randint(len(poison), (bs, width), generator=gen)
    ]
    perm = torch.tensor(live, dtype=torch.int32)[torch.randperm(len(live), generator=gen)]
    counts = [-(-int(n) // page_size) for n in lens]
    at = 0
    for i, n in enumerate(counts):
        table[i, :n] = perm[at : at + n]
        at += n
    indptr = torch.tensor([0] + torch.tensor(counts).cumsum(0).tolist(), dtype=torch.int32)
    indices = torch.cat([table[i, :n] for i, n in enumerate(counts)])
    last = torch.tensor([(int(n) - 1) % page_size + 1 for n in lens], dtype=torch.int32)
    return lens.to(torch.int32), table, indptr, indices, last


@pytest.mark.gpu
@pytest.mark.parametrize("page_size", [1, 16, 64])
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_graph_replays_follow_the_lengths_on_gpu(dtype, page_size):
    """Serving shapes: 32 query heads over 8 KV heads, head_dim 128. Both formats captured in
    one CUDA graph, then replayed after the lengths and page ids change (rows grow, shrink and
    empty), each replay compared with the reference; an eager call allocates nothing."""
    dev, dt = torch.device("cuda"), DTYPES[dtype]
    gen = torch.Generator().manual_seed(seed_of("gpu", dtype, page_size))
    bs, hq, hkv, dim, max_len = 13, 32, 8, 128, 3000
    width = -(-max_len // page_size)
    num_pages = bs * width + 8
    k = torch.randn(num_pages, page_size, hkv, dim, generator=gen).to(dt).to(dev)
    v = torch.randn(num_pages, page_size, hkv, dim, generator=gen)
    v[-8:] += POISON
    v = v.to(dt).to(dev)
    live, poison = list(range(num_pages - 8)), list(range(num_pages - 8, num_pages))
    q = torch.randn(bs, hq, dim, generator=gen).to(dt).to(dev)
    lens, table, indptr = (
        torch.zeros(bs, dtype=torch.int32, device=dev),
        torch.zeros(bs, width, dtype=torch.int32, device=dev),
        torch.zeros(bs + 1, dtype=torch.int32, device=dev),
    )
    indices = torch.zeros(bs * width + 8, dtype=torch.int32, device=dev)
    last = torch.ones(bs, dtype=torch.int32, device=dev)
    out, out_csr = torch.empty_like(q), torch.empty_like(q)
    ws = prepare_decode_attention(bs, hq, dim, device=dev, max_context_len=width * page_size)

    def step():
        paged_decode_attention(q, k, v, table, lens, out, page_size=page_size, workspace=ws)
        csr_decode_attention(
            q, k, v, indptr, indices, last, out_csr, page_size=page_size, workspace=ws
        )

    def load(batch):
        b_lens, b_table, b_indptr, b_indices, b_last = batch
        lens.copy_(b_lens), table.copy_(b_table), indptr.copy_(b_indptr), last.copy_(b_last)
        indices[: b_indices.shape[0]].copy_(b_indices)
        indices[b_indices.shape[0] :] = poison[0]  # the buffer's padding

    load(fill_batch(gen, bs, width, page_size, live, poison, max_len))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    allocated = torch.cuda.memory_allocated()
    step()
    assert torch.cuda.memory_allocated() == allocated
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        step()
    for replay in range(4):
        batch = fill_batch(gen, bs, width, page_size, live, poison, max_len // (replay + 1))
        load(batch)
        g.replay()
        torch.cuda.synchronize()
        want = reference_decode_attention(q, k, v, table, lens, page_size=page_size)
        rows = table_rows(table, lens, page_size)
        tol = tolerances(q, live_kv(k, v, rows, page_size))
        assert_close(out.cpu(), want.cpu(), tol, f"replay {replay}")
        assert_close(out_csr.cpu(), want.cpu(), tol, f"csr replay {replay}")
    del g
    torch.cuda.synchronize()
    torch.cuda.empty_cache()


# (kernel, dtype, page size, CSR, splits): both formats, every dtype, page sizes 1 to 256.
COMPILE_VARIANTS = [
    ("split", "bf16", 1, False, 16),
    ("split", "bf16", 16, False, 8),
    ("split", "fp16", 64, False, 16),
    ("split", "bf16", 256, False, 4),
    ("split", "fp16", 16, True, 16),
    ("split", "bf16", 1, True, 3),
    ("split", "fp32", 16, False, 8),
    ("combine", "bf16", 16, False, 16),
    ("combine", "fp16", 1, True, 3),
    ("combine", "fp32", 64, False, 8),
]
TRITON_TYPES = {"bf16": "*bf16", "fp16": "*fp16", "fp32": "*fp32"}


def compile_id(v) -> str:
    kernel, dtype, page_size, csr, splits = v
    return f"{kernel}-{dtype}-ps{page_size}-{'csr' if csr else 'table'}-s{splits}"


def compile_variant(kernel: str, dtype: str, page_size: int, csr: bool, splits: int) -> dict:
    """Compile one specialisation for sm_90 at serving shapes (32 query heads over 8 KV heads,
    head_dim 128, the launcher's tile sizes)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fn = pa._split_kernel if kernel == "split" else pa._combine_kernel
    consts = {
        "HEAD_DIM": 128,
        "PAGE_SIZE": page_size,
        "BLOCK_N": pa.BLOCK_N,
        "NUM_SPLITS": splits,
        "CSR": csr,
    }
    if kernel == "split":
        consts.update(
            GROUP=4,
            BLOCK_H=pa.MIN_BLOCK_H,
            WIDEN_DOT=False,
            DOT_PRECISION="ieee" if dtype == "fp32" else "tf32",
        )
    else:
        consts["SPLITS_P2"] = triton.next_power_of_2(splits)
    pointers = {
        "q_ptr": TRITON_TYPES[dtype],
        "k_ptr": TRITON_TYPES[dtype],
        "v_ptr": TRITON_TYPES[dtype],
        "out_ptr": TRITON_TYPES[dtype],
        "pages_ptr": "*i32",
        "lens_ptr": "*i32",
        "last_ptr": "*i32",
        "acc_ptr": "*fp32",
        "stats_ptr": "*fp32",
        "qk_scale": "fp32",
    }
    sig = {n: "constexpr" if n in consts else pointers.get(n, "i32") for n in fn.arg_names}
    names = list(sig)
    constexprs = {(names.index(k),): val for k, val in consts.items()}
    src = ASTSource(fn=fn, signature=sig, constexprs=constexprs)
    out = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": pa.NUM_WARPS})
    ptx = out.asm["ptx"]
    return {
        "cubin_bytes": len(out.asm["cubin"]),
        "sm90": ".target sm_90" in ptx,
        "tensor_cores": "mma" in ptx,
    }


def compile_all() -> dict:
    results = {}
    for v in COMPILE_VARIANTS:
        try:
            results[compile_id(v)] = compile_variant(*v)
        except Exception as exc:  # reported per variant by the test
            results[compile_id(v)] = {"error": f"{type(exc).__name__}: {exc}"}
    return results


_compiled: dict = {}


def compiled() -> dict:
    """Every variant's result, compiled once a process; in a child process with the
    interpreter off, since Triton's library functions are in interpreter form once it is on."""
    from pagegraph.kernels.contract import interpreter_active

    if not _compiled:
        if not interpreter_active():
            _compiled.update(compile_all())
        else:
            env = dict(os.environ, TRITON_INTERPRET="0")
            proc = subprocess.run(
                [sys.executable, __file__, "compile"],
                env=env,
                capture_output=True,
                text=True,
                timeout=600,
            )
            assert proc.returncode == 0, proc.stderr[-4000:]
            _compiled.update(json.loads(proc.stdout.strip().splitlines()[-1]))
    return _compiled


@pytest.mark.heavy
@pytest.mark.parametrize("variant", COMPILE_VARIANTS, ids=compile_id)
def test_kernels_compile_for_sm90(variant):
    result = compiled()[compile_id(variant)]
    assert "error" not in result, result.get("error")
    assert result["sm90"] and result["cubin_bytes"] > 0
    if variant[0] == "split" and variant[1] != "fp32":
        assert result["tensor_cores"], "the 16-bit dots run on the tensor cores"


if __name__ == "__main__" and sys.argv[1:] == ["compile"]:
    print(json.dumps(compile_all()))
