"""Scenario files (``graphs/*.toml``): one graph setup and its workload, validated on load.

A scenario has four tables; every key is optional except where noted, and an unknown key, a
wrong type or an impossible value is a ``ScenarioError`` naming the file, the key and the
problem, raised before anything runs::

    name = "sglang-h200"                 # default: the file name
    description = "..."

    [graph]                               # required
    buckets = "sglang"                    # preset or a list of batch sizes
    max_bs = 256                          # required
    max_context_len = 131072              # required
    page_size = 64                        # required
    padding = "sglang"                    # sglang | vllm | dummy-row
    swa = false
    index_dtype = "int32"                 # of the static req_pool_indices / seq_lens
    errors = false                        # device-side error counters

    [pool]
    max_reqs = 257                        # default max_bs + 1
    num_pages = 600000                    # default: every row at full length
    row_order = "low-first"               # or high-first

    [workload]
    steps = 200                           # replays
    seed = 0
    finish_rate = 0.05
    draft_tokens = 0                      # speculative decoding: 2..8
    initial_len = [1, 32768]
    near_capacity = 0.1
    swa_window = 4096                     # needs graph.swa
    swa_churn = 0.2                       # needs graph.swa

    [check]
    builder = "build_page_table"          # built-in name or module:function
    detectors = "auto"                    # auto | none | a list of torch, cupti
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from .buckets import PADDING, PRESETS, Buckets
from .checker import CheckConfig


class ScenarioError(ValueError):
    """A scenario file that cannot be run: names the file, the key and the problem."""

    def __init__(self, path: str | Path, key: str | None, problem: str):
        self.path, self.key, self.problem = str(path), key, problem
        where = f"{self.path}: {key}" if key else self.path
        super().__init__(f"{where}: {problem}")


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
    },
    "check": {"builder": ((str,), None), "detectors": ((str, list), "detectors")},
}
_REQUIRED = {"graph": ("max_bs", "max_context_len", "page_size")}
_DETECTORS = ("torch", "cupti")


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

    fields = {k.split(".", 1)[1]: v for k, v in values.items()}
    builder = str(fields.pop("builder", "build_page_table"))
    config = CheckConfig(**{_SCHEMA_FIELD[k]: v for k, v in fields.items()})
    _validate(path, config)
    return Scenario(
        name=str(top.get("name", path.stem)),
        path=str(path),
        description=str(top.get("description", "")),
        builder=builder,
        config=config,
    )


_SCHEMA_FIELD = {key: fld or key for table in _SCHEMA.values() for key, (_, fld) in table.items()}


def _take(path, table: str, key: str, value, out: dict) -> None:
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


def _validate(path, c: CheckConfig) -> None:
    def bad(key: str, problem: str):
        raise ScenarioError(path, key, problem)

    if c.max_bs < 1:
        bad("graph.max_bs", f"must be >= 1, got {c.max_bs}")
    if c.max_context_len < 1:
        bad("graph.max_context_len", f"must be >= 1, got {c.max_context_len}")
    if not 1 <= c.page_size <= 1024:
        bad("graph.page_size", f"must be in 1..1024, got {c.page_size}")
    if isinstance(c.buckets, str) and c.buckets not in PRESETS:
        bad("graph.buckets", f"unknown preset {c.buckets!r} (known: {', '.join(PRESETS)})")
    try:
        Buckets(c.buckets, c.max_bs)
    except ValueError as exc:
        bad("graph.buckets", str(exc))
    if c.padding not in PADDING:
        bad("graph.padding", f"unknown policy {c.padding!r} (known: {', '.join(PADDING)})")
    if c.index_dtype not in ("int32", "int64"):
        bad("graph.index_dtype", f"must be 'int32' or 'int64', got {c.index_dtype!r}")
    if c.max_reqs is not None and c.max_reqs < c.max_bs:
        bad("pool.max_reqs", f"must be >= graph.max_bs ({c.max_bs}), got {c.max_reqs}")
    if c.num_pages is not None and c.num_pages < 2:
        bad("pool.num_pages", f"must be >= 2 (page 0 is reserved), got {c.num_pages}")
    if c.row_order not in ("low-first", "high-first"):
        bad("pool.row_order", f"must be 'low-first' or 'high-first', got {c.row_order!r}")
    if c.steps < 1:
        bad("workload.steps", f"must be >= 1, got {c.steps}")
    for key in ("finish_rate", "near_capacity", "swa_churn"):
        v = getattr(c, key)
        if not 0 <= v <= 1:
            bad(f"workload.{key}", f"must be in [0, 1], got {v}")
    if not 0 <= c.draft_tokens <= 64:
        bad("workload.draft_tokens", f"must be in 0..64, got {c.draft_tokens}")
    if c.initial_len is not None:
        il = c.initial_len
        if len(il) != 2 or not all(isinstance(x, int) and not isinstance(x, bool) for x in il):
            bad("workload.initial_len", f"must be [lo, hi] integers, got {il!r}")
        if not 1 <= il[0] <= il[1] <= c.max_context_len:
            bad("workload.initial_len", f"must satisfy 1 <= lo <= hi <= max_context_len, got {il}")
        c.initial_len = (il[0], il[1])
    if not c.swa and (c.swa_window is not None or c.swa_churn):
        bad(
            "workload.swa_window" if c.swa_window is not None else "workload.swa_churn",
            "needs graph.swa = true",
        )
    if c.swa_window is not None and c.swa_window < 1:
        bad("workload.swa_window", f"must be >= 1, got {c.swa_window}")
    if isinstance(c.detectors, list):
        for d in c.detectors:
            if d not in _DETECTORS:
                bad("check.detectors", f"unknown detector {d!r} (known: {', '.join(_DETECTORS)})")
        c.detectors = tuple(c.detectors)
    elif c.detectors not in ("auto", "none"):
        bad("check.detectors", f"must be 'auto', 'none' or a list, got {c.detectors!r}")
    elif c.detectors == "none":
        c.detectors = ()
