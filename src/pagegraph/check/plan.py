"""A check validated once: ``plan_check(builder, config)`` and the ``CheckPlan`` it returns.

Planning is where a check's config is judged runnable, once: the config's own rules
(``validate_config``), the builder resolved and its kind found (``kind_of``), the preset
outputs of another kind dropped (``presets_of_kind``, as ``pagegraph check --builder`` drops
them), and the kind's fit with the scenario (``config_problem``: SWA, a consumer, the page
size, the padding, engine-state injections). A problem is a ``ValueError`` (a ``ConfigError``
for the config's own rules) before anything is allocated.

The plan says which judges the check runs (``pipeline``): ``"tables"``, the builder's
outputs compared exactly with the checker's model (``pagegraph.check.checker``), or
``"step"``, the decode step's attention output (``pagegraph.check.decode_step``, a config
with a ``[consumer]``). Both report through one ``Report``.

A parent that runs checks in child processes plans each one (``pagegraph.supervise.isolate``
writes ``CheckPlan.to_dict`` into the child's spec): the child resolves the builder by its
spec and runs the plan as given (``pagegraph.check.checker.run_plan``), validating nothing
again.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from ..consumers.reader import Reader, as_reader
from ..kernels.registry import BuilderLoadError, load_object
from ..kinds import KINDS, KindSpec, kind_of
from ..kinds.builders import builder_name, config_problem, resolve_builder
from .config import CheckConfig, validate_config

__all__ = ["PIPELINES", "CheckPlan", "plan_check", "preset_problem", "presets_of_kind",
           "resolve_reader"]  # fmt: skip

#: What a plan's check judges: the builder's outputs, or the decode step's attention output.
PIPELINES = ("tables", "step")


@dataclass(frozen=True)
class CheckPlan:
    """A validated check: the builder (as named to the user, or a spec a child resolves), the
    config (the builder kind's presets only), the builder's kind and the judges to run."""

    builder: str
    config: CheckConfig
    kind: str
    pipeline: str
    #: the decode step's reader as a child resolves it (``module:name``), ``None``: the
    #: consumer format's own attention (or a reader object given in this process)
    reader: str | None = None

    @property
    def kind_spec(self) -> KindSpec:
        return KINDS[self.kind]

    def to_dict(self) -> dict:
        return {"builder": self.builder, "config": dataclasses.asdict(self.config),
                "kind": self.kind, "pipeline": self.pipeline, "reader": self.reader}  # fmt: skip

    @classmethod
    def from_dict(cls, d: dict) -> CheckPlan:
        """The plan ``to_dict`` wrote (a parent's, for its child): trusted, not validated."""
        return cls(d["builder"], CheckConfig.from_dict(d["config"]), d["kind"], d["pipeline"],
                   d.get("reader"))  # fmt: skip


def resolve_reader(reader: Reader | Callable | str | None) -> Reader | None:
    """A decode step's reader: a ``Reader``, an attention call, or ``"module:name"`` /
    ``"path/to/file.py:name"`` naming either; ``ValueError`` (one line) otherwise."""
    if reader is None:
        return None
    if isinstance(reader, str):
        try:
            reader = load_object(reader)
        except BuilderLoadError as exc:
            raise ValueError(str(exc).replace("builder", "reader")) from None
    if not isinstance(reader, Reader) and not callable(reader):
        raise ValueError(f"reader {reader!r} is neither a Reader nor an attention call")
    return as_reader(reader)


def presets_of_kind(cfg: CheckConfig, kind: KindSpec) -> CheckConfig:
    """``cfg`` keeping only the preset outputs a builder of ``kind`` has: a scenario's presets
    describe its own builder, and another builder put on it (``--builder``, ``mutate``) has
    none of another kind's."""
    known = kind.presets
    return cfg.replace(preset_outputs=tuple(p for p in cfg.preset_outputs if p in known))


def preset_problem(cfg: CheckConfig, kind: KindSpec) -> str | None:
    """Why ``cfg.preset_outputs`` do not fit a builder of ``kind``; ``None`` when they do."""
    known = kind.presets
    unfit = [name for name in cfg.preset_outputs if name not in known]
    if not unfit:
        return None
    return f"preset_outputs {unfit} are not outputs of a {kind.name} builder" + (
        f" (its presettable outputs: {', '.join(known)})" if known else " (it has none)"
    )


def plan_check(
    builder: Callable | str,
    config: CheckConfig,
    spec: str | None = None,
    reader: Reader | Callable | str | None = None,
) -> tuple[CheckPlan, Callable]:
    """Validate a check of ``builder`` (a callable, a built-in name or ``module:fn``) on
    ``config``; the plan and the resolved builder. ``spec``: the builder as a child process
    resolves it (default: ``builder`` when a string, else its name). ``reader``: the decode
    step's reader (``resolve_reader``; a config with a consumer only), kept in the plan when
    given by name. ``ValueError`` when the check cannot run (the module docstring)."""
    validate_config(config)
    if reader is not None:
        if not config.consumer:
            raise ValueError(
                "a reader needs a decode-step scenario (one with a [consumer] table): the "
                "tables check has no reader"
            )
        resolve_reader(reader)  # a name that does not load is refused before anything runs
    fn = resolve_builder(builder)
    kind = kind_of(fn, config.outputs)
    cfg = presets_of_kind(config, kind)
    problem = config_problem(fn, kind, cfg)
    if problem:
        raise ValueError(problem)
    name = spec or (builder if isinstance(builder, str) else builder_name(fn))
    pipeline = "step" if cfg.consumer else "tables"
    return CheckPlan(name, cfg, kind.name, pipeline,
                     reader if isinstance(reader, str) else None), fn  # fmt: skip
