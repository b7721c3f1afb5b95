"""The engine state a kind's builder reads besides ``req_to_token``, kept by the check
between replays (``KindSpec.engine_state``): vLLM's per-request block tables and
``num_blocks`` (``pagegraph.workload.block_tables.EngineBlockTables``) for a ``block_table``
builder.

Before each replay, in the ``workload`` range (not the replay path), the batch's request
slots are brought up to date from the pool's ``req_to_token``, after the step's page writes:
each row's first ``cdiv(len, page_size)`` block ids (at most the width: the host guarantee
vLLM keeps) and its ``num_blocks``; the entries past ``num_blocks`` keep whatever an earlier
request left there, as in vLLM. A slot is rewritten from block 0 every step rather than
appended to: the check's pool does not know which slot took a new request (its workload may
run in child processes), and a builder that honours ``num_blocks`` reads the same entries
either way. Rows whose request index is outside the pool (a hostile injection) are no
request's: their slot is not touched, and the builder's row is judged by containment.
"""

from __future__ import annotations

import numpy as np
import torch

from ..detect.ranges import phase
from ..kinds import KindSpec
from ..workload.block_tables import EngineBlockTables
from ..workload.decode import Step
from ..workload.pool import KVPool
from .config import CheckConfig

#: ``KindSpec.engine_state`` -> the state's class.
ENGINE_STATES = {"block_tables": EngineBlockTables}


def make_engine_state(kind: KindSpec, cfg: CheckConfig, pool: KVPool, device: torch.device):
    """The engine state ``kind`` reads, sized for the pool and the config's table width, or
    ``None`` for a kind that reads none."""
    if kind.engine_state is None:
        return None
    state = ENGINE_STATES[kind.engine_state]
    return state(pool.req_to_token.shape[0], cfg.width, cfg.page_size, device)


def update_engine_state(run, step: Step) -> None:
    """Bring ``run.engine`` up to date for ``step``'s batch (see the module docstring)."""
    engine = run.engine
    if engine is None:
        return
    rpi = np.asarray(step.req_pool_indices, dtype=np.int64)
    lens = np.asarray(step.seq_lens, dtype=np.int64)
    if run.kind.tables_include_draft:  # the step's draft tokens have their blocks too
        lens = lens + run.cfg.draft_tokens
    mine = (rpi >= 0) & (rpi < engine.max_reqs)
    with phase("workload"):
        engine.update(rpi[mine], lens[mine], run.pool.req_to_token, new=np.ones(mine.sum(), bool))
