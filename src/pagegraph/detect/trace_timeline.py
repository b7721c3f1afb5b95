"""A replay window of a trace as a timeline: the ranges of each phase as bars on a row, and
every host sync or device-to-host copy marked where the host issued it.

``timeline_layout`` lays it out (plain data, tested without pixels), centred on a replay that
holds a hazard; ``write_timeline_image`` draws it with matplotlib, an optional dependency.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from .sync_calls import is_sync_api
from .trace_model import ApiCall, Range, Trace
from .trace_stats import _is_query_api, is_d2h_copy, is_host_blocking_sync

__all__ = ["Marker", "Timeline", "hazard_markers", "timeline_layout", "write_timeline_image"]

#: the phase whose ranges define the window
REPLAY = "replay"
#: bar colour per phase (others grey), marker colour per kind
PHASE_COLORS = {
    "warmup": "#ffb74d",
    "capture": "#ba68c8",
    "stage": "#64b5f6",
    "replay": "#81c784",
    "verify": "#a1887f",
}
MARKER_COLORS = {"sync": "#d32f2f", "d2h": "#1a237e"}
#: the image: inches wide, inches per row plus the margins, dots per inch
WIDTH_IN, ROW_IN, MARGIN_IN, DPI = 12.0, 0.55, 1.6, 100


@dataclass(frozen=True)
class Marker:
    """A host sync (``kind`` "sync") or device-to-host copy ("d2h") at ``time`` (ns), issued
    by API call ``call``; ``range``: the innermost range holding it (None: outside every
    range)."""

    time: int
    kind: str
    call: str
    range: str | None

    @property
    def in_replay(self) -> bool:
        return self.range is not None and self.range.split("/", 1)[0] == REPLAY


@dataclass
class Timeline:
    """What the image shows: the window (ns), a row per phase (in order of first
    appearance) with its bars ``(start, end, name)`` clipped to the window, and the markers
    inside the window."""

    start: int
    end: int
    rows: dict[str, list[tuple[int, int, str]]] = field(default_factory=dict)
    markers: list[Marker] = field(default_factory=list)


def _holder(ranges: list[Range], t: int, thread: object) -> Range | None:
    """The innermost (shortest) range holding time ``t`` on ``thread`` (or unbound)."""
    held = [r for r in ranges if r.start <= t <= r.end and (r.thread is None or r.thread == thread)]
    return min(held, key=lambda r: r.end - r.start) if held else None


def hazard_markers(trace: Trace) -> list[Marker]:
    """Every host sync and device-to-host copy of the trace, by time."""
    calls: dict[int, ApiCall] = {}
    for c in trace.api_calls:
        if c.correlation is not None:
            calls.setdefault(c.correlation, c)
    found: dict[tuple[int, str], tuple[ApiCall, str]] = {}
    for c in trace.api_calls:
        if is_sync_api(c.name):
            found[(id(c), "sync")] = (c, "sync")
    for a in trace.gpu:
        kind = "d2h" if is_d2h_copy(a) else "sync" if is_host_blocking_sync(a) else None
        call = calls.get(a.correlation) if a.correlation is not None else None
        if kind == "sync" and call is not None and _is_query_api(call.base_name):
            continue  # a poll (cudaEventQuery), not a wait: trace_stats does not count it
        if kind is not None and call is not None:
            found.setdefault((id(call), kind), (call, kind))
    out = []
    for c, kind in found.values():
        holder = _holder(trace.ranges, c.start, c.thread)
        out.append(Marker(c.start, kind, c.base_name, holder.name if holder else None))
    return sorted(out, key=lambda m: (m.time, m.kind))


def _window(replays: list[Range], markers: list[Marker], max_replays: int) -> tuple[int, int]:
    """The span of at most ``max_replays`` consecutive replay ranges: centred on the first
    replay holding a hazard, else the first ones."""
    first = 0
    for m in markers:
        if m.in_replay:
            k = next(i for i, r in enumerate(replays) if r.start <= m.time <= r.end)
            first = max(0, min(k - max_replays // 2, len(replays) - max_replays))
            break
    chosen = replays[first : first + max_replays]
    # A little room on either side: the stage before the first, the verify after the last.
    pad = max(1, (chosen[-1].end - chosen[0].start) // (4 * len(chosen)))
    return chosen[0].start - pad, chosen[-1].end + pad


def timeline_layout(trace: Trace, max_replays: int = 8) -> Timeline:
    """The timeline of a replay window of ``trace``; a ``ValueError`` when it has no replay
    range."""
    replays = sorted(
        (r for r in trace.ranges if r.name.split("/", 1)[0] == REPLAY), key=lambda r: r.start
    )
    if not replays:
        raise ValueError(f"{trace.path}: no {REPLAY}/* range to draw")
    markers = hazard_markers(trace)
    start, end = _window(replays, markers, max(1, max_replays))
    timeline = Timeline(start, end)
    for r in sorted(trace.ranges, key=lambda r: r.start):
        if r.end < start or r.start > end:
            continue
        phase = r.name.split("/", 1)[0]
        timeline.rows.setdefault(phase, []).append((max(r.start, start), min(r.end, end), r.name))
    timeline.markers = [m for m in markers if start <= m.time <= end]
    return timeline


def image_size(timeline: Timeline) -> tuple[int, int]:
    """The image's (width, height) in pixels."""
    return round(WIDTH_IN * DPI), round((MARGIN_IN + ROW_IN * max(1, len(timeline.rows))) * DPI)


def write_timeline_image(
    path: str | Path, timeline: Timeline, title: str = ""
) -> tuple[int, int] | None:
    """Draw ``timeline`` into the PNG ``path``; its (width, height) in pixels, or None when
    matplotlib is not installed (nothing written)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.lines import Line2D
    except ImportError:
        return None
    size = image_size(timeline)
    fig = plt.figure(figsize=(size[0] / DPI, size[1] / DPI), dpi=DPI)
    h_in = size[1] / DPI
    ax = fig.add_axes((1.0 / WIDTH_IN, 0.9 / h_in, 1 - 1.3 / WIDTH_IN, 1 - 1.5 / h_in))
    phases = list(timeline.rows)

    def ms(t: float) -> float:  # the axis unit
        return (t - timeline.start) / 1e6

    for row, phase in enumerate(phases):
        bars = [(ms(s), max(ms(e) - ms(s), 1e-4)) for s, e, _ in timeline.rows[phase]]
        ax.broken_barh(
            bars,
            (row - 0.35, 0.7),
            facecolors=PHASE_COLORS.get(phase, "#bdbdbd"),
            edgecolors="#555",
            linewidth=0.4,
        )
    for m in timeline.markers:
        y = phases.index(m.range.split("/", 1)[0]) if m.range else len(phases) - 0.5
        color = MARKER_COLORS[m.kind]
        # The offences (inside a replay range) stand out; the syncs of the checker's own
        # phases are drawn faint.
        alpha, mark = (1.0, 11) if m.in_replay else (0.35, 6)
        ax.axvline(ms(m.time), color=color, linewidth=0.8, alpha=alpha * 0.6)
        ax.plot([ms(m.time)], [y], marker="v", color=color, markersize=mark, alpha=alpha)
    ax.set_yticks(range(len(phases)))
    ax.set_yticklabels(phases, fontsize=8)
    ax.set_ylim(len(phases) - 0.4, -0.6)
    ax.set_xlim(0, ms(timeline.end))
    ax.set_xlabel("ms from the window's start", fontsize=8)
    ax.grid(True, axis="x", alpha=0.3)
    handles = [
        Line2D([], [], color=c, marker="v", linestyle="", label=label)
        for c, label in (
            (MARKER_COLORS["sync"], "host sync"),
            (MARKER_COLORS["d2h"], "device-to-host copy"),
        )
    ]
    ax.legend(handles=handles, loc="upper right", fontsize=7)
    bad = sum(m.in_replay for m in timeline.markers)
    fig.suptitle(
        title or f"replay window: {bad} sync/D2H marker(s) inside replay ranges", fontsize=9
    )
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return size
