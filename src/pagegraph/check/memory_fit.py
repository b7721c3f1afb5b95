"""Whether a check fits the memory its tables live in, decided before anything is allocated:
``memory_need`` counts what a check of a config allocates there, from the pool's own sizing
(``pagegraph.workload.pool.pool_sizing``, the formulas ``KVPool`` allocates by) and the
checker's (``pagegraph.check.pipeline.buffers.table_bytes``); ``fit_problem`` compares it
with the memory available (``plan_check(..., fit_memory=True)`` refuses a check that does
not fit).
"""

from __future__ import annotations

import os

import torch

from ..consumers.attention_reference import GATHER_TOKENS
from ..kinds import KindSpec
from ..workload.pool import pool_sizing
from ..workload.producer import SEGMENT_STEPS, streams_with_steps
from .config import CONSUMER_DTYPES, CheckConfig
from .pipeline.buffers import table_bytes
from .pipeline.workload_setup import pool_kwargs

__all__ = ["SLACK_BYTES", "available_memory", "fit_problem", "memory_need", "memory_problem"]

#: Bytes counted beside the parts of ``memory_need`` (allocator rounding, small tensors).
SLACK_BYTES = 64 << 20


def memory_need(cfg: CheckConfig, kind: KindSpec) -> tuple[int, dict[str, int]]:
    """About how many bytes a check of ``cfg`` on a builder of ``kind`` allocates where its
    tables live, and the parts: the pool's tables and write scratch (``pool_sizing``), the
    static buffers and the checker's working set, the tables parked by extra workload
    streams, with a consumer the KV cache and the reference's chunk; plus ``SLACK_BYTES``."""
    sizing = pool_sizing(**pool_kwargs(cfg))
    pool = sizing.device_bytes()
    # With more than one stream that has steps, each parks its tables in buffers of its own
    # (ProducedWorkload).
    streams = streams_with_steps(cfg.steps, cfg.workload_streams, SEGMENT_STEPS)
    tables = pool["req_to_token"] + pool["full_to_swa"]
    parts = {
        "req_to_token": pool["req_to_token"],
        "full_to_swa": pool["full_to_swa"],
        "tables and checker": table_bytes(cfg, kind),
        "pool write scratch": pool["pool write scratch"],
        "parked stream tables": tables * streams if streams > 1 else 0,
    }
    if cfg.consumer:
        parts["KV cache and reference"] = _consumer_bytes(cfg, sizing.num_pages)
    return sum(parts.values()) + SLACK_BYTES, parts


def _consumer_bytes(cfg: CheckConfig, pages: int) -> int:
    """The decode step's K and V pages (made in fp32, then cast) and the reference's gathered
    chunk of K and V (in the cache's dtype and in fp32)."""
    token = cfg.num_kv_heads * cfg.head_dim
    item = CONSUMER_DTYPES[cfg.consumer_dtype].itemsize
    cache = pages * cfg.page_size * token
    return cache * (2 * item + 4) + 2 * GATHER_TOKENS * token * (item + 4)


def available_memory() -> tuple[int, str] | None:
    """The bytes free where a check's tables live and where that is: the GPU's free memory,
    or without CUDA the host's available memory; None when the host does not say."""
    if torch.cuda.is_available():
        free, _ = torch.cuda.mem_get_info()
        return free, "GPU memory"
    try:
        free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None
    return free, "host memory (no CUDA: the tables live on the CPU)"


def fit_problem(need: int, parts: dict[str, int]) -> str | None:
    """Why ``need`` bytes (``memory_need``'s figure and ``parts``) do not fit the memory
    available (``available_memory``), or None: one line with the parts."""
    available = available_memory()
    if available is None:
        return None
    free, where = available
    if need <= free:
        return None
    shares = ", ".join(f"{name} {n / 2**30:.2f} GiB" for name, n in parts.items())
    return (
        f"does not fit: needs about {need / 2**30:.2f} GiB of {where} ({shares}), "
        f"{free / 2**30:.2f} GiB available"
    )


def memory_problem(cfg: CheckConfig, kind: KindSpec) -> str | None:
    """Why a check of ``cfg`` on a builder of ``kind`` does not fit the memory its tables
    would live in, or None (``fit_problem`` of ``memory_need``)."""
    return fit_problem(*memory_need(cfg, kind))
