"""What a builder or a runner factory declares about itself, as typed records: a builder's
page sizes and capabilities (``BuilderDeclaration``, set by ``declare_builder``, read by
``declaration_of``), and the output vectors a runner factory allocates itself
(``FactoryDeclaration``, ``declare_runner_factory``, ``factory_declaration_of``).

Each record lives in one attribute of the function (``DECLARATION_ATTRIBUTE``), so a builder
wrapped or re-exported keeps what it declares; its kind is the one other attribute
(``pagegraph.kernels.contract.declare_outputs``, ``fn.pagegraph_outputs``). A function carrying
a loose attribute of these names (``pagegraph_page_sizes``, ``pagegraph_capabilities``,
``pagegraph_engine_buffers``) is refused with the declaration to use: ignoring it would check
another contract than the one it means.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "CAPABILITY_NAMES",
    "DECLARATION_ATTRIBUTE",
    "BuilderDeclaration",
    "FactoryDeclaration",
    "declaration_of",
    "declare_builder",
    "declare_runner_factory",
    "factory_declaration_of",
]

#: The attribute holding a function's declaration (one record, typed).
DECLARATION_ATTRIBUTE = "pagegraph_declaration"

#: The optional arguments a builder may take beyond its kind's required ones.
CAPABILITY_NAMES = ("errors", "swa", "batch")

#: loose attribute -> the declaration that replaces it
_RETIRED = {
    "pagegraph_page_sizes": "declare_builder(fn, page_sizes=(...))",
    "pagegraph_capabilities": "declare_builder(fn, errors=..., swa=..., batch=...)",
    "pagegraph_engine_buffers": "declare_runner_factory(factory, engine_buffers=(...))",
}


@dataclass(frozen=True)
class BuilderDeclaration:
    """What a builder says of itself beyond its signature.

    ``page_sizes``: the only page sizes it takes (``None``: any). ``errors``, ``swa``,
    ``batch``: whether it takes ``errors=``, the SWA outputs (``swa_page_table=`` and
    ``full_to_swa=``) and ``batch=``; ``None`` leaves it to the signature
    (``pagegraph.kinds.builders.builder_capabilities``). ``engine_presets``: outputs its engine
    sets once, at allocation, and the builder never writes (its kind's presettable outputs,
    e.g. ``"kv_indptr[0]"``): a check presets them as the engine would
    (``pagegraph.check.plan.plan_check``).
    """

    page_sizes: tuple[int, ...] | None = None
    errors: bool | None = None
    swa: bool | None = None
    batch: bool | None = None
    engine_presets: tuple[str, ...] = ()

    def capabilities(self) -> dict[str, bool]:
        """The capabilities it declares, by name (those left to the signature omitted)."""
        found = {"errors": self.errors, "swa": self.swa, "batch": self.batch}
        return {name: value for name, value in found.items() if value is not None}


@dataclass(frozen=True)
class FactoryDeclaration:
    """What a runner factory (``check_replay_safety(runner_factory=...)``) says of itself:
    ``engine_buffers``, the names of the output vectors it allocates itself, as an engine
    does (the checker then hands it none of its own under those names)."""

    engine_buffers: tuple[str, ...] = ()


def _refuse_retired(fn: object) -> None:
    for attribute, instead in _RETIRED.items():
        if attribute in getattr(fn, "__dict__", {}):
            name = getattr(fn, "__qualname__", None) or repr(fn)
            raise ValueError(
                f"{name} sets {attribute}, which pagegraph does not read: declare it with "
                f"pagegraph.kernels.declarations.{instead}"
            )


def declare_builder(
    fn: object,
    *,
    page_sizes: tuple[int, ...] | None = None,
    errors: bool | None = None,
    swa: bool | None = None,
    batch: bool | None = None,
    engine_presets: tuple[str, ...] = (),
) -> None:
    """Record on ``fn`` the page sizes it takes (``None``: any), the capabilities its
    signature does not say (``None``: read from the signature) and the outputs its engine
    presets (``BuilderDeclaration.engine_presets``); a page size that is not a positive int,
    or a preset that is not a string, is a ``ValueError``."""
    if isinstance(engine_presets, str) or not all(isinstance(n, str) for n in engine_presets):
        raise ValueError(f"engine_presets must be a sequence of names, got {engine_presets!r}")
    if page_sizes is not None:
        page_sizes = tuple(page_sizes)
        if not page_sizes or not all(
            isinstance(p, int) and not isinstance(p, bool) and p > 0 for p in page_sizes
        ):
            raise ValueError(f"page_sizes must be positive ints, got {page_sizes!r}")
    declared = BuilderDeclaration(page_sizes, errors, swa, batch, tuple(engine_presets))
    setattr(fn, DECLARATION_ATTRIBUTE, declared)


def declaration_of(fn: object) -> BuilderDeclaration:
    """What ``fn`` declares (``declare_builder``); an empty declaration when nothing."""
    _refuse_retired(fn)
    found = getattr(fn, DECLARATION_ATTRIBUTE, None)
    return found if isinstance(found, BuilderDeclaration) else BuilderDeclaration()


def declare_runner_factory(factory: object, *, engine_buffers: tuple[str, ...] = ()) -> None:
    """Record on ``factory`` the output vectors it allocates itself (names of its kind's
    vectors, e.g. ``("kv_indptr",)`` for a CSR builder's engine); a bare string or a name
    that is not a string is a ``ValueError``."""
    if isinstance(engine_buffers, str) or not all(isinstance(n, str) for n in engine_buffers):
        raise ValueError(
            f"engine_buffers must be a sequence of vector names, got {engine_buffers!r}"
        )
    setattr(factory, DECLARATION_ATTRIBUTE, FactoryDeclaration(tuple(engine_buffers)))


def factory_declaration_of(factory: object) -> FactoryDeclaration:
    """What ``factory`` declares (``declare_runner_factory``); an empty declaration when
    nothing."""
    _refuse_retired(factory)
    found = getattr(factory, DECLARATION_ATTRIBUTE, None)
    return found if isinstance(found, FactoryDeclaration) else FactoryDeclaration()
