"""vLLM's KV-cache groups: a scenario's ``[layout] kv_groups``, checked group by group.

docs/ARCHITECTURE.md ("Inside the checker") has the details.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator

from ...kinds.kv_group_layout import KVGroup, bind_group, parse_groups
from ..config import CheckConfig
from ..planned import CheckPlan
from ..reports.report import BucketStats, Failure, Report

__all__ = ["group_config", "merge_reports", "GroupRuns"]

#: How bad a property's status is when groups disagree (the merged property takes the worst).
_STATUS_RANK = {"skip": 0, "pass": 1, "advice": 2, "incomplete": 3, "FAIL": 4}


def group_config(cfg: CheckConfig, group: KVGroup) -> CheckConfig:
    """The config of one group's check: the group's block size as the page size and its width
    as the table width; the rest (the workload's seed included) unchanged."""
    return cfg.replace(kv_groups=(), page_size=group.block_size, table_width=group.width)


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
            for f in (
                "replays",
                "out_of_contract",
                "mismatches",
                "oob_writes",
                "escaped_writes",
                "syncs",
            ):
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


class GroupRuns:
    """A planned check (``pagegraph.check.plan.CheckPlan``) with kv_groups, run once a group
    by its caller: iterating gives each group's plan, builder, ``progress`` (counting over all
    groups) and ``on_chunk`` (the merged report so far), until a group's check crashed; the
    caller ``add``s each group's report, and ``merged()`` is the check's."""

    def __init__(
        self,
        plan: CheckPlan,
        builder: Callable[..., object],
        progress: Callable[[int, int], None] | None = None,
        on_chunk: Callable[[Report], None] | None = None,
    ) -> None:
        from ...graph.builder_names import builder_name

        self.plan, self.builder = plan, builder
        self.progress, self.on_chunk = progress, on_chunk
        self.groups = parse_groups(plan.config)
        self.name = builder_name(builder)
        self.done: list[tuple[KVGroup, Report]] = []

    def __iter__(
        self,
    ) -> Iterator[
        tuple[
            CheckPlan, Callable[..., object], Callable[[int, int], None], Callable[[Report], None]
        ]
    ]:
        groups = self.groups
        for k, group in enumerate(groups):
            if self.done and self.done[-1][1].crash:
                return
            sub = dataclasses.replace(self.plan, config=group_config(self.plan.config, group))

            def step(d: int, t: int, k: int = k) -> None:
                if self.progress is not None:
                    self.progress(k * t + d, len(groups) * t)

            def chunk(report: Report, group: KVGroup = group) -> None:
                if self.on_chunk is not None:
                    merged = merge_reports(self.plan.config, [*self.done, (group, report)])
                    self.on_chunk(dataclasses.replace(merged, builder=self.name))

            yield sub, bind_group(self.builder, group), step, chunk
            if len(self.done) != k + 1:
                raise RuntimeError("GroupRuns: add() each group's report before the next")

    def add(self, report: Report) -> None:
        self.done.append((self.groups[len(self.done)], report))

    def merged(self) -> Report:
        return dataclasses.replace(merge_reports(self.plan.config, self.done), builder=self.name)
