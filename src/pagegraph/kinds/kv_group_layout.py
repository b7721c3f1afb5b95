"""vLLM's KV-cache groups as a scenario describes them (``[layout] kv_groups``): ``KVGroup``,
parsing and validation, and which builders can run on them. How a check runs group by group
is ``pagegraph.check.pipeline.group_checks``; a group's own slot mapping is
``pagegraph.kernels.group_slot_mappings``.

The functions take the check's config (``pagegraph.check.config.CheckConfig``, a layer
above, as ``pagegraph.kinds.seams.ScenarioConfig``): they read its ``kv_groups``,
``page_size``, ``max_context_len``, ``table_width``, ``swa`` and ``consumer``.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass

from ..kernels.contract import cdiv
from .seams import Builder, ScenarioConfig

__all__ = [
    "GROUP_BUILDER_KINDS",
    "GROUP_KEYS",
    "GROUP_KINDS",
    "KVGroup",
    "bind_group",
    "builder_group_problem",
    "groups_problem",
    "parse_groups",
]

GROUP_KINDS = ("full", "sliding", "ring")
#: Keys of one group's table.
GROUP_KEYS = ("name", "kind", "block_size", "width")
#: Kinds whose builders read vLLM's per-request block tables, the ones groups apply to.
GROUP_BUILDER_KINDS = ("block_table", "slot_mapping")


@dataclass(frozen=True)
class KVGroup:
    """One KV-cache group as a builder sees it (``group=``): its position among the
    scenario's groups, its name and kind (``GROUP_KINDS``), its block size and its width
    (blocks a row: the row stride of its tables)."""

    index: int
    name: str
    kind: str
    block_size: int
    width: int

    @property
    def ring(self) -> bool:
        return self.kind == "ring"

    @property
    def label(self) -> str:
        blocks = f"{self.width} block{'s' if self.width != 1 else ''}"
        return f"{self.name!r} ({self.kind}, {blocks} of {self.block_size} tokens a row)"


def parse_groups(cfg: ScenarioConfig) -> tuple[KVGroup, ...]:
    """The config's groups (``ValueError`` for a malformed one; ``groups_problem`` says it
    first)."""
    problem = groups_problem(cfg)
    if problem:
        raise ValueError(f"kv_groups {problem}")
    out: list[KVGroup] = []
    for i, g in enumerate(cfg.kv_groups):
        block = int(g.get("block_size", cfg.page_size))
        width = int(g.get("width") or cdiv(cfg.max_context_len, block))
        out.append(
            KVGroup(i, str(g.get("name", f"group{i}")), str(g.get("kind", "full")), block, width)
        )
    return tuple(out)


def groups_problem(cfg: ScenarioConfig) -> str | None:
    """Why ``cfg.kv_groups`` cannot run (without the key's name), ``None`` when it can."""
    groups = cfg.kv_groups
    if not groups:
        return None
    if not isinstance(groups, (list, tuple)) or not all(isinstance(g, dict) for g in groups):
        return (
            "must be a list of tables ({ name = ..., kind = ..., block_size = ..., width = ... })"
        )
    names: list[str] = []
    for i, g in enumerate(groups):
        unknown = sorted(set(g) - set(GROUP_KEYS))
        if unknown:
            return f"entry {i} has unknown keys {unknown} (known: {', '.join(GROUP_KEYS)})"
        kind = g.get("kind", "full")
        if kind not in GROUP_KINDS:
            return f"entry {i}: kind must be one of {', '.join(GROUP_KINDS)}, got {kind!r}"
        for key in ("block_size", "width"):
            value = g.get(key)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or value < 1
            ):
                return f"entry {i}: {key} must be an integer >= 1, got {value!r}"
        if kind == "ring" and g.get("width") is None:
            return f"entry {i}: a ring group needs its width (blocks a request)"
        names.append(str(g.get("name", f"group{i}")))
    if len(set(names)) != len(names):
        return f"names must differ, got {names}"
    if cfg.table_width is not None:
        return "and table_width cannot both be set: give each group its width"
    if cfg.swa or cfg.consumer:
        return "apply to vLLM's block-table and slot-mapping builders: no swa, no [consumer]"
    return None


def builder_group_problem(builder: Builder, kind_name: str, cfg: ScenarioConfig) -> str | None:
    """Why ``builder`` (of kind ``kind_name``) cannot run on ``cfg``'s groups; ``None`` when
    it can."""
    if not cfg.kv_groups:
        return None
    if kind_name not in GROUP_BUILDER_KINDS:
        return (
            f"is a {kind_name} builder: kv_groups are vLLM's block tables, checked with a "
            f"{' or '.join(GROUP_BUILDER_KINDS)} builder"
        )
    rings = [g for g in cfg.kv_groups if g.get("kind") == "ring"]
    if rings and kind_name == "slot_mapping" and not _takes_group(builder):
        return (
            "takes no group=: a ring group's slot mapping is the group's own (position modulo "
            "the ring), so a slot_mapping builder must know which group it maps"
        )
    return None


def _takes_group(builder: Builder) -> bool:
    try:
        params = inspect.signature(builder).parameters
    except (TypeError, ValueError):
        return False
    return "group" in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


def bind_group(builder: Builder, group: KVGroup) -> Builder:
    """``builder`` called with ``group=group`` when it takes it (same signature otherwise,
    ``group`` aside, and the same ``pagegraph_*`` declarations), else ``builder`` itself."""
    if not _takes_group(builder):
        return builder

    @functools.wraps(builder)
    def bound(*args: object, **kwargs: object) -> object:
        return builder(*args, group=group, **kwargs)

    sig = inspect.signature(builder)
    # inspect reads a function's __signature__ first; typeshed declares no such attribute.
    bound.__signature__ = sig.replace(  # type: ignore[attr-defined]
        parameters=[p for p in sig.parameters.values() if p.name != "group"]
    )
    del bound.__wrapped__  # inspect must read the signature above, not the builder's
    return bound
