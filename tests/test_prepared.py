"""Invariant: a ``PreparedBuild`` writes exactly what ``build_page_table`` writes on the same
prefix of its buffers, refuses a batch larger than it was prepared for, and refuses buffers
whose storage changed after ``prepare_build``."""

from __future__ import annotations

import pytest
import torch

from pagegraph import BuffersChanged, build_page_table, prepare_build, reference_page_table

from helpers import assert_equal_tables, framed, random_inputs

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"


def _inputs(seed: int, bs: int, swa: bool, page_size: int = 16, ctx: int = 2048):
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, ctx + 1, (bs,), generator=gen).tolist()
    lengths[0] = ctx  # one full row
    return random_inputs(
        gen,
        bs=bs,
        rows=bs + 3,
        ctx=ctx,
        page_size=page_size,
        lengths=lengths,
        swa=swa,
        device=DEVICE,
    )


@pytest.mark.parametrize("swa", [False, True], ids=["full", "swa"])
def test_prepared_matches_build_page_table_on_every_prefix(swa):
    bs, ps, ctx = 12, 16, 2048
    width = ctx // ps
    r2t, rpi, sl, f2s = _inputs(3 + swa, bs, swa, ps, ctx)
    big, pt = framed(bs, width, DEVICE)
    sbig, spt = framed(bs, width, DEVICE)
    kw = {"swa_page_table": spt, "full_to_swa": f2s} if swa else {}
    build = prepare_build(r2t, rpi, sl, pt, ps, **kw)
    assert build.rows == bs
    for rows in (bs, 5, 1, 0, bs):  # a second full call takes the cached launch on a GPU
        big_ref, pt_ref = framed(bs, width, DEVICE)
        sbig_ref, spt_ref = framed(bs, width, DEVICE)
        kw_ref = {"swa_page_table": spt_ref[:rows], "full_to_swa": f2s} if swa else {}
        big.copy_(big_ref)
        sbig.copy_(sbig_ref)
        if rows:
            reference_page_table(r2t, rpi[:rows], sl[:rows], pt_ref[:rows], ps, **kw_ref)
        build(rows)
        assert_equal_tables(big, big_ref, f"page_table, bs={rows}")
        if swa:
            assert_equal_tables(sbig, sbig_ref, f"swa_page_table, bs={rows}")


def test_prepared_rejects_bad_batch_and_moved_buffers():
    r2t, rpi, sl, _ = _inputs(5, 6, False)
    pt = torch.full((6, 128), -9, dtype=torch.int32, device=DEVICE)
    build = prepare_build(r2t, rpi, sl, pt, 16)
    for bad in (7, -1):
        with pytest.raises(ValueError, match="bs must be in 0..6"):
            build(bad)
    sl.set_(sl.clone())  # same tensor object, new storage
    with pytest.raises(BuffersChanged, match="seq_lens moved since prepare_build"):
        build()
    assert bool((pt == -9).all()), "nothing written by a refused call"


def test_prepare_build_checks_like_build_page_table():
    r2t, rpi, sl, _ = _inputs(6, 4, False)
    pt = torch.zeros((4, 128), dtype=torch.int64, device=DEVICE)
    with pytest.raises(TypeError, match="page_table must be int32"):
        prepare_build(r2t, rpi, sl, pt, 16)
    with pytest.raises(TypeError, match="page_table must be int32"):
        build_page_table(r2t, rpi, sl, pt, 16)


@pytest.mark.gpu
def test_gpu_prepared_build_is_sync_free_and_capturable():
    from pagegraph import no_device_sync

    bs, ps, ctx = 64, 64, 32768
    r2t, rpi, sl, _ = _inputs(7, bs, False, ps, ctx)
    pt = torch.full((bs, ctx // ps), -9, dtype=torch.int32, device="cuda")
    want = pt.clone()
    reference_page_table(r2t, rpi, sl, want, ps)
    build = prepare_build(r2t, rpi, sl, pt, ps)
    build()  # compiles
    pt.fill_(-9)
    with no_device_sync(detectors="torch"):
        build()
    torch.cuda.synchronize()
    assert torch.equal(pt, want)
    graph = torch.cuda.CUDAGraph()
    pt.fill_(-9)
    with torch.cuda.graph(graph):
        build()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(pt, want)
