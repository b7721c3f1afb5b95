"""Scenario files (``graphs/*.toml``): one graph setup and its workload, validated on load
(``load_scenario``); an unknown key, a wrong type or an impossible value is a
``ScenarioError`` naming the file, the key and the problem. docs/SCENARIOS.md lists every key.

The shipped scenarios live in the repository's ``graphs/`` folder, which the package links
as ``pagegraph/scenarios`` (and installs as package data), so ``pagegraph check sglang-h200``
finds ``graphs/sglang-h200.toml`` from any folder (``scenario_path``, ``shipped_scenarios``).
A path that exists is used as it is.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .config import CheckConfig, ConfigError, validate_config

#: The folder of the shipped scenarios inside the installed (or in-place) package.
SHIPPED_DIR = Path(__file__).resolve().parent.parent / "scenarios"
#: What ``pagegraph check`` runs when no scenario is named.
DEFAULT_SCENARIO = "default"


class ScenarioError(ValueError):
    """A scenario file that cannot be run: names the file, the key and the problem."""

    def __init__(self, path: str | Path, key: str | None, problem: str):
        self.path, self.key, self.problem = str(path), key, problem
        where = f"{self.path}: {key}" if key else self.path
        super().__init__(f"{where}: {problem}")


class ScenarioNotFound(ValueError):
    """Neither a file nor the name of a shipped scenario."""


def shipped_scenarios() -> list[str]:
    """The names of the shipped scenarios (``default``, ``sglang-h200``, ...), sorted."""
    if not SHIPPED_DIR.is_dir():
        return []
    return sorted(p.stem for p in SHIPPED_DIR.glob("*.toml"))


def scenario_path(spec: str | Path) -> Path:
    """The scenario file ``spec`` names: an existing path, else a shipped scenario's name
    (with or without ``.toml``); ``ScenarioNotFound`` naming the shipped ones otherwise."""
    path = Path(spec)
    if path.is_file():
        return path
    name = path.name[: -len(".toml")] if path.name.endswith(".toml") else path.name
    shipped = SHIPPED_DIR / f"{name}.toml"
    # A bare name, or the in-repository path graphs/NAME.toml from another folder.
    if shipped.is_file() and (len(path.parts) == 1 or path.parts[:-1] == ("graphs",)):
        return shipped
    known = ", ".join(shipped_scenarios()) or "none installed"
    raise ScenarioNotFound(
        f"{spec}: no such scenario file, nor a shipped scenario name (shipped: {known})"
    )


@dataclass
class Scenario:
    name: str
    path: str
    description: str
    builder: str
    config: CheckConfig = field(default_factory=CheckConfig)


_INT = (int,)
_NUM = (int, float)

# table -> key -> (accepted types, CheckConfig field or None)
_SCHEMA: dict[str, dict[str, tuple[tuple[type, ...], str | None]]] = {
    "": {"name": ((str,), None), "description": ((str,), None)},
    "graph": {
        "buckets": ((str, list), "buckets"),
        "max_bs": (_INT, "max_bs"),
        "max_context_len": (_INT, "max_context_len"),
        "page_size": (_INT, "page_size"),
        "padding": ((str,), "padding"),
        "swa": ((bool,), "swa"),
        "index_dtype": ((str,), "index_dtype"),
        "errors": ((bool,), "errors"),
    },
    "layout": {
        "table_width": (_INT, "table_width"),
        "table_pad_cols": (_INT, "table_pad_cols"),
        "swa_table_pad_cols": (_INT, "swa_table_pad_cols"),
        "req_to_token_extra_cols": (_INT, "r2t_extra_cols"),
        "req_to_token_offset": (_INT, "r2t_offset"),
        "req_to_token_dtype": ((str,), "r2t_dtype"),
        "full_to_swa_dtype": ((str,), "full_to_swa_dtype"),
        "index_dtype": ((str,), "index_dtype"),
        "kv_groups": ((list,), "kv_groups"),
    },
    "pool": {
        "max_reqs": (_INT, "max_reqs"),
        "num_pages": (_INT, "num_pages"),
        "row_order": ((str,), "row_order"),
    },
    "workload": {
        "steps": (_INT, "steps"),
        "seed": (_INT, "seed"),
        "finish_rate": (_NUM, "finish_rate"),
        "draft_tokens": (_INT, "draft_tokens"),
        "initial_len": ((list,), "initial_len"),
        "near_capacity": (_NUM, "near_capacity"),
        "swa_window": (_INT, "swa_window"),
        "swa_churn": (_NUM, "swa_churn"),
        "overlong": (_NUM, "overlong"),
        "negative": (_NUM, "negative"),
        "zero_len": (_NUM, "zero_len"),
        "bad_index": (_NUM, "bad_index"),
        "num_blocks_overrun": (_NUM, "num_blocks_overrun"),
        "streams": (_INT, "workload_streams"),
        "injections": ((str,), "injection_level"),
    },
    "check": {
        "builder": ((str,), None),
        "detectors": ((str, list), "detectors"),
        "staging": ((str,), "staging"),
        "chunk": (_INT, "chunk"),
        "outputs": ((str,), "outputs"),
        "workload_process": ((str,), "workload_process"),
        "emulate": ((bool,), "emulate"),
        "strict": ((list,), "strict"),
        "preset_outputs": ((list,), "preset_outputs"),
    },
    "consumer": {
        "format": ((str,), "consumer"),
        "dtype": ((str,), "consumer_dtype"),
        "num_q_heads": (_INT, "num_q_heads"),
        "num_kv_heads": (_INT, "num_kv_heads"),
        "head_dim": (_INT, "head_dim"),
        "timing_iters": (_INT, "timing_iters"),
        "null_block": ((str,), "null_block"),
        "pad_slot": ((str,), "pad_slot"),
        "reader": ((str,), "reader"),
        "bitwise": ((bool,), "bitwise"),
    },
}
_REQUIRED = {"graph": ("max_bs", "max_context_len", "page_size")}


def _type_name(types: tuple[type, ...]) -> str:
    names = {int: "an integer", float: "a number", str: "a string", bool: "true/false"}
    names[list] = "a list"
    return " or ".join(names[t] for t in types)


def load_scenario(path: str | Path) -> Scenario:
    """Read and validate one scenario file; ``ScenarioError`` on any problem."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ScenarioError(path, None, "no such file") from None
    except tomllib.TOMLDecodeError as exc:
        raise ScenarioError(path, None, f"not valid TOML: {exc}") from None

    values: dict[str, object] = {}
    top: dict[str, object] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            if key not in _SCHEMA or key == "":
                known = ", ".join(f"[{t}]" for t in _SCHEMA if t)
                raise ScenarioError(path, f"[{key}]", f"unknown table (known: {known})")
            for sub, subvalue in value.items():
                _take(path, key, sub, subvalue, values)
        else:
            if key not in _SCHEMA[""]:
                raise ScenarioError(path, key, "unknown top-level key (known: name, description)")
            _take(path, "", key, value, top)
    if "graph" not in data:
        raise ScenarioError(path, "[graph]", "missing table")
    for table, keys in _REQUIRED.items():
        for key in keys:
            if f"{table}.{key}" not in values:
                raise ScenarioError(path, f"{table}.{key}", "required key is missing")

    if "consumer" in data and "consumer.format" not in values:
        raise ScenarioError(path, "consumer.format", "required key of [consumer] is missing")
    if "graph.index_dtype" in values and "layout.index_dtype" in values:
        raise ScenarioError(path, "layout.index_dtype", "given in [graph] too: keep one")
    builder = str(values.pop("check.builder", "build_page_table"))
    # Each value's type is the schema's (``_take``); ``_validate`` checks the rest.
    fields: dict[str, Any] = {_SCHEMA_FIELD[k]: v for k, v in values.items()}
    config = CheckConfig(**fields)
    _validate(path, config)
    return Scenario(
        name=str(top.get("name", path.stem)),
        path=str(path),
        description=str(top.get("description", "")),
        builder=builder,
        config=config,
    )


_SCHEMA_FIELD = {
    (f"{table}.{key}" if table else key): fld or key
    for table, keys in _SCHEMA.items()
    for key, (_, fld) in keys.items()
}
#: CheckConfig field -> the scenario key that sets it (for messages).
_KEY_OF = {fld: key for key, fld in _SCHEMA_FIELD.items()}
_KEY_OF["index_dtype"] = "graph.index_dtype"


def _take(path: Path, table: str, key: str, value: object, out: dict[str, object]) -> None:
    name = f"{table}.{key}" if table else key
    spec = _SCHEMA[table].get(key)
    if spec is None:
        known = ", ".join(_SCHEMA[table])
        raise ScenarioError(path, name, f"unknown key (known in [{table}]: {known})")
    types, _ = spec
    # TOML booleans are Python bools, which are ints too: keep them apart.
    ok = isinstance(value, types) and not (isinstance(value, bool) and bool not in types)
    if not ok:
        raise ScenarioError(path, name, f"must be {_type_name(types)}, got {value!r}")
    out[name] = value


def _validate(path: Path, c: CheckConfig) -> None:
    """The one config validator (``pagegraph.check.config.validate_config``), its messages
    naming this file's keys; then the TOML-specific normalisation (lists to tuples, the
    detectors to their canonical form)."""
    from ..detect.sync import parse_detectors

    try:
        validate_config(c, name=_KEY_OF.__getitem__, strict=True)
    except ConfigError as exc:
        raise ScenarioError(path, _KEY_OF[exc.field], exc.problem) from None
    if c.initial_len is not None:
        c.initial_len = (c.initial_len[0], c.initial_len[1])
    c.strict = tuple(c.strict)
    c.preset_outputs = tuple(c.preset_outputs)
    c.kv_groups = tuple(dict(g) for g in c.kv_groups)
    c.detectors = parse_detectors(c.detectors)
