"""The kill table as an image: ``pagegraph mutate --png`` (or beside ``--markdown``).

A grid of builders (the controls first, marked, then the mutants) by scenarios, each cell
coloured by what the scenario did to the builder: killed (with the first failing property),
missed there but killed elsewhere, survived, SAFE, NOT SAFE, n/a or not run. ``kill_grid`` lays
it out (plain data, tested without pixels); ``write_kill_image`` draws it with matplotlib.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: cell state -> (fill colour, legend text)
STATES = {
    "killed": ("#4caf50", "killed (first failing property)"),
    "survived": ("#e53935", "SURVIVED (no scenario kills it)"),
    "missed": ("#ffcc80", "not killed here (killed elsewhere)"),
    "safe": ("#90caf9", "control SAFE"),
    "not safe": ("#6a1b9a", "control NOT SAFE"),
    "n/a": ("#d0d0d0", "n/a (outputs do not fit)"),
    "not run": ("#ffffff", "not run"),
}
#: inches: the builder-name margin, one scenario column, one builder row, the title and
#: legend bands; and the image's dots per inch
LABEL_W, COL_W, ROW_H, HEAD_H, LEGEND_H, DPI = 3.2, 0.9, 0.3, 1.6, 0.9, 100


@dataclass
class GridRow:
    """One builder's row: its name, whether it is a control, and one (state, text) cell per
    scenario (``text``: the killing property, else empty)."""

    name: str
    control: bool
    cells: list[tuple[str, str]]


def kill_grid(outcomes: list[Any], scenarios: list[str]) -> list[GridRow]:
    """The grid's rows, controls first; ``outcomes``: ``mutate.Outcome``s."""
    rows = []
    for o in sorted(outcomes, key=lambda o: not o.control):  # stable: the table's order
        killers = o.killers()
        cells = []
        for s in scenarios:
            report = o.reports.get(s)
            if o.skipped or (report is None and s not in o.not_applicable):
                cells.append(("not run", ""))
            elif s in o.not_applicable:
                cells.append(("n/a", ""))
            elif o.control:
                cells.append(("safe", "") if report.safe else ("not safe", report.verdict))
            elif s in killers:
                cells.append(("killed", killers[s]))
            else:
                cells.append(("missed" if killers else "survived", report.verdict))
        rows.append(GridRow(o.name, o.control, cells))
    return rows


def image_size(rows: int, columns: int) -> tuple[int, int]:
    """The image's (width, height) in pixels for a grid of ``rows`` x ``columns``."""
    width = LABEL_W + COL_W * max(columns, 1)
    height = HEAD_H + LEGEND_H + ROW_H * max(rows, 1)
    return round(width * DPI), round(height * DPI)


def write_kill_image(
    path: str | Path, outcomes: list[Any], scenarios: list[str], title: str = ""
) -> tuple[int, int] | None:
    """Draw the grid into the PNG ``path``; its (width, height) in pixels, or None when
    matplotlib is not installed (nothing written)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.patches import Patch, Rectangle
    except ImportError:
        return None
    rows = kill_grid(outcomes, scenarios)
    size = image_size(len(rows), len(scenarios))
    fig = plt.figure(figsize=(size[0] / DPI, size[1] / DPI), dpi=DPI)
    # The grid's axes in figure fractions: the name margin left, title on top, legend below.
    w_in, h_in = size[0] / DPI, size[1] / DPI
    ax = fig.add_axes(
        (
            LABEL_W / w_in,
            LEGEND_H / h_in,
            1 - (LABEL_W + 0.1) / w_in,
            1 - (HEAD_H + LEGEND_H) / h_in,
        )
    )
    for y, row in enumerate(rows):
        for x, (state, text) in enumerate(row.cells):
            ax.add_patch(Rectangle((x, y), 1, 1, facecolor=STATES[state][0], edgecolor="#888"))
            if state == "not run":
                ax.add_patch(Rectangle((x, y), 1, 1, fill=False, hatch="//", edgecolor="#bbb"))
            if text:
                dark = state in ("killed", "not safe", "survived")
                ax.text(
                    x + 0.5,
                    y + 0.5,
                    text[:18],
                    ha="center",
                    va="center",
                    fontsize=5.5,
                    color="white" if dark else "k",
                )
    controls = sum(r.control for r in rows)
    if 0 < controls < len(rows):  # a rule between the controls and the mutants
        ax.axhline(controls, color="k", linewidth=2)
    ax.set_xlim(0, len(scenarios))
    ax.set_ylim(len(rows), 0)
    ax.set_xticks([x + 0.5 for x in range(len(scenarios))])
    ax.set_xticklabels(scenarios, rotation=40, ha="left", fontsize=7)
    ax.xaxis.tick_top()
    ax.set_yticks([y + 0.5 for y in range(len(rows))])
    ax.set_yticklabels([f"{r.name} (control)" if r.control else r.name for r in rows], fontsize=7)
    ax.tick_params(length=0)
    handles = [Patch(facecolor=c, edgecolor="#888", label=t) for c, t in STATES.values()]
    fig.legend(handles=handles, loc="lower center", ncol=3, fontsize=7, frameon=False)
    if title:
        fig.text(0.01, 1 - 0.15 / h_in, title, fontsize=8, va="top")
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return size
