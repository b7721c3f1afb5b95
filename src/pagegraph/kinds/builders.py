"""What a builder takes, and the kinds' own builders by name.

``builder_capabilities`` reads the optional arguments a builder takes (``errors=``, SWA
outputs, ``batch=``) from its signature and its declaration
(``pagegraph.kernels.declarations.declare_builder``); ``supported_page_sizes`` the page sizes
it declares. ``kind_builders`` is every kind's built-in builders by name;
``contract_problem`` and ``scenario_problem`` say, before anything runs, why the bed cannot
call a builder as one of its kind on a scenario. Finding a builder by any name (the real
engines' too) and naming one in those reasons are a layer up
(``pagegraph.graph.builder_names``): the kinds import no layer above them.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, replace

from ..kernels.declarations import CAPABILITY_NAMES, declaration_of
from . import KINDS, KindSpec
from .seams import Builder, ScenarioConfig

__all__ = [
    "CAPABILITY_NAMES",
    "BuilderCapabilities",
    "builder_capabilities",
    "contract_problem",
    "is_builtin",
    "kind_builders",
    "scenario_problem",
    "supported_page_sizes",
]


def kind_builders() -> dict[str, Builder]:
    """Every kind's built-in builders (pagegraph's, the oracles, baselines) by name."""
    found: dict[str, Builder] = {}
    for spec in KINDS.values():
        found.update(spec.builders)
    return found


def is_builtin(name: str) -> bool:
    """Whether ``name`` is a built-in builder of a kind."""
    return any(name in spec.builders for spec in KINDS.values())


@dataclass(frozen=True)
class BuilderCapabilities:
    """What a builder takes beyond its kind's required arguments.

    ``errors``: ``errors=`` (the device-side error counters, pagegraph's own extension: most
    real builders have none, and without it the check skips the counters). ``swa``:
    ``swa_page_table=`` and ``full_to_swa=``. ``batch``: ``batch=``, a
    ``pagegraph.kinds.BatchContext`` (the real batch size where it runs eagerly, the bucket,
    ``max_bs``). Read from the signature (a ``**kwargs`` accepts everything) unless the
    function declares them: ``declare_builder(fn, errors=False)``.
    """

    errors: bool = True
    swa: bool = True
    batch: bool = False


def builder_capabilities(builder: Builder) -> BuilderCapabilities:
    """What ``builder`` takes: its signature's word, overridden by its declaration."""
    try:
        params = inspect.signature(builder).parameters
    except (TypeError, ValueError):  # a builtin or an extension with no signature
        found = BuilderCapabilities()
    else:
        var_kw = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
        found = BuilderCapabilities(
            errors=var_kw or "errors" in params,
            swa=var_kw or ("swa_page_table" in params and "full_to_swa" in params),
            batch="batch" in params,
        )
    return replace(found, **declaration_of(builder).capabilities())


def supported_page_sizes(builder: Builder) -> tuple[int, ...] | None:
    """The only page sizes ``builder`` takes, as it declares them
    (``declare_builder(fn, page_sizes=(1,))``); ``None``: any."""
    return declaration_of(builder).page_sizes


def scenario_problem(
    builder: Builder, kind: KindSpec, cfg: ScenarioConfig, name: str
) -> str | None:
    """``contract_problem`` on a scenario's config ``cfg`` (a ``CheckConfig``): its SWA
    outputs, its decode-step consumer, its page size and its padding; and an injection into
    engine state (``num_blocks_overrun``) for a kind that reads none."""
    problem = contract_problem(
        builder,
        kind,
        name,
        swa=cfg.swa,
        consumer=bool(cfg.consumer),
        page_size=cfg.page_size,
        padding=cfg.padding,
    )
    if problem is None and cfg.num_blocks_overrun and kind.engine_state is None:
        problem = (
            f"{name} is a {kind.name} builder: num_blocks_overrun breaks the "
            "per-request num_blocks of vLLM's block tables, which only a block_table builder reads"
        )
    if problem is None and cfg.kv_groups:
        from .kv_group_layout import builder_group_problem

        found = builder_group_problem(builder, kind.name, cfg)
        problem = found and f"{name} {found}"
    return problem


def contract_problem(
    builder: Builder,
    kind: KindSpec,
    name: str,
    *,
    swa: bool = False,
    consumer: bool = False,
    page_size: int | None = None,
    padding: str | None = None,
) -> str | None:
    """Why ``builder`` (``name`` in the reason) cannot be called as the bed calls a builder
    of ``kind``, with SWA outputs when ``swa``, on a decode-step scenario when ``consumer``,
    at ``page_size`` when given (a builder that takes only some declares them:
    ``declare_builder(fn, page_sizes=(1,))``), with the scenario's ``padding`` policy when
    given; ``None`` when it can. Only the arguments the bed always passes are required."""
    sizes = supported_page_sizes(builder)
    if page_size is not None and sizes is not None and page_size not in sizes:
        return (
            f"{name} takes page_size {' or '.join(map(str, sizes))} only, and this scenario "
            f"has page_size {page_size}"
        )
    usage = kind.usage_problem(swa=swa, consumer=consumer, padding=padding)
    if usage:
        return f"{name} {usage}"
    try:
        sig = inspect.signature(builder)
    except (TypeError, ValueError):
        return None
    bound = kind.bind_problem(builder, sig, swa)
    if bound:
        return f"{name}{sig} {bound}"
    if swa and not builder_capabilities(builder).swa:
        return (
            f"{name} takes no swa_page_table/full_to_swa, and this scenario has SWA "
            f"(swa = true); the contract: {kind.signature}"
        )
    return None
