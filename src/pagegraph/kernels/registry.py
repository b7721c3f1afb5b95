"""Builders by name: the built-in ones, or a user's own as ``module:function``.

Two kinds of builder plug into the test bed, told apart by their outputs:

* ``"page_table"``: the builder contract of ``pagegraph.contract`` (``build_page_table``'s
  signature): page tables only.
* ``"decode_metadata"``: ``pagegraph.metadata.build_decode_metadata``'s signature: the
  page tables plus ``cache_seqlens``, ``cu_seqlens_k`` and ``cu_seqlens_q``.
* ``"csr"``: ``pagegraph.kernels.kv_indices.build_kv_indices``'s signature: FlashInfer's
  ``kv_indptr`` and ``kv_indices``, no page table.

A user's function declares the second or third kind with an attribute,
``fn.pagegraph_outputs = "decode_metadata"`` (or ``"csr"``), or the check is told so
(``CheckConfig(outputs="decode_metadata")``).
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from .baselines import block_grid
from .decode_metadata import build_decode_metadata
from .kv_indices import build_kv_indices
from .page_table import build_page_table
from .reference import (
    host_max_gather,
    reference_decode_metadata,
    reference_kv_indices,
    reference_page_table,
    static_width_gather,
    unfused_decode_metadata,
)

OUTPUT_KINDS = ("page_table", "decode_metadata", "csr")

BUILDERS: dict[str, Callable] = {
    "build_page_table": build_page_table,
    "static_width_gather": static_width_gather,
    "host_max_gather": host_max_gather,
    "reference_page_table": reference_page_table,
    # The rejected fixed-grid design (pagegraph.baselines): exact, its cost follows the width.
    "block_grid": block_grid,
}

#: Builders with ``build_decode_metadata``'s signature and outputs.
METADATA_BUILDERS: dict[str, Callable] = {
    "build_decode_metadata": build_decode_metadata,
    "reference_decode_metadata": reference_decode_metadata,
    "unfused_decode_metadata": unfused_decode_metadata,
}

#: Builders with ``build_kv_indices``'s signature and CSR outputs.
CSR_BUILDERS: dict[str, Callable] = {
    "build_kv_indices": build_kv_indices,
    "reference_kv_indices": reference_kv_indices,
}


class BuilderLoadError(ValueError):
    """A builder spec that names nothing loadable; the message is one line, with the file and
    line of a syntax error in the builder's module."""


def resolve_builder(spec: str | Callable) -> Callable:
    """A callable with a builder signature, from a callable, a built-in name,
    ``"package.module:function"`` or ``"path/to/file.py:function"``; ``BuilderLoadError``
    (a ``ValueError``) with the reason otherwise. A module is looked for on ``sys.path`` and
    then in the current folder, as ``python -m`` would."""
    if callable(spec):
        return spec
    if spec in BUILDERS:
        return BUILDERS[spec]
    if spec in METADATA_BUILDERS:
        return METADATA_BUILDERS[spec]
    if spec in CSR_BUILDERS:
        return CSR_BUILDERS[spec]
    clients = client_builders()
    if spec in clients:
        return clients[spec]
    if ":" not in spec and (_is_path(spec) or _local_module_file(spec)):
        raise BuilderLoadError(_file_without_function(spec))
    if ":" not in spec:
        known = ", ".join(sorted([*BUILDERS, *METADATA_BUILDERS, *CSR_BUILDERS, *clients]))
        raise BuilderLoadError(
            f"unknown builder {spec!r}: use one of {known}, 'module:function' or "
            "'path/to/file.py:function'"
        )
    target, _, attr = spec.rpartition(":")
    module = _load_module(spec, target)
    fn = getattr(module, attr, None)
    if fn is None:
        raise BuilderLoadError(
            f"cannot load builder {spec!r}: {target} has no attribute {attr!r} "
            f"(its functions: {', '.join(_functions(module)) or 'none'})"
        )
    if not callable(fn):
        raise BuilderLoadError(f"builder {spec!r} is not callable")
    return fn


def _functions(module) -> list[str]:
    """The public functions defined in ``module`` (not imported into it), sorted."""
    return sorted(
        n for n, v in vars(module).items()
        if callable(v) and n[:1] != "_" and getattr(v, "__module__", None) == module.__name__
    )  # fmt: skip


def _local_module_file(spec: str) -> Path | None:
    """The file in the current folder a dotted name without ``:function`` names, if any."""
    path = Path(spec.replace(".", "/") + ".py")
    return path if spec.replace(".", "").isidentifier() and path.is_file() else None


def _file_without_function(spec: str) -> str:
    """The message for a builder given as a file (or a module of the current folder)
    without ``:function``."""
    path = _local_module_file(spec) or Path(spec)
    what = "a file" if _is_path(spec) else "a module"
    if not path.is_file():
        return f"builder {spec!r} names {what} but no function, and there is no such file"
    functions = ", ".join(_functions(_load_module(f"{spec}:FUNCTION", str(path)))) or "none"
    return (
        f"builder {spec!r} names {what} but no function: use {spec}:FUNCTION "
        f"(its functions: {functions})"
    )


def builder_spec_for_child(spec: str) -> str:
    """``spec`` as a child process in another folder can load it: a file path made absolute,
    a module found only in the current folder given as its file."""
    if ":" not in spec or spec in BUILDERS or spec in METADATA_BUILDERS or spec in CSR_BUILDERS:
        return spec
    target, _, attr = spec.rpartition(":")
    if _is_path(target):
        return f"{Path(target).resolve()}:{attr}"
    local = Path.cwd() / (target.replace(".", "/") + ".py")
    if importlib.util.find_spec(target.split(".")[0]) is None and local.is_file():
        return f"{local}:{attr}"
    return spec


#: The module name a builder file is loaded under (``sys.modules``), before a hash of its path.
FILE_MODULE_PREFIX = "pagegraph_user_builder_"


def _is_path(target: str) -> bool:
    return target.endswith(".py") or "/" in target or "\\" in target


def _load_module(spec: str, target: str):
    """The module ``target`` names (a dotted name or a ``.py`` file), with one-line errors."""
    try:
        if _is_path(target):
            path = Path(target)
            if not path.is_file():
                raise BuilderLoadError(f"cannot load builder {spec!r}: no such file {target}")
            name = f"{FILE_MODULE_PREFIX}{abs(hash(str(path.resolve())))}"
            if name in sys.modules:
                return sys.modules[name]
            loader_spec = importlib.util.spec_from_file_location(name, path)
            module = importlib.util.module_from_spec(loader_spec)
            sys.modules[name] = module
            try:
                loader_spec.loader.exec_module(module)
            except SystemExit as exc:  # a module that exits on import: a load error too
                del sys.modules[name]
                raise BuilderLoadError(
                    f"cannot load builder {spec!r}: importing it called exit({exc.code})"
                ) from None
            except BaseException:
                del sys.modules[name]
                raise
            return module
        try:
            return importlib.import_module(target)
        except ModuleNotFoundError as exc:
            if exc.name != target.split(".")[0] or str(Path.cwd()) in sys.path:
                raise
            sys.path.append(str(Path.cwd()))
            return importlib.import_module(target)
    except BuilderLoadError:
        raise
    except SyntaxError as exc:
        raise BuilderLoadError(
            f"cannot load builder {spec!r}: {type(exc).__name__} in {exc.filename}:{exc.lineno}: "
            f"{exc.msg}"
        ) from None
    except ModuleNotFoundError as exc:
        hint = ""
        if exc.name == target.split(".")[0]:
            hint = (
                " (not importable from here: put its folder on PYTHONPATH, or name the file: "
                "--builder path/to/file.py:function)"
            )
        raise BuilderLoadError(f"cannot load builder {spec!r}: {exc}{hint}") from None
    except Exception as exc:
        where = raised_at(exc)
        raise BuilderLoadError(
            f"cannot load builder {spec!r}: importing it raised {type(exc).__name__}: {exc}"
            f"{f' at {where}' if where else ''}"
        ) from None


def raised_at(exc: BaseException, builder=None) -> str:
    """``file:line`` of the innermost traceback frame in the builder's file, else of the
    innermost frame outside pagegraph, torch and triton; ``""`` when there is none."""
    frames = []
    tb = exc.__traceback__
    while tb is not None:
        frames.append((tb.tb_frame.f_code.co_filename, tb.tb_lineno))
        tb = tb.tb_next
    own = getattr(getattr(builder, "__code__", None), "co_filename", None)
    if own is None:
        inner = getattr(builder, "fn", None)  # a probe wrapping the builder
        own = getattr(getattr(inner, "__code__", None), "co_filename", None)
    for filename, line in reversed(frames):
        if own is not None and filename == own:
            return f"{filename}:{line}"
    library = ("/pagegraph/", "/torch/", "/triton/", "<frozen")
    for filename, line in reversed(frames):
        if not any(part in filename for part in library):
            return f"{filename}:{line}"
    return ""


def builder_kind(builder: Callable, declared: str = "auto") -> str:
    """``"page_table"``, ``"decode_metadata"`` or ``"csr"``: what ``declared`` says, else
    what the builder says of itself (a built-in, or its ``pagegraph_outputs`` attribute)."""
    if declared != "auto":
        if declared not in OUTPUT_KINDS:
            raise ValueError(f"outputs must be auto or one of {OUTPUT_KINDS}, got {declared!r}")
        return declared
    if any(fn is builder for fn in METADATA_BUILDERS.values()):
        return "decode_metadata"
    kind = getattr(builder, "pagegraph_outputs", "page_table")
    if kind not in OUTPUT_KINDS:
        raise ValueError(f"{builder!r}.pagegraph_outputs must be one of {OUTPUT_KINDS}")
    return kind


def builder_name(builder: Callable) -> str:
    for name, fn in (*BUILDERS.items(), *METADATA_BUILDERS.items(), *CSR_BUILDERS.items()):
        if fn is builder:
            return name
    module = getattr(builder, "__module__", "?") or "?"
    if module.startswith(FILE_MODULE_PREFIX):  # loaded from a file: name the file
        module = getattr(getattr(builder, "__code__", None), "co_filename", module)
    return f"{module}:{getattr(builder, '__qualname__', builder)}"


def client_builders() -> dict[str, Callable]:
    """Real engines' builders behind pagegraph's contracts (``pagegraph.clients``), by name;
    empty where the engine is not installed."""
    try:
        from ..clients.sglang import SGLANG_BUILDERS
    except ImportError:
        return {}
    return dict(SGLANG_BUILDERS)


@dataclass(frozen=True)
class BuilderCapabilities:
    """What a builder takes beyond the contract's required arguments.

    ``errors``: it takes ``errors=`` (the device-side error counters, pagegraph's own
    extension: most real builders have none, and without it the check skips the counters).
    ``swa``: it takes ``swa_page_table=`` and ``full_to_swa=`` (without them, scenarios with
    SWA cannot run it). Read from the signature (a ``**kwargs`` accepts everything) unless the
    function declares them: ``fn.pagegraph_capabilities = {"errors": False}``.
    """

    errors: bool = True
    swa: bool = True


def builder_capabilities(builder: Callable) -> BuilderCapabilities:
    try:
        params = inspect.signature(builder).parameters
    except (TypeError, ValueError):  # a builtin or an extension with no signature
        found = BuilderCapabilities()
    else:
        var_kw = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
        found = BuilderCapabilities(
            errors=var_kw or "errors" in params,
            swa=var_kw or ("swa_page_table" in params and "full_to_swa" in params),
        )
    declared = getattr(builder, "pagegraph_capabilities", None) or {}
    unknown = set(declared) - {"errors", "swa"}
    if unknown:
        raise BuilderLoadError(
            f"{builder_name(builder)}.pagegraph_capabilities has unknown keys {sorted(unknown)} "
            "(known: errors, swa)"
        )
    return replace(found, **{k: bool(v) for k, v in declared.items()})


PAGE_TABLE_SIGNATURE = (
    "build(req_to_token, req_pool_indices, seq_lens, page_table, page_size, *, "
    "swa_page_table=None, full_to_swa=None, errors=None)"
)
DECODE_METADATA_SIGNATURE = (
    "build(req_to_token, req_pool_indices, seq_lens, page_size, *, cache_seqlens, "
    "cu_seqlens_k, page_table, draft_tokens=0, cu_seqlens_q=None, swa_page_table=None, "
    "full_to_swa=None, errors=None)"
)
CSR_SIGNATURE = (
    "build(req_to_token, req_pool_indices, seq_lens, page_size, *, kv_indptr, kv_indices)"
)


def signature_problem(
    builder: Callable,
    kind: str,
    *,
    swa: bool = False,
    consumer: bool = False,
    page_size: int | None = None,
) -> str | None:
    """Why ``builder`` cannot be called as the bed calls a builder of ``kind`` (one of
    ``OUTPUT_KINDS``), with SWA outputs when ``swa``, on a decode-step scenario (whose
    attention reads the builder's page table) when ``consumer``, at ``page_size`` when given
    (a builder that takes only some declares them: ``fn.pagegraph_page_sizes = (1,)``);
    ``None`` when it can. Only the
    arguments the bed always passes are required: ``errors=`` is passed only to a builder
    that takes it."""
    sizes = getattr(builder, "pagegraph_page_sizes", None)
    if page_size is not None and sizes is not None and page_size not in sizes:
        return (
            f"{builder_name(builder)} takes page_size {' or '.join(map(str, sizes))} only, and "
            f"this scenario has page_size {page_size}"
        )
    try:
        sig = inspect.signature(builder)
    except (TypeError, ValueError):
        return None
    caps = builder_capabilities(builder)
    swa_kw = {"swa_page_table": None, "full_to_swa": None} if swa else {}
    if kind == "decode_metadata":
        args = (None,) * 4
        kwargs = {"cache_seqlens": None, "cu_seqlens_k": None, "page_table": None,
                  "draft_tokens": 0, "cu_seqlens_q": None, **swa_kw}  # fmt: skip
        contract = DECODE_METADATA_SIGNATURE
    elif kind == "csr":
        if consumer:
            return (
                f"{builder_name(builder)} is a csr builder: a decode-step scenario ([consumer]) "
                "feeds the builder's page table to the attention (its CSR consumer builds "
                "kv_indptr/kv_indices from that table), so it takes a page_table or "
                "decode_metadata builder"
            )
        if swa:
            return (
                f"{builder_name(builder)} is a csr builder: the CSR format has no SWA table, and "
                "this scenario has SWA (swa = true)"
            )
        args, kwargs, contract = (None,) * 4, {"kv_indptr": None, "kv_indices": None}, CSR_SIGNATURE
    else:
        args, kwargs, contract = (None,) * 5, swa_kw, PAGE_TABLE_SIGNATURE
    try:
        sig.bind(*args, **{k: v for k, v in kwargs.items() if k not in swa_kw})
    except TypeError as exc:
        return (
            f"{builder_name(builder)}{sig} cannot be called as a {kind} builder ({exc}); "
            f"the contract: {contract}"
        )
    if swa and not caps.swa:
        return (
            f"{builder_name(builder)} takes no swa_page_table/full_to_swa, and this scenario "
            f"has SWA (swa = true); the contract: {contract}"
        )
    return None
