"""A check validated once: ``plan_check(builder, config)`` and the ``CheckPlan`` it returns.

docs/ARCHITECTURE.md ("Inside the checker") has the details.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..clients.engine_readers import engine_reader, is_engine_reader_name
from ..consumers.reader import Reader, as_reader
from ..graph.builder_names import builder_name, config_problem, resolve_builder
from ..kernels.registry import BuilderLoadError, load_object
from ..kinds import KINDS, KindSpec, kind_of
from .config import CheckConfig, validate_config

__all__ = [
    "PIPELINES",
    "CheckPlan",
    "PlanError",
    "plan_check",
    "preset_problem",
    "resolve_kind",
    "resolve_reader",
]

#: What a plan's check judges: the builder's outputs, or the decode step's attention output.
PIPELINES = ("tables", "step")


class PlanError(ValueError):
    """A builder that does not fit a check's config (its kind, its preset outputs, SWA, a
    consumer, the page size, the padding, an injection, a reader): one line, the reason."""


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

    def to_dict(self) -> dict[str, Any]:
        return {
            "builder": self.builder,
            "config": dataclasses.asdict(self.config),
            "kind": self.kind,
            "pipeline": self.pipeline,
            "reader": self.reader,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CheckPlan:
        """The plan ``to_dict`` wrote (a parent's, for its child): trusted, not validated."""
        return cls(
            d["builder"],
            CheckConfig.from_dict(d["config"]),
            d["kind"],
            d["pipeline"],
            d.get("reader"),
        )


def resolve_reader(reader: Reader | Callable[..., object] | str | None) -> Reader | None:
    """A decode step's reader: a ``Reader``, an attention call, or ``"module:name"`` /
    ``"path/to/file.py:name"`` naming either; ``ValueError`` (one line) otherwise."""
    if reader is None:
        return None
    if isinstance(reader, str) and is_engine_reader_name(reader):
        return engine_reader(reader)
    found: object = reader
    if isinstance(reader, str):
        try:
            found = load_object(reader)
        except BuilderLoadError as exc:
            raise ValueError(str(exc).replace("builder", "reader")) from None
    if not isinstance(found, Reader) and not callable(found):
        raise ValueError(f"reader {found!r} is neither a Reader nor an attention call")
    return as_reader(found)


def resolve_kind(
    builder: Callable[..., object] | str, outputs: str = "auto"
) -> tuple[Callable[..., object], KindSpec]:
    """``builder`` resolved (a callable, a built-in name or ``module:fn``; ``BuilderLoadError``
    otherwise) and the kind of outputs a check of it judges: ``outputs`` when declared (a
    config's ``outputs``), else what the builder says of itself."""
    fn = resolve_builder(builder)
    return fn, kind_of(fn, outputs)


def preset_problem(cfg: CheckConfig, kind: KindSpec) -> str | None:
    """Why ``cfg.preset_outputs`` do not fit a builder of ``kind``; ``None`` when they do."""
    known = kind.presets
    unfit = [name for name in cfg.preset_outputs if name not in known]
    if not unfit:
        return None
    return f"preset_outputs {unfit} are not outputs of a {kind.name} builder" + (
        f" (its presettable outputs: {', '.join(known)})" if known else " (it has none)"
    )


def _presets(cfg: CheckConfig, kind: KindSpec, own_builder: bool) -> CheckConfig:
    """``cfg`` with the preset outputs of the one rule (the module docstring): the scenario's
    own builder must have them all, another builder keeps those its kind has."""
    if own_builder:
        problem = preset_problem(cfg, kind)
        if problem:
            raise PlanError(problem)
        return cfg
    return cfg.replace(preset_outputs=tuple(p for p in cfg.preset_outputs if p in kind.presets))


def plan_check(
    builder: Callable[..., object] | str,
    config: CheckConfig,
    spec: str | None = None,
    reader: Reader | Callable[..., object] | str | None = None,
    *,
    own_builder: bool = False,
) -> tuple[CheckPlan, Callable[..., object]]:
    """Validate a check of ``builder`` (a callable, a built-in name or ``module:fn``) on
    ``config``; the plan and the resolved builder. ``spec``: the builder as a child process
    resolves it (default: ``builder`` when a string, else its name). ``reader``: the decode
    step's reader (``resolve_reader``; a config with a consumer only), kept in the plan when
    given by name; default: the config's ``reader``. ``own_builder``: ``builder`` is the one
    the config's scenario names, so its preset outputs must all be its kind's (else they are
    dropped: the module docstring).
    ``PlanError`` when the builder does not fit, another ``ValueError`` when the config or a
    name is bad (the module docstring)."""
    validate_config(config)
    if reader is None:
        reader = config.reader  # the scenario's own reader ([consumer] reader)
    if reader is not None:
        if not config.consumer:
            raise PlanError(
                "a reader needs a decode-step scenario (one with a [consumer] table): the "
                "tables check has no reader"
            )
        resolve_reader(reader)  # a name that does not load is refused before anything runs
    fn, kind = resolve_kind(builder, config.outputs)
    problem = config_problem(fn, kind, config)
    if problem:
        raise PlanError(problem)
    cfg = _presets(config, kind, own_builder)
    name = spec or (builder if isinstance(builder, str) else builder_name(fn))
    pipeline = "step" if cfg.consumer else "tables"
    return CheckPlan(
        name, cfg, kind.name, pipeline, reader if isinstance(reader, str) else None
    ), fn
