""" "outputs unaliased": no output the graph writes shares a byte with another buffer it reads
or writes.

docs/ARCHITECTURE.md ("Inside the checker") has the details.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ...kinds import KindSpec
from ..reports.report import PropertyResult

__all__ = ["Overlap", "byte_runs", "find_overlaps", "judge_aliasing", "split_buffers"]

PROPERTY = "outputs unaliased"

#: Contiguous runs a view may be cut into before its bytes are taken whole (its span from its
#: first to its last byte): past it, overlap is judged by the spans, which can only add one.
MAX_RUNS = 1 << 22


@dataclass(frozen=True)
class Overlap:
    """Two buffers that share bytes: ``first`` an output, ``second`` an output or an input."""

    first: str
    second: str
    #: "two outputs" or "an output and an input"
    relation: str
    #: bytes both views cover
    common: int
    #: where the first common byte lies in each (``name[i, j]``)
    first_at: str
    second_at: str

    def __str__(self) -> str:
        return (
            f"{self.first} overlaps {self.second} ({self.relation}): {self.common} bytes in "
            f"common, the first at {self.first_at} = {self.second_at}; a write into one "
            f"overwrites what the graph reads of the other"
        )


def byte_runs(t: torch.Tensor) -> np.ndarray:
    """The bytes ``t`` covers as ``[R, 2]`` int64 ``[start, end)`` addresses, sorted, merged,
    disjoint: its elements through its strides (dimensions of stride 0 repeat elements and
    add none). Past ``MAX_RUNS`` runs, its span (first to last byte) as one run."""
    if t.numel() == 0:
        return np.zeros((0, 2), dtype=np.int64)
    es, base = t.element_size(), t.data_ptr()
    dims = sorted((st, n) for n, st in zip(t.shape, t.stride(), strict=True) if n > 1 and st > 0)
    run = 1  # elements of one contiguous run: the inner dimensions that follow one another
    while dims and dims[0][0] == run:
        run *= dims.pop(0)[1]
    outer = dims
    count = int(np.prod([n for _, n in outer], dtype=np.int64)) if outer else 1
    if count > MAX_RUNS:
        last = sum((n - 1) * st for n, st in zip(t.shape, t.stride(), strict=True))
        return np.array([[base, base + (last + 1) * es]], dtype=np.int64)
    starts = np.zeros(1, dtype=np.int64)
    for stride, n in outer:
        starts = (starts[:, None] + np.arange(n, dtype=np.int64) * stride).reshape(-1)
    starts = np.sort(starts) * es + base
    return _merged(np.stack([starts, starts + run * es], axis=1))


def _merged(runs: np.ndarray) -> np.ndarray:
    """Sorted runs with overlapping or touching neighbours joined."""
    if len(runs) < 2:
        return runs
    ends = np.maximum.accumulate(runs[:, 1])
    new = np.ones(len(runs), dtype=bool)
    new[1:] = runs[1:, 0] > ends[:-1]
    first = np.flatnonzero(new)
    last = np.append(first[1:] - 1, len(runs) - 1)
    return np.stack([runs[first, 0], ends[last]], axis=1)


def _common(a: np.ndarray, b: np.ndarray) -> tuple[int, int]:
    """Bytes two run lists (``byte_runs``) share, and the first shared address (-1: none)."""
    if not len(a) or not len(b) or a[-1, 1] <= b[0, 0] or b[-1, 1] <= a[0, 0]:
        return 0, -1
    lo = np.searchsorted(a[:, 1], b[:, 0], side="right")  # first run of a ending past b's start
    hi = np.searchsorted(a[:, 0], b[:, 1], side="left")  # runs of a starting before b's end
    counts = np.maximum(hi - lo, 0)
    if not counts.any():
        return 0, -1
    bi = np.repeat(np.arange(len(b)), counts)
    ai = np.repeat(lo - np.cumsum(counts) + counts, counts) + np.arange(counts.sum())
    start = np.maximum(a[ai, 0], b[bi, 0])
    end = np.minimum(a[ai, 1], b[bi, 1])
    return int((end - start).sum()), int(start.min())


def _index_of(name: str, t: torch.Tensor, address: int) -> str:
    """``name[i, j]``: the element of ``t`` holding byte ``address`` (its first element whose
    bytes hold it, by the strides from the largest down)."""
    offset = (address - t.data_ptr()) // t.element_size()
    index = [0] * t.dim()
    strides = t.stride()
    for d in sorted(range(t.dim()), key=lambda d: -strides[d]):
        if t.stride(d) > 0 and t.shape[d] > 1:
            index[d] = min(offset // t.stride(d), t.shape[d] - 1)
            offset -= index[d] * t.stride(d)
    return f"{name}[{', '.join(map(str, index))}]" if index else name


def _span(t: torch.Tensor) -> tuple[int, int]:
    last = sum((n - 1) * st for n, st in zip(t.shape, t.stride(), strict=True))
    return t.data_ptr(), t.data_ptr() + (last + 1) * t.element_size()


def find_overlaps(
    outputs: dict[str, torch.Tensor], inputs: dict[str, torch.Tensor]
) -> list[Overlap]:
    """Every pair of an output with another output, or with an input, whose bytes meet
    (exactly: ``byte_runs``), in the order of ``outputs`` then ``inputs``. Empty tensors
    cover nothing."""
    named = [(n, t, True) for n, t in outputs.items() if t is not None and t.numel()]
    named += [(n, t, False) for n, t in inputs.items() if t is not None and t.numel()]
    spans = [_span(t) for _, t, _ in named]
    runs: dict[int, np.ndarray] = {}
    found = []
    for i, (name, t, out) in enumerate(named):
        if not out:
            continue
        for j in range(i + 1, len(named)):
            other, u, other_out = named[j]
            if spans[i][1] <= spans[j][0] or spans[j][1] <= spans[i][0]:
                continue  # the spans do not meet: nothing to cut into runs
            a = runs[i] = runs[i] if i in runs else byte_runs(t)
            b = runs[j] = runs[j] if j in runs else byte_runs(u)
            common, first = _common(a, b)
            if common:
                relation = "two outputs" if other_out else "an output and an input"
                found.append(
                    Overlap(
                        name,
                        other,
                        relation,
                        common,
                        _index_of(name, t, first),
                        _index_of(other, u, first),
                    )
                )
    return found


def split_buffers(
    buffers: dict[str, torch.Tensor | None], kind: KindSpec
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """``(outputs, inputs)`` of a runner's ``static_buffers()`` for a builder of ``kind``:
    outputs are what the graph writes (the tables where the kind writes tables, its vectors,
    ``errors``, ``read_table``); the tables of a kind that writes none are neither (nothing
    reads or writes them); everything else is read."""
    written = {"errors", "read_table", *kind.vector_names}
    tables = ("page_table", "swa_page_table")
    if kind.writes_tables:
        written.update(tables)
    outputs: dict[str, torch.Tensor] = {}
    inputs: dict[str, torch.Tensor] = {}
    for name, t in buffers.items():
        if t is None or (name in tables and not kind.writes_tables):
            continue
        (outputs if name in written else inputs)[name] = t
    return outputs, inputs


def judge_aliasing(prop: PropertyResult, runner: object, kind: KindSpec) -> None:
    """Judge ``prop`` ("outputs unaliased") on ``runner``'s static buffers (see the module
    docstring): a failure names the first two buffers that share bytes and how many."""
    static = getattr(runner, "static_buffers", None)
    if static is None:
        prop.skip("the runner lists no static buffers (static_buffers())")
        return
    outputs, inputs = split_buffers(static(), kind)
    overlaps = find_overlaps(outputs, inputs)
    prop.detail = (
        f"{len(outputs)} output(s) ({', '.join(outputs)}) against each other and "
        f"{len(inputs)} input(s): "
    )
    if not overlaps:
        prop.detail += "no byte in common"
        return
    prop.detail += f"{len(overlaps)} overlap(s): " + "; ".join(
        f"{o.first} / {o.second}" for o in overlaps[:4]
    )
    prop.fail(str(overlaps[0]))
