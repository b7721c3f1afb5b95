"""Staging inside the graph: a pinned mailbox the captured graph reads its batch from. Staging
with torch costs the host several launches before the graph's own; here the host writes a few
integers into pinned memory (``Mailbox.post``) and each captured graph's first node,
``stage_inputs_kernel``, copies the batch into the static inputs and pads the bucket. The slot
layout, the tags that keep posts and launches in step, and the costs: docs/ARCHITECTURE.md,
"Staging inside the graph".
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import TypeAlias

import numpy as np
import numpy.typing as npt
import torch
import triton
import triton.language as tl

#: Posts the host can be ahead of the device before it waits.
SLOTS = 16
#: int64 fields of a slot's header (64 bytes: one load).
HEADER = 8
#: Header fields.
RPI_ADDR, SL_ADDR, RPI_STRIDE, SL_STRIDE, RPI_64, SL_64, COUNT, TAG = range(HEADER)
#: Rows the stage kernel copies per loop iteration.
STAGE_BLOCK = 256

#: The header's fields before the tag, written by one ``pack_into`` (native byte order, as
#: the device reads them).
_HEADER_BEFORE_TAG = struct.Struct(f"={TAG}q")
#: Header value of a tensor's dtype (``RPI_64`` / ``SL_64``); other dtypes are not posted by
#: address.
_IS_INT64 = {torch.int32: 0, torch.int64: 1}

#: One batch argument, ``[n]`` request indices or lengths: a 1-D int32/int64 tensor (on the
#: graphs' device: posted by address) or host integers (a CPU tensor, a list, a numpy array:
#: posted by value).
BatchValues: TypeAlias = (
    torch.Tensor | Sequence[int] | npt.NDArray[np.int32] | npt.NDArray[np.int64]
)


def count_values(values: BatchValues) -> int:
    """Entries of a batch argument: ``shape[0]`` of a 1-D tensor (cheaper than ``len()``),
    else ``len()`` (which raises for a 0-d tensor or a non-sequence)."""
    if type(values) is torch.Tensor and values.dim() == 1:
        return values.shape[0]
    return len(values)


def write_batch(
    inputs: tuple[torch.Tensor, torch.Tensor],
    req_pool_indices: BatchValues | None = None,
    seq_lens: BatchValues | None = None,
) -> None:
    """Copy a batch of ``n`` rows (tensors on any device, or lists) into rows ``:n`` of
    ``inputs``, the static ``(req_pool_indices, seq_lens)``, now, on the current stream;
    ``ValueError`` unless both have ``n`` rows, ``0 < n <=`` the buffers' rows. With neither,
    every row gets a capture's inputs: request row 0, length 1."""
    if req_pool_indices is None and seq_lens is None:
        inputs[0].fill_(0)
        inputs[1].fill_(1)
        return
    if req_pool_indices is None or seq_lens is None:
        raise ValueError("a batch has both req_pool_indices and seq_lens, or neither")
    n, rows = count_values(seq_lens), inputs[0].shape[0]
    if count_values(req_pool_indices) != n or not 0 < n <= rows:
        raise ValueError(
            f"a batch is 1 to {rows} rows of req_pool_indices and of seq_lens, got "
            f"{count_values(req_pool_indices)} and {n}"
        )
    for buffer, values in zip(inputs, (req_pool_indices, seq_lens), strict=True):
        buffer[:n].copy_(torch.as_tensor(values))


# The two Triton kernels below stay unannotated: Triton reads a kernel's parameter annotations
# as its own (``tl.constexpr``, type hints that specialise the kernel), and ships no types for
# ``triton.jit``.


@triton.jit  # type: ignore[untyped-decorator]  # Triton ships no types (above)
def _field(header, idx, k: tl.constexpr):  # type: ignore[no-untyped-def]  # a Triton kernel
    return tl.sum(tl.where(idx == k, header, 0))


@triton.jit  # type: ignore[untyped-decorator]  # Triton ships no types (above)
def stage_inputs_kernel(  # type: ignore[no-untyped-def]  # a Triton kernel (above)
    mailbox,  # [SLOTS * slot_size] int64, pinned host memory
    counter,  # [1] int64, device: posts consumed so far
    consumed,  # [1] int64, pinned: the same count, for the host
    rpi_dst,  # [>= bucket] static req_pool_indices (int32 / int64)
    sl_dst,  # [>= bucket] static seq_lens
    bucket,  # rows of this graph
    pad_len,  # seq_len of padded rows
    pad_rpi,  # req_pool_index of padded rows (used when PAD_RPI)
    slot_size,
    PAD_RPI: tl.constexpr,
    SLOTS: tl.constexpr,
    HEADER: tl.constexpr,
    BLOCK: tl.constexpr,
):
    c = tl.load(counter)
    slot = mailbox + (c % SLOTS) * slot_size
    idx = tl.arange(0, HEADER)
    # The header in one vector load (not atomic: the host wrote it, tag last, before the
    # launch that posted it).
    header = tl.load(slot + idx, volatile=True)
    tag = _field(header, idx, 7)
    if tag == c:
        rpi_addr = _field(header, idx, 0)
        sl_addr = _field(header, idx, 1)
        rpi_stride = _field(header, idx, 2)
        sl_stride = _field(header, idx, 3)
        rpi_64 = _field(header, idx, 4)
        sl_64 = _field(header, idx, 5)
        n = _field(header, idx, 6)
        # A while loop: the interpreter runs range() only over host integers.
        start = 0
        while start < bucket:
            rows = start + tl.arange(0, BLOCK)
            in_bucket = rows < bucket
            live = (rows < n) & in_bucket
            if rpi_64 != 0:
                r = tl.load(
                    rpi_addr.to(tl.pointer_type(tl.int64)) + rows * rpi_stride,
                    mask=live,
                    other=0,
                    volatile=True,
                )
            else:
                r = tl.load(
                    rpi_addr.to(tl.pointer_type(tl.int32)) + rows * rpi_stride,
                    mask=live,
                    other=0,
                    volatile=True,
                ).to(tl.int64)
            if sl_64 != 0:
                s = tl.load(
                    sl_addr.to(tl.pointer_type(tl.int64)) + rows * sl_stride,
                    mask=live,
                    other=0,
                    volatile=True,
                )
            else:
                s = tl.load(
                    sl_addr.to(tl.pointer_type(tl.int32)) + rows * sl_stride,
                    mask=live,
                    other=0,
                    volatile=True,
                ).to(tl.int64)
            s = tl.where(live, s, pad_len)
            tl.store(sl_dst + rows, s.to(sl_dst.dtype.element_ty), mask=in_bucket)
            if PAD_RPI:
                r = tl.where(live, r, pad_rpi)
                tl.store(rpi_dst + rows, r.to(rpi_dst.dtype.element_ty), mask=in_bucket)
            else:  # padded rows keep the request index they held (SGLang)
                tl.store(rpi_dst + rows, r.to(rpi_dst.dtype.element_ty), mask=live)
            start += BLOCK
        # The copies above read the slot before this store says it is free again.
        tl.debug_barrier()
        tl.store(counter, c + 1)
        tl.store(consumed, c + 1)


class MailboxOutOfStep(RuntimeError):
    """A post was never consumed: posts and graph launches are out of step."""


class Mailbox:
    """Pinned slots a captured graph stages its batch from (docs/ARCHITECTURE.md, "Staging
    inside the graph").

    Args:
        max_bs: rows of the static inputs.
        device: the device of the graphs (CPU: ordinary memory, for the interpreter).
    """

    def __init__(self, max_bs: int, device: torch.device) -> None:
        self.max_bs = max_bs
        self.device = device
        pin = device.type == "cuda"
        # Slots 64-byte aligned: the header is one load.
        self.slot_size = -(-(HEADER + 2 * max_bs) // HEADER) * HEADER
        self.slots = torch.zeros(SLOTS * self.slot_size, dtype=torch.int64, pin_memory=pin)
        self.consumed = torch.zeros(1, dtype=torch.int64, pin_memory=pin)
        self.counter = torch.zeros(1, dtype=torch.int64, device=device)
        self._np = self.slots.numpy()
        self._np.reshape(SLOTS, self.slot_size)[:, TAG] = -1
        # memoryview item writes cost a third less than numpy's (``.data``: the array's
        # memoryview, as ``memoryview(array)`` makes it).
        self._mv = self._np.data.cast("B").cast("q")
        self._bytes = self._np.data.cast("B")
        self._consumed = self.consumed.numpy().data.cast("B").cast("q")
        self._base = self.slots.data_ptr()
        #: Posts written since capture (the next post's tag).
        self.posted = 0

    def launch(
        self,
        req_pool_indices: torch.Tensor,
        seq_lens: torch.Tensor,
        bucket: int,
        pad_len: int,
        pad_rpi: int | None,
    ) -> None:
        """Enqueue the stage of rows ``:bucket`` (inside a capture: record it)."""
        stage_inputs_kernel[(1,)](
            self.slots,
            self.counter,
            self.consumed,
            req_pool_indices,
            seq_lens,
            bucket,
            pad_len,
            0 if pad_rpi is None else pad_rpi,
            self.slot_size,
            PAD_RPI=pad_rpi is not None,
            SLOTS=SLOTS,
            HEADER=HEADER,
            BLOCK=STAGE_BLOCK,
        )

    def post(
        self, req_pool_indices: BatchValues, seq_lens: BatchValues, n: int, device_index: int
    ) -> None:
        """Write the batch (``n`` rows) as the next post.

        Device tensors (on ``device_index``, int32/int64, 1-D) are posted by address; anything
        else is converted on the host and posted by value. Two such tensors, the engine's usual
        batch, take ``try_post_tensors``; the rest ``post_each``.
        """
        if (
            type(req_pool_indices) is torch.Tensor
            and type(seq_lens) is torch.Tensor
            and self.try_post_tensors(req_pool_indices, seq_lens, n, device_index)
        ):
            return
        self.post_each(req_pool_indices, seq_lens, n, device_index)

    def post_each(
        self, req_pool_indices: BatchValues, seq_lens: BatchValues, n: int, device_index: int
    ) -> None:
        """``post()`` field by field: each argument by address or by value (``_put``)."""
        k = self.posted
        if self._consumed[0] < k - SLOTS + 1:
            self._wait(k)
        o = (k % SLOTS) * self.slot_size
        self._put(o, 0, req_pool_indices, n, device_index)
        self._put(o, 1, seq_lens, n, device_index)
        mv = self._mv
        mv[o + COUNT] = n
        mv[o + TAG] = k  # last: the tag says the slot is complete
        self.posted = k + 1

    def try_post_tensors(
        self, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor, n: int, device_index: int
    ) -> bool:
        """``post()``'s path for the usual batch, two 1-D int32/int64 tensors of ``n`` rows on
        ``device_index``, both posted by address with one write for the header before the tag.

        Returns ``False``, having written nothing, for any other pair of tensors (``post()``
        then takes ``post_each``, which converts or raises).
        """
        rpi_64 = _IS_INT64.get(req_pool_indices.dtype)
        sl_64 = _IS_INT64.get(seq_lens.dtype)
        if (
            rpi_64 is None
            or sl_64 is None
            or req_pool_indices.get_device() != device_index
            or seq_lens.get_device() != device_index
        ):
            return False
        try:
            (rpi_stride,) = req_pool_indices.stride()
            (sl_stride,) = seq_lens.stride()
        except ValueError:  # not 1-D
            return False
        k = self.posted
        if self._consumed[0] < k - SLOTS + 1:
            self._wait(k)
        o = (k % SLOTS) * self.slot_size
        _HEADER_BEFORE_TAG.pack_into(
            self._bytes,
            8 * o,
            req_pool_indices.data_ptr(),
            seq_lens.data_ptr(),
            rpi_stride,
            sl_stride,
            rpi_64,
            sl_64,
            n,
        )
        self._mv[o + TAG] = k  # last: the tag says the slot is complete
        self.posted = k + 1
        return True

    def _put(self, o: int, i: int, values: BatchValues, n: int, device_index: int) -> None:
        """Field ``i`` (0: request indices, 1: lengths) of the post at slot offset ``o``."""
        mv = self._mv
        if isinstance(values, torch.Tensor) and values.get_device() == device_index:
            # Posted by address: a tensor on the graphs' device (on a CPU, only a 1-D
            # int32/int64 one; anything else there is converted by value).
            dtype = values.dtype
            if values.dim() == 1 and (dtype is torch.int64 or dtype is torch.int32):
                mv[o + i] = values.data_ptr()
                mv[o + RPI_STRIDE + i] = values.stride(0)
                mv[o + RPI_64 + i] = dtype is torch.int64
                return
            if device_index >= 0:
                raise TypeError(
                    "batch tensors on the device must be 1-D int32 or int64, got "
                    f"{dtype} of shape {tuple(values.shape)}"
                )
        if isinstance(values, torch.Tensor):
            if values.device.type != "cpu":
                raise ValueError(
                    f"batch tensors must be on {self.device} or the CPU, got {values.device}"
                )
            values = values.numpy()
        start = o + HEADER + i * self.max_bs
        self._np[start : start + n] = np.asarray(values)
        mv[o + i] = self._base + 8 * start
        mv[o + RPI_STRIDE + i] = 1
        mv[o + RPI_64 + i] = 1

    def withdraw(self) -> None:
        """Take the last post back (its launch failed: no graph will consume it)."""
        k = self.posted - 1
        self._mv[(k % SLOTS) * self.slot_size + TAG] = -1
        self.posted = k

    def _wait(self, k: int) -> None:
        # The device is SLOTS posts behind: wait for it (a real sync, which detectors report),
        # on every stream, in case earlier replays were launched on another.
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        if self._consumed[0] < k - SLOTS + 1:
            raise MailboxOutOfStep(
                f"post {k - SLOTS} was never staged by a graph (device consumed "
                f"{self._consumed[0]} of {k} posts): every post must be followed by one "
                "graph launch"
            )
