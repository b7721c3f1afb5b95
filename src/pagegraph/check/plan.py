"""A check decided once, before anything runs: ``plan_check(builder, config)`` and the
``CheckPlan`` it returns (docs/ARCHITECTURE.md, "Inside the checker").

``plan_check`` is the one place that decides how a check is set up and whether it fits; the
jobs (``pagegraph check``, ``mutate``, ``make sglang``, ``make vllm``) take its answer, and
nothing that runs the plan decides again:

* the builder and its kind (``resolve_kind``: the config's ``outputs`` when declared);
* the fit: the builder takes the scenario's SWA outputs, consumer, page size (the page sizes
  it declares: ``CheckPlan.page_sizes``, and ``PlanError.page_sizes`` on a refusal), padding
  and engine-state injections (``config_problem``), else a ``PlanError``;
* the preset outputs, by one rule: the scenario's own builder (``own_builder``) must have
  every preset the scenario names (else a ``PlanError``, ``preset_problem``); another
  builder put on the scenario keeps those its kind has and drops the rest. Outputs the
  engine sets once, at allocation (``engine_presets``), join the scenario's first. The plan's
  config holds the presets decided: whoever runs it uses them as they are;
* the reader: one needs a decode-step scenario (a ``[consumer]`` table), else a
  ``PlanError``, and must load (``pagegraph.clients.engine_readers.load_reader``);
* the error counters (``CheckPlan.errors``): read when the config asks for them and the
  builder takes ``errors=``;
* the memory (``fit_memory``): a check whose tables would not fit the memory they live in is
  refused with the pool's own figure (``pagegraph.check.memory_fit``);
* a scenario's kind, for a job that pairs engines' clients with scenarios (``scenario_kind``).
"""

from __future__ import annotations

from collections.abc import Callable

from ..clients.engine_readers import load_reader as resolve_reader
from ..consumers.reader import Reader
from ..graph.builder_names import builder_name, config_problem, resolve_builder
from ..kernels.declarations import declaration_of
from ..kinds import KindSpec, kind_named, kind_of
from ..kinds.builders import builder_capabilities, supported_page_sizes
from .config import CheckConfig, validate_config
from .memory_fit import fit_problem, memory_need
from .planned import PIPELINES, CheckPlan

__all__ = [
    "PIPELINES",
    "READER_NEEDS_CONSUMER",
    "CheckPlan",
    "PlanError",
    "plan_check",
    "preset_problem",
    "resolve_kind",
    "resolve_reader",
    "scenario_kind",
]

#: Why a reader is refused on a scenario without a decode step (``plan_check``).
READER_NEEDS_CONSUMER = (
    "a reader needs a decode-step scenario (one with a [consumer] table): the tables check "
    "has no reader"
)


class PlanError(ValueError):
    """A builder that does not fit a check's config (its kind, its preset outputs, SWA, a
    consumer, the page size, the padding, an injection, a reader, the memory): one line, the
    reason. ``page_sizes``: the page sizes the builder declares (None: any, or no builder
    was resolved), for a job that says a page-size refusal in its engine's words."""

    def __init__(self, message: str, *, page_sizes: tuple[int, ...] | None = None) -> None:
        super().__init__(message)
        self.page_sizes = page_sizes


def resolve_kind(
    builder: Callable[..., object] | str, outputs: str = "auto"
) -> tuple[Callable[..., object], KindSpec]:
    """``builder`` resolved (a callable, a built-in name or ``module:fn``; ``BuilderLoadError``
    otherwise) and the kind of outputs a check of it judges: ``outputs`` when declared (a
    config's ``outputs``), else what the builder says of itself."""
    fn = resolve_builder(builder)
    return fn, kind_of(fn, outputs)


def scenario_kind(builder: str, config: CheckConfig) -> KindSpec | None:
    """The kind of a scenario's own ``builder`` (the scenario's ``outputs`` when declared,
    else what the builder says of itself); None when neither says: the builder does not load
    here (an engine's whose files are missing) and the scenario declares no ``outputs``. A
    job pairs a client only with a scenario of its kind, so with none of an unknown one."""
    if config.outputs != "auto":
        return kind_named(config.outputs)
    try:
        return resolve_kind(builder)[1]
    except ValueError:
        return None


def preset_problem(cfg: CheckConfig, kind: KindSpec) -> str | None:
    """Why ``cfg.preset_outputs`` do not fit a builder of ``kind``; ``None`` when they do."""
    known = kind.presets
    unfit = [name for name in cfg.preset_outputs if name not in known]
    if not unfit:
        return None
    return f"preset_outputs {unfit} are not outputs of a {kind.name} builder" + (
        f" (its presettable outputs: {', '.join(known)})" if known else " (it has none)"
    )


def _presets(
    cfg: CheckConfig, kind: KindSpec, own_builder: bool, engine_presets: tuple[str, ...]
) -> CheckConfig:
    """``cfg`` with the preset outputs of the one rule (the module docstring): the engine's
    joined to the scenario's, then the scenario's own builder must have them all, another
    builder keeps those its kind has."""
    if engine_presets:
        merged = tuple(dict.fromkeys((*cfg.preset_outputs, *engine_presets)))
        cfg = cfg.replace(preset_outputs=merged)
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
    fit_memory: bool = False,
) -> tuple[CheckPlan, Callable[..., object]]:
    """Decide a check of ``builder`` (a callable, a built-in name or ``module:fn``) on
    ``config``; the plan and the resolved builder. ``spec``: the builder as a child process
    resolves it (default: ``builder`` when a string, else its name). ``reader``: the decode
    step's reader (``resolve_reader``; a config with a consumer only), kept in the plan when
    given by name; default: the config's ``reader``. ``own_builder``: ``builder`` is the one
    the config's scenario names, so its preset outputs must all be its kind's (else they are
    dropped); the outputs the builder's engine sets at allocation (its declaration's
    ``engine_presets``) are preset on any scenario. ``fit_memory``: refuse a check that does
    not fit the memory its tables
    would live in (the GPU's free memory, or the host's available memory without CUDA).
    ``PlanError`` when the builder does not fit, another ``ValueError`` when the config or a
    name is bad: the rules are the module docstring's."""
    validate_config(config)
    if reader is None:
        reader = config.reader  # the scenario's own reader ([consumer] reader)
    if reader is not None:
        if not config.consumer:
            raise PlanError(READER_NEEDS_CONSUMER)
        resolve_reader(reader)  # a name that does not load is refused before anything runs
    fn, kind = resolve_kind(builder, config.outputs)
    page_sizes = supported_page_sizes(fn)
    problem = config_problem(fn, kind, config)
    if problem:
        raise PlanError(problem, page_sizes=page_sizes)
    cfg = _presets(config, kind, own_builder, declaration_of(fn).engine_presets)
    need: int | None = None
    if fit_memory:
        need, parts = memory_need(cfg, kind)
        problem = fit_problem(need, parts)
        if problem:
            raise PlanError(problem, page_sizes=page_sizes)
    name = spec or (builder if isinstance(builder, str) else builder_name(fn))
    return CheckPlan(
        name,
        cfg,
        kind.name,
        "step" if cfg.consumer else "tables",
        reader if isinstance(reader, str) else None,
        errors=cfg.errors and builder_capabilities(fn).errors,
        page_sizes=page_sizes,
        memory_need=need,
    ), fn
