"""Loading a Python file by path as its own module, once per process and safely from several
threads: a builder named by its file (``kernels.registry``) and an engine's kernel files
(``pagegraph.clients.sglang``, ``pagegraph.clients.vllm_files``).

A worker pool plans its checks in one thread per worker, so two threads may ask for the same
file at once. The module is registered in ``sys.modules`` before its code runs (``@triton.jit``
reads the source through it), so without the lock the second thread would be handed the first
one's half-run module, one without the function it asked for.
"""

from __future__ import annotations

import importlib.util
import sys
import threading
from pathlib import Path
from types import ModuleType

#: Held while a file module is looked up and run: one load at a time, each file run once.
#: Reentrant, since running one file may load another.
_LOADING = threading.RLock()


def load_file_module(
    key: str, path: Path, module_builtins: dict[str, object] | None = None
) -> ModuleType:
    """The file ``path`` run as the module ``key`` of ``sys.modules``, once per process, whole
    in whichever thread asks. ``module_builtins``: the module's own ``__builtins__`` (an
    ``__import__`` that answers some names itself, say). The module is registered before it
    runs, as an import would, and removed again if running it raises (``SystemExit``
    included), so no half-made module is left behind."""
    with _LOADING:
        module = sys.modules.get(key)
        if module is not None:
            return module
        spec = importlib.util.spec_from_file_location(key, path)
        if spec is None or spec.loader is None:
            raise ImportError(f"{path} cannot be loaded as a Python module")
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
