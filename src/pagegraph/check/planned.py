"""A check as planned: ``CheckPlan``, the value ``plan_check`` (``pagegraph.check.plan``)
returns and everything that runs a check reads. It sits below the pipeline and the planning
alike: the beds read a plan without importing how one is made.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from ..kinds import KINDS, KindSpec
from .config import CheckConfig

__all__ = ["PIPELINES", "CheckPlan"]

#: What a plan's check judges: the builder's outputs, or the decode step's attention output.
PIPELINES = ("tables", "step")


@dataclass(frozen=True)
class CheckPlan:
    """A decided check: the builder (as named to the user, or a spec a child resolves), the
    config (its preset outputs decided: the builder kind's only), the builder's kind and the
    judges to run, and what else ``plan_check`` decided (the module docstring)."""

    builder: str
    config: CheckConfig
    kind: str
    pipeline: str
    #: the decode step's reader as a child resolves it (``module:name``), ``None``: the
    #: consumer format's own attention (or a reader object given in this process)
    reader: str | None = None
    #: whether the check reads the builder's error counters (``errors=``)
    errors: bool = True
    #: the page sizes the builder declares it takes; None: any
    page_sizes: tuple[int, ...] | None = None
    #: bytes the check needs where its tables live (``memory_fit.memory_need``), when planned
    #: with ``fit_memory``; None otherwise
    memory_need: int | None = None

    @property
    def kind_spec(self) -> KindSpec:
        """The plan's builder kind as its spec."""
        return KINDS[self.kind]

    def to_dict(self) -> dict[str, Any]:
        """The plan as JSON values, for a child process (``from_dict`` reads it back)."""
        return {
            "builder": self.builder,
            "config": dataclasses.asdict(self.config),
            "kind": self.kind,
            "pipeline": self.pipeline,
            "reader": self.reader,
            "errors": self.errors,
            "page_sizes": None if self.page_sizes is None else list(self.page_sizes),
            "memory_need": self.memory_need,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CheckPlan:
        """The plan ``to_dict`` wrote (a parent's, for its child): trusted, not validated."""
        sizes = d["page_sizes"]
        return cls(
            d["builder"],
            CheckConfig.from_dict(d["config"]),
            d["kind"],
            d["pipeline"],
            d["reader"],
            d["errors"],
            None if sizes is None else tuple(sizes),
            d["memory_need"],
        )
