"""tools/compare_verdicts.py: two runs' job files side by side. The same verdicts compare equal;
a planted change of each kind (a mutant's killing property, a client's verdict, a corpus entry
not held) is reported with exit 1; a missing field is exit 2."""

from __future__ import annotations

import copy
import importlib.util
import json
from pathlib import Path

import pytest

TOOL = Path(__file__).resolve().parents[1] / "tools" / "compare_verdicts.py"
spec = importlib.util.spec_from_file_location("compare_verdicts", TOOL)
assert spec is not None and spec.loader is not None
compare = importlib.util.module_from_spec(spec)
spec.loader.exec_module(compare)

DOCS = {
    "mutate.json": {
        "builders": [
            {
                "name": "no_clamp",
                "control": False,
                "killed": True,
                "skipped": None,
                "killers": {"default": "row containment", "big-pool": "correct"},
            },
            {
                "name": "build_page_table",
                "control": True,
                "killed": None,
                "skipped": None,
                "killers": {},
            },
        ],
        "survivors": [],
        "bad_controls": [],
    },
    "vllm-0.34.0.json": {
        "runs": [
            {
                "client": "gather",
                "reader": None,
                "scenario": "s",
                "verdict": "SAFE",
                "skipped": None,
                "failures": [],
                "advice": [{"property": "p"}],
            }
        ]
    },
    "wild.json": {
        "entries": [
            {
                "key": "vllm-1",
                "held": True,
                "buggy": "UNSAFE",
                "fixed": "SAFE",
                "property": "correct",
                "skipped": None,
            }
        ]
    },
}


def write(folder: Path, docs: dict) -> Path:
    folder.mkdir()
    for name, doc in docs.items():
        (folder / name).write_text(json.dumps(doc))
    return folder


def test_the_same_verdicts_compare_equal(tmp_path, capsys):
    before = write(tmp_path / "a", DOCS)
    after = copy.deepcopy(DOCS)
    # a mutant checked on fewer scenarios after (stopped at another first kill) is no change
    del after["mutate.json"]["builders"][0]["killers"]["big-pool"]
    assert compare.main([str(before), str(write(tmp_path / "b", after))]) == 0
    assert "0 differ" in capsys.readouterr().out


@pytest.mark.parametrize(
    "plant, shows",
    [
        (
            lambda d: d["mutate.json"]["builders"][0]["killers"].update(default="correct"),
            "no_clamp",
        ),
        (lambda d: d["vllm-0.34.0.json"]["runs"][0].update(verdict="UNSAFE"), "gather / None / s"),
        (lambda d: d["wild.json"]["entries"][0].update(held=False), "vllm-1"),
    ],
    ids=["mutant-killer", "client-verdict", "wild-held"],
)
def test_a_changed_verdict_is_reported(tmp_path, capsys, plant, shows):
    after = copy.deepcopy(DOCS)
    plant(after)
    before = write(tmp_path / "a", DOCS)
    assert compare.main([str(before), str(write(tmp_path / "b", after))]) == 1
    assert shows in capsys.readouterr().out


def test_an_unreadable_file_is_exit_2(tmp_path):
    broken = copy.deepcopy(DOCS)
    del broken["wild.json"]["entries"][0]["key"]
    assert compare.main([str(write(tmp_path / "a", DOCS)), str(write(tmp_path / "b", broken))]) == 2


def test_a_job_in_one_folder_only_or_none_at_all_is_exit_2(tmp_path, capsys):
    before = write(tmp_path / "a", DOCS)
    after = write(tmp_path / "b", {k: v for k, v in DOCS.items() if k != "wild.json"})
    assert compare.main([str(before), str(after)]) == 2
    assert "wild.json: in one folder only" in capsys.readouterr().out
    assert compare.main([str(write(tmp_path / "c", {})), str(write(tmp_path / "d", {}))]) == 2
