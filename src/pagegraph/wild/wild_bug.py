"""One entry of the corpus of bugs from the wild (``WildBug``) and how its twins are checked.

An entry names a public bug (engine, version, issue or pull request, its state), says in two
lines what went wrong and why, and holds two ``Twin``s: the buggy one, written from the
report, and the fixed one. Both run through the bed on the entry's scenario
(``wild/scenarios/<key>.toml``); the buggy twin must be UNSAFE through the entry's property,
the fixed twin SAFE. An entry that needs what only a GPU has (a real stream capture, CUPTI)
says why in ``needs``; elsewhere it is skipped with that reason, never passed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..check.checker import check_replay_safety
from ..check.reports.report import Report
from ..check.scenario import load_scenario
from ..consumers.reader import Reader
from ..graph.runner import GraphRunner

__all__ = ["BUG_CLASSES", "SCENARIO_DIR", "Fidelity", "NotYetExpressible", "Twin", "WildBug"]

#: The classes of bugs, by letter: where in the metadata's life the bug sits.
BUG_CLASSES = {
    "a": "stale tail when the batch shrinks below its bucket",
    "b": "host value frozen at capture in the reader's launch",
    "c": "host work inside capture",
    "d": "reads past a row",
    "e": "padding conventions drifting between builder and reader",
    "f": "unstable addresses and aliasing",
}

#: The entries' scenario files.
SCENARIO_DIR = Path(__file__).resolve().parent / "scenarios"


@dataclass(frozen=True)
class Twin:
    """What one side of an entry runs through the bed.

    ``builder``: the metadata builder (a callable of a kind's contract, or a built-in name);
    ``reader``: the decode step's reader (the scenario then has a ``[consumer]``); ``runner``:
    the engine's runner, staging the batch into the graph's static inputs (``GraphRunner``'s
    arguments; default pagegraph's ``GraphRunner``)."""

    builder: Callable[..., object] | str = "build_page_table"
    reader: Reader | Callable[..., object] | None = None
    runner: Callable[..., GraphRunner] | None = None


@dataclass(frozen=True)
class Fidelity:
    """How closely an entry follows its bug (``profiles/wild.md`` shows it).

    ``modelled``: what is reproduced exactly (the root cause, as upstream had it);
    ``stands_in``: what stands in for what (``"seq_lens for positions"``, ``"KV page 0 for the
    SSM state"``), empty when nothing does; ``fix``: the upstream fix the fixed twin follows
    (its pull request or commit, and its mechanism); ``refs``: further threads of the same
    defect (``owner/repo#number``), one entry per mechanism."""

    modelled: str
    fix: str
    stands_in: tuple[str, ...] = ()
    refs: tuple[str, ...] = ()


@dataclass(frozen=True)
class NotYetExpressible:
    """A public bug the bed cannot yet reproduce faithfully: listed, never counted as held."""

    ref: str
    engine: str
    bug_class: str
    summary: str
    why: str


@dataclass(frozen=True)
class WildBug:
    """One public bug (see the module docstring)."""

    #: ``engine-number``, e.g. ``"vllm-33664"``; also the scenario file's name
    key: str
    engine: str
    #: the versions the bug was reported against (as the report states them)
    version: str
    #: ``owner/repo#number``
    ref: str
    #: ``"open"`` or ``"fixed by #N"`` (as the tracker shows it)
    state: str
    #: a letter of ``BUG_CLASSES``
    bug_class: str
    symptom: str
    cause: str
    #: the property of the bed that must fail on the buggy twin
    prop: str
    buggy: Twin
    fixed: Twin
    #: why the entry needs a GPU (a real stream capture, CUPTI); ``None``: runs anywhere
    needs: str | None = None
    #: settings of the entry's check besides its scenario file (``CheckConfig`` fields)
    overrides: dict[str, object] = field(default_factory=dict)
    #: how faithful the entry is to its bug (None: not yet recorded)
    fidelity: Fidelity | None = None

    @property
    def url(self) -> str:
        repo, number = self.ref.split("#")
        return f"https://github.com/{repo}/issues/{number}"

    @property
    def scenario_path(self) -> Path:
        return SCENARIO_DIR / f"{self.key}.toml"

    def runnable(self, device: torch.device) -> str | None:
        """Why the entry cannot run on ``device`` (``None`` when it can)."""
        if self.needs is not None and device.type != "cuda":
            return f"needs CUDA: {self.needs}"
        return None

    def check(self, which: str, device: torch.device | str | None = None) -> Report:
        """The bed's report on the ``"buggy"`` or ``"fixed"`` twin, on the entry's scenario."""
        twin = {"buggy": self.buggy, "fixed": self.fixed}[which]
        scenario = load_scenario(self.scenario_path)
        cfg = scenario.config.replace(**self.overrides)
        return check_replay_safety(
            twin.builder, cfg, device=device, runner_factory=twin.runner, reader=twin.reader
        )
