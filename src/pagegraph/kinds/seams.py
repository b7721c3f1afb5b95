"""What a kind reads of the layers above it, as protocols the classes there satisfy
structurally (the kinds never import them): a builder's buffers (``BuilderIO``: the runner,
the checker's eager calls and decode step), the engine's state (``EngineState``), the
verifier and its model of the replays (``VectorVerifier``, ``ReplayModel``) and a scenario's
config (``ScenarioConfig``). Members are read-only properties: a kind reads them, and writes
into the tensors they hold, but never rebinds them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Protocol, TypeAlias

import torch

__all__ = [
    "Builder",
    "BuilderIO",
    "EngineState",
    "GroupTable",
    "ReplayModel",
    "ScenarioConfig",
    "VectorVerifier",
]

#: A metadata builder: any callable; the bed passes its kind's arguments (``KindSpec.call``)
#: and ignores what it returns (a builder writes into the buffers it is given).
Builder: TypeAlias = Callable[..., object]

#: One KV-cache group's table as a scenario gives it (``[layout] kv_groups``): ``name`` and
#: ``kind`` (str), ``block_size`` and ``width`` (int), each optional;
#: ``pagegraph.kinds.kv_group_layout.groups_problem`` says why a config's tables are not that.
GroupTable: TypeAlias = Mapping[str, int | str]


class EngineState(Protocol):
    """The engine's state between steps that a kind of ``engine_state = "block_tables"``
    reads (vLLM's per-request block tables,
    ``pagegraph.workload.engine_block_tables.EngineBlockTables``)."""

    @property
    def block_table(self) -> torch.Tensor:
        """``[max_reqs, width]`` int32: each request slot's blocks."""
        ...

    @property
    def num_blocks(self) -> torch.Tensor:
        """``[max_reqs]`` int32: each request slot's live blocks."""
        ...

    def buffers(self) -> Mapping[str, torch.Tensor]:
        """The device state a builder reads, by name (a runner watches their addresses)."""
        ...


class BuilderIO(Protocol):
    """A builder's inputs and outputs as the bed hands them to ``KindSpec.call``: the fields
    of ``IO_FIELDS`` (``None`` where the bed has none). The call reads rows ``:bs`` of the
    batch tensors and writes into the output tensors, in place."""

    @property
    def req_to_token(self) -> torch.Tensor:
        """``[max_reqs, >= max_context_len]`` int32/int64: each request's token slots."""
        ...

    @property
    def req_pool_indices(self) -> torch.Tensor:
        """``[>= bs]`` int32/int64: each row's request (the staged batch, padded)."""
        ...

    @property
    def seq_lens(self) -> torch.Tensor:
        """``[>= bs]`` int32/int64: each row's length in tokens."""
        ...

    @property
    def page_table(self) -> torch.Tensor:
        """``[>= bs, width]`` int32: the page table the builder writes (a kind that writes no
        table gets one all the same, which it must leave alone)."""
        ...

    @property
    def swa_page_table(self) -> torch.Tensor | None:
        """``[>= bs, width]`` int32 SWA table, or ``None`` (the bed passes it in ``extra``)."""
        ...

    @property
    def full_to_swa(self) -> torch.Tensor | None:
        """``[num_slots + 1]`` int32/int64 slot map of the SWA pool, or ``None``."""
        ...

    @property
    def errors(self) -> torch.Tensor | None:
        """``[E]`` int32 error counters, or ``None`` (the bed passes them in ``extra``)."""
        ...

    @property
    def page_size(self) -> int:
        """Tokens per page."""
        ...

    @property
    def draft_tokens(self) -> int:
        """Draft tokens a row (a speculative step's; 0 for a plain decode step)."""
        ...

    @property
    def vectors(self) -> Mapping[str, torch.Tensor]:
        """The kind's 1-D output vectors by name (``KindSpec.vectors``); read only by kinds
        that have vectors."""
        ...

    @property
    def engine(self) -> EngineState | None:
        """The engine state a kind of ``engine_state`` reads, else ``None``."""
        ...

    @property
    def derived(self) -> Mapping[str, torch.Tensor]:
        """The static inputs the call derives from the staged batch
        (``KindSpec.derived_inputs``; empty for most kinds)."""
        ...


class ReplayModel(Protocol):
    """The independent model of the ``K`` replays a verification launch judges, per replay
    and row: ``[K, M]`` device tensors (``M = max_bs``), what ``KindSpec.vector_fields``
    computes the expected vectors from."""

    @property
    def sl(self) -> torch.Tensor:
        """``[K, M]`` int64: each row's length as staged (the padding's past ``n``)."""
        ...

    @property
    def in_bucket(self) -> torch.Tensor:
        """``[K, M]`` bool: rows of the replay's bucket (real and padded)."""
        ...

    @property
    def real(self) -> torch.Tensor:
        """``[K, M]`` bool: the batch's real rows."""
        ...

    @property
    def ooc(self) -> torch.Tensor:
        """``[K, M]`` bool: rows of the bucket outside the contract."""
        ...

    @property
    def n_pages(self) -> torch.Tensor:
        """``[K, M]`` int64: each row's live pages in the reference (0 past the bucket)."""
        ...

    @property
    def slots(self) -> torch.Tensor:
        """``[K, M, cap]`` int64: each page's first token slot, gathered at the replay."""
        ...


class VectorVerifier(Protocol):
    """What ``KindSpec.vector_fields`` reads of the verifier that judges ``K = batch``
    replays at once (``pagegraph.check.judges.verify.TableVerifier``): its sizes, its buffers for
    the kind's vectors (a ``[V, L]`` allocation a replay, with a canary entry on both sides
    of each vector) and the two functions that turn expected values into mask fields."""

    @property
    def batch(self) -> int:
        """``K``: replays verified at once."""
        ...

    @property
    def max_bs(self) -> int:
        """``M``: rows of the static buffers."""
        ...

    @property
    def width(self) -> int:
        """Pages a table row."""
        ...

    @property
    def cap(self) -> int:
        """Pages of a row the reference gathers (``ReplayModel.slots``' last dimension)."""
        ...

    @property
    def page_size(self) -> int:
        """Tokens per page."""
        ...

    @property
    def draft_tokens(self) -> int:
        """Draft tokens a row."""
        ...

    @property
    def poison_value(self) -> int:
        """What every entry no builder may write holds."""
        ...

    @property
    def engine_capacity(self) -> int:
        """Entries of the kind's engine-sized vector (a CSR builder's ``kv_indices``), or 0."""
        ...

    @property
    def expected_vectors(self) -> torch.Tensor:
        """``[K, V, L]`` scratch (the vectors' dtype) the kind fills with expected values."""
        ...

    @property
    def snap_vectors(self) -> torch.Tensor | None:
        """``[K, V, L]``: what each replay left in the vectors (``None`` for a kind without
        vectors, whose ``vector_fields`` is never called)."""
        ...

    @property
    def vector_index(self) -> torch.Tensor:
        """``[M + 1]`` int64: ``0..M``."""
        ...

    @property
    def capacity_index(self) -> torch.Tensor:
        """``[engine_capacity]`` int64: ``0..engine_capacity - 1``."""
        ...

    def running_sums(self, sl: torch.Tensor, in_bucket: torch.Tensor) -> torch.Tensor:
        """``[K, M]`` int64 true running sums of ``cache_seqlens`` over the bucket's rows."""
        ...

    def vector_masks(
        self, exp: torch.Tensor, live: torch.Tensor, judged: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``[K, 8]`` int64: the two vector masks' fields (entries of ``live`` that differ
        from ``exp``, then entries outside it that differ and are ``judged``)."""
        ...


class ScenarioConfig(Protocol):
    """What the kinds read of a scenario's config (``pagegraph.check.config.CheckConfig``)
    to say whether a builder can run on it."""

    @property
    def page_size(self) -> int: ...

    @property
    def max_context_len(self) -> int: ...

    @property
    def table_width(self) -> int | None:
        """Pages a table row, when narrower than the context's."""
        ...

    @property
    def swa(self) -> bool: ...

    @property
    def consumer(self) -> str | None:
        """The decode step's attention format, or ``None`` (no consumer)."""
        ...

    @property
    def padding(self) -> str:
        """The padding policy's name (``pagegraph.graph.buckets.PADDING``)."""
        ...

    @property
    def kv_groups(self) -> Sequence[GroupTable]:
        """vLLM's KV-cache groups (``pagegraph.kinds.kv_group_layout``); empty: one group."""
        ...

    @property
    def num_blocks_overrun(self) -> float:
        """Rate of injected ``num_blocks`` past the width (0: none)."""
        ...
