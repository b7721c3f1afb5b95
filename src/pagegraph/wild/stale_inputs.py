"""Engine runners whose staging leaves the padded rows' inputs as an earlier batch left them.

SGLang's graph runners copy the real rows' inputs into the bucket's static buffers before a
replay; rows past the real batch must then be reset to the padding's values. A runner that
forgets one input (``positions``, in a decode step ``seq_lens - 1``) replays the padded rows
with whatever the last, larger batch held there. The bed's staged inputs stand for the
engine's: here the lengths.
"""

from __future__ import annotations

from typing import Any

import torch

from ..graph.runner import GraphRunner
from ..graph.staging import BatchValues

__all__ = ["TailKeptRunner"]


def _host_list(values: BatchValues) -> list[int]:
    """A host batch (list, numpy array or CPU tensor) as ints; never a device read."""
    return [int(v) for v in values]


class TailKeptRunner(GraphRunner):
    """Stages each batch of ``n`` rows with rows ``n .. m`` (``m``: the previous batch's size,
    at most the bucket) holding the previous batch's request indices and lengths, as a buffer
    whose tail was not reset does; the padding policy then fills only what lies past ``m``.
    Takes host batches only (a scenario with ``[check] staging = "host"``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._last: tuple[list[int], list[int]] = ([], [])

    def replay(
        self, req_pool_indices: BatchValues, seq_lens: BatchValues
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        rpi, lens = _host_list(req_pool_indices), _host_list(seq_lens)
        n = len(lens)
        m = min(len(self._last[1]), self.buckets.bucket_for(n))
        last_rpi, last_lens = self._last
        staged_rpi, staged_lens = rpi + last_rpi[n:m], lens + last_lens[n:m]
        self._last = (staged_rpi, staged_lens)
        # n <= m <= bucket_for(n): the batch of m rows replays the same bucket.
        return super().replay(staged_rpi, staged_lens)
