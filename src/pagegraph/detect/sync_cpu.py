"""The ``"cpu"`` detector: the operations that would make the host wait on CUDA, seen on a CPU.

Without CUDA nothing ever waits, so neither torch's sync-debug mode nor CUPTI can run. This
detector watches torch's operators instead, through a ``TorchDispatchMode`` and a
``TorchFunctionMode`` on the thread that starts it, and flags, with their file:line, the reads
of device-side tensors that would wait on CUDA (scalar reads, copies to the host, shapes from
data, explicit ``synchronize()``). What it flags, which tensors count as host ones and its
limits: docs/ARCHITECTURE.md, "Sync detectors, ranges and traces".
"""

from __future__ import annotations

import sys
import threading
import weakref
from collections.abc import Callable
from types import CodeType, FrameType
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from .sync_hub import Hub
from .sync_stacks import add_machinery_file, code_site, user_frame

__all__ = ["CpuHub", "is_device_side", "mark_host", "sync_op_name"]

aten = torch.ops.aten

#: aten operators (packets: every overload) whose CUDA kernel waits for a data-dependent size
#: or value, whatever their arguments, with the name the event gets.
_ALWAYS = {
    aten._local_scalar_dense: "scalar read (.item(), int(), float(), bool())",
    aten.nonzero: "nonzero (output shape from the data)",
    aten.masked_select: "masked_select (output shape from the data)",
    aten._unique: "unique (output shape from the data)",
    aten._unique2: "unique (output shape from the data)",
    aten.unique_dim: "unique (output shape from the data)",
    aten.unique_consecutive: "unique_consecutive (output shape from the data)",
    aten.unique_dim_consecutive: "unique_consecutive (output shape from the data)",
    aten.bincount: "bincount (its length from the data's max)",
    aten.equal: "equal (a Python bool of device values)",
}
#: Operators that wait only with some arguments (see ``_conditional``).
_CONDITIONAL = {
    aten.index,
    aten.index_put,
    aten.index_put_,
    aten._index_put_impl_,
    aten.repeat_interleave,
    aten.histc,
    aten.copy_,
    aten._to_copy,
}
#: Tensor methods that read a tensor into host memory without an aten operator on a CPU.
_HOST_READS = {
    torch.Tensor.tolist: ".tolist() (copy to the host)",
    torch.Tensor.numpy: ".numpy() (copy to the host)",
    torch.Tensor.__array__: "numpy array of a tensor (copy to the host)",
    torch.Tensor.cpu: ".cpu() (copy to the host)",
}
#: Functions that make a tensor from data (a list, an array, a tensor): with ``device=`` other
#: than "cpu" the result is the device's; from a device tensor with ``device="cpu"``, a copy to
#: the host.
_DEVICE_ARG_FUNCS = {torch.tensor, torch.as_tensor}

_interpreter_codes: set[CodeType] | None = None


def _interpreter_launch_codes() -> set[CodeType]:
    """Code objects of the Triton interpreter's launch (empty without Triton)."""
    global _interpreter_codes
    if _interpreter_codes is None:
        codes: set[CodeType] = set()
        try:
            from triton.runtime import interpreter as ti

            for fn in (
                ti.GridExecutor.__call__,
                ti.InterpretedFunction.run,
                ti.InterpretedFunction.__call__,
            ):
                codes.add(fn.__code__)
        except (ImportError, AttributeError):
            pass
        _interpreter_codes = codes
    return _interpreter_codes


def _inside_interpreter_launch() -> bool:
    codes = _interpreter_launch_codes()
    if not codes:
        return False
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        if frame.f_code in codes:
            return True
        frame = frame.f_back
    return False


# -- host tensors --------------------------------------------------------------------------------

#: storage address -> weak reference to a tensor holding it, for host storages.
_host: dict[int, weakref.ref[torch.Tensor]] = {}
_host_lock = threading.Lock()


def _storage_key(t: torch.Tensor) -> int:
    try:
        return t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):  # a tensor without storage (sparse, ...)
        return 0


def mark_host(*tensors: torch.Tensor) -> None:
    """Say that these CPU tensors (and every view of their storage) are host memory, as a
    pinned staging buffer is on CUDA: the cpu detector does not count reading them. Lasts while
    the tensor given is alive."""
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.device.type == "cpu":
            key = _storage_key(t)
            if key:
                with _host_lock:
                    held = _host.get(key)
                    if held is None or held() is None:  # a live mark stays as it is
                        _host[key] = weakref.ref(t, _forgetter(key))


def _forgetter(key: int) -> Callable[[object], None]:
    """A weak reference's callback that forgets ``key``'s mark once its tensor is gone."""
    return lambda _: _forget(key)


def _forget(key: int) -> None:
    with _host_lock:
        ref = _host.get(key)
        if ref is not None and ref() is None:
            del _host[key]


def _unmark(t: torch.Tensor) -> None:
    with _host_lock:
        _host.pop(_storage_key(t), None)


def is_device_side(t: object) -> bool:
    """Whether reading ``t`` on the host would wait on the device (see the module's doc)."""
    if not isinstance(t, torch.Tensor):
        return False
    kind = t.device.type
    if kind != "cpu":
        return kind != "meta"
    if not _host:
        return True
    ref = _host.get(_storage_key(t))
    return ref is None or ref() is None


def _tensors(tree: object) -> list[torch.Tensor]:
    return [x for x in tree_flatten(tree)[0] if isinstance(x, torch.Tensor)]


def _is_mask(t: object) -> bool:
    return isinstance(t, torch.Tensor) and t.dtype in (torch.bool, torch.uint8)


def _conditional(
    func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[str, list[Any]] | None:
    """An operator of ``_CONDITIONAL`` that waits with these arguments: its event name and
    the tensors that must be device-side for it to wait."""
    packet = func.overloadpacket
    if packet is aten.index:
        masks = [i for i in (args[1] if len(args) > 1 else []) if _is_mask(i)]
        return (
            ("indexing with a boolean mask (output shape from the data)", masks) if masks else None
        )
    if packet in (aten.index_put, aten.index_put_, aten._index_put_impl_):
        masks = [i for i in (args[1] if len(args) > 1 else []) if _is_mask(i)]
        return ("index_put with a boolean mask (nonzero of the mask)", masks) if masks else None
    if packet is aten.repeat_interleave:
        if kwargs.get("output_size") is None and args and isinstance(args[0], torch.Tensor):
            return "repeat_interleave without output_size (output shape from the data)", [args[0]]
        return None
    if packet is aten.histc:
        lo = args[2] if len(args) > 2 else kwargs.get("min", 0)
        hi = args[3] if len(args) > 3 else kwargs.get("max", 0)
        return ("histc with min == max (its range from the data)", [args[0]]) if lo == hi else None
    if packet is aten.copy_:
        dst, src = args[0], args[1]
        real_device_src = isinstance(src, torch.Tensor) and src.device.type not in ("cpu", "meta")
        if dst.device.type == "cpu" and (real_device_src or not is_device_side(dst)):
            return "copy_ into a host tensor (copy to the host)", [src]
        return None
    if packet is aten._to_copy:
        # A copy from a real device to the CPU (on a CPU run, .to(device) never moves a tensor).
        dev = kwargs.get("device")
        src = args[0] if args else None
        to_cpu = dev is not None and torch.device(dev).type == "cpu"
        if to_cpu and isinstance(src, torch.Tensor) and src.device.type not in ("cpu", "meta"):
            return "copy to the host (.to/.cpu)", [src]
    return None


def sync_op_name(
    func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[str, list[Any]] | None:
    """The event an aten call (an ``OpOverload``) would make on CUDA, with the tensors that
    must be device-side for it, or None when it cannot wait."""
    packet: Any = getattr(func, "overloadpacket", None)
    name = _ALWAYS.get(packet)
    if name is not None:
        return name, _tensors((args, kwargs))
    if packet in _CONDITIONAL:
        return _conditional(func, args, kwargs)
    return None


def _to_host_target(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether ``Tensor.to(*args, **kwargs)`` names the CPU as a string (see the module's doc)."""
    dev = kwargs.get("device")
    if dev is None and len(args) > 1 and isinstance(args[1], str):
        dev = args[1]
    return isinstance(dev, str) and dev.strip().startswith("cpu")


class CpuHub(Hub):
    name = "cpu"

    def __init__(self) -> None:
        super().__init__()
        hub = self

        class _Dispatch(TorchDispatchMode):
            def __torch_dispatch__(
                self,
                func: Any,
                types: Any,
                args: tuple[Any, ...] = (),
                kwargs: dict[str, Any] | None = None,
            ) -> Any:
                kwargs = kwargs or {}
                found = sync_op_name(func, args, kwargs)
                out = func(*args, **kwargs)
                if found is not None:
                    hub._maybe_record(found[0], found[1])
                elif func.overloadpacket is aten.lift_fresh:
                    mark_host(out)  # a tensor made from Python data or numpy: host memory
                elif _host:
                    hub._propagate_host(args, kwargs, out)
                return out

        class _Function(TorchFunctionMode):
            def __torch_function__(
                self,
                func: Any,
                types: Any,
                args: tuple[Any, ...] = (),
                kwargs: dict[str, Any] | None = None,
            ) -> Any:
                kwargs = kwargs or {}
                what = _HOST_READS.get(func)
                if what is None and func is torch.Tensor.to and _to_host_target(args, kwargs):
                    what = '.to("cpu") (copy to the host)'
                elif what is None and func in _DEVICE_ARG_FUNCS and _to_host_target((), kwargs):
                    what = f'torch.{func.__name__}(tensor, device="cpu") (copy to the host)'
                # On a real device the copy is an aten operator, which _Dispatch sees.
                if what is not None and args and getattr(args[0], "is_cpu", False):
                    hub._maybe_record(what, [args[0]])
                out = func(*args, **kwargs)
                if kwargs:
                    hub._note_factory(func, args, kwargs, out)
                return out

        self._dispatch_mode = _Dispatch()  # type: ignore[no-untyped-call]  # torch's __init__ is unannotated
        self._function_mode = _Function()
        self._pushed = False
        self._patched: list[tuple[object, str, object]] = []

    @staticmethod
    def unavailable_reason(probe: bool = True) -> str | None:
        return None  # torch's Python modes exist in every torch pagegraph supports

    # -- what the modes see ------------------------------------------------------------------

    def _maybe_record(self, what: str, tensors: list[Any]) -> None:
        if self.paused or not any(is_device_side(t) for t in tensors):
            return
        if _inside_interpreter_launch():
            return  # the Triton interpreter copying a kernel's arguments (see the module doc)
        frame = user_frame()
        self._dispatch(f"{what} at {code_site(frame)}", frame)

    @staticmethod
    def _propagate_host(args: object, kwargs: object, out: object) -> None:
        """An operator's outputs are host tensors when all its tensor inputs are."""
        inputs = _tensors((args, kwargs))
        if inputs and not any(is_device_side(t) for t in inputs):
            mark_host(*_tensors(out))

    @staticmethod
    def _note_factory(func: Any, args: object, kwargs: dict[str, Any], out: object) -> None:
        """A new tensor made with ``device="cpu"`` or ``pin_memory=True`` is host memory; one
        made from Python data with another ``device=`` is the device's. An output that shares
        its memory with an input (``t.to(device="cpu")`` of a CPU tensor is ``t``) is left as
        it was: it is not a new tensor."""
        dev = kwargs.get("device")
        host = kwargs.get("pin_memory") or (isinstance(dev, str) and dev.strip().startswith("cpu"))
        if not host and (dev is None or func not in _DEVICE_ARG_FUNCS):
            return
        shared = {_storage_key(t) for t in _tensors((args, kwargs))}
        for t in _tensors(out):
            if _storage_key(t) in shared:
                continue
            if host:
                mark_host(t)
            else:
                _unmark(t)

    # -- explicit waits --------------------------------------------------------------------

    def _wrap_synchronize(self) -> None:
        targets = [(torch.cuda, "synchronize", "torch.cuda.synchronize()")]
        for cls_name in ("Stream", "Event"):
            cls = getattr(torch.cuda, cls_name, None)
            if cls is not None and hasattr(cls, "synchronize"):
                targets.append((cls, "synchronize", f"torch.cuda.{cls_name}.synchronize()"))
        accel = getattr(torch, "accelerator", None)
        if accel is not None and hasattr(accel, "synchronize"):
            targets.append((accel, "synchronize", "torch.accelerator.synchronize()"))
        for owner, attr, what in targets:
            original = getattr(owner, attr)
            self._patched.append((owner, attr, original))
            setattr(owner, attr, self._waiting(original, what))

    def _waiting(self, original: Callable[..., Any], what: str) -> Callable[..., Any]:
        hub = self

        def synchronize(*args: Any, **kwargs: Any) -> Any:
            if hub.active and not hub.paused:
                frame = user_frame()
                hub._dispatch(f"{what} (explicit wait) at {code_site(frame)}", frame)
            return original(*args, **kwargs)

        synchronize.__wrapped__ = original  # type: ignore[attr-defined]
        return synchronize

    # -- installation ----------------------------------------------------------------------

    def _push(self) -> None:
        self._function_mode.__enter__()  # type: ignore[no-untyped-call]  # torch's modes are unannotated
        try:
            self._dispatch_mode.__enter__()  # type: ignore[no-untyped-call]  # as above
        except BaseException:
            self._function_mode.__exit__(None, None, None)  # type: ignore[no-untyped-call]  # as above
            raise
        self._pushed = True

    def _pop_if_on_top(self) -> bool:
        """Leave the modes if they are the innermost ones (else another mode entered after
        them is still active: they stay, and ``paused`` silences them)."""
        from torch.overrides import _get_current_function_mode
        from torch.utils._python_dispatch import _get_current_dispatch_mode

        if not self._pushed:
            return True
        if (
            _get_current_dispatch_mode() is not self._dispatch_mode
            or _get_current_function_mode() is not self._function_mode  # type: ignore[no-untyped-call]
        ):
            return False
        self._dispatch_mode.__exit__(None, None, None)  # type: ignore[no-untyped-call]  # as above
        self._function_mode.__exit__(None, None, None)
        self._pushed = False
        return True

    def _install(self) -> None:
        self._push()
        self._wrap_synchronize()

    def _pause(self) -> None:
        self._pop_if_on_top()

    def _resume(self) -> None:
        if not self._pushed:
            self._push()

    def _uninstall(self) -> None:
        self.paused = False
        try:
            if not self._pop_if_on_top():
                raise RuntimeError(
                    "the cpu sync detector's modes are not the innermost ones at its exit: "
                    "a torch mode entered inside the recorded region is still active"
                )
        finally:
            while self._patched:
                owner, attr, original = self._patched.pop()
                setattr(owner, attr, original)


add_machinery_file(__file__)
