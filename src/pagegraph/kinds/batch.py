"""The batch a builder of the ``block_table`` kind is called for: ``BatchContext``.

An engine pads a batch of ``num_reqs`` real requests up to a CUDA-graph bucket of
``num_rows`` rows; ``max_bs`` is the largest bucket (the persistent tables' row count). All
three are host ints, known before the step's kernels are launched, so a builder may size its
grid from them without reading the device.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["BatchContext"]


@dataclass(frozen=True)
class BatchContext:
    """Host-side sizes of one padded batch.

    Attributes:
        num_reqs: real rows (batch rows ``0 .. num_reqs - 1`` hold requests).
        num_rows: the padded bucket: rows ``num_reqs .. num_rows - 1`` are padding.
        max_bs: the largest bucket the engine captures.

    ``0 <= num_reqs <= num_rows <= max_bs`` (``ValueError`` otherwise; ``TypeError`` for a
    value that is not an int).
    """

    num_reqs: int
    num_rows: int
    max_bs: int

    def __post_init__(self) -> None:
        for name in ("num_reqs", "num_rows", "max_bs"):
            value = getattr(self, name)
            # bool is an int subclass, and a tensor would be read on the host: both refused.
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{name} must be an int, got {type(value).__name__}")
        if not 0 <= self.num_reqs <= self.num_rows <= self.max_bs:
            raise ValueError(
                "BatchContext needs 0 <= num_reqs <= num_rows <= max_bs, got "
                f"num_reqs={self.num_reqs}, num_rows={self.num_rows}, max_bs={self.max_bs}"
            )
