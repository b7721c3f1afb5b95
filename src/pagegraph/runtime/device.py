"""The device pagegraph runs on: the one asked for, else CUDA when present, else the CPU
(where the Triton kernels run under the interpreter)."""

from __future__ import annotations

import torch


def pick_device(device: str | torch.device | None) -> torch.device:
    """The device given, else CUDA when present, else the CPU."""
    return torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
