"""Builders by name and what they take: the built-in ones of every kind, real engines'
(``pagegraph.clients``), or a user's own as ``module:function`` / ``path/file.py:function``.

``resolve_builder`` finds one; ``builder_capabilities`` reads the optional arguments it takes
(``errors=``, SWA outputs, ``batch=``); ``signature_problem`` says, before anything runs, why
the bed cannot call it as a builder of its kind on a scenario.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, replace

from ..kernels.registry import FILE_MODULE_PREFIX, BuilderLoadError, load_builder
from . import KINDS, KindSpec
from .seams import Builder, ScenarioConfig


def builtin_builders() -> dict[str, Builder]:
    """Every built-in builder by name: each kind's own, then the real engines' adapters
    (empty for an engine whose files are missing)."""
    found: dict[str, Builder] = {}
    for spec in KINDS.values():
        found.update(spec.builders)
    found.update(client_builders())
    return found


def client_builders() -> dict[str, Builder]:
    """Real engines' builders behind pagegraph's contracts (``pagegraph.clients``), by name."""
    from ..clients import CLIENT_BUILDERS

    return CLIENT_BUILDERS()


def resolve_builder(spec: str | Builder) -> Builder:
    """A callable with a builder signature, from a callable, a built-in name,
    ``"package.module:function"`` or ``"path/to/file.py:function"``; ``BuilderLoadError``
    (a ``ValueError``) with the reason otherwise."""
    if callable(spec):
        return spec
    for spec_kind in KINDS.values():
        if spec in spec_kind.builders:
            return spec_kind.builders[spec]
    clients = client_builders()
    if spec in clients:
        return clients[spec]
    return load_builder(spec, known=sorted(builtin_builders()))


def is_builtin(name: str) -> bool:
    return any(name in spec.builders for spec in KINDS.values())


def builder_name(builder: Builder) -> str:
    """A builder's name: its built-in name (pagegraph's first, the clients' only when it is
    none of those, so naming pagegraph's builders imports no client), else where it lives."""
    for spec in KINDS.values():
        for name, fn in spec.builders.items():
            if fn is builder:
                return name
    for name, fn in client_builders().items():
        if fn is builder:
            return name
    module = getattr(builder, "__module__", "?") or "?"
    if module.startswith(FILE_MODULE_PREFIX):  # loaded from a file: name the file
        module = getattr(getattr(builder, "__code__", None), "co_filename", module)
    return f"{module}:{getattr(builder, '__qualname__', builder)}"


@dataclass(frozen=True)
class BuilderCapabilities:
    """What a builder takes beyond its kind's required arguments.

    ``errors``: ``errors=`` (the device-side error counters, pagegraph's own extension: most
    real builders have none, and without it the check skips the counters). ``swa``:
    ``swa_page_table=`` and ``full_to_swa=``. ``batch``: ``batch=``, a
    ``pagegraph.kinds.BatchContext`` (the real batch size where it runs eagerly, the bucket,
    ``max_bs``). Read from the signature (a ``**kwargs`` accepts everything) unless the
    function declares them: ``fn.pagegraph_capabilities = {"errors": False}``.
    """

    errors: bool = True
    swa: bool = True
    batch: bool = False


CAPABILITY_NAMES = ("errors", "swa", "batch")


def builder_capabilities(builder: Builder) -> BuilderCapabilities:
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
    declared = getattr(builder, "pagegraph_capabilities", None) or {}
    unknown = set(declared) - set(CAPABILITY_NAMES)
    if unknown:
        raise BuilderLoadError(
            f"{builder_name(builder)}.pagegraph_capabilities has unknown keys {sorted(unknown)} "
            f"(known: {', '.join(CAPABILITY_NAMES)})"
        )
    return replace(found, **{k: bool(v) for k, v in declared.items()})


def supported_page_sizes(builder: Builder) -> tuple[int, ...] | None:
    """The page sizes ``builder`` takes (``fn.pagegraph_page_sizes = (1,)``), None: any."""
    sizes = getattr(builder, "pagegraph_page_sizes", None)
    return None if sizes is None else tuple(sizes)


def config_problem(builder: Builder, kind: KindSpec, cfg: ScenarioConfig) -> str | None:
    """``signature_problem`` on a scenario's config ``cfg`` (a ``CheckConfig``): its SWA
    outputs, its decode-step consumer, its page size and its padding; and an injection into
    engine state (``num_blocks_overrun``) for a kind that reads none."""
    problem = signature_problem(
        builder,
        kind,
        swa=cfg.swa,
        consumer=bool(cfg.consumer),
        page_size=cfg.page_size,
        padding=cfg.padding,
    )
    if problem is None and cfg.num_blocks_overrun and kind.engine_state is None:
        problem = (
            f"{builder_name(builder)} is a {kind.name} builder: num_blocks_overrun breaks the "
            "per-request num_blocks of vLLM's block tables, which only a block_table builder reads"
        )
    if problem is None and cfg.kv_groups:
        from .kv_group_layout import builder_group_problem

        found = builder_group_problem(builder, kind.name, cfg)
        problem = found and f"{builder_name(builder)} {found}"
    return problem


def signature_problem(
    builder: Builder,
    kind: KindSpec,
    *,
    swa: bool = False,
    consumer: bool = False,
    page_size: int | None = None,
    padding: str | None = None,
) -> str | None:
    """Why ``builder`` cannot be called as the bed calls a builder of ``kind``, with SWA
    outputs when ``swa``, on a decode-step scenario when ``consumer``, at ``page_size`` when
    given (a builder that takes only some declares them: ``fn.pagegraph_page_sizes = (1,)``),
    with the scenario's ``padding`` policy when given; ``None`` when it can. Only the
    arguments the bed always passes are required."""
    name = builder_name(builder)
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
