"""``pagegraph sync-table``: which sync detector catches which planted sync.

A demonstration of the detectors of :mod:`pagegraph.detect.sync`, not part of them: known
syncs (and known clean operations) are planted inside ``phase("replay", bs=1)`` and each is
run under each detector alone. ``clean`` and ``clean_graph_replay`` must stay silent.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

from ..detect import ranges
from ..detect.sync import GPU_DETECTORS, available_detectors, record_device_syncs

__all__ = ["PlantedSync", "detector_matrix", "format_detector_matrix", "planted_syncs"]


def _no_requirement() -> str | None:
    return None


def _cuda_python_reason() -> str | None:
    try:
        from cuda.bindings import driver  # type: ignore[import-not-found,unused-ignore]  # noqa: F401
    except ImportError as e:
        return f"cuda-python is not installed (pip install cuda-python): {e}"
    return None


@dataclass(frozen=True)
class PlantedSync:
    """A known sync (or a known clean operation) for checking the detectors.

    Calling it with a device prepares and runs it; :meth:`prepare` splits the two so that
    set-up (allocation, warm-up, graph capture, which do sync) stays outside the recording.
    ``expected``: detectors that should catch it; empty means it must stay silent.
    """

    name: str
    description: str
    expected: frozenset[str]
    setup: Callable[[torch.device], Callable[[], object]] = field(repr=False)
    requires: Callable[[], str | None] = field(default=_no_requirement, repr=False)

    def unavailable_reason(self) -> str | None:
        return self.requires()

    def prepare(self, device: Any = "cuda") -> Callable[[], object]:
        """Set up on ``device`` (then wait for the device); return the planted action."""
        reason = self.requires()
        if reason is not None:
            raise RuntimeError(f"planted sync {self.name!r} cannot run: {reason}")
        action = self.setup(torch.device(device))
        torch.cuda.synchronize(device)
        return action

    def __call__(self, device: Any = "cuda") -> None:
        self.prepare(device)()


def _vec(device: torch.device) -> torch.Tensor:
    t = torch.arange(1, 65, dtype=torch.float32, device=device)
    t.sum()  # warm up the reduction's module load outside the recording
    t.add_(0)
    return t


def _setup_item(device: torch.device) -> Callable[[], object]:
    t = _vec(device)

    def run() -> object:
        with ranges.phase("replay", bs=1):
            return t.sum().item()

    return run


def _setup_bool(device: torch.device) -> Callable[[], object]:
    t = _vec(device)

    def run() -> object:
        with ranges.phase("replay", bs=1):
            return bool(t.sum() > 0)

    return run


def _setup_cpu(device: torch.device) -> Callable[[], object]:
    t = _vec(device)

    def run() -> object:
        with ranges.phase("replay", bs=1):
            return t.cpu()

    return run


def _setup_tolist(device: torch.device) -> Callable[[], object]:
    t = _vec(device)

    def run() -> object:
        with ranges.phase("replay", bs=1):
            return t.tolist()

    return run


def _setup_copy_to_host(device: torch.device) -> Callable[[], object]:
    t = _vec(device)
    host = torch.empty(t.shape, dtype=t.dtype)

    def run() -> None:
        with ranges.phase("replay", bs=1):
            host.copy_(t)

    return run


def _setup_nonblocking_pageable(device: torch.device) -> Callable[[], object]:
    t = _vec(device)
    host = torch.empty(t.shape, dtype=t.dtype)  # pageable: not pin_memory()
    assert not host.is_pinned()

    def run() -> None:
        with ranges.phase("replay", bs=1):
            # non_blocking only helps with pinned memory: into pageable memory the driver
            # stages the copy and returns once it is done, and torch calls no sync for it.
            host.copy_(t, non_blocking=True)

    return run


def _setup_cuda_synchronize(device: torch.device) -> Callable[[], object]:
    t = _vec(device)

    def run() -> None:
        with ranges.phase("replay", bs=1):
            t.add_(1)
            torch.cuda.synchronize(device)

    return run


def _setup_event_synchronize(device: torch.device) -> Callable[[], object]:
    t = _vec(device)
    event = torch.cuda.Event()

    def run() -> None:
        with ranges.phase("replay", bs=1):
            t.add_(1)
            event.record()
            event.synchronize()

    return run


def _setup_stream_synchronize(device: torch.device) -> Callable[[], object]:
    t = _vec(device)

    def run() -> None:
        with ranges.phase("replay", bs=1):
            t.add_(1)
            torch.cuda.current_stream(device).synchronize()

    return run


def _setup_cu_stream_synchronize(device: torch.device) -> Callable[[], object]:
    from cuda.bindings import driver

    t = _vec(device)

    def run() -> None:
        with ranges.phase("replay", bs=1):
            t.add_(1)
            stream = driver.CUstream(torch.cuda.current_stream(device).cuda_stream)
            (err,) = driver.cuStreamSynchronize(stream)
            if err != driver.CUresult.CUDA_SUCCESS:
                raise RuntimeError(f"cuStreamSynchronize failed: {err}")

    return run


def _setup_clean(device: torch.device) -> Callable[[], object]:
    t = _vec(device)
    t.mul_(1)

    def run() -> None:
        with ranges.phase("replay", bs=1):
            t.add_(1)
            t.mul_(1)

    return run


def _setup_clean_graph_replay(device: torch.device) -> Callable[[], object]:
    static = torch.zeros(64, dtype=torch.float32, device=device)
    # Warm up on a side stream, then capture: the capture itself synchronizes (torch.cuda.graph
    # calls synchronize() around it), which is why it happens here, outside the recording.
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(3):
            static.add_(1)
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static.add_(1)
    graph.replay()

    def run() -> None:
        with ranges.phase("replay", bs=1):
            graph.replay()

    # keeps the graph (and its pool) alive as long as the action
    vars(run).update(graph=graph, static=static)
    return run


_BOTH = frozenset({"torch", "cupti"})
_CUPTI_ONLY = frozenset({"cupti"})
_NONE: frozenset[str] = frozenset()

_PLANTED = {
    p.name: p
    for p in (
        PlantedSync("item", "t.sum().item()", _BOTH, _setup_item),
        PlantedSync("bool", "bool(t.sum() > 0)", _BOTH, _setup_bool),
        PlantedSync("cpu", "t.cpu()", _BOTH, _setup_cpu),
        PlantedSync("tolist", "t.tolist()", _BOTH, _setup_tolist),
        PlantedSync("copy_to_host", "host.copy_(t)", _BOTH, _setup_copy_to_host),
        PlantedSync(
            "nonblocking_pageable",
            "host_pageable.copy_(t, non_blocking=True)",
            _CUPTI_ONLY,
            _setup_nonblocking_pageable,
        ),
        PlantedSync("cuda_synchronize", "torch.cuda.synchronize()", _BOTH, _setup_cuda_synchronize),
        PlantedSync(
            "event_synchronize",
            "event.record(); event.synchronize()",
            _BOTH,
            _setup_event_synchronize,
        ),
        PlantedSync(
            "stream_synchronize",
            "torch.cuda.current_stream().synchronize()",
            _BOTH,
            _setup_stream_synchronize,
        ),
        PlantedSync(
            "cu_stream_synchronize",
            "cuda.bindings.driver.cuStreamSynchronize(current stream)",
            _CUPTI_ONLY,
            _setup_cu_stream_synchronize,
            requires=_cuda_python_reason,
        ),
        PlantedSync("clean", "t.add_(1); t.mul_(1) (no sync)", _NONE, _setup_clean),
        PlantedSync(
            "clean_graph_replay",
            "graph.replay() of a captured t.add_(1) (no sync)",
            _NONE,
            _setup_clean_graph_replay,
        ),
    )
}


def planted_syncs() -> dict[str, PlantedSync]:
    """Name -> planted sync; each is ``callable(device)`` and does its device work inside
    ``phase("replay", bs=1)``. ``clean`` and ``clean_graph_replay`` must stay silent."""
    return dict(_PLANTED)


def detector_matrix(device: str | torch.device = "cuda") -> list[dict[str, Any]]:
    """Run every planted sync under each detector alone; one row per (planted, detector).

    Row keys: ``planted``, ``detector``, ``status`` (``"caught"``, ``"missed"``, ``"n/a"``
    or ``"error"``), ``names`` (distinct call names recorded), ``count``, ``expected``
    (whether the detector should catch it), ``reason`` (for n/a and error).
    """
    # The GPU detectors only: the planted syncs are CUDA calls, and the cpu detector's own
    # planted operations and twins are in tests/test_sync_cpu.py.
    available = {d: r for d, r in available_detectors().items() if d in GPU_DETECTORS}
    rows = []
    for planted in planted_syncs().values():
        planted_reason = planted.unavailable_reason()
        for det in available:  # every GPU detector, in the order they are started
            row = {
                "planted": planted.name,
                "detector": det,
                "status": "n/a",
                "names": [],
                "count": 0,
                "expected": det in planted.expected,
                "reason": available.get(det) or planted_reason,
            }
            if row["reason"] is None:
                try:
                    action = planted.prepare(device)
                    with record_device_syncs((det,)) as recorder:
                        action()
                except Exception as e:
                    row.update(status="error", reason=f"{type(e).__name__}: {e}")
                else:
                    row.update(
                        status="caught" if recorder.events else "missed",
                        names=recorder.names(),
                        count=len(recorder.events),
                    )
            rows.append(row)
    return rows


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def format_detector_matrix(rows: Iterable[dict[str, Any]]) -> str:
    """Markdown table: one row per planted sync, one column per detector.

    A cell that contradicts the expectation is marked ``(unexpected)``.
    """
    rows = list(rows)
    detectors = list(dict.fromkeys(r["detector"] for r in rows))
    planted = list(dict.fromkeys(r["planted"] for r in rows))
    cells = {(r["planted"], r["detector"]): r for r in rows}
    expected: dict[str, list[str]] = {p: [] for p in planted}
    for r in rows:
        if r["expected"]:
            expected[r["planted"]].append(r["detector"])
    header = ["planted sync", *detectors, "expected to catch it"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for p in planted:
        line = [f"`{p}`"]
        for det in detectors:
            found = cells.get((p, det))
            if found is None:
                line.append("")
                continue
            if found["status"] == "caught":
                cell = f"caught ({', '.join(found['names'])})"
            elif found["status"] == "missed":
                cell = "missed"
            else:
                cell = f"{found['status']}: {found['reason']}"
            if (
                found["status"] in ("caught", "missed")
                and (found["status"] == "caught") != found["expected"]
            ):
                cell += " **(unexpected)**"
            line.append(_md(cell))
        line.append(", ".join(expected[p]) or "none (must stay silent)")
        lines.append("| " + " | ".join(line) + " |")
    return "\n".join(lines)
