"""The compiled-kernel launcher shared by the package's Triton kernels (the page-table and
decode-metadata builders, the pool's run writer).

``kernel[grid](...)`` spends several times the launch itself in Python, binding and hashing
the arguments. A ``LaunchCache`` keeps each compiled kernel under a key at least as fine as
Triton's own specialisation (``launch_key``); the first call of a key takes Triton's JIT path,
which compiles, and later calls go straight into the compiled C launcher with raw pointers
(``launch_compiled``). Under Triton launch hooks every call takes the JIT path (``hooks_active``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any, TypeAlias

import torch
import triton

__all__ = [
    "MAX_KEYS",
    "LaunchCache",
    "current_stream",
    "device_context",
    "hooks_active",
    "launch_compiled",
    "launch_entry",
    "launch_key",
    "raw_stream",
]

#: A compiled kernel's launch (``launch_entry``): the function to call and its leading
#: arguments.
LaunchEntry: TypeAlias = tuple[Callable[..., object], tuple[object, ...]]
#: A ``launch_key``: the device, dtypes, alignment, ints, constexprs and warps of a launch.
LaunchKey: TypeAlias = tuple[object, ...]

#: Beyond this many keys a ``LaunchCache`` starts over (keys hold exact int values, so a caller
#: that kept changing strides could otherwise grow it without bound).
MAX_KEYS = 4096

#: ``raw_stream(index)``: the current stream of device ``index`` as a raw ``cudaStream_t``,
#: without building a ``torch.cuda.Stream``; ``None`` in builds of torch without it.
raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def current_stream(index: int) -> int:
    """The current stream of device ``index`` as a raw ``cudaStream_t``, through torch's
    public API (slower than ``raw_stream``)."""
    return torch.cuda.current_stream(index).cuda_stream


def hooks_active() -> bool:
    """Whether Triton launch hooks are installed (a profiler, say): then the normal launch
    path runs, so they see every launch. Triton 3.6 keeps them in (possibly empty) chains."""
    runtime = triton.knobs.runtime
    for hook in (runtime.launch_enter_hook, runtime.launch_exit_hook):
        if hook is not None and getattr(hook, "calls", True):
            return True
    return False


def device_context(index: int) -> AbstractContextManager[object]:
    """A context that makes CUDA device ``index`` current, or does nothing where it already
    is or ``index < 0`` (CPU tensors under the interpreter)."""
    if index >= 0 and index != torch.cuda.current_device():
        return torch.cuda.device(index)
    return nullcontext()


def launch_key(
    index: int,
    dtypes: tuple[object, ...],
    ptrs: Sequence[int],
    ints: tuple[object, ...],
    constexprs: tuple[object, ...],
    num_warps: int,
) -> LaunchKey:
    """A launch key finer than Triton's own specialisation (the ints by value, not by class),
    so one key never maps to two compiled kernels.

    ``dtypes``: those of the tensor arguments whose dtype is part of the signature and not
    already implied by a constexpr; ``ptrs``: every pointer argument, raw. Arguments the
    kernel does not specialise (a batch size) stay out of it, so one key serves them all.
    """
    # 16-byte alignment is part of Triton's specialisation: one flag when every pointer is
    # aligned (the usual case), the full pattern otherwise.
    combined = 0
    for q in ptrs:
        combined |= q
    aligned: bool | tuple[bool, ...] = (
        True if combined & 15 == 0 else tuple(q & 15 == 0 for q in ptrs)
    )
    return (index, dtypes, aligned, ints, constexprs, num_warps)


def launch_entry(kernel: Any) -> LaunchEntry:
    """How later launches of the compiled ``kernel`` go: ``(function, leading arguments)``,
    straight into the compiled C launcher when the kernel needs no scratch memory, else
    through ``kernel.run``."""
    run = kernel.run
    launch: Callable[..., object] | None = getattr(run, "launch", None)
    if (
        launch is not None
        and getattr(run, "global_scratch_size", 1) == 0
        and getattr(run, "profile_scratch_size", 1) == 0
        and getattr(run, "num_ctas", 0) == 1
        and hasattr(run, "launch_cooperative_grid")
        and hasattr(run, "launch_pdl")
    ):
        # The C launcher's own order: function, cooperative, pdl, the two scratch buffers,
        # then what CompiledKernel.run passes on (metadata, launch metadata, two hooks).
        leading = (
            kernel.function,
            run.launch_cooperative_grid,
            run.launch_pdl,
            None,
            None,
            kernel.packed_metadata,
            None,
            None,
            None,
        )
        return launch, leading
    return run, (kernel.function, kernel.packed_metadata, None, None, None)


def launch_compiled(
    entry: LaunchEntry,
    index: int,
    grid_x: int,
    grid_y: int,
    ptrs: Sequence[object],
    ints: Sequence[object],
    tail: Sequence[object],
) -> None:
    """Launch a compiled kernel's entry (``launch_entry``) on the grid ``(grid_x, grid_y)`` of
    device ``index``, on that device's current stream.

    The kernel's arguments, in signature order, are ``ptrs`` (raw pointers, which spare the
    launcher a ``data_ptr()`` call and a driver pointer query per tensor), then ``ints``, then
    ``tail`` (the rest, constexprs included). Given as sequences the callers mostly hold
    already (only ``tail`` is built a call): a single argument tuple would be built again
    inside, one more allocation a launch.
    """
    function, leading = entry
    if index != torch._C._cuda_getDevice():
        # Launch on the tensors' device; a device context costs host time, so only here.
        with torch.cuda.device(index):
            stream = current_stream(index)
            function(grid_x, grid_y, 1, stream, *leading, *ptrs, *ints, *tail)
        return
    stream = raw_stream(index) if raw_stream is not None else current_stream(index)
    function(grid_x, grid_y, 1, stream, *leading, *ptrs, *ints, *tail)


class LaunchCache(dict[LaunchKey, LaunchEntry]):
    """Launch entries (``launch_entry``) of one kernel by launch key (``launch_key``).

    A plain ``dict`` for lookups (``get`` is the fast path); ``add`` keeps it under
    ``MAX_KEYS`` entries and ``first_launch`` fills it.
    """

    def add(self, key: LaunchKey, entry: LaunchEntry) -> None:
        """Keep ``entry`` under ``key``, starting over once ``MAX_KEYS`` keys are held."""
        if len(self) >= MAX_KEYS:
            self.clear()
        self[key] = entry

    def first_launch(
        self, key: LaunchKey, index: int, jit_launch: Callable[..., object], *args: object
    ) -> None:
        """Launch through Triton's own path, ``jit_launch(*args)`` (which compiles on first
        use and returns the compiled kernel), with device ``index`` current; keep the
        kernel's entry under ``key`` if none is kept yet. For the first call of a key and for
        calls under launch hooks."""
        with device_context(index):
            kernel = jit_launch(*args)
        if key not in self:
            self.add(key, launch_entry(kernel))
