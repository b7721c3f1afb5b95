"""The page-table kind: ``pagegraph.build_page_table``'s contract (``docs/ARCHITECTURE.md``).

``build(req_to_token, req_pool_indices, seq_lens, page_table, page_size, *,
swa_page_table=None, full_to_swa=None, errors=None)`` fills each row's live pages of the page
table (and the SWA table), leaves every other entry as it was, and runs inside the graph.
"""

from __future__ import annotations

from collections.abc import Mapping

from .base import KindSpec
from .seams import Builder, BuilderIO


class PageTableKind(KindSpec):
    name = "page_table"
    signature = (
        "build(req_to_token, req_pool_indices, seq_lens, page_table, page_size, *, "
        "swa_page_table=None, full_to_swa=None, errors=None)"
    )
    positional = 5
    reference = "reference_page_table"

    def load_builders(self) -> dict[str, Builder]:
        from ..kernels.baselines import block_grid
        from ..kernels.page_table import build_page_table
        from ..kernels.reference import host_max_gather, reference_page_table, static_width_gather

        return {
            "build_page_table": build_page_table,
            "static_width_gather": static_width_gather,
            "host_max_gather": host_max_gather,
            "reference_page_table": reference_page_table,
            # The rejected fixed-grid design: exact, its cost follows the width.
            "block_grid": block_grid,
        }

    def call(self, builder: Builder, io: BuilderIO, bs: int, extra: Mapping[str, object]) -> None:
        builder(
            io.req_to_token,
            io.req_pool_indices[:bs],
            io.seq_lens[:bs],
            io.page_table[:bs],
            io.page_size,
            **extra,
        )


PAGE_TABLE = PageTableKind()
