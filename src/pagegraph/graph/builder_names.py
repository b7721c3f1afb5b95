"""Builders by name: the built-in ones of every kind (``pagegraph.kinds``), real engines'
(``pagegraph.clients``), or a user's own as ``module:function`` / ``path/file.py:function``;
and, before anything runs, why the bed cannot call one as a builder of its kind on a scenario.

This sits above both the kinds and the clients (the kinds import neither this nor the
clients): ``resolve_builder`` finds a builder, ``builder_name`` names one,
``signature_problem`` and ``config_problem`` say why it does not fit.
"""

from __future__ import annotations

from ..kernels.registry import FILE_MODULE_PREFIX, load_builder
from ..kinds import KINDS, KindSpec
from ..kinds.builders import contract_problem, kind_builders, scenario_problem
from ..kinds.seams import Builder, ScenarioConfig

__all__ = [
    "builder_name",
    "builtin_builders",
    "client_builders",
    "config_problem",
    "resolve_builder",
    "signature_problem",
]


def builtin_builders() -> dict[str, Builder]:
    """Every built-in builder by name: each kind's own, then the real engines' adapters
    (empty for an engine whose files are missing)."""
    return {**kind_builders(), **client_builders()}


def client_builders() -> dict[str, Builder]:
    """Real engines' builders behind pagegraph's contracts (``pagegraph.clients``), by name
    (imported on first use: naming pagegraph's own builders imports no client)."""
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


def config_problem(builder: Builder, kind: KindSpec, cfg: ScenarioConfig) -> str | None:
    """Why ``builder`` cannot run as a builder of ``kind`` on a scenario's config ``cfg`` (a
    ``CheckConfig``), named by ``builder_name`` (``pagegraph.kinds.builders.scenario_problem``);
    ``None`` when it can."""
    return scenario_problem(builder, kind, cfg, builder_name(builder))


def signature_problem(
    builder: Builder,
    kind: KindSpec,
    *,
    swa: bool = False,
    consumer: bool = False,
    page_size: int | None = None,
    padding: str | None = None,
) -> str | None:
    """Why ``builder`` cannot be called as the bed calls a builder of ``kind``, named by
    ``builder_name`` (``pagegraph.kinds.builders.contract_problem``); ``None`` when it can."""
    return contract_problem(
        builder,
        kind,
        builder_name(builder),
        swa=swa,
        consumer=consumer,
        page_size=page_size,
        padding=padding,
    )
