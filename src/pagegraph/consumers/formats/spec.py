"""A reader format: the metadata a decode step's attention reads, as one spec.

A ``ReaderFormat`` says everything the step, the checker and the benchmarks need to know about
one format, so that adding one is a module of its own (``paged_format.py`` and ``csr_format.py``
beside this file) registered into ``FORMATS``:

* ``kernel``: pagegraph's attention of the format (the default consumer of a scenario naming it);
* ``allocate`` / ``build``: the format's own buffers, allocated once for ``max_bs`` rows of the
  table's ``width`` before capture, and what the step's graph builds into them (torch or Triton
  ops, no sync) from the runner's ``page_table[:bs]`` and ``cache_seqlens[:bs]`` before the
  attention;
* ``arguments``: the attention's positional metadata, between ``v_cache`` and ``out``
  (``attention(q, k_cache, v_cache, *arguments, out, page_size=, workspace=)``);
* ``stale``: views of the format's buffers that hold entries no real row may read once the
  graph has built them (poisoned with other live pages' ids beside the table's stale tails, and
  named the NaN page in the reads-only-its-row replay), and ``overread_visible`` /
  ``past_row``: when that replay can see a row read past its own, and what such a read read;
* ``rows``: how the torch reference reads the metadata (each row's page ids and length).

docs/ARCHITECTURE.md, "The step's graphs", says how to add one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeAlias

import torch

from ..attention_reference import attend, live_kv

__all__ = [
    "FORMATS",
    "Metadata",
    "ReaderFormat",
    "Row",
    "reader_format",
    "register_format",
]

#: A format's own buffers by name (``ReaderFormat.allocate``); empty for one that reads the
#: runner's table as it is.
Metadata: TypeAlias = dict[str, torch.Tensor]
#: One row as the reference reads it: its page ids (those a correct reader may read) and its
#: length in tokens.
Row: TypeAlias = tuple[list[int], int]


class Allocate(Protocol):
    def __call__(self, max_bs: int, width: int, device: torch.device) -> Metadata: ...


class Build(Protocol):
    def __call__(
        self,
        meta: Metadata,
        page_table: torch.Tensor,
        cache_seqlens: torch.Tensor,
        page_size: int,
    ) -> None: ...


class Arguments(Protocol):
    def __call__(
        self, meta: Metadata, page_table: torch.Tensor, cache_seqlens: torch.Tensor
    ) -> tuple[torch.Tensor, ...]: ...


class Stale(Protocol):
    def __call__(self, meta: Metadata) -> tuple[torch.Tensor, ...]: ...


class OverreadVisible(Protocol):
    def __call__(self, lens: Sequence[int], page_size: int, width: int) -> bool: ...


class ReferenceRows(Protocol):
    def __call__(self, args: Sequence[torch.Tensor], page_size: int, bs: int) -> list[Row]: ...


def no_metadata(max_bs: int, width: int, device: torch.device) -> Metadata:
    """A format that reads the runner's table and lengths as they are: no buffers."""
    return {}


def builds_nothing(
    meta: Metadata, page_table: torch.Tensor, cache_seqlens: torch.Tensor, page_size: int
) -> None:
    """Nothing to build in the graph."""


def nothing_stale(meta: Metadata) -> tuple[torch.Tensor, ...]:
    """No buffer besides the table holds stale entries."""
    return ()


@dataclass(frozen=True)
class ReaderFormat:
    """One metadata format of the decode step's attention (module docstring)."""

    #: the value of a scenario's ``[consumer] format`` (``CheckConfig.consumer``)
    name: str
    #: pagegraph's attention of the format: ``kernel(q, k_cache, v_cache, *arguments, out, *,
    #: page_size, workspace)``
    kernel: Callable[..., object]
    #: the positional metadata of a call on ``bs`` rows, from ``allocate``'s buffers and the
    #: runner's ``page_table[:bs]`` / ``cache_seqlens[:bs]`` (views: the graph reads them)
    arguments: Arguments
    #: each of the first ``bs`` rows' page ids and length from ``arguments``' tensors, as the
    #: kernel clamps them: what the torch reference reads
    rows: ReferenceRows
    #: whether the reads-only-its-row replay (every entry outside the rows the graph reads
    #: names the NaN page) can see a real row read past its own, for a batch of ``lens``
    overread_visible: OverreadVisible
    #: what a row that read past its own read, for the report (``{width}``: the table's width)
    past_row: str
    #: the format's buffers, allocated once before capture
    allocate: Allocate = no_metadata
    #: what the graph builds into them on each call, before the attention
    build: Build = builds_nothing
    #: views of the buffers whose entries past what the graph builds stay stale: poisoned
    #: whole (each entry a live page) beside the table's stale tails, and named the NaN page
    #: in the reads-only-its-row replay
    stale: Stale = nothing_stale

    def reference(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        *args: torch.Tensor,
        page_size: int,
        sm_scale: float | None = None,
    ) -> torch.Tensor:
        """What ``kernel`` computes on the same arguments (no ``out``): a new ``[bs, Hq, D]``
        tensor in q's dtype, by dense fp32 attention (``consumers/attention_reference.py``)."""
        rows = self.rows(args, page_size, q.shape[0])
        return attend(q, live_kv(k_cache, v_cache, rows, page_size), sm_scale)


#: Every registered format by name, in registration order (pagegraph's own first).
FORMATS: dict[str, ReaderFormat] = {}


def register_format(fmt: ReaderFormat) -> ReaderFormat:
    """Add ``fmt`` to ``FORMATS`` (a format module calls it once, at import); a second format
    of the same name is refused. Returns ``fmt``."""
    known = FORMATS.get(fmt.name)
    if known is not None and known is not fmt:
        raise ValueError(f"a reader format named {fmt.name!r} is already registered")
    FORMATS[fmt.name] = fmt
    return fmt


def reader_format(name: str) -> ReaderFormat:
    """The registered format ``name``; a ``ValueError`` naming the known ones otherwise."""
    try:
        return FORMATS[name]
    except KeyError:
        known = ", ".join(repr(n) for n in FORMATS)
        raise ValueError(f"unknown reader format {name!r} (known: {known})") from None
