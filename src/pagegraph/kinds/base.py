"""``KindSpec``: everything the bed knows about one kind of metadata builder: its contract,
where it runs, its outputs, its padded-row policy, its built-in builders and oracle. The
runner, the checker's buffers, the verifier and the judge ask the builder's spec instead of
comparing kind names, so adding a kind is one module (a ``KindSpec`` subclass, in this folder
or registered with ``pagegraph.kinds.register_kind``) plus its scenarios
(docs/ARCHITECTURE.md, "Builder kinds as specs").
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar

import torch

from ..kernels.batch import BatchContext
from ..kernels.contract import ERROR_KINDS
from .seams import Builder, BuilderIO, EngineState, ReplayModel, VectorVerifier


@dataclass(frozen=True)
class PaddedRows:
    """What a builder leaves in rows ``n..bucket`` (the padding) of its outputs.

    ``"built"``: padded rows are built from what the padding policy staged, like real rows
    (SGLang's fill length 1 and stale request index). ``"cleared"``: every entry of a padded
    row's ``[0, width)`` is set to ``null`` (vLLM points padded rows at the null block 0).
    """

    policy: str = "built"
    null: int = 0

    @property
    def cleared(self) -> bool:
        return self.policy == "cleared"


@dataclass(frozen=True)
class VectorSpec:
    """A 1-D output of a builder: its name, dtype and length for a runner of ``max_bs`` rows
    and ``width`` pages a row (``length(max_bs, width, draft_tokens)``)."""

    name: str
    dtype: torch.dtype
    length: Callable[[int, int, int], int]
    #: an engine's own buffer of this name may be longer, and is used whole (the builder
    #: must stay inside it: ``kv_indices``)
    engine_sized: bool = False
    #: the entries outside the live region, which must keep the checker's poison, as a
    #: report names them ("the poison: <untouched> must stay untouched")
    untouched: str = "an entry past the batch"


#: The builder's outputs and inputs as the bed hands them over (the runner, or the checker's
#: eager probe): any object with these attributes (``None`` where absent), typed as
#: ``pagegraph.kinds.seams.BuilderIO``.
IO_FIELDS = (
    "req_to_token",
    "req_pool_indices",
    "seq_lens",
    "page_table",
    "swa_page_table",
    "full_to_swa",
    "errors",
    "page_size",
    "draft_tokens",
    "vectors",
    "engine",
    "derived",
)


class KindSpec:
    """One builder kind (docs/ARCHITECTURE.md, "Builder kinds as specs"). Subclasses set the
    class attributes and ``call``; the instances in ``pagegraph.kinds.KINDS`` are the ones the
    bed uses."""

    name: ClassVar[str]
    #: the contract as users read it
    signature: ClassVar[str]
    #: positional arguments and keyword arguments the bed always passes (bound to check a
    #: builder's signature before anything runs)
    positional: ClassVar[int] = 5
    keywords: ClassVar[tuple[str, ...]] = ()
    #: "graph": captured in each bucket's graph; "eager": called before each replay
    where: ClassVar[str] = "graph"
    writes_tables: ClassVar[bool] = True
    #: may write an SWA table (``swa_page_table`` / ``full_to_swa``)
    swa: ClassVar[bool] = True
    #: a decode-step scenario's attention can read its outputs
    feeds_consumer: ClassVar[bool] = True
    vectors: ClassVar[tuple[VectorSpec, ...]] = ()
    #: presettable output -> (vector index, entry in the vector's allocation)
    presets: ClassVar[dict[str, tuple[int, int]]] = {}
    error_kinds: ClassVar[tuple[str, ...]] = ERROR_KINDS
    padded_rows: ClassVar[PaddedRows] = PaddedRows()
    #: on an out-of-contract replay its vectors stay exact up to the first out-of-contract row
    #: (a longer row shifts only what follows it: CSR), and are judged there
    ooc_prefix_exact: ClassVar[bool] = False
    #: its outputs cover ``max(len, 0) + draft_tokens`` tokens a row (a decode or verify
    #: step's: the tables for those lengths, the draft tokens' slots), and the pool holds them
    tables_include_draft: ClassVar[bool] = False
    #: the engine state it reads besides ``req_to_token`` (``"block_tables"``: vLLM's
    #: per-request block tables and ``num_blocks``), or ``None``
    engine_state: ClassVar[str | None] = None
    #: the vector a decode step's attention reads as each row's length, when the builder
    #: writes it (else the step computes the lengths itself), or ``None``
    consumer_lengths: ClassVar[str | None] = None
    #: padding policies it is defined for (``None``: any)
    paddings: ClassVar[tuple[str, ...] | None] = None
    #: name of the oracle among ``builders``
    reference: ClassVar[str]

    def __init__(self) -> None:
        self._builders: dict[str, Builder] | None = None

    def __repr__(self) -> str:
        return f"<kind {self.name}>"

    # -- builders -------------------------------------------------------------------------

    def load_builders(self) -> dict[str, Builder]:
        """The kind's built-in builders by name (pagegraph's, the oracle, baselines)."""
        raise NotImplementedError

    @property
    def builders(self) -> dict[str, Builder]:
        if self._builders is None:
            self._builders = self.load_builders()
        return self._builders

    # -- calling --------------------------------------------------------------------------

    def call(self, builder: Builder, io: BuilderIO, bs: int, extra: Mapping[str, object]) -> None:
        """Call ``builder`` on rows ``:bs`` of ``io``'s buffers (see ``IO_FIELDS``), with
        ``extra`` keyword arguments (``errors``, SWA outputs, ``batch``) it takes."""
        raise NotImplementedError

    def vector_fields(self, verifier: VectorVerifier, model: ReplayModel) -> torch.Tensor:
        """Two masks' fields a replay (``[K, 8]`` int64) of the kind's vectors against what
        the independent ``model`` of the verifier's ``K`` replays expects, computed on the
        device with ``verifier`` (a ``pagegraph.check.judges.verify.TableVerifier``): entries of the
        live region that are wrong, and entries outside it that are not the poison. ``model``
        holds, per replay and row, ``[K, M]`` tensors: ``sl`` (int64 lengths),
        ``in_bucket``, ``real`` and ``ooc`` (bool), ``n_pages`` (int64 live pages), and
        ``slots`` ``[K, M, cap]`` (int64: each page's first slot, gathered at the replay).
        Kinds with vectors define it."""
        raise NotImplementedError(f"{self.name} has no vectors")

    def call_rows(self, args: tuple[object, ...], kwargs: Mapping[str, object]) -> int:
        """The batch rows of one call of a builder of this kind, from the arguments ``call``
        passed (what a probe of the builder records): the rows of the page table it writes,
        by keyword or as the fourth positional argument; -1 where that is no tensor."""
        table = kwargs.get("page_table", args[3] if len(args) > 3 else None)
        shape = getattr(table, "shape", None)
        return int(shape[0]) if shape is not None else -1

    def entry_owner(
        self,
        vector: str,
        entry: int,
        lengths: Sequence[int],
        page_size: int,
        cap: int,
        capacity: int,
    ) -> str:
        """What entry ``entry`` of the vector ``vector`` is, when its index alone does not
        say (a report's note), on a replay whose bucket's rows have ``lengths`` tokens (host
        ints), pages of ``page_size`` tokens, at most ``cap`` pages a row and ``capacity``
        entries in the kind's engine-sized vectors; ``""`` (the index says) by default."""
        return ""

    @staticmethod
    def engine_of(io: BuilderIO) -> EngineState:
        """``io``'s engine state, for a kind that reads one (``engine_state``); a runner
        refuses such a kind without it, so ``None`` here is a caller's bug, said so."""
        engine = io.engine
        if engine is None:
            raise ValueError("this builder kind reads the engine's state: the IO has no engine")
        return engine

    def derived_inputs(
        self, max_bs: int, draft_tokens: int, device: torch.device
    ) -> dict[str, torch.Tensor]:
        """Static inputs the graph derives from the staged batch before calling the builder
        (``call`` fills them), made once by whoever holds the buffers; none for most kinds."""
        return {}

    def vector_lengths(self, max_bs: int, width: int, draft_tokens: int = 0) -> dict[str, int]:
        return {v.name: v.length(max_bs, width, draft_tokens) for v in self.vectors}

    @property
    def vector_names(self) -> tuple[str, ...]:
        return tuple(v.name for v in self.vectors)

    def vector(self, name: str) -> VectorSpec:
        """The vector ``name`` of this kind (``ValueError`` naming its vectors otherwise)."""
        for spec in self.vectors:
            if spec.name == name:
                return spec
        raise ValueError(self.unknown_vectors_message([name]))

    def unknown_vectors_message(self, names: Sequence[str]) -> str:
        """Why ``names`` cannot be vectors of a builder of this kind: it has others, or none."""
        listed = ", ".join(self.vector_names) or "none"
        return (
            f"{', '.join(map(repr, names))}: not an output vector of a {self.name} builder "
            f"(its vectors: {listed})"
        )

    # -- the contract, checked before anything runs --------------------------------------

    def bind_problem(self, builder: Builder, sig: inspect.Signature, swa: bool) -> str | None:
        """Why the bed's call cannot bind to ``sig``; ``None`` when it can."""
        kwargs = dict.fromkeys(self.keywords)
        try:
            sig.bind(*(None,) * self.positional, **kwargs)
        except TypeError as exc:
            return (
                f"cannot be called as a {self.name} builder ({exc}); the contract: {self.signature}"
            )
        return None

    def usage_problem(self, *, swa: bool, consumer: bool, padding: str | None = None) -> str | None:
        """Why a scenario with SWA (``swa``), a decode-step consumer (``consumer``) or the
        padding policy ``padding`` cannot run a builder of this kind; ``None`` when it can."""
        if padding is not None and self.paddings is not None and padding not in self.paddings:
            return (
                f"is a {self.name} builder, defined for padding {' or '.join(self.paddings)} "
                f"(this scenario pads with {padding!r})"
            )
        if consumer and not self.feeds_consumer:
            return (
                f"is a {self.name} builder: a decode-step scenario ([consumer]) feeds the "
                "builder's page table to the attention, so it takes a page_table or "
                "decode_metadata builder"
            )
        if swa and not self.swa:
            return (
                f"is a {self.name} builder: its outputs have no SWA table, and this scenario "
                "has SWA (swa = true)"
            )
        return None

    def batch_context(self, n: int | None, bucket: int, max_bs: int) -> BatchContext:
        """The ``batch=`` of a call for ``n`` real rows padded to ``bucket`` (``n`` is only a
        host value where the builder runs eagerly)."""
        return BatchContext(n if self.where == "eager" else None, bucket, max_bs)
