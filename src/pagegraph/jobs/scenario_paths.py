"""Scenario files by name or by path.

The shipped scenarios live in the repository's ``graphs/`` folder, which the package links
as ``pagegraph/scenarios`` (and installs as package data), so ``pagegraph check sglang-h200``
finds ``graphs/sglang-h200.toml`` from any folder. A path that exists is used as it is.
"""

from __future__ import annotations

from pathlib import Path

#: The folder of the shipped scenarios inside the installed (or in-place) package.
SHIPPED_DIR = Path(__file__).resolve().parent.parent / "scenarios"
#: What ``pagegraph check`` runs when no scenario is named.
DEFAULT_SCENARIO = "default"


class ScenarioNotFound(ValueError):
    """Neither a file nor the name of a shipped scenario."""


def shipped_scenarios() -> list[str]:
    """The names of the shipped scenarios (``default``, ``sglang-h200``, ...), sorted."""
    if not SHIPPED_DIR.is_dir():
        return []
    return sorted(p.stem for p in SHIPPED_DIR.glob("*.toml"))


def scenario_path(spec: str | Path) -> Path:
    """The scenario file ``spec`` names: an existing path, else a shipped scenario's name
    (with or without ``.toml``); ``ScenarioNotFound`` naming the shipped ones otherwise."""
    path = Path(spec)
    if path.is_file():
        return path
    name = path.name[: -len(".toml")] if path.name.endswith(".toml") else path.name
    shipped = SHIPPED_DIR / f"{name}.toml"
    # A bare name, or the in-repository path graphs/NAME.toml from another folder.
    if shipped.is_file() and (len(path.parts) == 1 or path.parts[:-1] == ("graphs",)):
        return shipped
    known = ", ".join(shipped_scenarios()) or "none installed"
    raise ScenarioNotFound(
        f"{spec}: no such scenario file, nor a shipped scenario name (shipped: {known})"
    )
