"""What a builder may be told about the batch beyond its tensors: ``BatchContext`` (a
builder's ``batch=``, found from its signature by ``pagegraph.kinds.builders``).

A builder that takes ``batch=`` (found from its signature, like ``errors=``) is passed one.
Inside a captured graph only the bucket and ``max_bs`` are host values that stay true at
every replay; the real batch size is known to the host only where the builder runs eagerly,
before the graph (vLLM's block tables), so ``num_reqs`` is ``None`` for a builder captured in
the graph.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BatchContext:
    """One call's batch shape, host ints only.

    ``num_reqs``: the real rows (``None`` inside a graph, where it changes between replays);
    ``num_rows``: the padded bucket the call fills; ``max_bs``: rows of the static buffers.
    """

    num_reqs: int | None
    num_rows: int
    max_bs: int

    def __post_init__(self) -> None:
        for name in ("num_rows", "max_bs"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"BatchContext.{name} must be an int, got {value!r}")
        if self.num_reqs is not None and (
            isinstance(self.num_reqs, bool) or not isinstance(self.num_reqs, int)
        ):
            raise TypeError(f"BatchContext.num_reqs must be an int or None, got {self.num_reqs!r}")
        low = 0 if self.num_reqs is None else self.num_reqs
        if not 0 <= low <= self.num_rows <= self.max_bs:
            raise ValueError(
                f"BatchContext needs 0 <= num_reqs <= num_rows <= max_bs, got num_reqs="
                f"{self.num_reqs}, num_rows={self.num_rows}, max_bs={self.max_bs}"
            )
