"""Triton's CPU interpreter made able to run the engines' kernel files as they are
(``fit_interpreter``): two gaps of the interpreter, patched in the interpreter only, so that
compiled kernels never see them and the engines' files stay unchanged.
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["fit_interpreter"]


def fit_interpreter() -> None:
    """Under ``TRITON_INTERPRET=1``, patch the interpreter (once per process) so that a scalar
    loaded from memory can bound a ``range`` and a bf16 ``tl.dot`` multiplies values; nothing
    elsewhere."""
    if os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
        return
    _interpreter_indexes_loaded_scalars()
    _interpreter_dots_bf16_as_values()


def _interpreter_indexes_loaded_scalars() -> None:
    """Let Triton's CPU interpreter use a scalar loaded from memory as a ``range`` bound.

    Under ``TRITON_INTERPRET=1`` such a scalar is a one-element array, and the interpreter
    converts it with ``int(array)``, which NumPy 2.4 refuses for anything but 0-d arrays.
    SGLang's kernels loop up to lengths they load (``range(tl.cdiv(n, BLOCK))``), so without
    this they cannot run on a machine without a GPU. The wrapper converts through ``.item()``
    and changes nothing where NumPy still accepts the conversion; compiled kernels never see it.
    """
    import numpy as np

    try:
        int(np.ones(1, dtype=np.int32))
        return
    except TypeError:
        pass
    from triton.runtime import interpreter

    original = getattr(interpreter, "_patch_lang_tensor", None)
    if original is None or getattr(original, "pagegraph_index_fix", False):
        return

    def index(self: Any) -> int:
        return int(self.handle.data.item())

    def patch_lang_tensor(tensor: Any, scope: Any) -> None:
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", index)

    vars(patch_lang_tensor)["pagegraph_index_fix"] = True
    interpreter._patch_lang_tensor = patch_lang_tensor


def _interpreter_dots_bf16_as_values() -> None:
    """Let Triton's CPU interpreter ``tl.dot`` bf16 operands by value.

    The interpreter stores bf16 as uint16 and its dot multiplies those raw bits, so any
    kernel that dots bf16 tiles (SGLang's decode does) is wrong under ``TRITON_INTERPRET=1``
    only. The wrapper widens bf16 operands to fp32 first (exact); compiled kernels never see
    it, and other dtypes are untouched."""
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder
    original = builder.create_dot
    if getattr(original, "pagegraph_bf16_fix", False):
        return
    import numpy as np
    import triton.language as tl

    def widened(handle: Any) -> Any:
        if handle.dtype.scalar != tl.bfloat16:
            return handle
        data = interpreter._convert_float(handle.data, tl.bfloat16, tl.float32, None)
        return interpreter.TensorHandle(data.view(np.float32), tl.float32)

    def create_dot(
        self: Any, a: Any, b: Any, d: Any, input_precision: Any, max_num_imprecise_acc: Any
    ) -> Any:
        return original(self, widened(a), widened(b), d, input_precision, max_num_imprecise_acc)

    vars(create_dot)["pagegraph_bf16_fix"] = True
    builder.create_dot = create_dot
