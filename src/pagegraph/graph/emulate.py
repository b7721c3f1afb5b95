"""``EmulatedGraph``: what a CUDA graph freezes at capture, imitated on a CPU. A captured graph
replays exactly what was recorded, host-side decisions of the body included, and calling the
builder again at each replay, as an eager runner does, hides every bug of that class; so the
body is recorded once (aten ops through a ``TorchDispatchMode``, Triton interpreter launches)
and the record replays without calling it again. What is recorded, what stays frozen and what
is refused: docs/ARCHITECTURE.md, "The emulated graph".
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, ParamSpec, TypeAlias, TypeVar

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from torch.utils._pytree import tree_flatten

if TYPE_CHECKING:
    from torch._ops import OpOverload

    #: An aten op as dispatch hands it over: what it returns is whatever its schema says.
    AtenOp: TypeAlias = OpOverload[..., Any]
    #: An op's arguments as dispatch hands them over: tensors, numbers, lists, dtypes, None.
    OpArgs: TypeAlias = tuple[Any, ...]
    OpKwargs: TypeAlias = dict[str, Any]
    #: A Triton launch grid: the programs per axis, or a function of the launch's
    #: meta-parameters that gives them.
    TritonGrid: TypeAlias = tuple[int, ...] | Callable[[dict[str, Any]], Sequence[int]]
    P = ParamSpec("P")
    R = TypeVar("R")

__all__ = ["EmulatedGraph", "EmulationError", "describe_frozen", "emulation_wanted"]

aten = torch.ops.aten

#: Ops that only allocate: a graph runs nothing for them at replay (the memory keeps what the
#: last kernel left there), so neither does the emulation.
_ALLOCATION_ONLY = {
    aten.empty.memory_format,
    aten.empty_strided.default,
    aten.empty_like.default,
    aten.new_empty.default,
    aten.new_empty_strided.default,
}

#: Ops whose output shape depends on the data: on CUDA each syncs (the capture fails); here
#: the recorded output keeps its captured contents (torch's sync debug mode lists the same;
#: ``repeat_interleave`` given its ``output_size`` does not sync, and runs again).
_DATA_DEPENDENT_SHAPE = {
    aten.nonzero.default,
    aten.masked_select.default,
    aten._unique.default,
    aten._unique2.default,
    aten.unique_dim.default,
    aten.unique_consecutive.default,
    aten.repeat_interleave.Tensor,
}


def _masked(func: AtenOp, args: OpArgs) -> bool:
    """``index`` / ``index_put`` with a boolean (or uint8) mask: the mask's ``nonzero`` runs
    inside the operator, so its output shape comes from the data as ``nonzero``'s does."""
    if func.overloadpacket not in (aten.index, aten.index_put, aten.index_put_):
        return False
    indices = args[1] if len(args) > 1 else ()
    return any(
        isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in indices or ()
    )


class EmulationError(RuntimeError):
    """The record cannot be replayed as captured (a view moved, a shape changed), or the body
    did what a CUDA stream capture refuses."""


#: Factories that make a tensor from host data (a list, a number, a numpy array).
_FROM_HOST_DATA = (torch.tensor, torch.as_tensor)

_BASIC_INDEX = (int, slice, type(None), type(Ellipsis))


def _element_from_host(args: OpArgs) -> bool:
    """``t[i] = number`` selecting one element: torch makes the number a host scalar tensor
    and, the shapes being equal, copies it (a host-to-device copy on CUDA); a selection of
    several elements is filled on the device instead. Basic indices only: a tensor index
    goes through ``index_put_``, which takes a host scalar."""
    if len(args) != 3 or not isinstance(args[2], (int, float, bool)):
        return False
    target, index = args[0], args[1]
    index = index if isinstance(index, tuple) else (index,)
    if not isinstance(target, torch.Tensor) or target.is_pinned():
        return False
    if not all(isinstance(i, _BASIC_INDEX) for i in index):
        return False
    with _disable_current_modes():
        return target[index].dim() == 0


class _HostDataGuard(TorchFunctionMode):
    """Refuses a device tensor made from host data while a capture records: on CUDA it is a
    copy from pageable host memory, which a stream capture refuses. A tensor is the device's
    as the cpu sync detector counts it: ``device=`` given and not spelled as the string
    "cpu" (on a CPU run ``device=t.device`` names the device), not ``pin_memory``. Not
    checked inside a Triton launch (the interpreter's own copies of its arguments). Also
    refused: a Python number assigned to one element (``t[0] = 0``), a copy of a host scalar
    (``_element_from_host``); every tensor of the body counts as the device's here."""

    def __init__(self, recorder: _Recorder) -> None:
        super().__init__()
        self.recorder = recorder

    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: Collection[type],
        args: OpArgs = (),
        kwargs: OpKwargs | None = None,
    ) -> object:
        kwargs = kwargs or {}
        if func in _FROM_HOST_DATA and not self.recorder.paused:
            data = args[0] if args else kwargs.get("data")
            device = kwargs.get("device")  # keyword-only in both
            host = kwargs.get("pin_memory") or (
                isinstance(device, str) and device.strip().startswith("cpu")
            )
            if device is not None and not host and not isinstance(data, torch.Tensor):
                raise EmulationError(
                    "Cannot copy between CPU and CUDA tensors during CUDA graph capture unless "
                    f"the CPU tensor is pinned (emulated: torch.{func.__name__} of host data "
                    f"with device={device} is a copy from pageable host memory on CUDA; make "
                    "the values on the device, or before the capture)"
                )
        if func is torch.Tensor.__setitem__ and not self.recorder.paused:
            if _element_from_host(args):
                raise EmulationError(
                    "Cannot copy between CPU and CUDA tensors during CUDA graph capture unless "
                    "the CPU tensor is pinned (emulated: a Python number assigned to one "
                    "element, t[i] = value, is a copy of a host scalar on CUDA; fill it on "
                    "the device, e.g. t[i:i + 1].fill_(value))"
                )
        return func(*args, **kwargs)


def _mutates(func: AtenOp) -> bool:
    """Whether an op writes one of its arguments (in place or ``out=``)."""
    return any(a.alias_info is not None and a.alias_info.is_write for a in func._schema.arguments)


def _tensors(tree: object) -> list[torch.Tensor]:
    return [t for t in tree_flatten(tree)[0] if isinstance(t, torch.Tensor)]


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


class _Recorder(TorchDispatchMode):
    """Records every aten op dispatched while active, except while ``paused`` (inside a
    Triton launch, whose interpreter copies are not part of the body)."""

    def __init__(self, graph: EmulatedGraph) -> None:
        super().__init__()  # type: ignore[no-untyped-call]  # torch's __init__ is unannotated
        self.graph = graph
        self.paused = 0

    def __torch_dispatch__(
        self,
        func: AtenOp,
        types: Collection[type],
        args: OpArgs = (),
        kwargs: OpKwargs | None = None,
    ) -> object:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if not self.paused:
            self.graph._record_op(func, args, kwargs, out)
        return out


class EmulatedGraph:
    """A CUDA graph's capture and replay, imitated on CPU tensors (see the module's notes).

    The interface the runner uses of ``torch.cuda.CUDAGraph``: ``with graph.capture():
    body()`` (or ``graph.record(fn, *args)``, or ``capture_begin()``/``capture_end()``), then
    ``graph.replay()`` any number of times. ``frozen`` names the ops whose results stay as
    capture saw them; ``steps`` counts what a replay runs (ops and launches).
    """

    def __init__(self) -> None:
        #: what a replay runs, in order (what a step returns is dropped)
        self._steps: list[Callable[[], object]] = []
        #: every tensor the record touched: the graph's private pool, kept alive
        self._keep: list[object] = []
        #: id -> (tensor, data_ptr at capture) of every tensor the record touches
        self._watch: dict[int, tuple[torch.Tensor, int]] = {}
        self._watched: list[tuple[torch.Tensor, int]] = []
        #: ops whose results stay frozen as captured (host reads, data-dependent shapes)
        self.frozen: list[str] = []
        self.launches = 0
        self._recorder: _Recorder | None = None
        self._guard: _HostDataGuard | None = None
        #: Triton's interpreter class and its own ``run`` while hooked (Triton ships no types)
        self._saved_run: tuple[Any, Any] | None = None
        self.captured = False

    # -- capture ----------------------------------------------------------------------------

    def capture_begin(self) -> None:
        if self.captured or self._recorder is not None:
            raise EmulationError("this EmulatedGraph has a capture already: reset() it first")
        self._recorder = _Recorder(self)
        self._guard = _HostDataGuard(self._recorder)
        self._hook_triton()
        entered = []
        try:
            for mode in (self._recorder, self._guard):
                mode.__enter__()  # type: ignore[no-untyped-call]  # torch's are unannotated
                entered.append(mode)
        except BaseException:
            for mode in reversed(entered):
                mode.__exit__(None, None, None)  # type: ignore[no-untyped-call]  # as above
            self._unhook_triton()
            self._recorder = self._guard = None
            raise

    def capture_end(self) -> None:
        # capture_begin set both modes (a CUDAGraph's capture_end without it fails too).
        try:
            self._guard.__exit__(None, None, None)  # type: ignore[union-attr]
            self._recorder.__exit__(None, None, None)  # type: ignore[union-attr]
        finally:
            self._unhook_triton()
            self._recorder = self._guard = None
        self._watched = list(self._watch.values())
        self.captured = True

    @contextmanager
    def capture(self) -> Iterator[EmulatedGraph]:
        """Record everything the block runs (it runs once, for real). A block that raises
        leaves no graph (as a failed CUDA capture): the record is dropped."""
        self.capture_begin()
        try:
            yield self
        except BaseException:
            self.capture_end()
            self.reset()
            raise
        self.capture_end()

    def record(self, fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
        """Capture ``fn(*args, **kwargs)``; return what it returned."""
        with self.capture():
            return fn(*args, **kwargs)

    def _record_op(self, func: AtenOp, args: OpArgs, kwargs: OpKwargs, out: object) -> None:
        """One aten op seen at capture, turned into what its replay runs (or nothing)."""
        self._keep.append((args, kwargs, out))
        outputs = _tensors(out)
        self._watch_tensors(_tensors((args, kwargs)) + outputs)
        if func in _ALLOCATION_ONLY:
            return
        flat_out = tree_flatten(out)[0]
        if any(not isinstance(o, torch.Tensor) and o is not None for o in flat_out):
            # A Python scalar the body went on with on the host: frozen, as capture saw it.
            self.frozen.append(str(func))
            return
        if _mutates(func):
            self._steps.append(lambda: func(*args, **kwargs))
            return
        if (func in _DATA_DEPENDENT_SHAPE and kwargs.get("output_size") is None) or _masked(
            func, args
        ):
            self.frozen.append(str(func))
            return
        inputs = {_storage(t) for t in _tensors((args, kwargs))}
        if func.is_view or any(_storage(o) in inputs for o in outputs):
            # An alias of an input (a view, lift_fresh, _unsafe_view): nothing to run; its
            # memory is its base's.
            return
        self._steps.append(self._functional_step(func, args, kwargs, outputs))

    @staticmethod
    def _functional_step(
        func: AtenOp, args: OpArgs, kwargs: OpKwargs, outputs: list[torch.Tensor]
    ) -> Callable[[], None]:
        """Run ``func`` again and copy its result into the tensors capture returned."""
        if len(outputs) == 1:
            target = outputs[0]

            def step() -> None:
                new = func(*args, **kwargs)
                if new.shape != target.shape:
                    raise EmulationError(
                        f"{func} made shape {tuple(new.shape)} at replay, "
                        f"{tuple(target.shape)} at capture"
                    )
                target.copy_(new)

            return step

        def steps() -> None:
            news = _tensors(func(*args, **kwargs))
            for new, target in zip(news, outputs, strict=True):
                if new.shape != target.shape:
                    raise EmulationError(f"{func} changed an output's shape at replay")
                target.copy_(new)

        return steps

    # -- Triton launches ----------------------------------------------------------------------

    def _hook_triton(self) -> None:
        """Wrap the interpreter's launch entry while capturing: every ``kernel[grid](...)``
        call is recorded with its grid frozen, and runs with op recording paused."""
        try:
            from triton.runtime.interpreter import InterpretedFunction
        except ImportError:  # no Triton: only aten ops can be recorded
            return
        original = InterpretedFunction.run
        # capture_begin made the recorder before hooking Triton: it is not None here.
        recorder: _Recorder
        graph, recorder, capturing = self, self._recorder, threading.get_ident()  # type: ignore[assignment]

        def run(
            fn_self: object, *args: object, grid: TritonGrid, warmup: bool, **kwargs: object
        ) -> object:
            # The class is patched for every thread; the dispatch mode, like a CUDA capture's
            # stream, sees only the capturing thread's work, so the launches recorded do too.
            if warmup or threading.get_ident() != capturing:
                return original(fn_self, *args, grid=grid, warmup=warmup, **kwargs)
            frozen: dict[str, tuple[int, ...]] = {}
            launch_grid: TritonGrid
            if callable(grid):
                # Evaluated once, by the interpreter, on this launch's arguments; frozen.
                def frozen_grid(
                    meta: dict[str, Any],
                    _grid: Callable[[dict[str, Any]], Sequence[int]] = grid,
                ) -> tuple[int, ...]:
                    frozen["grid"] = tuple(_grid(meta))
                    return frozen["grid"]

                launch_grid = frozen_grid
            else:
                frozen["grid"] = launch_grid = tuple(grid)
            recorder.paused += 1
            try:
                result = original(fn_self, *args, grid=launch_grid, warmup=False, **kwargs)
            finally:
                recorder.paused -= 1
            graph._record_launch(original, fn_self, args, kwargs, frozen["grid"])
            return result

        self._saved_run = (InterpretedFunction, original)
        InterpretedFunction.run = run

    def _unhook_triton(self) -> None:
        if self._saved_run is not None:
            cls, original = self._saved_run
            cls.run = original
            self._saved_run = None

    def _record_launch(
        self,
        run: Callable[..., object],
        fn: object,
        args: tuple[object, ...],
        kwargs: dict[str, object],
        grid: tuple[int, ...],
    ) -> None:
        self._keep.append((fn, args, kwargs))
        self._watch_tensors(_tensors((args, kwargs)))
        self.launches += 1
        self._steps.append(lambda: run(fn, *args, grid=grid, warmup=False, **kwargs))

    def _watch_tensors(self, tensors: list[torch.Tensor]) -> None:
        for t in tensors:
            if id(t) not in self._watch:
                self._watch[id(t)] = (t, t.data_ptr())

    # -- replay -------------------------------------------------------------------------------

    @property
    def steps(self) -> int:
        """Ops and launches a replay runs."""
        return len(self._steps)

    def replay(self) -> None:
        """Run the record again on the recorded tensors, never the body. Dispatch modes the
        caller has on (an allocation counter, say) do not see it: a graph's replay allocates
        nothing and dispatches nothing on the host."""
        if not self.captured:
            raise EmulationError("replay() before capture")
        for t, ptr in self._watched:
            if t.data_ptr() != ptr:
                raise EmulationError(
                    f"a tensor of shape {tuple(t.shape)} recorded at capture moved ({ptr:#x} "
                    f"-> {t.data_ptr():#x}): it was given new storage after capture"
                )
        if torch._C._len_torch_dispatch_stack():
            with _disable_current_modes():
                for step in self._steps:
                    step()
        else:
            for step in self._steps:
                step()

    def reset(self) -> None:
        """Drop the record and release its tensors."""
        self.__init__()  # type: ignore[misc]  # this class's own __init__: a fresh record


# -- GraphRunner's use ---------------------------------------------------------------------------


def emulation_wanted(device: torch.device, use_graphs: bool | None, emulate: bool | None) -> bool:
    """Whether a runner on ``device`` captures emulated graphs: on the CPU with ``use_graphs``
    unset, unless ``emulate=False`` (``ValueError`` for ``emulate=True`` anywhere else)."""
    possible = device.type == "cpu" and use_graphs is None
    if emulate and not possible:
        raise ValueError("emulate=True needs a CPU runner with use_graphs unset")
    return possible and emulate is not False


def describe_frozen(graphs: Mapping[int, object] | Iterable[object]) -> str:
    """``"; N op(s) frozen at capture (names)"`` over emulated ``graphs`` (a dict or list),
    or ``""``: what the replays could not redo, which on a GPU would have synced."""
    frozen = [
        op
        for g in (graphs.values() if isinstance(graphs, dict) else graphs)
        for op in getattr(g, "frozen", ())
    ]
    if not frozen:
        return ""
    names = ", ".join(sorted({op.removeprefix("aten.") for op in frozen}))
    return f"; {len(frozen)} op(s) frozen at capture, a sync on a GPU ({names})"
