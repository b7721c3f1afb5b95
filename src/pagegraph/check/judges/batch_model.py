"""The checker's host model of each replay (``BatchModel``): what the static inputs must
hold after a batch of ``n`` requests is staged. It picks the bucket itself (the smallest
captured size ``>= n``), pads rows ``n:bucket`` by its own reading of the padding policy, and
keeps its own copy of the request indices that padded rows inherit from earlier batches
(SGLang does not reset them). It also classifies each row: in the contract, or out of it (a
negative length, a length past ``len_limit``, a request index outside ``req_to_token``, engine
state a hostile injection broke: ``pagegraph.check.pipeline.engine_state``). The
device side that compares a replay's outputs with the reference is
``pagegraph.check.judges.verify.TableVerifier``, which reads the model's ``state``."""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

#: Row flags of the model (bits).
REAL, IN_BUCKET, OUT_OF_CONTRACT = 1, 2, 4


@dataclass
class ModelStep:
    """The model's view of one replay."""

    index: int
    n: int
    bucket: int
    #: some row of the bucket holds a value outside the contract
    out_of_contract: bool
    #: some real row is longer than the lengths the graphs were captured with
    longer_than_capture: bool
    #: ``[bucket]`` bool, rows outside the contract
    ooc_rows: np.ndarray
    #: ``[bucket]`` what the static inputs must hold (the batch, padded)
    asked_rpi: np.ndarray
    asked_sl: np.ndarray
    #: ``[n]`` bool, real rows whose engine state was broken (``num_blocks`` past the width),
    #: or None
    broken_rows: np.ndarray | None = None


class BatchModel:
    """The static inputs a correct runner holds after staging a batch (see module docstring).

    Args:
        sizes: the captured batch sizes (ascending).
        max_bs: rows of the static buffers.
        pad_seq_len, pad_req_pool_index: what padded rows get (``None``: keep the old index).
        initial_req_pool_indices: ``[max_bs]`` the static indices right after capture.
        len_limit: longest length in the contract (``max(max_context_len, width *
            page_size)``).
        r2t_rows: rows of ``req_to_token``.
        capture_pages: pages of the longest row the graphs were captured with.
        page_size: tokens per page.
        draft_tokens: added to every length a metadata builder builds its tables for (its
            ``cache_seqlens``); 0 for a page-table builder.
    """

    def __init__(
        self,
        *,
        sizes: list[int],
        max_bs: int,
        pad_seq_len: int,
        pad_req_pool_index: int | None,
        initial_req_pool_indices: np.ndarray,
        len_limit: int,
        r2t_rows: int,
        capture_pages: int,
        page_size: int,
        draft_tokens: int = 0,
    ):
        self.sizes = sorted(sizes)
        self.draft_tokens = draft_tokens
        self.max_bs = max_bs
        self.pad_seq_len = pad_seq_len
        self.pad_req_pool_index = pad_req_pool_index
        self.len_limit = len_limit
        self.r2t_rows = r2t_rows
        self.capture_pages = capture_pages
        self.page_size = page_size
        #: ``[3 * max_bs]`` int64: request indices, lengths and row flags, as uploaded.
        self.state = np.zeros(3 * max_bs, dtype=np.int64)
        self.req_pool_indices = self.state[:max_bs]
        self.seq_lens = self.state[max_bs : 2 * max_bs]
        self.flags = self.state[2 * max_bs :]
        self.req_pool_indices[:] = initial_req_pool_indices
        # The same fields seen as unsigned: a negative value is larger than any limit.
        self._rpi_u = self.req_pool_indices.view(np.uint64)
        self._sl_u = self.seq_lens.view(np.uint64)
        self._rows_u = np.uint64(r2t_rows)
        # The longest in-contract length: its tables, len + draft_tokens, reach len_limit.
        # None when the draft tokens alone pass len_limit: every row is out of the contract.
        self._sl_limit = np.uint64(len_limit - draft_tokens) if len_limit >= draft_tokens else None
        # A real row is longer than at capture when its length passes this (its tables, for
        # max(len, 0) + draft_tokens, have more pages than capture_pages).
        self._long_from = capture_pages * page_size - draft_tokens

    def bucket_for(self, n: int) -> int:
        at = bisect.bisect_left(self.sizes, n)
        if at == len(self.sizes):
            raise ValueError(f"batch of {n} requests exceeds the largest bucket {self.sizes[-1]}")
        return self.sizes[at]

    def stage(
        self,
        index: int,
        req_pool_indices: Sequence[int] | np.ndarray,
        seq_lens: Sequence[int] | np.ndarray,
        broken: np.ndarray | None = None,
    ) -> ModelStep:
        """The model's view of the replay of a batch (``[n]`` request indices and lengths);
        ``broken``: ``[n]`` bool, real rows whose engine state was broken (out of contract)."""
        # Called once a replay: each line is one numpy call on at most max_bs values.
        n = len(seq_lens)
        bucket = self.bucket_for(n)
        rpi, sl = self.req_pool_indices, self.seq_lens
        rpi[:n] = req_pool_indices
        sl[:n] = seq_lens
        if bucket > n:
            sl[n:bucket] = self.pad_seq_len
            if self.pad_req_pool_index is not None:
                rpi[n:bucket] = self.pad_req_pool_index
        # Out of the contract: a negative length, a length whose tables (built for
        # max(len, 0) + draft_tokens) pass len_limit, a request index outside req_to_token.
        if self._sl_limit is None:
            ooc = np.ones(bucket, dtype=bool)
        else:
            ooc = self._sl_u[:bucket] > self._sl_limit
            ooc |= self._rpi_u[:bucket] >= self._rows_u
        pad = self.pad_req_pool_index
        if pad is not None and pad < 0 and bucket > n and self._sl_limit is not None:
            ooc[n:bucket] = self._sl_u[n:bucket] > self._sl_limit  # -1 marks a padded row
        if broken is not None:
            ooc[:n] |= broken
        flags = self.flags
        flags[:n] = REAL | IN_BUCKET
        flags[n:bucket] = IN_BUCKET
        flags[bucket:] = 0
        in_bucket = flags[:bucket]
        np.bitwise_or(in_bucket, OUT_OF_CONTRACT, out=in_bucket, where=ooc)
        return ModelStep(
            index=index,
            n=n,
            bucket=bucket,
            out_of_contract=bool(np.count_nonzero(ooc)),
            longer_than_capture=n > 0
            and (self._long_from < 0 or bool(sl[:n].max() > self._long_from)),
            ooc_rows=ooc,
            asked_rpi=rpi[:bucket].copy(),
            asked_sl=sl[:bucket].copy(),
            broken_rows=None if broken is None else broken.copy(),
        )

    def describe_rows(self, st: ModelStep, limit: int = 6) -> str:
        """The out-of-contract and zero-length rows of replay ``st``, by kind, with their
        values: what a failure or a crash on that replay had to deal with; ``""`` when none.
        """
        sl, rpi = st.asked_sl, st.asked_rpi
        kinds: tuple[tuple[str, np.ndarray, np.ndarray, str], ...] = (
            ("negative seq_len", sl < 0, sl, "seq_len"),
            (
                f"seq_len past the row's capacity ({self.len_limit - self.draft_tokens} tokens)",
                sl > self.len_limit - self.draft_tokens,
                sl,
                "seq_len",
            ),
            (
                f"req_pool_index outside req_to_token's {self.r2t_rows} rows",
                (rpi < 0) | (rpi >= self.r2t_rows),
                rpi,
                "req_pool_index",
            ),
            ("zero-length (in the contract)", sl == 0, sl, "seq_len"),
        )
        if st.broken_rows is not None:
            broken = np.zeros(sl.size, dtype=bool)
            broken[: st.broken_rows.size] = st.broken_rows
            kinds += (("num_blocks past the width (engine state)", broken, rpi, "req_pool_index"),)
        parts = []
        for label, mask, values, name in kinds:
            rows = np.flatnonzero(mask)
            if rows.size:
                shown = ", ".join(f"{r} ({name} {int(values[r])})" for r in rows[:limit])
                more = f", +{rows.size - limit} more" if rows.size > limit else ""
                parts.append(f"{label}: row(s) {shown}{more}")
        return "; ".join(parts)
