"""The CUDA runtime calls made without torch (``pagegraph.kernels.cudart``): the upload copy lands
exactly, in stream order, and is refused (``None``) where it cannot work."""

from __future__ import annotations

import pytest
import torch

from pagegraph.kernels.cudart import HostToDevice, runtime_paths

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def test_no_copy_is_made_for_memory_it_cannot_copy_into():
    assert HostToDevice.make(torch.zeros(8, dtype=torch.int64)) is None  # a CPU tensor
    if torch.cuda.is_available():
        strided = torch.zeros(16, dtype=torch.int64, device="cuda")[::2]
        assert HostToDevice.make(strided) is None


@needs_cuda
def test_the_copy_lands_exactly_and_in_stream_order():
    """Copies from two pinned buffers in turn on a side stream, each followed on that stream by
    a kernel that reads the destination: every read sees the copy just before it."""
    gen = torch.Generator().manual_seed(11)
    n = 3 * 256 + 1
    dst = torch.full((n + 2,), -9, dtype=torch.int64, device="cuda")
    inner = dst[1 : n + 1]  # canaries on both sides
    copy = HostToDevice.make(inner)
    assert copy is not None and copy.nbytes == 8 * n
    hosts = [torch.empty(n, dtype=torch.int64, pin_memory=True) for _ in range(2)]
    side = torch.cuda.Stream()
    seen = []
    torch.cuda.synchronize()  # dst's fill is done
    # The default stream is kept busy: a copy wrongly put there would land after the side
    # stream's clone that follows it, and the clone would see stale contents.
    torch.cuda._sleep(50_000_000)
    with torch.cuda.stream(side):
        for i in range(6):
            host = hosts[i % 2]
            side.synchronize()  # the buffer's last copy has completed: refill it
            host.copy_(torch.randint(-(1 << 40), 1 << 40, (n,), generator=gen))
            copy(host.data_ptr())
            seen.append((inner.clone(), host.clone()))
    torch.cuda.synchronize()
    for got, want in seen:
        assert torch.equal(got.cpu(), want)
    assert dst[0].item() == -9 and dst[-1].item() == -9


def test_runtime_paths_skip_deleted_files_and_repeats():
    lines = [
        "7f00-7f10 r--p 00000000 08:01 11 /usr/lib/libc.so.6\n",
        "7f10-7f20 r-xp 00000000 08:01 12 /opt/a/lib/libcudart.so.13 (deleted)\n",
        "7f20-7f30 r--p 00000000 08:01 13 /opt/b/lib/libcudart.so.13\n",
        "7f30-7f40 r-xp 00001000 08:01 13 /opt/b/lib/libcudart.so.13\n",
        "7f40-7f50 rw-p 00000000 00:00 0 \n",
        "7f50-7f60 r--p 00000000 08:01 14 /opt/c/my libcudart.so.12\n",
    ]
    assert runtime_paths(lines) == ["/opt/b/lib/libcudart.so.13", "/opt/c/my libcudart.so.12"]
