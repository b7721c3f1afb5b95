"""Measuring the builder and the runner: allocations (``AllocationCounter`` on the CPU, the
allocator's statistics on CUDA), Triton compilations (``CompileCounter``), and the builder as
the runner calls it (``BuilderProbe``) or as the checker calls it once, eagerly
(``measure_eager_call``). These only measure; ``pagegraph.check.judges.table_judges`` turns the
figures into
verdicts."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import TracebackType

import torch

from ..kernels.declarations import declare_builder
from .ranges import current_range, phase
from .sync_events import SyncEvent


class AllocationCounter:
    """Counts tensor allocations by torch operators while active (a dispatch mode): the way
    to see allocations on a CPU, where torch keeps no allocator statistics. An operator
    output that shares storage with no input (and every tensor made from Python data)
    counts as one allocation. Triton launches allocate nothing it can see."""

    def __init__(self) -> None:
        from torch.utils._python_dispatch import TorchDispatchMode
        from torch.utils._pytree import tree_flatten

        counter = self

        class _Mode(TorchDispatchMode):
            @classmethod
            def _should_skip_dynamo(cls) -> bool:
                # torch otherwise wraps __torch_dispatch__ in a dynamo-disable, which imports
                # torch._dynamo (seconds) at its first call; nothing here runs under
                # torch.compile, so there is nothing to disable.
                return False

            def __torch_dispatch__(
                self,
                func: Callable[..., object],
                types: tuple[type, ...],
                args: tuple[object, ...] = (),
                kwargs: dict[str, object] | None = None,
            ) -> object:
                out = func(*args, **(kwargs or {}))
                if func is torch.ops.aten.lift_fresh.default:
                    counter.count += 1
                    counter.ops.append(str(func))
                    return out
                inputs = {
                    t.untyped_storage().data_ptr()
                    for t in tree_flatten((args, kwargs))[0]
                    if isinstance(t, torch.Tensor)
                }
                for o in tree_flatten(out)[0]:
                    if (
                        isinstance(o, torch.Tensor)
                        and o.numel()
                        and o.untyped_storage().data_ptr() not in inputs
                    ):
                        counter.count += 1
                        counter.ops.append(str(func))
                return out

        self.count = 0
        self.ops: list[str] = []
        # (the unannotated TorchDispatchMode.__init__, as above)
        self._mode: contextlib.AbstractContextManager[object] = _Mode()  # type: ignore[no-untyped-call]

    def __enter__(self) -> AllocationCounter:
        self._mode.__enter__()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._mode.__exit__(exc_type, exc, tb)


def cuda_allocations(device: torch.device) -> int:
    """Allocator events so far on a CUDA ``device`` (allocations and new segments): a
    difference of two readings counts the allocations between them."""
    stats = torch.cuda.memory_stats(device)
    allocations: int = stats.get("allocation.all.allocated", 0)
    segments: int = stats.get("segment.all.allocated", 0)
    return allocations + segments


class CompileCounter:
    """Counts Triton JIT compilations (any kernel) through Triton's post-compile hook, from
    construction to ``stop()``; ``reason`` says why it cannot count (then ``count`` stays 0)."""

    def __init__(self) -> None:
        from ..kernels.contract import interpreter_active

        self.count = 0
        self.reason: str | None = None
        self._knobs = None
        if interpreter_active():
            self.reason = "the Triton interpreter compiles nothing (no GPU here)"
            return
        try:
            import triton

            knobs = triton.knobs.runtime
            self._previous = knobs.jit_post_compile_hook
        except (ImportError, AttributeError):
            self.reason = "this Triton has no jit_post_compile_hook to count compilations"
            return
        self._knobs = knobs

        def hook(*args: object, **kwargs: object) -> object:
            self.count += 1
            if self._previous is not None:
                return self._previous(*args, **kwargs)
            return None

        knobs.jit_post_compile_hook = hook

    def stop(self) -> None:
        if self._knobs is not None:
            self._knobs.jit_post_compile_hook = self._previous
            self._knobs = None


@dataclass
class BuilderCall:
    """One call of the builder by the runner: its NVTX phase (``warmup/...``, ``capture/...``),
    the batch size of its table, and what it allocated and compiled."""

    phase: str
    bs: int
    allocations: int
    compiles: int
    allocation_ops: list[str]
    #: the call's host time (ms): a cold compilation's cost shows here
    ms: float = 0.0


def _no_rows(args: tuple[object, ...], kwargs: Mapping[str, object]) -> int:
    """A call's batch rows where the prober knows no kind: unknown."""
    return -1


class BuilderProbe:
    """The builder as the runner sees it: each call (warm-up, capture, eager replay) is
    measured for allocations and compilations and recorded with its NVTX phase, while
    ``measure`` is set (graph replays never call it; eager replays do)."""

    def __init__(
        self,
        fn: Callable[..., object],
        device: torch.device,
        compiles: CompileCounter,
        capabilities: dict[str, bool],
        rows: Callable[[tuple[object, ...], Mapping[str, object]], int] | None = None,
    ) -> None:
        self.fn = fn
        # What the builder takes (``kinds.builders.builder_capabilities``), as the runner
        # reads it from the probe in the builder's place.
        declare_builder(
            self,
            errors=capabilities.get("errors"),
            swa=capabilities.get("swa"),
            batch=capabilities.get("batch"),
        )
        #: the batch rows of a call from its arguments (its kind's ``KindSpec.call_rows``);
        #: -1 where unknown
        self.rows = rows or _no_rows
        self.cuda = device.type == "cuda"
        self.device = device
        self.compiles = compiles
        self.calls: list[BuilderCall] = []
        self.measure = True
        #: the NVTX phase of the call in progress (or the last one): what raised, if it raised
        self.current_phase = "capture"
        #: the builder's measured eager call before the capture (its syncs, if any)
        self.eager_call: EagerCall | None = None

    def __call__(self, *args: object, **kwargs: object) -> object:
        if not self.measure:
            return self.fn(*args, **kwargs)
        where = current_range() or "?"
        self.current_phase = where
        bs = self.rows(args, kwargs)
        c0 = self.compiles.count
        t0 = time.perf_counter()
        if self.cuda:
            a0 = cuda_allocations(self.device)
            result = self.fn(*args, **kwargs)
            allocations, ops = cuda_allocations(self.device) - a0, []
        else:
            with AllocationCounter() as counter:
                result = self.fn(*args, **kwargs)
            allocations, ops = counter.count, counter.ops
        ms = (time.perf_counter() - t0) * 1e3
        self.calls.append(BuilderCall(where, bs, allocations, self.compiles.count - c0, ops, ms))
        return result


@dataclass
class EagerCall:
    """What the builder's second eager call on a batch of ``bs`` rows did."""

    bs: int
    allocations: int
    allocation_ops: list[str] = field(default_factory=list)
    #: host syncs the detectors saw (events with a ``name``)
    sync_events: list[SyncEvent] = field(default_factory=list)


def measure_eager_call(
    warm_up: Callable[[], None],
    call: Callable[[], None],
    bs: int,
    device: torch.device,
    detectors: tuple[str, ...],
) -> EagerCall:
    """Call the builder's short warm-up (an engine's first call: compiling and loading a
    kernel may sync and allocate, once), then measure ``call`` on a real batch. Whatever the
    builder raises propagates."""
    from . import sync

    with phase("build", bs):
        warm_up()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        a0 = cuda_allocations(device)
        with sync.record_device_syncs(detectors) as rec, phase("build", bs):
            call()
        return EagerCall(bs, cuda_allocations(device) - a0, [], rec.events if detectors else [])
    # On a CPU the allocation counter and the cpu detector are both dispatch modes; the
    # detector (innermost) is left before the counter, as modes must be.
    with AllocationCounter() as counter, sync.record_device_syncs(detectors) as rec:
        with phase("build", bs):
            call()
    return EagerCall(bs, counter.count, counter.ops, rec.events if detectors else [])
