"""The graph's stage node and its mailbox (``pagegraph.graph.staging``).

On a CPU the kernel runs under the Triton interpreter with the mailbox in ordinary memory, so
everything but pinned memory and graph capture is exercised here; on a GPU the runner's
graphs run it (and tests/test_runner.py checks what they stage). Every case stages into
static buffers with canary rows past ``max_bs`` and checks them exactly.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pagegraph.graph.staging import SLOTS, STAGE_BLOCK, Mailbox, MailboxOutOfStep

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
#: The device index posts are made for (-1: the CPU).
INDEX = torch.cuda.current_device() if DEVICE.type == "cuda" else -1
CANARY = -777


class Bed:
    """Static inputs ``[max_bs]`` (with canary rows after them) and a mailbox."""

    def __init__(self, max_bs: int, rpi_dtype=torch.int32, sl_dtype=torch.int32, seed=0):
        self.max_bs = max_bs
        g = torch.Generator().manual_seed(seed)
        self._rpi = torch.randint(0, 1000, (max_bs + 4,), generator=g).to(rpi_dtype).to(DEVICE)
        self._sl = torch.randint(1, 9, (max_bs + 4,), generator=g).to(sl_dtype).to(DEVICE)
        self._rpi[max_bs:] = CANARY
        self._sl[max_bs:] = CANARY
        self.rpi, self.sl = self._rpi[:max_bs], self._sl[:max_bs]
        self.mailbox = Mailbox(max_bs, DEVICE)

    def launch(self, bucket: int, pad_len=1, pad_rpi=None) -> None:
        self.mailbox.launch(self.rpi, self.sl, bucket, pad_len, pad_rpi)

    def canaries_intact(self) -> bool:
        return bool((self._rpi[self.max_bs :] == CANARY).all()) and bool(
            (self._sl[self.max_bs :] == CANARY).all()
        )


def batch(n: int, seed: int, dtype=torch.int64, device=DEVICE, step=1):
    g = torch.Generator().manual_seed(seed)
    rpi = torch.randint(0, 500, (n * step,), generator=g)[::step]
    sl = torch.randint(-3, 100_000, (n * step,), generator=g)[::step]
    return rpi.to(dtype).to(device), sl.to(dtype).to(device)


KINDS = ["list", "numpy", "cpu-int32", "device-int32", "device-int64", "device-strided"]


def as_kind(values: torch.Tensor, kind: str):
    if kind == "list":
        return values.tolist()
    if kind == "numpy":
        return values.cpu().numpy()
    if kind == "cpu-int32":
        return values.cpu().to(torch.int32)
    if kind == "device-int32":
        return values.to(torch.int32)
    if kind == "device-strided":  # every other entry of a longer int32 tensor
        wide = torch.full((2 * len(values),), -5, dtype=torch.int32, device=DEVICE)
        wide[::2] = values.to(torch.int32)
        return wide[::2]
    return values


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    "static", [(torch.int32, torch.int32), (torch.int64, torch.int32), (torch.int64, torch.int64)]
)
@pytest.mark.parametrize("pad_rpi", [None, 0])
def test_a_post_is_staged_and_padded(kind, static, pad_rpi):
    bed = Bed(16, *static, seed=len(kind))
    before = bed.rpi.clone()
    n, bucket = 5, 12
    rpi, sl = batch(n, seed=3)
    # Posted by address or by value: the tensors must live until the launch, as for any
    # kernel's inputs.
    posted = (as_kind(rpi, kind), as_kind(sl, kind))
    bed.mailbox.post(*posted, n, INDEX)
    bed.launch(bucket, pad_len=7, pad_rpi=pad_rpi)
    want_sl = torch.cat([sl.cpu(), torch.full((bucket - n,), 7, dtype=torch.int64)])
    want_sl = want_sl.to(static[1])
    assert torch.equal(bed.sl[:bucket].cpu(), want_sl.cpu())
    if pad_rpi is None:  # padded rows keep their request index
        want_rpi = torch.cat([rpi.cpu(), before[n:bucket].cpu().to(torch.int64)])
    else:
        want_rpi = torch.cat([rpi.cpu(), torch.zeros(bucket - n, dtype=torch.int64)])
    assert torch.equal(bed.rpi[:bucket].cpu(), want_rpi.to(static[0]))
    assert torch.equal(bed.rpi[bucket:].cpu(), before[bucket:].cpu()), "rows past the bucket"
    assert bed.canaries_intact()
    assert int(bed.mailbox.counter[0]) == 1 and int(bed.mailbox.consumed[0]) == 1


def test_a_launch_without_a_post_leaves_the_inputs():
    """A graph replayed directly (nothing posted for it) stages nothing and consumes
    nothing: the next post is still staged by the next launch."""
    bed = Bed(8)
    before = (bed.rpi.clone(), bed.sl.clone())
    bed.launch(8)
    assert torch.equal(bed.rpi, before[0]) and torch.equal(bed.sl, before[1])
    assert int(bed.mailbox.counter[0]) == 0
    rpi, sl = batch(3, seed=1)
    bed.mailbox.post(rpi, sl, 3, INDEX)
    bed.launch(4)
    assert torch.equal(bed.sl[:3].cpu(), sl.cpu().to(torch.int32))
    bed.launch(4)  # a second launch: the post was consumed, the rows stay
    assert torch.equal(bed.sl[:3].cpu(), sl.cpu().to(torch.int32))
    assert int(bed.mailbox.counter[0]) == 1


def test_posts_are_consumed_in_order_around_the_ring():
    bed = Bed(8)
    for k in range(2 * SLOTS + 3):
        n = 1 + k % 8
        rpi, sl = batch(n, seed=100 + k)
        bed.mailbox.post(rpi.tolist() if k % 2 else rpi, sl, n, INDEX)
        bed.launch(8, pad_len=0)
        assert torch.equal(bed.sl[:n].cpu(), sl.cpu().to(torch.int32)), k
        assert torch.equal(bed.rpi[:n].cpu(), rpi.cpu().to(torch.int32)), k
        assert bool((bed.sl[n:8] == 0).all()), k
    assert int(bed.mailbox.counter[0]) == 2 * SLOTS + 3
    assert bed.canaries_intact()


def test_a_bucket_past_one_block():
    max_bs = STAGE_BLOCK * 2 + 40
    bed = Bed(max_bs)
    n = STAGE_BLOCK + 17
    rpi, sl = batch(n, seed=9)
    bed.mailbox.post(rpi.tolist(), sl.tolist(), n, INDEX)
    bed.launch(max_bs, pad_len=1, pad_rpi=3)
    assert torch.equal(bed.sl[:n].cpu(), sl.cpu().to(torch.int32))
    assert bool((bed.sl[n:] == 1).all()) and bool((bed.rpi[n:] == 3).all())
    assert bed.canaries_intact()


def test_a_withdrawn_post_is_not_staged():
    bed = Bed(8)
    rpi, sl = batch(4, seed=2)
    bed.mailbox.post(rpi, sl, 4, INDEX)
    bed.mailbox.withdraw()
    before = bed.sl.clone()
    bed.launch(8)
    assert torch.equal(bed.sl, before) and bed.mailbox.posted == 0
    bed.mailbox.post(rpi, sl, 4, INDEX)  # the same tag, posted again
    bed.launch(8)
    assert torch.equal(bed.sl[:4].cpu(), sl.cpu().to(torch.int32))


def test_posts_never_launched_are_reported_not_overwritten():
    """SLOTS posts with no launch: the next post would overwrite one the device has not
    read. The mailbox waits for the device, then raises (here nothing will ever read it)."""
    bed = Bed(4)
    rpi, sl = batch(2, seed=4)
    for _ in range(SLOTS):
        bed.mailbox.post(rpi, sl, 2, INDEX)
    with pytest.raises(MailboxOutOfStep, match="never staged"):
        bed.mailbox.post(rpi, sl, 2, INDEX)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="device tensors need CUDA")
def test_device_tensors_of_other_dtypes_are_refused():
    bed = Bed(4)
    with pytest.raises(TypeError, match="int32 or int64"):
        bed.mailbox.post(
            torch.zeros(2, dtype=torch.int16, device=DEVICE),
            torch.ones(2, dtype=torch.int32, device=DEVICE),
            2,
            INDEX,
        )
    assert bed.mailbox.posted == 0


def test_host_values_of_other_dtypes_are_converted():
    bed = Bed(4)
    bed.mailbox.post(np.array([3, 2], dtype=np.int16), torch.tensor([9.0, 4.0]), 2, INDEX)
    bed.launch(4)
    assert bed.rpi[:2].tolist() == [3, 2] and bed.sl[:2].tolist() == [9, 4]


@pytest.mark.parametrize("sl_kind", ["device-int32", "device-int64"])
@pytest.mark.parametrize("kind", ["device-int32", "device-int64", "device-strided"])
def test_the_short_post_writes_what_post_writes(kind, sl_kind):
    """``try_post_tensors`` (``post()``'s path for two device tensors) leaves the slot
    exactly as the field-by-field path (``post_each``) leaves it, and the launch stages that
    batch."""
    rpi, sl = batch(6, seed=len(kind + sl_kind))
    sl = sl.abs()  # representable as int32 too
    posted = (as_kind(rpi, kind), as_kind(sl, sl_kind))
    by_post, by_short = Bed(8, seed=1), Bed(8, seed=1)
    by_post.mailbox.post_each(*posted, 6, INDEX)
    assert by_short.mailbox.try_post_tensors(*posted, 6, INDEX)
    header = slice(0, by_post.mailbox.slot_size)  # the first post's slot
    assert torch.equal(by_short.mailbox.slots[header], by_post.mailbox.slots[header])
    assert by_short.mailbox.posted == by_post.mailbox.posted == 1
    by_short.launch(8, pad_len=3)
    assert by_short.sl[:6].cpu().tolist() == sl.tolist()
    assert by_short.rpi[:6].cpu().tolist() == rpi.tolist()
    assert (by_short.sl[6:8] == 3).all() and by_short.canaries_intact()


def test_the_short_post_refuses_what_it_cannot_post_and_writes_nothing():
    """Another dtype, a tensor that is not 1-D, or tensors not on the mailbox's device
    index: ``False``, with the slots and the post count untouched (the caller then takes
    ``post``)."""
    bed = Bed(4)
    before = bed.mailbox.slots.clone()
    ok = torch.ones(2, dtype=torch.int32, device=DEVICE)
    for rpi, sl, index in [
        (torch.ones(2, dtype=torch.int16, device=DEVICE), ok, INDEX),
        (ok, torch.ones(2, dtype=torch.float32, device=DEVICE), INDEX),
        (ok, torch.ones(2, 1, dtype=torch.int32, device=DEVICE), INDEX),
        (torch.ones(2, 1, dtype=torch.int64, device=DEVICE), ok, INDEX),
        (ok, ok, INDEX + 1),  # the tensors are on another device than the graphs
    ]:
        assert not bed.mailbox.try_post_tensors(rpi, sl, 2, index)
    assert bed.mailbox.posted == 0 and torch.equal(bed.mailbox.slots, before)
