"""Invariant: ``pagegraph mutate``'s kill-table image lays out every builder against every
scenario with the right state (killed with its property, missed there but killed
elsewhere, survived, control SAFE or NOT SAFE, n/a, not run), controls first, and is
written at the size it announces; without matplotlib nothing is written and the caller is
told."""

from __future__ import annotations

import struct
import sys

from pagegraph.check.config import CheckConfig
from pagegraph.check.reports.report import PropertyResult, Report
from pagegraph.jobs.kill_image import image_size, kill_grid, write_kill_image
from pagegraph.jobs.mutate_report import Outcome

SCENARIOS = ["default", "spec-metadata", "csr"]


def _report(failed: str | None = None) -> Report:
    r = Report("b", CheckConfig(), "cpu", True)
    r.properties = [
        PropertyResult(n, "FAIL" if n == failed else "pass", "")
        for n in ("capture", "correct", "bounded writes")
    ]
    return r


def _outcomes() -> list[Outcome]:
    killed = Outcome(
        "floor_last_page",
        "bug",
        False,
        reports={"default": _report("correct"), "spec-metadata": _report()},
        not_applicable={"csr": "no CSR outputs"},
    )
    survivor = Outcome("lucky", "bug", False, reports={s: _report() for s in SCENARIOS})
    control = Outcome(
        "build_page_table",
        "doc",
        True,
        reports={"default": _report(), "spec-metadata": _report("bounded writes")},
        not_applicable={"csr": "no CSR outputs"},
    )
    skipped = Outcome("gpu_only", "bug", False, skipped="can only die on a GPU")
    return [control, killed, survivor, skipped]


def test_the_grid_says_what_each_scenario_did_to_each_builder():
    rows = {r.name: r for r in kill_grid(_outcomes(), SCENARIOS)}
    assert list(rows)[0] == "build_page_table" and rows["build_page_table"].control
    assert rows["floor_last_page"].cells == [("killed", "correct"), ("missed", "SAFE"), ("n/a", "")]
    assert [c[0] for c in rows["lucky"].cells] == ["survived"] * 3
    assert rows["build_page_table"].cells == [("safe", ""), ("not safe", "UNSAFE"), ("n/a", "")]
    assert rows["gpu_only"].cells == [("not run", "")] * 3


def _png_size(path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR"
    return struct.unpack(">II", head[16:24])


def test_the_image_is_written_at_its_size(tmp_path):
    png = tmp_path / "kill.png"
    size = write_kill_image(png, _outcomes(), SCENARIOS, title="3/3 killed")
    assert size == image_size(4, 3)
    assert _png_size(png) == size
    # One more scenario column, one more builder row: a bigger image.
    assert image_size(5, 4)[0] > size[0] and image_size(5, 4)[1] > size[1]


def test_without_matplotlib_nothing_is_written(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises
    png = tmp_path / "kill.png"
    assert write_kill_image(png, _outcomes(), SCENARIOS) is None
    assert not png.exists()
