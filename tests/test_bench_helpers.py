"""Invariant: the benchmark measures what it says. Rotated tables hold the same requests on
other pages (the kernel's answers on them are exact), the rotation count divides the graph's
builds, and the floor counts one sector and one write per live page."""

from __future__ import annotations

import torch

from pagegraph import bench
from pagegraph.checker import POISON, expected_tables


def test_rotation_count_divides_builds_and_covers_l2():
    for nbytes in (1, 10_000, 9_000_000, 40_000_000, 10**9):
        k = bench.rotation_count(nbytes, table_bytes=1 << 20, l2_bytes=60 << 20, builds=20)
        assert 20 % k == 0
        assert k == 20 or k * nbytes >= 4 * (60 << 20)


def test_rotated_tables_are_page_permutations():
    cfg = bench.smoke_config(bench.get_config("decode-large"))
    # The kernel takes CPU tensors only under the interpreter: on a GPU machine, the GPU.
    inp = bench.make_inputs(cfg, "cuda" if torch.cuda.is_available() else "cpu")
    bench.rotate_out_of_l2(inp, 60 << 20, 20)
    assert len(inp.rotated) == 19
    ps = cfg.page_size
    base_pages = inp.req_to_token // ps
    for table in inp.rotated:
        assert torch.equal(table % ps, inp.req_to_token % ps), "offsets inside a page kept"
        pages = table // ps
        # One page id maps to one page id: the same request structure on other pages.
        pairs = set(zip(base_pages.flatten().tolist(), pages.flatten().tolist()))
        assert len({a for a, _ in pairs}) == len(pairs) == len({b for _, b in pairs})
        assert (0, 0) in pairs or 0 not in base_pages, "page 0 (padding) stays page 0"
        want, _ = expected_tables(table, inp.req_pool_indices, inp.seq_lens, cfg.width, ps)
        got = torch.full_like(want, POISON)
        bench.build_page_table(table, inp.req_pool_indices, inp.seq_lens, got, ps)
        assert torch.equal(got, want)


def test_floor_bytes():
    assert bench.floor_bytes(10, page_size=64) == 10 * (32 + 4)
    assert bench.floor_bytes(10, page_size=1) == 10 * (4 + 4)
    assert bench.floor_bytes(10, page_size=16, swa=True) == 10 * (32 + 4 + 32 + 4)
