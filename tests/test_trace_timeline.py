"""Invariant: the profile's timeline of a replay window marks every host sync and
device-to-host copy where the host issued it. On the recorded H200 traces, the planted
``.item()`` (a D2H copy and its stream sync) sits inside a replay range and the window is
centred on it; the clean twin has no marker inside any replay range. The image is written at
the size it announces, and ``pagegraph profile`` shows it in its report."""

from __future__ import annotations

import struct
import sys
from pathlib import Path

import pytest

from pagegraph.detect.trace_loaders import load_trace
from pagegraph.detect.trace_model import Range, Trace
from pagegraph.detect.trace_timeline import image_size, timeline_layout, write_timeline_image

DATA = Path(__file__).resolve().parent / "data"


@pytest.mark.parametrize("fmt", ["sqlite", "torch.json.gz"])
def test_the_planted_item_is_marked_inside_its_replay_range(fmt):
    trace = load_trace(DATA / f"h200_replay_planted_item.{fmt}")
    layout = timeline_layout(trace)
    inside = [m for m in layout.markers if m.in_replay]
    assert {m.kind for m in inside} == {"d2h", "sync"}, inside
    for m in inside:
        # The marker lies within the bar of the replay range it names, inside the window.
        bars = [(s, e) for s, e, name in layout.rows["replay"] if name == m.range]
        assert any(s <= m.time <= e for s, e in bars), (m, bars)
        assert layout.start <= m.time <= layout.end
    d2h = next(m for m in inside if m.kind == "d2h")
    assert d2h.call.startswith("cudaMemcpy") and d2h.range.startswith("replay/")
    assert len(layout.rows["replay"]) == 8  # the default window: eight replays


@pytest.mark.parametrize("fmt", ["sqlite", "torch.json.gz"])
def test_the_clean_twin_has_no_marker_in_a_replay_range(fmt):
    layout = timeline_layout(load_trace(DATA / f"h200_replay_clean.{fmt}"))
    assert layout.rows["replay"] and layout.markers  # the checker's own syncs are there
    assert not [m for m in layout.markers if m.in_replay]
    assert {"stage", "replay", "verify"} <= set(layout.rows)


def test_a_trace_without_replay_ranges_has_no_timeline():
    trace = Trace("t", "nsys-sqlite", ranges=[Range("capture/bs=1", 0, 10, None)])
    with pytest.raises(ValueError, match="no replay"):
        timeline_layout(trace)


def test_the_image_is_written_at_its_size(tmp_path):
    layout = timeline_layout(load_trace(DATA / "h200_replay_planted_item.sqlite"))
    png = tmp_path / "timeline.png"
    size = write_timeline_image(png, layout)
    assert size == image_size(layout)
    head = png.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    assert struct.unpack(">II", head[16:24]) == size


def test_without_matplotlib_nothing_is_written(tmp_path, monkeypatch):
    layout = timeline_layout(load_trace(DATA / "h200_replay_clean.sqlite"))
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert write_timeline_image(tmp_path / "t.png", layout) is None
    assert not (tmp_path / "t.png").exists()
