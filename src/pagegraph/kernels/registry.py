"""Loading a user's builder: ``module:function`` or ``path/to/file.py:function``, with
one-line errors (``BuilderLoadError``) and the file:line where a builder raised
(``raised_at``). Built-in builders by name, their kinds and what they take are layers above,
in ``pagegraph.graph.builder_names`` (``resolve_builder``). A decode step's reader loads by
the same rules, in its own words (``LoadWords``; ``pagegraph.clients.engine_readers.load_reader``).
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import cast

from .file_modules import load_file_module


class BuilderLoadError(ValueError):
    """A builder spec that names nothing loadable; the message is one line, with the file and
    line of a syntax error in the builder's module."""


@dataclass(frozen=True)
class LoadWords:
    """How ``load_object``'s errors name what is loaded: ``noun`` ("builder"), what the part
    after the colon names (``attribute``: "function"), the command-line option that takes it
    (``option``), the error raised (``error``, a ``ValueError``), and the module's attributes
    listed when one is missing (``members``: public functions defined there, by default)."""

    noun: str
    attribute: str
    option: str
    error: type[ValueError]
    members: Callable[[ModuleType], list[str]] | None = None

    def listed(self, module: ModuleType) -> str:
        found = (self.members or _functions)(module)
        return ", ".join(found) or "none"


#: A builder's words (``load_builder``).
BUILDER_WORDS = LoadWords("builder", "function", "--builder", BuilderLoadError)


def load_builder(spec: str, known: list[str] | tuple[str, ...] = ()) -> Callable[..., object]:
    """The function ``"package.module:function"`` or ``"path/to/file.py:function"`` names;
    ``BuilderLoadError`` with the reason otherwise (``known``: the built-in names, listed
    when ``spec`` is neither). A module is looked for on ``sys.path`` and then in the current
    folder, as ``python -m`` would."""
    fn = load_object(spec, known)
    if not callable(fn):
        raise BuilderLoadError(f"builder {spec!r} is not callable")
    return cast("Callable[..., object]", fn)


def load_object(
    spec: str, known: list[str] | tuple[str, ...] = (), words: LoadWords = BUILDER_WORDS
) -> object:
    """The attribute ``"package.module:name"`` or ``"path/to/file.py:name"`` names, whatever
    it is (``load_builder``'s rules and errors, without asking for a callable; ``words``:
    what the errors call it, and the error raised)."""
    if ":" not in spec and (_is_path(spec) or _local_module_file(spec)):
        raise words.error(_file_without_function(spec, words))
    if ":" not in spec:
        raise words.error(
            f"unknown {words.noun} {spec!r}: use one of {', '.join(known)}, "
            f"'module:{words.attribute}' or 'path/to/file.py:{words.attribute}'"
        )
    target, _, attr = spec.rpartition(":")
    module = _load_module(spec, target, words)
    fn: object = getattr(module, attr, None)
    if fn is None:
        raise words.error(
            f"cannot load {words.noun} {spec!r}: {target} has no attribute {attr!r} "
            f"(its {words.attribute}s: {words.listed(module)})"
        )
    return fn


def _functions(module: ModuleType) -> list[str]:
    """The public functions defined in ``module`` (not imported into it), sorted."""
    return sorted(
        n
        for n, v in vars(module).items()
        if callable(v) and n[:1] != "_" and getattr(v, "__module__", None) == module.__name__
    )


def _local_module_file(spec: str) -> Path | None:
    """The file in the current folder a dotted name without ``:function`` names, if any."""
    path = Path(spec.replace(".", "/") + ".py")
    return path if spec.replace(".", "").isidentifier() and path.is_file() else None


def _file_without_function(spec: str, words: LoadWords = BUILDER_WORDS) -> str:
    """The message for a builder (``words.noun``) given as a file (or a module of the current
    folder) without ``:function``."""
    path = _local_module_file(spec) or Path(spec)
    what = "a file" if _is_path(spec) else "a module"
    noun, attribute = words.noun, words.attribute
    if not path.is_file():
        return f"{noun} {spec!r} names {what} but no {attribute}, and there is no such file"
    placeholder = attribute.upper()
    members = words.listed(_load_module(f"{spec}:{placeholder}", str(path), words))
    return (
        f"{noun} {spec!r} names {what} but no {attribute}: use {spec}:{placeholder} "
        f"(its {attribute}s: {members})"
    )


def builder_spec_for_child(spec: str) -> str:
    """``spec`` as a child process in another folder can load it: a file path made absolute,
    a module found only in the current folder given as its file (a built-in name, with no
    ``:``, is kept)."""
    if ":" not in spec:
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


def _load_module(spec: str, target: str, words: LoadWords = BUILDER_WORDS) -> ModuleType:
    """The module ``target`` names (a dotted name or a ``.py`` file), with one-line errors
    (``words.error``: "cannot load builder ...")."""
    cannot = f"cannot load {words.noun} {spec!r}"
    try:
        if _is_path(target):
            path = Path(target)
            if not path.is_file():
                raise words.error(f"{cannot}: no such file {target}")
            name = f"{FILE_MODULE_PREFIX}{abs(hash(str(path.resolve())))}"
            try:
                return load_file_module(name, path)
            except SystemExit as exc:  # a module that exits on import: a load error too
                raise words.error(f"{cannot}: importing it called exit({exc.code})") from None
        try:
            return importlib.import_module(target)
        except ModuleNotFoundError as exc:
            if exc.name != target.split(".")[0] or str(Path.cwd()) in sys.path:
                raise
            sys.path.append(str(Path.cwd()))
            return importlib.import_module(target)
    except words.error:
        raise
    except SyntaxError as exc:
        raise words.error(
            f"{cannot}: {type(exc).__name__} in {exc.filename}:{exc.lineno}: {exc.msg}"
        ) from None
    except ModuleNotFoundError as exc:
        hint = ""
        if exc.name == target.split(".")[0]:
            hint = (
                " (not importable from here: put its folder on PYTHONPATH, or name the file: "
                f"{words.option} path/to/file.py:{words.attribute})"
            )
        raise words.error(f"{cannot}: {exc}{hint}") from None
    except Exception as exc:
        where = raised_at(exc)
        raise words.error(
            f"{cannot}: importing it raised {type(exc).__name__}: {exc}"
            f"{f' at {where}' if where else ''}"
        ) from None


def raised_at(exc: BaseException, builder: object = None) -> str:
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
