"""Invariant: the fused ``update_trtllm_mha_graph_metadata``'s other outputs are exact replay
after replay on the same buffers, and it writes nothing else.

The formats that ``tests/test_sglang_clients.py`` does not reach through the decode-metadata
contract: ``swa_out_cache_loc`` (the output slots translated to the SWA pool, zero padded),
``cu_seqlens_q`` by running sum (``Q_MODE_CUMSUM``) and by stride (``Q_MODE_STRIDED``), and
``skip_page_table=True``. SGLang's function is called as its backend calls it, on static
buffers that each "replay" refills in place with fresh seeded inputs (never zeros) while the
outputs are poisoned again, as a CUDA graph sees them; with CUDA the call is also captured
once and the captured graph replayed. Each output is a view with a canary entry either side,
compared whole. One test pins down what the kernel does not do: clamp a slot into
``full_to_swa``. Without SGLang installed, every test skips with the reason.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from pagegraph.clients import sglang as sg

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
REASON = sg.sglang_unavailable_reason()
needs_sglang = pytest.mark.skipif(REASON is not None, reason=f"SGLang unavailable: {REASON}")
POISON = -77
#: What the engine writes once, at allocation, into entries the kernel must never write.
PRESET = -5
REPLAYS = 4
PAGE_SIZE = 16


def kernels():
    return sg.load_kernel_file("trtllm_mha_graph_metadata")


def poisoned(n: int, dtype=torch.int32) -> torch.Tensor:
    return torch.full((n,), POISON, dtype=dtype, device=DEVICE)


def rand(gen, lo: int, hi: int, n: int, dtype=torch.int64) -> torch.Tensor:
    return torch.randint(lo, hi, (n,), generator=gen, dtype=dtype).to(DEVICE)


def pool(gen, rows: int, cols: int) -> torch.Tensor:
    """``req_to_token`` ``[rows, cols]`` int32: random distinct pages, consecutive slots."""
    pages = -(-cols // PAGE_SIZE)
    starts = (torch.randperm(rows * pages, generator=gen) + 1).reshape(rows, pages) * PAGE_SIZE
    slots = starts.repeat_interleave(PAGE_SIZE, dim=1) + torch.arange(PAGE_SIZE).repeat(pages)
    return slots[:, :cols].to(torch.int32).contiguous().to(DEVICE)


def assert_equal(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    if torch.equal(got.cpu(), want.cpu()):
        return
    diff = (got.cpu() != want.cpu()).nonzero().flatten().tolist()[:6]
    cells = ", ".join(f"[{i}]: {got[i].item()} != {want[i].item()}" for i in diff)
    raise AssertionError(f"{what} differs at {cells}")


def replay(call: Callable[[], None], refresh: Callable[[int], None], check: Callable[[int], None]):
    """``REPLAYS`` replays: ``refresh(k)`` refills the static inputs and re-poisons the outputs
    in place, then ``call()`` runs (eagerly, or on CUDA as a graph captured once after a
    warm-up on a side stream), then ``check(k)`` judges the outputs."""
    graph = None
    if DEVICE == "cuda":
        refresh(0)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            call()  # compiles outside the capture
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            call()
    for k in range(REPLAYS):
        refresh(k)
        if graph is None:
            call()
        else:
            graph.replay()
            torch.cuda.synchronize()
        check(k)


class Batch:
    """Static decode inputs of ``bs`` rows (``req_pool_indices`` int64, ``seq_lens`` int32, as
    SGLang's graph runners hold them) and the kernel's required outputs, each a view with a
    canary either side; ``refresh`` refills the inputs and poisons the outputs."""

    def __init__(self, gen, bs: int, width: int):
        self.gen, self.bs, self.width = gen, bs, width
        self.req_to_token = pool(gen, bs + 3, width * PAGE_SIZE)
        self.req_pool_indices = torch.zeros(bs, dtype=torch.int64, device=DEVICE)
        self.seq_lens = torch.zeros(bs, dtype=torch.int32, device=DEVICE)
        self.cache_seqlens_buf = poisoned(bs + 2)
        self.cu_seqlens_k_buf = poisoned(bs + 3)
        self.cu_seqlens_k_buf[1] = 0  # entry 0 of the view: preset at allocation
        self.page_table_buf = torch.full(
            (bs + 2, width + 2), POISON, dtype=torch.int32, device=DEVICE
        )

    def views(self) -> dict:
        return {
            "req_pool_indices": self.req_pool_indices,
            "seq_lens": self.seq_lens,
            "req_to_token": self.req_to_token,
            "cache_seqlens": self.cache_seqlens_buf[1:-1],
            "cu_seqlens_k": self.cu_seqlens_k_buf[1 : self.bs + 2],
            "page_table": self.page_table_buf[1:-1, 1:-1],
            "bs": self.bs,
            "seqlen_offset": 0,
            "max_seq_pages": self.width,
            "page_size": PAGE_SIZE,
        }

    def refresh(self) -> None:
        rows = torch.randperm(self.req_to_token.shape[0] - 1, generator=self.gen)[: self.bs] + 1
        self.req_pool_indices.copy_(rows.to(DEVICE))
        self.seq_lens.copy_(rand(self.gen, 1, self.width * PAGE_SIZE + 1, self.bs, torch.int32))
        self.cache_seqlens_buf.fill_(POISON)
        self.cu_seqlens_k_buf[2:] = POISON
        self.page_table_buf.fill_(POISON)

    def check_seqlens(self) -> None:
        lens = self.seq_lens.cpu().to(torch.int64)
        want = torch.full((self.bs + 2,), POISON, dtype=torch.int32)
        want[1:-1] = lens.to(torch.int32)
        assert_equal(self.cache_seqlens_buf, want, "cache_seqlens")
        want = torch.full((self.bs + 3,), POISON, dtype=torch.int32)
        want[1] = 0
        want[2 : self.bs + 2] = lens.cumsum(0).to(torch.int32)
        assert_equal(self.cu_seqlens_k_buf, want, "cu_seqlens_k")


# -- swa_out_cache_loc --------------------------------------------------------------------------


def expected_swa_out(out_cache_loc, full_to_swa, length: int) -> torch.Tensor:
    """``full_to_swa[loc]`` for each ``loc >= 0`` among the first ``min(len, length)`` slots,
    -1 for a negative one, 0 for the rest of ``length`` entries (int64, on the host)."""
    loc = out_cache_loc.cpu()[:length]
    table = full_to_swa.cpu()
    want = torch.zeros(length, dtype=torch.int64)
    n = loc.shape[0]
    want[:n] = torch.where(loc >= 0, table[loc.clamp(min=0)], torch.full_like(loc, -1))
    return want


@needs_sglang
@pytest.mark.parametrize(
    "seed, n, length",
    [
        (71, 5, 9),  # a zero-padded tail
        (72, 700, 1030),  # several programs of 512 entries, tail across a program boundary
        (73, 6, 6),
        (74, 8, 5),  # out_cache_loc longer: only the first 5 are translated
    ],
)
def test_swa_out_cache_loc_is_translated_and_zero_padded(seed, n, length):
    gen = torch.Generator().manual_seed(seed)
    batch = Batch(gen, bs=3, width=4)
    slots = int(batch.req_to_token.max()) + 1 + 40
    full_to_swa = rand(gen, 1, 10**6, slots + 1)
    out_cache_loc = torch.zeros(n, dtype=torch.int64, device=DEVICE)
    swa_out_buf = poisoned(length + 2, torch.int64)  # a canary either side of the view

    def refresh(k):
        batch.refresh()
        loc = rand(gen, 0, slots + 1, n)
        loc[torch.rand(n, generator=gen).to(DEVICE) < 0.25] = -1  # padded tokens' slots
        out_cache_loc.copy_(loc)
        swa_out_buf.fill_(POISON)
        full_to_swa.copy_(rand(gen, 1, 10**6, slots + 1))  # the mapping changes too

    def call():
        kernels().update_trtllm_mha_graph_metadata(
            **batch.views(),
            swa_mapping=full_to_swa,
            out_cache_loc=out_cache_loc,
            swa_out_cache_loc=swa_out_buf[1:-1],
        )

    def check(k):
        want = torch.full((length + 2,), POISON, dtype=torch.int64)
        want[1:-1] = expected_swa_out(out_cache_loc, full_to_swa, length)
        assert_equal(swa_out_buf, want, f"replay {k}: swa_out_cache_loc")
        batch.check_seqlens()

    replay(call, refresh, check)


@needs_sglang
def test_swa_lookups_are_not_clamped_into_full_to_swa():
    # full_to_swa is a view of a longer tensor here, so the reads past its end stay inside one
    # allocation and show what they read: the entries after the mapping.
    gen = torch.Generator().manual_seed(75)
    batch = Batch(gen, bs=2, width=3)
    batch.refresh()
    numel = int(batch.req_to_token.min())  # every slot of the pool is at or past the end
    backing = rand(gen, 1, 10**6, int(batch.req_to_token.max()) + 8)
    full_to_swa = backing[:numel]
    out_cache_loc = torch.tensor([numel, numel + 3, -1], dtype=torch.int64, device=DEVICE)
    swa_out = poisoned(4, torch.int64)
    swa_table_buf = torch.full((2, 3), POISON, dtype=torch.int32, device=DEVICE)
    kernels().update_trtllm_mha_graph_metadata(
        **batch.views(),
        swa_mapping=full_to_swa,
        swa_page_table=swa_table_buf,
        out_cache_loc=out_cache_loc,
        swa_out_cache_loc=swa_out,
    )
    assert swa_out.tolist() == [int(backing[numel]), int(backing[numel + 3]), -1, 0]
    # The SWA page table's lookup is not clamped either (build_trtllm_mha_page_table clamps).
    r2t, rows = batch.req_to_token.cpu(), batch.req_pool_indices.cpu()
    lens = batch.seq_lens.cpu()
    for i in range(2):
        pages = min(-(-int(lens[i]) // PAGE_SIZE), 3)
        slots = r2t[int(rows[i]), : pages * PAGE_SIZE : PAGE_SIZE].to(torch.int64)
        assert swa_table_buf[i, :pages].tolist() == (backing.cpu()[slots] // PAGE_SIZE).tolist()


# -- cu_seqlens_q --------------------------------------------------------------------------------


@needs_sglang
@pytest.mark.parametrize(
    "seed, bs, mode",
    [(81, 5, "cumsum"), (82, 33, "cumsum"), (83, 1, "strided"), (84, 6, "strided")],
)
def test_cu_seqlens_q_by_cumsum_and_by_stride(seed, bs, mode):
    gen = torch.Generator().manual_seed(seed)
    batch = Batch(gen, bs=bs, width=4)
    qlens = torch.zeros(bs, dtype=torch.int32, device=DEVICE)
    cu_q_buf = poisoned(bs + 3)
    cu_q_buf[0] = PRESET  # entry 0: set at allocation, never by the kernel
    q_stride = 3
    mod = kernels()

    def refresh(k):
        batch.refresh()
        qlens.copy_(rand(gen, 1, 9, bs, torch.int32))
        cu_q_buf[1:] = POISON

    def call():
        extra = {"qlens": qlens} if mode == "cumsum" else {"q_stride": q_stride}
        mod.update_trtllm_mha_graph_metadata(
            **batch.views(),
            cu_seqlens_q=cu_q_buf[: bs + 1],
            q_mode=mod.Q_MODE_CUMSUM if mode == "cumsum" else mod.Q_MODE_STRIDED,
            **extra,
        )

    def check(k):
        want = torch.full((bs + 3,), POISON, dtype=torch.int32)
        want[0] = PRESET
        if mode == "cumsum":
            want[1 : bs + 1] = qlens.cpu().to(torch.int64).cumsum(0).to(torch.int32)
        else:
            want[1 : bs + 1] = torch.arange(1, bs + 1, dtype=torch.int32) * q_stride
        assert_equal(cu_q_buf, want, f"replay {k}: cu_seqlens_q")
        batch.check_seqlens()

    replay(call, refresh, check)


# -- skip_page_table ----------------------------------------------------------------------------


@needs_sglang
def test_skip_page_table_writes_only_the_seqlens():
    gen = torch.Generator().manual_seed(91)
    batch = Batch(gen, bs=4, width=5)
    full_to_swa = rand(gen, 1, 10**6, int(batch.req_to_token.max()) + 2)
    swa_table_buf = torch.full((6, 7), POISON, dtype=torch.int32, device=DEVICE)

    def call():
        kernels().update_trtllm_mha_graph_metadata(
            **batch.views(),
            swa_mapping=full_to_swa,
            swa_page_table=swa_table_buf[1:-1, 1:-1],
            skip_page_table=True,
        )

    def check(k):
        assert (batch.page_table_buf == POISON).all(), f"replay {k}: page_table written"
        assert (swa_table_buf == POISON).all(), f"replay {k}: swa_page_table written"
        batch.check_seqlens()

    replay(call, lambda k: batch.refresh(), check)
