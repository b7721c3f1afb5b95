"""The CSR kind: FlashInfer's ``kv_indptr`` / ``kv_indices``
(``pagegraph.kernels.kv_indices.build_kv_indices``'s contract).

``build(req_to_token, req_pool_indices, seq_lens, page_size, *, kv_indptr, kv_indices)``
writes no page table: ``kv_indptr[: bs + 1]`` (0, then the running page counts, cut at the
capacity) and each row's span of ``kv_indices``. No SWA outputs, no decode-step consumer
(the consumer reads a page table). ``kv_indptr[0]`` may be preset by the engine.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch

from .base import KindSpec, VectorSpec
from .seams import Builder, BuilderIO, ReplayModel, VectorVerifier


class CsrKind(KindSpec):
    name = "csr"
    signature = (
        "build(req_to_token, req_pool_indices, seq_lens, page_size, *, kv_indptr, kv_indices)"
    )
    positional = 4
    keywords = ("kv_indptr", "kv_indices")
    writes_tables = False
    swa = False
    feeds_consumer = False
    vectors = (
        VectorSpec("kv_indptr", torch.int32, lambda max_bs, width, d: max_bs + 1),
        VectorSpec(
            "kv_indices",
            torch.int32,
            lambda max_bs, width, d: max_bs * width,
            engine_sized=True,
            # a report's words: "the poison: <untouched> must stay untouched"
            untouched="an entry past kv_indptr[bucket], or a canary,",
        ),
    )
    presets = {"kv_indptr[0]": (0, 1)}
    ooc_prefix_exact = True
    reference = "reference_kv_indices"

    def load_builders(self) -> dict[str, Builder]:
        from ..kernels.kv_indices import build_kv_indices
        from ..kernels.reference import reference_kv_indices

        return {"build_kv_indices": build_kv_indices, "reference_kv_indices": reference_kv_indices}

    def vector_fields(self, verifier: VectorVerifier, model: ReplayModel) -> torch.Tensor:
        """The vectors against the independent ``model`` (``[K, 8]`` int64, two masks' fields
        a replay, from ``verifier``'s buffers): ``kv_indptr = [0, running sums of the rows'
        pages, cut at the capacity]`` for entries ``0..bucket``, and ``kv_indices[j]`` for
        ``j < kv_indptr[bucket]`` the id of page ``j - kv_indptr[i]`` of the row ``i`` that
        owns ``j``; poison everywhere else.

        An out-of-contract row ``r`` (the replay's first) may be longer than the reference's,
        shifting the rows after it, so there the live region ends at it: ``kv_indptr[0..r]``
        and ``kv_indices[: kv_indptr[r]]`` stay exact (nothing before row ``r`` depends on
        it), ``kv_indptr[r + 1 .. bucket]`` must rise and stay within ``[0, capacity]`` (a
        consumer reads ``kv_indices`` by them), and ``kv_indices`` past row ``r``'s start is
        not judged; the canaries and ``kv_indptr`` past the bucket always are.

        From the model (the verifier's ``K`` replays): ``n_pages`` ``[K, M]`` int64 (0 past
        the bucket), ``slots`` ``[K, M, cap]`` int64 page-start slots, ``in_bucket`` and
        ``ooc`` ``[K, M]`` bool (``ooc``: rows of the bucket outside the contract)."""
        n_pages, slots, in_bucket, ooc = model.n_pages, model.slots, model.in_bucket, model.ooc
        M, K, cap = verifier.max_bs, verifier.batch, verifier.cap
        C, poison = verifier.engine_capacity, verifier.poison_value
        index = verifier.vector_index  # [M + 1]: 0..M
        snapped = verifier.snap_vectors
        if snapped is None:  # a verifier of a kind with vectors snapshots them at each replay
            raise ValueError("the verifier holds no snapshot of the vectors to judge")
        exp = verifier.expected_vectors
        exp.fill_(poison)
        sums = torch.cumsum(n_pages, -1).clamp(max=C)  # [K, M]
        bucket = in_bucket.sum(-1, keepdim=True)
        ooc_replay = ooc.any(-1, keepdim=True)  # [K, 1]
        first = torch.where(ooc_replay, ooc.to(torch.uint8).argmax(-1, keepdim=True), bucket)
        exp[:, 0, 1:2].fill_(0)
        exp[:, 0, 2 : 2 + M] = torch.where(index[1:] <= bucket, sums, poison)
        j = verifier.capacity_index.expand(K, C)
        # The row owning entry j: the number of rows that end at or before it.
        row = torch.searchsorted(sums, j.contiguous(), right=True).clamp(max=M - 1)
        start = torch.where(row > 0, sums.gather(1, (row - 1).clamp(min=0)), 0)
        page = (j - start).clamp(0, cap - 1)
        ids = slots.reshape(K, M * cap).gather(1, row * cap + page) // verifier.page_size
        exp[:, 1, 1 : 1 + C] = torch.where(j < sums[:, -1:], ids, poison)
        # The exact region: up to the first out-of-contract row (the whole bucket without one).
        end = torch.where(first > 0, sums.gather(1, (first - 1).clamp(min=0)), 0)
        live = torch.zeros_like(exp, dtype=torch.bool)
        live[:, 0, 1 : 2 + M] = index <= first
        live[:, 1, 1 : 1 + C] = j < end
        got = snapped[:, 0, 1 : 2 + M].to(torch.int64)
        prev = torch.cat([got[:, :1], got[:, :-1]], dim=1)
        disordered = (got < prev) | (got < 0) | (got > C)
        judged = torch.ones_like(live)
        judged[:, 0, 1 : 2 + M] = (index > bucket) | disordered
        judged[:, 1, 1 : 1 + C] = ~ooc_replay
        return verifier.vector_masks(exp, live, judged)

    def entry_owner(
        self,
        vector: str,
        entry: int,
        lengths: Sequence[int],
        page_size: int,
        cap: int,
        capacity: int,
    ) -> str:
        """Which row of the reference owns ``kv_indices[entry]``, as text: "row i's page p"
        (from the replay's staged ``lengths``), or where the live stream ends; ``""`` for
        ``kv_indptr`` and a canary (``entry < 0``)."""
        if vector != "kv_indices" or entry < 0:
            return ""
        sl = np.asarray(lengths, dtype=np.int64)
        pages = np.clip(-(-np.maximum(sl, 0) // page_size), 0, cap)
        ends = np.minimum(np.cumsum(pages), capacity)
        total = int(ends[-1]) if len(ends) else 0
        if entry >= total:
            if entry >= capacity:
                return f"past the end of kv_indices ({capacity} entries)"
            return f"past kv_indptr[{len(sl)}] = {total}"
        row = int(np.searchsorted(ends, entry, side="right"))
        start = int(ends[row - 1]) if row else 0
        return f"row {row}'s page {entry - start}"

    def call(self, builder: Builder, io: BuilderIO, bs: int, extra: Mapping[str, object]) -> None:
        v = io.vectors
        builder(
            io.req_to_token,
            io.req_pool_indices[:bs],
            io.seq_lens[:bs],
            io.page_size,
            kv_indptr=v["kv_indptr"][: bs + 1],
            kv_indices=v["kv_indices"],
            **extra,
        )


CSR = CsrKind()
