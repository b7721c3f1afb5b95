"""The ``"slot_mapping"`` kind: vLLM's slot mapping, each scheduled token's KV-cache slot,
computed inside the graph from the engine's per-request block tables (vLLM 0.34.0 captures it
in its drafter's full graph). The graph derives the builder's ``idx_mapping`` and
``positions`` from the staged batch (``call``), as an engine's input preparation would. The
contract, the decode step of the bed and ring groups: docs/ARCHITECTURE.md, "vLLM's block
tables"; shapes and dtypes: ``pagegraph.kernels.slot_mapping.compute_slot_mappings``.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from ..kernels.slot_mapping import PAD_SLOT_ID
from .base import KindSpec, VectorSpec
from .seams import Builder, BuilderIO, ReplayModel, VectorVerifier

#: Token entries past the largest bucket's: the fill past the last row is never empty.
SLACK_TOKENS = 7


class SlotMappingKind(KindSpec):
    name = "slot_mapping"
    signature = (
        "build(block_table, idx_mapping, query_start_loc, positions, slot_mapping, page_size)"
    )
    positional = 6
    writes_tables = False
    swa = False
    feeds_consumer = False
    vectors = (
        VectorSpec(
            "slot_mapping", torch.int64, lambda max_bs, width, d: max_bs * (d + 1) + SLACK_TOKENS
        ),
    )
    error_kinds = ()
    tables_include_draft = True
    engine_state = "block_tables"
    paddings = ("vllm-graph",)
    reference = "reference_slot_mapping"

    def load_builders(self) -> dict[str, Builder]:
        from ..kernels.group_slot_mappings import compute_group_slot_mappings
        from ..kernels.slot_mapping import compute_slot_mappings
        from ..kernels.vllm_reference import reference_group_slot_mapping, reference_slot_mapping

        return {
            "compute_slot_mappings": compute_slot_mappings,
            "reference_slot_mapping": reference_slot_mapping,
            "compute_group_slot_mappings": compute_group_slot_mappings,
            "reference_group_slot_mapping": reference_group_slot_mapping,
        }

    def derived_inputs(
        self, max_bs: int, draft_tokens: int, device: torch.device
    ) -> dict[str, torch.Tensor]:
        """The engine's step inputs the graph derives from the staged batch: ``idx_mapping``
        ``[max_bs]`` int32, ``query_start_loc`` ``[max_bs + 1]`` int32 (``i * q``, fixed),
        ``positions`` ``[max_bs * q + SLACK_TOKENS]`` int64, and the constant offsets of a
        row's tokens ``[q]`` int64 (``j``)."""
        q = draft_tokens + 1
        total = max_bs * q + SLACK_TOKENS
        return {
            "idx_mapping": torch.zeros(max_bs, dtype=torch.int32, device=device),
            "query_start_loc": torch.arange(max_bs + 1, dtype=torch.int32, device=device) * q,
            "positions": torch.zeros(total, dtype=torch.int64, device=device),
            "token_offsets": torch.arange(q, dtype=torch.int64, device=device),
        }

    def call(self, builder: Builder, io: BuilderIO, bs: int, extra: Mapping[str, object]) -> None:
        d = io.derived
        q = d["token_offsets"].shape[0]
        idx = d["idx_mapping"][:bs]
        idx.copy_(io.req_pool_indices[:bs])
        positions = d["positions"][: bs * q].view(bs, q)  # max(len - 1, 0) + j
        torch.sub(io.seq_lens[:bs].unsqueeze(1).expand(bs, q), 1, out=positions)
        positions.clamp_(min=0).add_(d["token_offsets"])
        builder(
            self.engine_of(io).block_table,
            idx,
            d["query_start_loc"][: bs + 1],
            d["positions"],
            io.vectors["slot_mapping"],
            io.page_size,
            **extra,
        )

    def vector_fields(self, verifier: VectorVerifier, model: ReplayModel) -> torch.Tensor:
        """``slot_mapping`` against the ``model`` (see ``KindSpec.vector_fields``): token
        ``t`` of a real row ``i = t // q`` holds the slot of position ``max(len_i - 1, 0) + t
        % q`` (the page's first slot, gathered at the replay, plus the offset in the page: a
        page's slots are consecutive), its page ``(pos // page_size) % width``: a position
        past the table in the contract is a ring group's (docs/ARCHITECTURE.md, "vLLM's block
        tables"); a padded row's tokens and every token past the bucket's rows hold
        ``PAD_SLOT_ID``. An out-of-contract row's tokens are not judged."""
        K, M, ps, cap = verifier.batch, verifier.max_bs, verifier.page_size, verifier.cap
        poison = verifier.poison_value
        q = verifier.draft_tokens + 1
        exp = verifier.expected_vectors
        L = exp.shape[-1] - 2
        t = torch.arange(L, device=exp.device)
        row = (t // q).clamp(max=M - 1).expand(K, L)
        in_rows = (t // q < M).expand(K, L)
        pos = (model.sl.gather(1, row) - 1).clamp(min=0) + (t % q)
        # A ring's blocks in turn (a table spanning the context has pos < width * ps in the
        # contract: the token's own page).
        page = ((pos // ps) % verifier.width).clamp(max=cap - 1)
        first = model.slots.reshape(K, M * cap).gather(1, row * cap + page)
        real = model.real.gather(1, row) & in_rows
        ooc = model.ooc.gather(1, row) & in_rows
        exp.fill_(poison)
        exp[:, 0, 1 : 1 + L] = torch.where(real, first + pos % ps, PAD_SLOT_ID)
        live = torch.zeros_like(exp, dtype=torch.bool)
        live[:, 0, 1 : 1 + L] = ~ooc
        judged = torch.ones_like(live)
        judged[:, 0, 1 : 1 + L] = ~ooc
        return verifier.vector_masks(exp, live, judged)


SLOT_MAPPING = SlotMappingKind()
