"""What a report or benchmark row records about the machine it ran on."""

from __future__ import annotations

import datetime
import platform
from typing import Any

import torch

#: pagegraph's version (``pagegraph.__version__``, ``pagegraph --version``, every report).
PAGEGRAPH_VERSION = "0.1.0"


def environment() -> dict[str, Any]:
    """The machine and the versions a report or a benchmark row records: ``pagegraph``,
    ``date`` (UTC, ISO 8601), ``device`` (the GPU's name, or the interpreter), ``cuda``,
    ``torch``, ``triton`` (``None`` where absent) and ``python``."""
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    cuda = torch.cuda.is_available()
    return {
        "pagegraph": PAGEGRAPH_VERSION,
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name() if cuda else "CPU (Triton interpreter)",
        "cuda": torch.version.cuda if cuda else None,
        "torch": torch.__version__,
        "triton": triton_version,
        "python": platform.python_version(),
    }
