"""vLLM's KV-cache groups: a scenario's ``[layout] kv_groups``, checked group by group.

vLLM 0.34.0's ``BlockTables`` holds ``num_kv_cache_groups`` groups, each with its own block
size and its own row width (``max_num_blocks``, the row stride of its per-request and batch
tables); its kernels run over all of them in one launch (grid ``(num_groups, rows)``). A
scenario describes its groups as a list of tables::

    [layout]
    kv_groups = [
        { name = "full", block_size = 16 },                  # width: cdiv(context, block)
        { name = "swa", kind = "sliding", block_size = 32 },
        { name = "ring", kind = "ring", block_size = 8, width = 2 },
    ]

Group kinds (``GROUP_KINDS``):

* ``full``: a table that spans the context (``cdiv(max_context_len, block_size)`` blocks a
  row unless ``width`` says otherwise).
* ``sliding``: a sliding-window group. Its table spans the context like a full group's, with
  its own block size; the gather's nulling of leading entries (``MASK_SLIDING_WINDOW``) is not
  modelled: the gather runs as vLLM runs it without ``num_computed_tokens``.
* ``ring``: a ring of ``width`` blocks per request (vLLM's ``CircularBufferSpec``, the
  ``KpoolTailSpec`` tail: one block each), narrower than the sequence. A position past ``width
  * block_size`` is in the contract (the engine sends every position of a long request), and
  its slot is the ring's: ``block_table[r, (pos // block_size) % width] * block_size + pos %
  block_size``. Its per-request table and its batch table hold ``min(cdiv(len, block_size),
  width)`` blocks.

Each group is checked as one check of the scenario's kind (``group_config``: the group's block
size as the page size, its width as the table width; the same workload seed, so the same
batches), with every table and vector compared exactly and canaries either side, and the
reports are merged into one (``merge_reports``): a property takes its worst status over the
groups, and its detail names the group. A builder that takes ``group=`` gets the group's
``KVGroup`` (``bind_group``); a ``slot_mapping`` builder must take it on a scenario with a
ring group, since a ring's mapping is the group's own (vLLM runs its generic kernel only on
the groups that use it).

What one launch over all groups could do that a check a group cannot see: a program of one
group writing into another group's table at a valid address of that table. A write past a
group's own table still shows (its canaries).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass

from ..kernels.contract import cdiv
from .config import CheckConfig
from .report import BucketStats, Failure, Report

__all__ = [
    "GROUP_KEYS",
    "GROUP_KINDS",
    "KVGroup",
    "bind_group",
    "builder_group_problem",
    "group_config",
    "groups_problem",
    "merge_reports",
    "parse_groups",
    "run_groups",
]

GROUP_KINDS = ("full", "sliding", "ring")
#: Keys of one group's table.
GROUP_KEYS = ("name", "kind", "block_size", "width")
#: Kinds whose builders read vLLM's per-request block tables, the ones groups apply to.
GROUP_BUILDER_KINDS = ("block_table", "slot_mapping")
#: How bad a property's status is when groups disagree (the merged property takes the worst).
_STATUS_RANK = {"skip": 0, "pass": 1, "advice": 2, "incomplete": 3, "FAIL": 4}


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


def parse_groups(cfg: CheckConfig) -> tuple[KVGroup, ...]:
    """The config's groups (``ValueError`` for a malformed one; ``groups_problem`` says it
    first)."""
    problem = groups_problem(cfg)
    if problem:
        raise ValueError(f"kv_groups {problem}")
    out = []
    for i, g in enumerate(cfg.kv_groups):
        block = int(g.get("block_size", cfg.page_size))
        width = int(g.get("width") or cdiv(cfg.max_context_len, block))
        out.append(KVGroup(i, str(g.get("name", f"group{i}")), str(g.get("kind", "full")),
                           block, width))  # fmt: skip
    return tuple(out)


def groups_problem(cfg: CheckConfig) -> str | None:
    """Why ``cfg.kv_groups`` cannot run (without the key's name), ``None`` when it can."""
    groups = cfg.kv_groups
    if not groups:
        return None
    if not isinstance(groups, (list, tuple)) or not all(isinstance(g, dict) for g in groups):
        return (
            "must be a list of tables ({ name = ..., kind = ..., block_size = ..., width = ... })"
        )
    names = []
    for i, g in enumerate(groups):
        unknown = sorted(set(g) - set(GROUP_KEYS))
        if unknown:
            return f"entry {i} has unknown keys {unknown} (known: {', '.join(GROUP_KEYS)})"
        kind = g.get("kind", "full")
        if kind not in GROUP_KINDS:
            return f"entry {i}: kind must be one of {', '.join(GROUP_KINDS)}, got {kind!r}"
        for key in ("block_size", "width"):
            value = g.get(key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                      or value < 1):  # fmt: skip
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


def group_config(cfg: CheckConfig, group: KVGroup) -> CheckConfig:
    """The config of one group's check: the group's block size as the page size and its width
    as the table width; the rest (the workload's seed included) unchanged."""
    return cfg.replace(kv_groups=(), page_size=group.block_size, table_width=group.width)


def builder_group_problem(builder: Callable, kind_name: str, cfg: CheckConfig) -> str | None:
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


def _takes_group(builder: Callable) -> bool:
    try:
        params = inspect.signature(builder).parameters
    except (TypeError, ValueError):
        return False
    return "group" in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


def bind_group(builder: Callable, group: KVGroup) -> Callable:
    """``builder`` called with ``group=group`` when it takes it (same signature otherwise,
    ``group`` aside, and the same ``pagegraph_*`` declarations), else ``builder`` itself."""
    if not _takes_group(builder):
        return builder

    @functools.wraps(builder)
    def bound(*args, **kwargs):
        return builder(*args, group=group, **kwargs)

    sig = inspect.signature(builder)
    bound.__signature__ = sig.replace(
        parameters=[p for p in sig.parameters.values() if p.name != "group"]
    )
    del bound.__wrapped__  # inspect must read the signature above, not the builder's
    return bound


def merge_reports(cfg: CheckConfig, parts: list[tuple[KVGroup, Report]]) -> Report:
    """One report of a check group by group: the first group's, with each property at its
    worst status over the groups (its detail and first failure from that group, named), the
    replays, buckets and wall times summed, and the first stop or crash."""
    first = parts[0][1]
    merged = dataclasses.replace(first, config=cfg, properties=[], buckets={})
    for prop in first.properties:
        group, worst = max(
            ((g, r.property(prop.name)) for g, r in parts if _has(r, prop.name)),
            key=lambda pair: _STATUS_RANK.get(pair[1].status, 0),
        )
        out = dataclasses.replace(worst)
        if len(parts) > 1 and out.status in ("FAIL", "incomplete", "advice"):
            out.detail = (
                f"group {group.label}: {out.detail}" if out.detail else (f"group {group.label}")
            )
            statuses = ", ".join(f"{g.name} {r.property(prop.name).status}" for g, r in parts)
            out.detail += f" [groups: {statuses}]"
            out.first_failure = _in_group(out.first_failure, group)
        merged.properties.append(out)
    for _, r in parts[1:]:
        merged.replays += r.replays
        merged.long_replays += r.long_replays
        merged.stopped = merged.stopped or r.stopped
        merged.crash = merged.crash or r.crash
        for key, value in r.wall_s.items():
            merged.wall_s[key] = merged.wall_s.get(key, 0.0) + value
    for _, r in parts:
        for b, stats in r.buckets.items():
            into = merged.buckets.setdefault(b, BucketStats(b))
            for f in ("replays", "out_of_contract", "mismatches", "oob_writes",
                      "escaped_writes", "syncs"):  # fmt: skip
                setattr(into, f, getattr(into, f) + getattr(stats, f))
            into.replay_us = into.replay_us + list(stats.replay_us)
    merged.wall_s = dict(merged.wall_s)
    return merged


def _in_group(failure: Failure | str | None, group: KVGroup) -> Failure | str | None:
    """``failure`` saying which group it is in (a ``Failure``'s note, a string's prefix)."""
    if isinstance(failure, Failure):
        note = f"group {group.name!r}" + (f", {failure.note}" if failure.note else "")
        return dataclasses.replace(failure, note=note)
    return f"group {group.name!r}: {failure}" if failure else failure


def _has(report: Report, name: str) -> bool:
    return any(p.name == name for p in report.properties)


def run_groups(plan, builder: Callable, run_one: Callable[..., Report], *,
               progress=None, on_chunk=None, **options) -> Report:  # fmt: skip
    """Run a planned check (``pagegraph.check.plan.CheckPlan``) with kv_groups once a group,
    ``run_one(group_plan, group_builder, progress=..., on_chunk=..., **options)`` each, and
    merge the reports (``merge_reports``). ``progress`` counts over all groups;
    ``on_chunk`` gets the merged report so far."""
    from ..kinds.builders import builder_name  # the kinds import the check's modules

    groups = parse_groups(plan.config)
    name = builder_name(builder)
    done: list[tuple[KVGroup, Report]] = []
    for k, group in enumerate(groups):
        sub = dataclasses.replace(plan, config=group_config(plan.config, group))

        def step(d, t, k=k):
            if progress is not None:
                progress(k * t + d, len(groups) * t)

        def chunk(report, group=group):
            if on_chunk is not None:
                on_chunk(
                    dataclasses.replace(
                        merge_reports(plan.config, [*done, (group, report)]), builder=name
                    )
                )

        report = run_one(sub, bind_group(builder, group), progress=step, on_chunk=chunk,
                         **options)  # fmt: skip
        done.append((group, report))
        if report.crash:
            break
    return dataclasses.replace(merge_reports(plan.config, done), builder=name)
