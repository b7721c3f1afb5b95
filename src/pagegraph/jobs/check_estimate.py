"""How long a check will take on a CPU, told before it starts: ``check_estimate`` (seconds,
from the table entries a replay builds and the interpreter's measured rate) and
``slow_warning`` (the line that announces a slow check)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..runtime.progress import format_seconds

if TYPE_CHECKING:
    from ..check.config import CheckConfig

#: Table entries a second a check builds and checks on a CPU (the Triton interpreter),
#: measured with ``pagegraph check default`` (``check_entries``: 24 rows x 32 pages x 2
#: tables a replay, about 0.1 s a replay on two cores).
CPU_ENTRIES_PER_S = 15_000
#: A check estimated to take longer than this many seconds is announced with its estimate.
SLOW_CHECK_S = 60.0


def live_pages(cfg: CheckConfig) -> int:
    """Pages a row of ``cfg`` about holds: its longest initial length's (the workload's
    default: a quarter of the context), within the width (the builder's work, in the
    interpreter, goes with the live pages)."""
    width = -(-cfg.max_context_len // cfg.page_size)
    longest = cfg.initial_len[1] if cfg.initial_len else max(1, cfg.max_context_len // 4)
    return max(1, min(width, -(-longest // cfg.page_size)))


def check_entries(cfg: CheckConfig) -> int:
    """Live table entries a replay of ``cfg`` builds at most: the largest bucket's rows times
    ``live_pages``, for the full table and the SWA one."""
    return cfg.max_bs * live_pages(cfg) * (2 if cfg.swa else 1)


def check_estimate(cfg: CheckConfig, device: str) -> float | None:
    """Seconds a check of ``cfg`` is estimated to take on ``device`` (``"cpu"`` or
    ``"cuda"``); None where pagegraph has no rate (a GPU: checks there run at thousands of
    replays a second). On a CPU: entries per replay (``check_entries``) times replays, plus
    one replay's worth for every bucket captured, at ``CPU_ENTRIES_PER_S``. An estimate for an
    idle machine: on two cores shared with other jobs, ``sglang-h200`` took about a minute a
    replay and ``default`` 0.6 s (a ratio near the estimate's, 8.7 s against 0.1 s), and the
    time also goes with the rows' lengths as they grow and with the builder."""
    if device != "cpu":
        return None
    from ..graph.buckets import Buckets

    buckets = len(Buckets(cfg.buckets, cfg.max_bs))
    return check_entries(cfg) * (cfg.steps + buckets) / CPU_ENTRIES_PER_S


def slow_warning(
    name: str, cfg: CheckConfig, device: str, limit: float = SLOW_CHECK_S
) -> str | None:
    """The line that announces a check of scenario ``name`` estimated to take longer than
    ``limit`` seconds here, or None."""
    seconds = check_estimate(cfg, device)
    if seconds is None or seconds <= limit:
        return None
    return (
        f"pagegraph check: {name} will be slow on the CPU (Triton interpreter): estimate "
        f"{format_seconds(seconds)} or more for {cfg.steps} replays of up to {cfg.max_bs} rows "
        f"x {live_pages(cfg)} live pages; --replays N shortens it, a GPU runs it in seconds"
    )
