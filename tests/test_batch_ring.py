"""Invariant: a block taken from the ring holds exactly the bytes its writer put, whatever the
sizes, wraps and waits; a writer never overwrites a block the reader has not taken; a block
too large for the ring is refused (and goes through the queue instead); a workload child's
batches arrive through the ring as the same runs, step for step."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest
import torch

from pagegraph.workload import batch_ring, producer
from pagegraph.workload.batch_ring import RingReader, RingWriter
from pagegraph.workload.decode import DecodeWorkload
from pagegraph.workload.pool import KVPool
from pagegraph.workload.pool import _PageWriter as PageWriter
from pagegraph.workload.producer import ProducedWorkload, _batches, _pack, _unpack
from test_producer import CASES, produced_batch, tables

# Starts child processes: scheduled first in a parallel run (see conftest.py).
pytestmark = pytest.mark.heavy


@pytest.fixture
def ring(tmp_path):
    reader = RingReader(1024, folder=str(tmp_path))
    writer = RingWriter(reader.path, 1024)
    yield reader, writer
    writer.close()
    reader.close()


def test_blocks_come_back_exact_across_many_wraps(ring):
    reader, writer = ring
    rng = np.random.default_rng(7)
    for i in range(300):
        block = rng.integers(-(2**62), 2**62, size=int(rng.integers(1, 64)), dtype=np.int64)
        start = writer.put(block, alive=lambda: True)
        assert start is not None and start % 1024 + block.nbytes <= 1024
        got = reader.take(start, block.nbytes).view(np.int64)
        assert np.array_equal(got, block), f"block {i}"
    assert writer.written > 20 * 1024  # wrapped many times


def test_a_full_ring_holds_the_writer_until_the_reader_takes(ring, monkeypatch):
    reader, writer = ring
    monkeypatch.setattr(batch_ring, "ALIVE_EVERY_S", 0.0)
    a = np.arange(64, dtype=np.int64)  # 512 bytes: two fill the ring
    b = a + 1000
    starts = [writer.put(a, alive=lambda: True), writer.put(b, alive=lambda: True)]
    assert starts == [0, 512]
    # A third block must wait for the first to be taken: given up when the reader is gone.
    with pytest.raises(batch_ring.ReaderGone):
        writer.put(a + 2000, alive=lambda: False)
    assert np.array_equal(reader.take(0, 512).view(np.int64), a)  # not overwritten
    c = a + 2000
    assert writer.put(c, alive=lambda: True) == 1024  # where a was
    tries = []

    def alive():  # the reader takes b while the writer waits
        tries.append(1)
        if len(tries) == 3:
            assert np.array_equal(reader.take(512, 512).view(np.int64), b)
        return True

    d = a + 3000
    assert writer.put(d, alive=alive) == 1536 and len(tries) >= 3
    assert np.array_equal(reader.take(1024, 512).view(np.int64), c)
    assert np.array_equal(reader.take(1536, 512).view(np.int64), d)


def test_a_borrowed_block_is_read_in_place_and_held_until_released(ring, monkeypatch):
    """``borrow`` hands out the block without a copy and without giving its bytes back: the
    writer cannot overwrite it until ``release`` passes its end."""
    reader, writer = ring
    monkeypatch.setattr(batch_ring, "ALIVE_EVERY_S", 0.0)
    a = np.arange(64, dtype=np.int64)  # 512 bytes: two fill the ring
    assert writer.put(a, alive=lambda: True) == 0
    view = reader.borrow(0, 512).view(np.int64)
    assert np.array_equal(view, a) and not view.flags.writeable
    assert writer.put(a + 1, alive=lambda: True) == 512
    # Borrowed, not released: a third block would overwrite it, so the writer waits.
    with pytest.raises(batch_ring.ReaderGone):
        writer.put(a + 2, alive=lambda: False)
    assert np.array_equal(view, a)
    second = reader.borrow(512, 512).view(np.int64)
    reader.release(1024)  # done with both
    with pytest.raises(ValueError, match="released to 1024"):
        reader.release(512)  # never backwards
    assert writer.put(a + 2, alive=lambda: True) == 1024
    assert np.array_equal(view, a + 2)  # the old view now shows the writer's new bytes
    assert np.array_equal(second, a + 1)
    with pytest.raises(ValueError, match="no block"):
        reader.borrow(0, 512)  # released


def test_blocks_larger_than_half_the_ring_are_refused(ring):
    reader, writer = ring
    assert writer.put(np.zeros(65, dtype=np.int64), alive=lambda: True) is None
    assert writer.put(np.zeros(64, dtype=np.int64), alive=lambda: True) == 0


def test_taking_a_block_that_is_not_there_is_an_error(ring):
    reader, writer = ring
    start = writer.put(np.arange(8, dtype=np.int64), alive=lambda: True)
    reader.take(start, 64)
    with pytest.raises(ValueError, match="no block"):
        reader.take(start, 64)  # already released
    with pytest.raises(ValueError, match="no block"):
        reader.take(1000, 64)  # past the ring's end


@pytest.mark.parametrize("capacity", [0, 60, 100])
def test_bad_capacities_are_refused(capacity, tmp_path):
    with pytest.raises(ValueError, match="capacity"):
        RingReader(capacity, folder=str(tmp_path))


def test_the_file_is_removed_once_mapped_and_the_map_lives_on(tmp_path):
    reader = RingReader(256, folder=str(tmp_path))
    path = reader.path
    writer = RingWriter(path, 256)
    reader.unlink()
    reader.unlink()  # idempotent
    assert not os.path.exists(path) and not list(tmp_path.iterdir())
    start = writer.put(np.arange(4, dtype=np.int64), alive=lambda: True)
    assert np.array_equal(reader.take(start, 32).view(np.int64), np.arange(4))
    writer.close()
    reader.close()


def test_a_reader_dropped_unclosed_leaves_no_file(tmp_path):
    reader = RingReader(256, folder=str(tmp_path))
    assert list(tmp_path.iterdir())
    del reader
    assert not list(tmp_path.iterdir())


def test_a_ring_without_room_is_refused_when_made(tmp_path, monkeypatch):
    def no_room(fd, offset, size):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(batch_ring.os, "posix_fallocate", no_room)
    with pytest.raises(OSError):
        RingReader(1024, folder=str(tmp_path))
    assert not list(tmp_path.iterdir())  # nothing left behind


def test_a_small_dev_shm_is_not_used(monkeypatch):
    class Usage:
        free = 10 << 20

    monkeypatch.setattr(batch_ring.shutil, "disk_usage", lambda path: Usage)
    assert batch_ring.ring_folder(8 << 20) != "/dev/shm"
    assert batch_ring.ring_folder(4 << 20) == "/dev/shm"


@pytest.mark.parametrize("capacity", [1 << 20, 16 << 10, 1 << 10])
@pytest.mark.parametrize("case", list(CASES))
def test_a_batch_packed_through_a_ring_unpacks_to_the_same_runs(case, capacity, tmp_path):
    """Every batch of the case, through rings where all, some or none of them fit: the same
    steps, the same writer tags and the same runs, in order."""
    pool_kwargs, workload_kwargs = CASES[case]
    reader = RingReader(capacity, folder=str(tmp_path))
    writer = RingWriter(reader.path, capacity)
    kinds = set()
    for batch in _batches(pool_kwargs, workload_kwargs):
        kind, payload = _pack(batch, writer, alive=lambda: True)
        kinds.add(kind)
        got = _unpack(payload, reader) if kind == "ring" else payload
        assert len(got) == len(batch)
        for (want_step, want_writes), (got_step, got_writes) in zip(batch, got):
            assert got_step == want_step
            assert [t for t, _ in got_writes] == [t for t, _ in want_writes]
            for (_, w), (_, g) in zip(want_writes, got_writes):
                assert g.dtype == np.int64 and np.array_equal(g, w)
    sizes = {1 << 20: {"ring"}, 1 << 10: {"steps"}}
    assert kinds == sizes.get(capacity, {"ring", "steps"}), kinds
    writer.close()
    reader.close()


@pytest.mark.parametrize(
    "device",
    ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)],
)
@pytest.mark.parametrize("ring_bytes", [0, 32 << 10], ids=["queue", "small-ring"])
def test_a_child_through_a_small_ring_gives_the_same_steps_and_tables(
    ring_bytes, device, monkeypatch
):
    """A ring that holds a few batches only (it wraps every few; the child, running ahead,
    waits for room), or none: the steps and tables of ``DecodeWorkload``. With the tables on a
    GPU the ring is registered with CUDA and the runs go to the device straight from it, each
    block given back only once those copies are done (else the child would overwrite runs
    a copy has yet to read, and the tables would differ)."""
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    unpacked, uploads = [], []

    def counting_unpack(payload, ring, **kwargs):
        unpacked.append(payload[0])
        return _unpack(payload, ring, **kwargs)

    upload = PageWriter._upload

    def counting_upload(self, lo, hi, first, pinned):
        uploads.append(first is not None and hi > lo)
        return upload(self, lo, hi, first, pinned)

    monkeypatch.setattr(producer, "_unpack", counting_unpack)
    monkeypatch.setattr(PageWriter, "_upload", counting_upload)
    pool_kwargs, workload_kwargs = CASES["swa-injections-int64"]
    workload_kwargs = dict(workload_kwargs, steps=320)
    here, there = KVPool(**pool_kwargs), KVPool(**pool_kwargs, device=device)
    expected = DecodeWorkload(here, **workload_kwargs, lookahead=16)
    produced = ProducedWorkload(
        there, pool_kwargs, workload_kwargs, processes=True, ring_bytes=ring_bytes
    )
    ring = ring_bytes and batch_ring.RING_SUPPORTED
    assert produced._pinned == bool(ring and device == "cuda")
    for want, got in zip(expected, produced, strict=True):
        assert produced_batch(got) == (want.req_pool_indices, want.seq_lens)
        for a, b in zip(tables(here), tables(there)):
            assert torch.equal(a, b.cpu()), f"tables differ after step {got.index}"
    if ring:
        assert len(unpacked) == 20 and max(unpacked) > 3 * ring_bytes  # wrapped thrice
    else:
        assert not unpacked
    # Runs read in place from the ring: only where it is registered with CUDA.
    assert any(uploads) == produced._pinned


@pytest.mark.skipif(not batch_ring.RING_SUPPORTED, reason="no ring on this machine")
def test_a_rings_file_is_gone_once_its_child_sent_a_batch():
    """The child maps its ring before it sends anything: the first batch received (whether it
    was waited for or already there) removes the file, so a parent killed later leaves none."""
    pool_kwargs, workload_kwargs = CASES["plain"]
    produced = ProducedWorkload(
        KVPool(**pool_kwargs),
        pool_kwargs,
        dict(workload_kwargs, steps=40),
        processes=True,
        ring_bytes=1 << 20,
    )
    paths = [source.ring.path for source in produced._sources]
    assert all(os.path.exists(path) for path in paths)
    with produced:
        # The batch already there when asked for (no wait): the path that missed the removal.
        deadline = time.monotonic() + 60
        while produced._sources[0].queue.empty() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not produced._sources[0].queue.empty()
        steps = iter(produced)
        next(steps)
        assert not any(os.path.exists(path) for path in paths)
        assert [source.ring.path for source in produced._sources] == [None]


@pytest.mark.gpu
def test_gpu_a_refused_registration_leaves_no_cuda_error():
    """A ring registered twice is refused the second time; the refusal must not stay behind
    as CUDA's last error, which the next kernel launch in the process would report as its own.
    Closing unregisters: a new registration of the same kind succeeds. (The rings go where the
    workload's go, /dev/shm when it has room: a file in the temporary folder may be refused
    registration, and the runs are then copied out instead.)"""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    reader = RingReader(1 << 20)
    try:
        assert reader.pin_for_cuda()
        assert reader.tensor is not None and reader.tensor.numel() == 1 << 20
        assert not reader.pin_for_cuda()  # already registered
        x = torch.arange(4, device="cuda") * 2  # a launch after the refusal
        torch.cuda.synchronize()
        assert x.tolist() == [0, 2, 4, 6]
    finally:
        reader.close()
    again = RingReader(1 << 20)
    try:
        assert again.pin_for_cuda()
    finally:
        again.close()


def test_only_a_ring_in_shared_memory_is_registered_with_cuda(tmp_path):
    """A ring in an ordinary folder is never registered (no call that could fail and leave an
    error behind); without CUDA, none is."""
    reader = RingReader(1 << 10, folder=str(tmp_path))
    try:
        assert not reader.pin_for_cuda() and reader.tensor is None
    finally:
        reader.close()
    if not torch.cuda.is_available():
        shm = RingReader(1 << 10)
        try:
            assert not shm.pin_for_cuda() and shm.tensor is None
        finally:
            shm.close()


@pytest.mark.parametrize("case", list(CASES))
def test_runs_borrowed_as_tensors_are_the_packed_runs_and_stay_until_released(case, tmp_path):
    """``_unpack(borrow=True)`` from a ring with a tensor view (what ``pin_for_cuda`` makes;
    here without CUDA): the runs as int64 tensors over the ring's bytes, table by table as
    packed, equal to the batch's; the block stays unreleased until the reader releases it."""
    pool_kwargs, workload_kwargs = CASES[case]
    reader = RingReader(1 << 20, folder=str(tmp_path))
    writer = RingWriter(reader.path, 1 << 20)
    reader.tensor = torch.from_numpy(reader._data)
    for batch in _batches(pool_kwargs, workload_kwargs):
        kind, payload = _pack(batch, writer, alive=lambda: True)
        assert kind == "ring"
        got = producer._unpack(payload, reader, borrow=True)
        for (_, want_writes), (_, got_writes) in zip(batch, got, strict=True):
            assert [t for t, _ in got_writes] == [t for t, _ in want_writes]
            for (_, w), (_, g) in zip(want_writes, got_writes):
                assert isinstance(g, torch.Tensor) and g.dtype == torch.int64
                assert np.array_equal(g.numpy(), w)
        end = producer._block_end(payload)
        assert int(reader._header[0]) < end  # borrowed, not released
        reader.release(end)
    reader.tensor = None
    writer.close()
    reader.close()
