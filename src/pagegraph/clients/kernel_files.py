"""Loading an engine's kernel file by path, as its own module: what the SGLang and vLLM
clients share (``pagegraph.clients.sglang``, ``pagegraph.clients.vllm_files``)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType


def load_file_module(key: str, path: Path, module_builtins: dict | None = None) -> ModuleType:
    """The file ``path`` run as the module ``key`` of ``sys.modules``, once per process.
    ``module_builtins``: the module's own ``__builtins__`` (an ``__import__`` that answers
    some names itself, say). The module is registered before it runs, as an import would
    (``@triton.jit`` reads the source through it), and removed again if running it raises,
    so no half-made module is left behind."""
    module = sys.modules.get(key)
    if module is not None:
        return module
    spec = importlib.util.spec_from_file_location(key, path)
    module = importlib.util.module_from_spec(spec)
    if module_builtins is not None:
        module.__dict__["__builtins__"] = module_builtins
    sys.modules[key] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[key]
        raise
    return module
