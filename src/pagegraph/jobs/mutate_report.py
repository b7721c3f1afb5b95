"""The reports of ``pagegraph mutate``: each builder's ``Outcome``, the kill table, the matrix
of which scenario kills which mutant, the smallest killing set, and the JSON, Markdown and
image files written from them.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from ..check.config import PROPERTIES
from ..check.pipeline.step_bed import STEP_PROPERTIES
from ..check.reports.report import Report
from ..supervise.isolate import write_json_atomic

__all__ = [
    "PROPERTY_ORDER",
    "Outcome",
    "format_kill_table",
    "format_matrix",
    "killing_property",
    "print_results",
    "smallest_killing_set",
    "write_image",
    "write_json",
    "write_markdown",
]

#: Every property a report can fail, in the order the kill table names the first: the
#: checker's, then the decode step's that the checker does not have.
PROPERTY_ORDER = [*PROPERTIES, *(name for name in STEP_PROPERTIES if name not in PROPERTIES)]


@dataclass
class Outcome:
    """One builder over every scenario."""

    name: str
    bug: str
    control: bool
    reports: dict[str, Report] = field(default_factory=dict)
    skipped: str | None = None  # why it was not run
    #: scenario -> why the builder cannot run there (a CSR builder on an SWA scenario)
    not_applicable: dict[str, str] = field(default_factory=dict)
    #: scenarios a mutant was not checked on because another had killed it already
    not_checked_after_kill: list[str] = field(default_factory=list)

    def killers(self) -> dict[str, str]:
        """scenario -> what killed it there (the first failing property, or the crash)."""
        out = {}
        for scenario, report in self.reports.items():
            prop = killing_property(report)
            if prop is not None:
                out[scenario] = prop
        return out

    @property
    def killed(self) -> bool:
        return bool(self.killers())

    @property
    def safe_everywhere(self) -> bool:
        return bool(self.reports) and all(r.safe for r in self.reports.values())


def killing_property(report: Report) -> str | None:
    """The property by which ``report`` kills its builder (the first failing one, in
    ``PROPERTY_ORDER``), or None: the one definition of a kill, for the table and for
    stopping a mutant at its first kill."""
    failed = [p.name for p in report.properties if p.status == "FAIL"]
    return min(failed, key=PROPERTY_ORDER.index) if failed else None


def smallest_killing_set(outcomes: list[Outcome], scenarios: list[str]) -> list[str]:
    """Scenarios that together kill every killed mutant, chosen greedily (each step takes the
    scenario that kills the most mutants not yet killed)."""
    left = {o.name: set(o.killers()) for o in outcomes if not o.control and o.killed}
    chosen: list[str] = []
    while any(left.values()):
        best = max(scenarios, key=lambda s: sum(s in k for k in left.values()))
        chosen.append(best)
        left = {name: k for name, k in left.items() if best not in k}
    return chosen


def format_kill_table(outcomes: list[Outcome], scenarios: list[str]) -> str:
    lines = [
        "| builder | bug | result | first caught by | property | killed in |",
        "|---|---|---|---|---|---|",
    ]
    for o in outcomes:
        if o.skipped:
            result, first, prop, where = f"not run ({o.skipped})", "", "", ""
        elif o.control:
            result = "SAFE everywhere" if o.safe_everywhere else "NOT SAFE (control)"
            bad = [s for s, r in o.reports.items() if not r.safe]
            first = bad[0] if bad else ""
            prop = (
                ", ".join(
                    p.name
                    for p in o.reports[first].properties
                    if p.status != "pass" and p.status != "skip"
                )
                if bad
                else ""
            )
            where = ", ".join(bad)
        else:
            killers = o.killers()
            result = "killed" if killers else "SURVIVED"
            first = next((s for s in scenarios if s in killers), "")
            prop = killers.get(first, "")
            stopped = o.reports[first].stopped if first else None
            if stopped and "process" in stopped:
                prop += " (process died)"
            where = ", ".join(s for s in scenarios if s in killers)
            if o.not_checked_after_kill:
                where += f" (then not checked on {len(o.not_checked_after_kill)} more)"
        lines.append(f"| {o.name} | {o.bug} | {result} | {first} | {prop} | {where} |")
    return "\n".join(lines)


def format_matrix(outcomes: list[Outcome], scenarios: list[str]) -> str:
    head = "| builder | " + " | ".join(scenarios) + " |"
    lines = [head, "|---|" + "---|" * len(scenarios)]
    for o in outcomes:
        if o.skipped:
            continue
        killers = o.killers()
        cells = []
        for s in scenarios:
            r = o.reports.get(s)
            if s in o.not_applicable:
                cells.append("n/a")
            elif s in o.not_checked_after_kill:
                cells.append("(killed before)")
            elif r is None:
                cells.append("")
            elif s in killers:
                cells.append(killers[s])
            else:
                cells.append("SAFE" if r.safe else r.verdict.lower())
        lines.append(f"| {o.name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_image(
    png_path: str | None,
    markdown_path: str | None,
    outcomes: list[Outcome],
    labels: list[str],
    summary: str,
) -> str:
    """The kill-table image at ``png_path`` (default: beside ``markdown_path``; neither: no
    image); the Markdown line that shows it, or says why there is none."""
    if not png_path and not markdown_path:
        return ""
    from .kill_image import write_kill_image

    png = Path(png_path) if png_path else Path(cast(str, markdown_path)).with_suffix(".png")
    title = summary.removeprefix("pagegraph mutate: ").split("; smallest")[0]
    if write_kill_image(png, outcomes, labels, title=title) is None:
        print("pagegraph mutate: matplotlib not installed: no kill-table image", file=sys.stderr)
        return "(matplotlib not installed: no kill-table image)"
    if markdown_path:
        folder = Path(markdown_path).resolve().parent
        shown = png.resolve()
        shown = shown.relative_to(folder) if shown.is_relative_to(folder) else shown
        return f"![kill table]({shown})"
    return ""


def print_results(
    table: str, matrix: str, survivors: list[str], bad_controls: list[str], summary: str
) -> None:
    print(table)
    print()
    print(matrix)
    print()
    if survivors:
        print(f"survived: {', '.join(survivors)}")
    if bad_controls:
        print(f"controls not SAFE everywhere: {', '.join(bad_controls)}")
    print(summary)


def write_json(
    json_path: str,
    loaded: list[Any],
    outcomes: list[Outcome],
    smallest: list[str],
    survivors: list[str],
    bad_controls: list[str],
    elapsed: float,
) -> None:
    """The whole run as JSON: environment, scenarios, verdicts and every report."""
    from ..runtime.environment import environment

    write_json_atomic(
        json_path,
        {
            "environment": environment(),
            "scenarios": [{"name": s.name, "path": s.path} for s in loaded],
            "smallest_killing_set": smallest,
            "survivors": survivors,
            "bad_controls": bad_controls,
            "seconds": elapsed,
            "builders": [
                {
                    "name": o.name,
                    "bug": o.bug,
                    "control": o.control,
                    "skipped": o.skipped,
                    "killed": o.killed if not o.control else None,
                    "killers": o.killers(),
                    "not_applicable": o.not_applicable,
                    "not_checked_after_kill": o.not_checked_after_kill,
                    "reports": {s: r.to_dict() for s, r in o.reports.items()},
                }
                for o in outcomes
            ],
        },
    )


def write_markdown(
    markdown_path: str, summary: str, table: str, matrix: str, image: str = ""
) -> None:
    """The summary, the kill table and the matrix as Markdown (``image``: the line that
    shows the kill-table image, after the summary)."""
    from ..runtime.environment import environment

    env = environment()
    path = Path(markdown_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        "\n".join(
            [
                "# pagegraph mutate",
                "",
                f"{env['date']} on {env['device']} (torch {env['torch']}, triton {env['triton']})",
                "",
                summary,
                "",
                *([image, ""] if image else []),
                "## Kill table",
                "",
                table,
                "",
                "## Which scenario kills which mutant (first failing property)",
                "",
                matrix,
                "",
            ]
        )
    )
