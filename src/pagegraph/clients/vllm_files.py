"""vLLM's GPU block-table kernel files, found and loaded by path without the ``vllm`` package.

``block_table.py`` and the ``buffer_utils.py`` it imports are loaded as they are, once per
process, and the few names they import from the rest of vLLM are answered by stand-ins
(``STUBBED_IMPORTS``) through each file's own ``__import__``, never through ``sys.modules``, so
a real ``vllm`` is never shadowed. Where the files are looked for (``$PAGEGRAPH_VLLM_PATH``,
an installed ``vllm``, ``.device/vllm-lite`` and ``.venv/vllm-lite``): docs/ARCHITECTURE.md,
"vLLM's own kernels".
"""

from __future__ import annotations

import ast
import builtins
import importlib.util
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import NoReturn, cast

from ..kernels.file_modules import load_file_module
from .interpreter import fit_interpreter

__all__ = [
    "ENV_VAR",
    "KERNEL_FILES",
    "STUBBED_IMPORTS",
    "TESTED_VERSION",
    "VLLMUnavailable",
    "load_vllm_kernels",
    "pad_slot_id",
    "vllm_available",
    "vllm_root",
    "vllm_unavailable_reason",
]

#: The vLLM release the adapters were written against.
TESTED_VERSION = "0.34.0"
#: A folder holding ``vllm/v1/worker/gpu/block_table.py``, searched first.
ENV_VAR = "PAGEGRAPH_VLLM_PATH"
#: The files loaded, relative to the folder that holds ``vllm/``.
KERNEL_FILES = ("vllm/v1/worker/gpu/buffer_utils.py", "vllm/v1/worker/gpu/block_table.py")
#: Where ``PAD_SLOT_ID`` is read from (parsed, never run: its imports reach all of vLLM).
PAD_SLOT_FILE = "vllm/v1/attention/backends/utils.py"
#: Folders under the source tree's root searched last.
LOCAL_FOLDERS = (".device/vllm-lite", ".venv/vllm-lite")

#: Every name the two kernel files import from vLLM that pagegraph answers itself, with what
#: stands in for it. ``vllm.v1.worker.gpu.buffer_utils`` is not here: it is vLLM's own file.
STUBBED_IMPORTS: dict[str, str] = {
    "vllm.triton_utils.triton": "the installed triton",
    "vllm.triton_utils.tl": "the installed triton.language",
    "vllm.v1.attention.backends.utils.PAD_SLOT_ID": (
        f"the constant parsed from vLLM's {PAD_SLOT_FILE}, -1 where that file is missing"
    ),
    "vllm.logger.init_logger": "logging.getLogger",
    "vllm.utils.platform_utils.is_pin_memory_available": "returns False (no kernel uses it)",
    "vllm.utils.platform_utils.is_uva_available": "returns False (no kernel uses it)",
    "vllm.utils.torch_utils.TORCH_DTYPE_TO_ARRAY_TYPECODE": (
        "an empty dict (vLLM's staged host writes are not used)"
    ),
    "vllm.utils.torch_utils.get_accelerator_view_from_cpu_tensor": "raises (UVA is not used)",
    "vllm.v1.conf_compute_utils.register_inplace_h2d_target": "raises (not used)",
}

_MODULE_KEY = "pagegraph_vllm_file_{}"
# The loaded kernels (load_vllm_kernels), once found.
_kernels: SimpleNamespace | None = None
_ROOT = Path(__file__).resolve().parents[3]


class VLLMUnavailable(ImportError):
    """vLLM's kernel files cannot be loaded here; the message says why."""


def _has_files(folder: Path, files: tuple[str, ...] = KERNEL_FILES) -> bool:
    return all((folder / f).is_file() for f in files)


def vllm_root(files: tuple[str, ...] = KERNEL_FILES) -> Path:
    """The folder holding vLLM's ``vllm/`` with ``files`` (default: both kernel files; search
    order: the module docstring); ``VLLMUnavailable`` with the places tried when there is
    none."""
    tried = []
    env = os.environ.get(ENV_VAR)
    if env:
        if _has_files(Path(env), files):
            return Path(env)
        tried.append(f"${ENV_VAR}={env}")
    try:
        spec = importlib.util.find_spec("vllm")
    except (ImportError, ValueError):
        spec = None
    for base in (spec.submodule_search_locations or []) if spec else []:
        if _has_files(Path(base).parent, files):
            return Path(base).parent
        tried.append(f"installed vllm at {base}")
    for local in LOCAL_FOLDERS:
        if _has_files(_ROOT / local, files):
            return _ROOT / local
        tried.append(str(_ROOT / local))
    raise VLLMUnavailable(
        f"vLLM {TESTED_VERSION}'s {' and '.join(files)} not found (tried "
        f"{'; '.join(tried)}); tools/fetch_vllm_files.sh fetches them"
    )


def vllm_unavailable_reason() -> str | None:
    """Why vLLM's kernels cannot be loaded here (one line), or ``None`` when they can."""
    try:
        vllm_root()
    except VLLMUnavailable as exc:
        return str(exc)
    return None


def vllm_available() -> bool:
    return vllm_unavailable_reason() is None


def pad_slot_id(root: Path) -> int:
    """``PAD_SLOT_ID`` as vLLM's own ``attention/backends/utils.py`` under ``root`` defines it
    (a module-level constant, read with ``ast``), -1 where the file or the name is missing."""
    path = root / PAD_SLOT_FILE
    if not path.is_file():
        return -1
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "PAD_SLOT_ID" for t in node.targets
        ):
            return int(ast.literal_eval(node.value))
    return -1


def _unused(name: str) -> Callable[..., NoReturn]:
    def stand_in(*args: object, **kwargs: object) -> NoReturn:
        raise NotImplementedError(f"{name} is stubbed by pagegraph (only the kernels are used)")

    return stand_in


def _stand_ins(root: Path) -> dict[str, ModuleType]:
    """The stubbed modules, by the name the files import them by (never in ``sys.modules``)."""
    import triton
    import triton.language as tl

    def module(name: str, **names: object) -> ModuleType:
        m = ModuleType(f"pagegraph_vllm_stub.{name}")
        m.__dict__.update(names)
        return m

    return {
        "vllm.triton_utils": module("vllm.triton_utils", triton=triton, tl=tl),
        "vllm.v1.attention.backends.utils": module(
            "vllm.v1.attention.backends.utils", PAD_SLOT_ID=pad_slot_id(root)
        ),
        "vllm.logger": module("vllm.logger", init_logger=logging.getLogger),
        "vllm.utils.platform_utils": module(
            "vllm.utils.platform_utils",
            is_pin_memory_available=lambda: False,
            is_uva_available=lambda: False,
        ),
        "vllm.utils.torch_utils": module(
            "vllm.utils.torch_utils",
            TORCH_DTYPE_TO_ARRAY_TYPECODE={},
            get_accelerator_view_from_cpu_tensor=_unused("get_accelerator_view_from_cpu_tensor"),
        ),
        "vllm.v1.conf_compute_utils": module(
            "vllm.v1.conf_compute_utils",
            register_inplace_h2d_target=_unused("register_inplace_h2d_target"),
        ),
    }


def _importer(answers: dict[str, ModuleType]) -> Callable[..., ModuleType]:
    """An ``__import__`` that answers ``answers``' names and refuses any other ``vllm``."""
    real = builtins.__import__

    def isolated_import(
        name: str,
        globals: Mapping[str, object] | None = None,
        locals: Mapping[str, object] | None = None,
        fromlist: Sequence[str] = (),
        level: int = 0,
    ) -> ModuleType:
        if level == 0 and (name == "vllm" or name.startswith("vllm.")):
            if name in answers and fromlist:
                return answers[name]
            raise ImportError(
                f"vLLM's kernel files import {name}, which pagegraph does not stub "
                f"(written against vLLM {TESTED_VERSION})"
            )
        return real(name, globals, locals, fromlist, level)

    return isolated_import


def _load_file(name: str, path: Path, answers: dict[str, ModuleType]) -> ModuleType:
    # exec keeps a module's own __builtins__: the file's imports go through the importer.
    own = dict(builtins.__dict__, __import__=_importer(answers))
    return load_file_module(_MODULE_KEY.format(name), path, own)


def load_vllm_kernels() -> SimpleNamespace:
    """vLLM's kernels, loaded once per process: ``gather`` (``_gather_block_tables_kernel``),
    ``slot_mappings`` (``_compute_slot_mappings_kernel``), ``pad_slot_id`` (the ``PAD_SLOT_ID``
    the file saw) and ``root`` (the folder they came from). ``VLLMUnavailable`` when the files
    are missing. After the first call, no file is looked at again (a builder calls this at
    every launch)."""
    global _kernels
    if _kernels is not None:
        return _kernels
    root = vllm_root()
    # vLLM's loops run up to values they load (tl.range(0, num_blocks, ...)).
    fit_interpreter()
    answers = _stand_ins(root)
    buffer_utils = _load_file("buffer_utils", root / KERNEL_FILES[0], answers)
    answers["vllm.v1.worker.gpu.buffer_utils"] = buffer_utils
    block_table = _load_file("block_table", root / KERNEL_FILES[1], answers)
    _kernels = SimpleNamespace(
        gather=block_table._gather_block_tables_kernel,
        slot_mappings=block_table._compute_slot_mappings_kernel,
        pad_slot_id=block_table.PAD_SLOT_ID,
        root=Path(cast(str, block_table.__file__)).parents[4],
    )
    return _kernels
