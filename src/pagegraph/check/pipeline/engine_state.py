"""The engine state a kind's builder reads besides ``req_to_token``, kept by the check
between replays (``KindSpec.engine_state``): vLLM's per-request block tables and
``num_blocks`` (``pagegraph.workload.engine_block_tables.EngineBlockTables``) for a ``block_table``
builder.

docs/ARCHITECTURE.md ("Inside the checker") has the details.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
import numpy.typing as npt
import torch

from ...detect.ranges import phase
from ...kinds import KindSpec
from ...kinds.seams import EngineState as BuilderEngineState
from ...workload.decode import Step
from ...workload.engine_block_tables import EngineBlockTables
from ...workload.pool import KVPool
from ..config import CheckConfig

#: ``KindSpec.engine_state`` -> the state's class.
ENGINE_STATES = {"block_tables": EngineBlockTables}


class EngineState(BuilderEngineState, Protocol):
    """An engine state a kind's builder reads (``EngineBlockTables``; what the builder reads
    of it: ``pagegraph.kinds.seams.EngineState``), as the check keeps it: its device buffers
    by name, brought up to date before each replay, and its hostile ``num_blocks``
    injection."""

    @property
    def max_reqs(self) -> int: ...
    @property
    def width(self) -> int: ...
    def buffers(self) -> dict[str, torch.Tensor]: ...
    def update(
        self,
        req_pool_indices: npt.ArrayLike,
        seq_lens: npt.ArrayLike,
        req_to_token: torch.Tensor,
        new: npt.ArrayLike | None = None,
    ) -> None: ...
    def inject_num_blocks(self, rows: npt.ArrayLike, values: npt.ArrayLike) -> None: ...
    def restore_num_blocks(self) -> None: ...


class EngineRun(Protocol):
    """What the engine state's update reads and sets of a check's run
    (``pagegraph.check.pipeline.state.CheckRun``)."""

    @property
    def cfg(self) -> CheckConfig: ...
    @property
    def kind(self) -> KindSpec: ...
    @property
    def pool(self) -> KVPool | None: ...
    @property
    def engine(self) -> EngineState | None: ...
    @property
    def engine_rng(self) -> np.random.Generator | None: ...

    #: the rows whose engine state this replay broke, or None
    engine_overrun: np.ndarray | None


def make_engine_state(
    kind: KindSpec, cfg: CheckConfig, pool: KVPool, device: torch.device
) -> EngineState | None:
    """The engine state ``kind`` reads, sized for the pool and the config's table width, or
    ``None`` for a kind that reads none."""
    if kind.engine_state is None:
        return None
    state = ENGINE_STATES[kind.engine_state]
    return state(pool.req_to_token.shape[0], cfg.width, cfg.page_size, device)


def update_engine_state(run: EngineRun, step: Step, may_break: bool = True) -> None:
    """Bring ``run.engine`` up to date for ``step``'s batch (see the module docstring); with
    ``may_break``, draw the scenario's hostile ``num_blocks_overrun`` for it."""
    engine = run.engine
    if engine is None:
        return
    rpi = np.asarray(step.req_pool_indices, dtype=np.int64)
    lens = np.asarray(step.seq_lens, dtype=np.int64)
    if run.kind.tables_include_draft:
        # The step's tokens, at positions max(len - 1, 0) + j for j <= draft_tokens, have
        # their blocks: a zero-length row's token at position 0 too, as vLLM's scheduler
        # allocates the block of every token it schedules.
        lens = np.maximum(lens, 1) + run.cfg.draft_tokens
    mine = (rpi >= 0) & (rpi < engine.max_reqs)
    pool = run.pool
    assert pool is not None, "the pool is set up before the engine state is updated"
    with phase("workload"):
        if run.engine_overrun is not None:  # the last replay's broken count, undone
            engine.restore_num_blocks()
            run.engine_overrun = None
        engine.update(rpi[mine], lens[mine], pool.req_to_token, new=np.ones(mine.sum(), bool))
        if may_break:
            run.engine_overrun = _break_num_blocks(run, engine, rpi, mine)


def _break_num_blocks(
    run: EngineRun, engine: EngineState, rpi: np.ndarray, mine: np.ndarray
) -> np.ndarray | None:
    """With probability ``cfg.num_blocks_overrun``, one real row's device ``num_blocks`` past
    the width (the module docstring); the ``[bs]`` bool rows broken, or ``None``."""
    rate, rng = run.cfg.num_blocks_overrun, run.engine_rng
    if not rate:
        return None
    assert rng is not None, "the engine's generator is set up with the engine state"
    if rng.random() >= rate:
        return None
    rows = np.flatnonzero(mine)
    if not rows.size:
        return None
    row = int(rng.choice(rows))
    width = engine.width
    engine.inject_num_blocks([rpi[row]], [width + int(rng.integers(1, width + 1))])
    broken = np.zeros(rpi.size, dtype=bool)
    broken[row] = True
    return broken
