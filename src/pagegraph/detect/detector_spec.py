"""The one parser of a detector choice, for every spelling pagegraph accepts.

The CLI (``--detectors torch,cupti``), scenario files (``detectors = ["torch"]``),
``CheckConfig.detectors`` and the Python API (``no_device_sync(("cupti",))``) all go through
:func:`parse_detectors`.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["DETECTORS", "GPU_DETECTORS", "parse_detectors"]

#: Every detector pagegraph knows, in the order they are started.
DETECTORS = ("torch", "cupti", "cpu")
#: The detectors that watch a real CUDA device: what ``"auto"`` runs where CUDA is present
#: (``"cpu"``, which sees operators rather than waits, is ``"auto"``'s choice without CUDA).
GPU_DETECTORS = ("torch", "cupti")


def parse_detectors(
    spec: str | Iterable[str] | None, *, known: Iterable[str] = DETECTORS
) -> str | tuple[str, ...]:
    """Normalise a detector choice: ``"auto"``; ``"none"``, ``""``, ``None`` or an empty
    sequence (no detector); a name (``"torch"``, ``"cupti"``, ``"cpu"``); a comma-separated
    list (``"torch,cupti"``);
    or a sequence of names (``("torch", "cupti")``, ``["cupti"]``).

    Returns ``"auto"`` or a tuple of distinct names in the order given. ``ValueError`` names
    the first bad one. ``known``: the valid names (default :data:`DETECTORS`).
    """
    known = tuple(known)
    if spec is None or (isinstance(spec, str) and spec.strip() in ("none", "")):
        return ()
    if isinstance(spec, str):
        if spec.strip() == "auto":
            return "auto"
        names = [part.strip() for part in spec.split(",") if part.strip()]
    else:
        try:
            names = list(spec)
        except TypeError:
            raise ValueError(f"detectors must be a string or a sequence, got {spec!r}") from None
    for name in names:
        if not isinstance(name, str) or name not in known:
            raise ValueError(
                f"unknown detector {name!r}: use auto, none, or names among "
                f"{', '.join(known)} (e.g. 'torch,cupti')"
            )
    return tuple(dict.fromkeys(names))
