"""The Python stack of an offending call, without the detectors' own frames."""

from __future__ import annotations

import linecache
import os
import sys
import threading
import traceback
import warnings
from collections.abc import Callable
from types import CodeType, FrameType
from typing import Any

import torch

__all__ = [
    "STACK_FRAMES",
    "TORCH_DIR",
    "add_machinery",
    "add_machinery_dir",
    "add_machinery_file",
    "caller_frame",
    "code_location",
    "code_site",
    "format_stack",
    "user_frame",
]

#: Frames kept of the Python stack of the first occurrence of each offending call.
STACK_FRAMES = 8
TORCH_DIR = os.path.dirname(torch.__file__) + os.sep

_WARNINGS_FILE = warnings.__file__
_machinery_codes: set[CodeType] = set()
_machinery_dirs: list[str] = []
_machinery_files: set[str] = set()


def add_machinery(*functions: Callable[..., Any]) -> None:
    """Leave the frames of these functions (detector hooks, dispatchers) out of stacks."""
    _machinery_codes.update(f.__code__ for f in functions)


def add_machinery_dir(directory: str) -> None:
    """Leave every frame of a file under ``directory`` (a package's trampolines) out."""
    _machinery_dirs.append(directory.rstrip(os.sep) + os.sep)


def add_machinery_file(filename: str) -> None:
    """Leave every frame of this source file (a detector's own module) out."""
    _machinery_files.add(filename)


def _is_machinery(frame: FrameType) -> bool:
    code = frame.f_code
    if code in _machinery_codes:
        return True
    filename = code.co_filename
    if filename in _machinery_files:
        return True
    if filename == _WARNINGS_FILE:
        return True
    # torch's CallbackRegistry.fire_callbacks, between the C++ trace hook and our callback.
    if code.co_name == "fire_callbacks" and filename.startswith(TORCH_DIR):
        return True
    return any(filename.startswith(d) for d in _machinery_dirs)


def caller_frame() -> FrameType | None:
    """Innermost frame that is not detector machinery (our hooks, warnings, trampolines)."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None and _is_machinery(frame):
        frame = frame.f_back
    return frame


def user_frame() -> FrameType | None:
    """Innermost frame that is neither detector machinery nor torch's own code: the line that
    called into torch (for a detector inside torch's operator dispatch)."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None and (
        _is_machinery(frame) or frame.f_code.co_filename.startswith(TORCH_DIR)
    ):
        frame = frame.f_back
    return frame


def format_stack(frame: FrameType | None) -> str | None:
    if frame is None:
        return None
    thread = threading.current_thread().name
    entries = traceback.format_list(traceback.extract_stack(frame, limit=STACK_FRAMES))
    return f"(thread {thread})\n" + "".join(entries)


def code_location(frame: FrameType | None) -> str:
    """Source of the innermost frame outside torch, e.g. ``t.sum().item()``."""
    while frame is not None and frame.f_code.co_filename.startswith(TORCH_DIR):
        frame = frame.f_back
    if frame is None:
        return "<unknown location>"
    filename, lineno = frame.f_code.co_filename, frame.f_lineno
    code = linecache.getline(filename, lineno).strip()
    if not code:
        return f"{os.path.basename(filename)}:{lineno}"
    return code if len(code) <= 60 else code[:57] + "..."


def code_site(frame: FrameType | None) -> str:
    """``file.py:LINE: source`` of ``frame`` (``<unknown location>`` without one): where an
    event happened, for a report that must name the line."""
    if frame is None:
        return "<unknown location>"
    filename, lineno = frame.f_code.co_filename, frame.f_lineno
    code = linecache.getline(filename, lineno).strip()
    code = code if len(code) <= 60 else code[:57] + "..."
    return f"{os.path.basename(filename)}:{lineno}" + (f": {code}" if code else "")


add_machinery(caller_frame, user_frame)
