"""Invariant: checks too big to run on every worker at once share a few slots, so a parallel
``pagegraph mutate`` does not run out of GPU memory and call a correct builder NOT SAFE.

A slot is an exclusive ``flock`` on a lock file (``isolate.memory_slot``): a second holder waits
until the first lets go, and a process that dies frees its slot. ``mutate.memory_slots`` gives
slots only to the scenarios that need more than half an equal share of the GPU's memory (the
host's without CUDA); the kill
table keeps the scenarios' order whatever order each builder ran them in.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from pagegraph.check.config import CheckConfig
from pagegraph.check.memory_fit import memory_need
from pagegraph.check.scenario import load_scenario
from pagegraph.jobs import mutate
from pagegraph.kinds import CSR, PAGE_TABLE
from pagegraph.supervise.isolate import (
    Job,
    SlotWaitStopped,
    _wait_for_child,
    memory_slot,
    run_isolated,
)

ROOT = Path(__file__).resolve().parents[1]


def test_no_paths_holds_nothing():
    with memory_slot(()) as held:
        assert held is None


def test_a_second_holder_waits_until_the_first_lets_go(tmp_path):
    paths = [str(tmp_path / "slot-0")]
    events = []
    first_in = threading.Event()
    release = threading.Event()

    def first():
        with memory_slot(paths):
            events.append("first in")
            first_in.set()
            release.wait(5)
            events.append("first out")

    t = threading.Thread(target=first)
    t.start()
    first_in.wait(5)
    threading.Timer(0.3, release.set).start()
    with memory_slot(paths, on_wait=lambda: events.append("waited")) as held:
        events.append("second in")
        assert held == paths[0]
    t.join()
    assert events == ["first in", "waited", "first out", "second in"]


def test_two_slots_let_two_in_at_once(tmp_path):
    paths = [str(tmp_path / f"slot-{i}") for i in range(2)]
    waited = []
    with memory_slot(paths) as a, memory_slot(paths, on_wait=lambda: waited.append(1)) as b:
        assert {a, b} == set(paths) and not waited


def test_a_process_that_dies_frees_its_slot(tmp_path):
    path = str(tmp_path / "slot-0")
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, sys, time; f = open(sys.argv[1], 'a'); fcntl.flock(f, fcntl.LOCK_EX); "
            "print('held', flush=True); time.sleep(60)",
            path,
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        waited = []
        t = threading.Thread(target=lambda: (time.sleep(0.3), holder.kill()))
        t.start()
        with memory_slot([path], on_wait=lambda: waited.append(1)) as held:
            assert held == path and waited == [1]  # it had to wait for the death
        t.join()
    finally:
        holder.kill()
        holder.wait()


def fake_gpu(monkeypatch, total_gib: float) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    props = SimpleNamespace(total_memory=int(total_gib * 2**30))
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: props)


def configs(*names: str) -> dict:
    return {n: load_scenario(ROOT / "graphs" / f"{n}.toml").config for n in names}


def test_only_scenarios_over_half_an_equal_share_get_slots(monkeypatch, tmp_path):
    cfgs = configs("big-pool", "default", "decode-step")
    big = mutate.check_need(cfgs["big-pool"])
    assert big > 10 * 2**30 and mutate.check_need(cfgs["default"]) < 2**31
    # The decode step's KV cache and reference chunk are counted.
    assert memory_need(cfgs["decode-step"], PAGE_TABLE)[1]["KV cache and reference"] > 2**30
    # The larger of the two builder kinds' needs (big-pool's CSR buffers), and the child's own.
    assert big == memory_need(cfgs["big-pool"], CSR)[0] + mutate.CHILD_BYTES
    fake_gpu(monkeypatch, 139)
    budget = 0.8 * 139 * 2**30
    slots = mutate.memory_slots(cfgs, 12, tmp_path)
    assert set(slots) == {"big-pool"}
    assert len(slots["big-pool"]) == int(budget / 2 // big) >= 1
    assert mutate.memory_slots(cfgs, 1, tmp_path) == {}  # one at a time: nothing to share
    assert mutate.memory_slots(cfgs, 4, tmp_path) == {}  # half a share holds big-pool
    slots = mutate.memory_slots(cfgs, 16, tmp_path)  # the decode step's check is big too
    assert set(slots) == {"big-pool", "decode-step"}
    assert slots["big-pool"] == slots["decode-step"]  # one set of slots for all big checks
    fake_gpu(monkeypatch, 10)  # smaller than one big check: still one slot
    assert len(mutate.memory_slots(cfgs, 16, tmp_path)["big-pool"]) == 1


def test_without_cuda_the_hosts_memory_is_the_budget(monkeypatch, tmp_path):
    cfgs = configs("big-pool", "default")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    pages = {"SC_PHYS_PAGES": 24 * 2**30 // 4096, "SC_PAGE_SIZE": 4096}  # a 24 GiB host
    monkeypatch.setattr(mutate.os, "sysconf", lambda name: pages[name])
    slots = mutate.memory_slots(cfgs, 2, tmp_path)
    assert set(slots) == {"big-pool"} and len(slots["big-pool"]) == 1
    pages["SC_PHYS_PAGES"] *= 10  # 240 GiB: half a share holds big-pool
    assert mutate.memory_slots(cfgs, 2, tmp_path) == {}


def test_the_slots_follow_each_jobs_config(monkeypatch, tmp_path):
    """More replays park more tables: the estimate is of the config the jobs run."""
    cfgs = configs("sglang-h200")
    fake_gpu(monkeypatch, 139)
    few = mutate.check_need(cfgs["sglang-h200"])
    many = cfgs["sglang-h200"].replace(steps=10000)
    assert mutate.check_need(many) > few
    workers = int(0.8 * 139 * 2**30 / 2 / few)  # half a share just holds the scenario's own
    assert mutate.memory_slots(cfgs, workers, tmp_path) == {}
    assert set(mutate.memory_slots({"sglang-h200": many}, workers, tmp_path)) == {"sglang-h200"}


def test_reports_keep_the_scenarios_order_whatever_order_they_ran_in(monkeypatch):
    loaded = [load_scenario(ROOT / "graphs" / f"{n}.toml") for n in ("default", "spec-metadata")]
    ran = []

    def fake_run_isolated(jobs, timeout=None, on_report=None):
        ran.append([j.label for j in jobs])
        return [SimpleNamespace(label=j.label, properties=[], safe=True) for j in jobs]

    monkeypatch.setattr(mutate, "run_isolated", fake_run_isolated)
    outcomes = []
    for k in range(2):
        o = mutate.Outcome("build_page_table", "", True)
        mutate._check_builder(o, k, loaded, {}, 3, None, True)
        outcomes.append(o)
    assert ran == [["default", "spec-metadata"], ["spec-metadata", "default"]]
    for o in outcomes:
        assert list(o.reports) == ["default", "spec-metadata"]
        assert [r.label for r in o.reports.values()] == list(o.reports)


def test_a_stop_asked_for_while_waiting_ends_the_wait(tmp_path):
    paths = [str(tmp_path / "slot-0")]
    with memory_slot(paths), pytest.raises(SlotWaitStopped):
        with memory_slot(paths, should_stop=lambda: True):
            pass


def test_the_time_limit_stands_still_while_the_child_waits_for_a_slot():
    """A check queued behind a big one is not killed for the time it waited."""
    waiting = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1.5)"])
    ended = _wait_for_child(waiting, 0.5, paused=lambda: True)
    assert not ended.timed_out and ended.returncode == 0
    running = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    ended = _wait_for_child(running, 0.5, paused=lambda: False)
    assert ended.timed_out


SLOT_PROBE = """
import fcntl, os
from pagegraph import build_page_table

def notes_its_slot(*args, **kwargs):
    # A second open file description conflicts with the child's own flock on the slot.
    with open(os.environ["SLOT_PATH"], "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            fcntl.flock(f, fcntl.LOCK_UN)
            held = False
        except BlockingIOError:
            held = True
    with open(os.environ["SLOT_NOTES"], "a") as notes:
        notes.write("held\\n" if held else "free\\n")
    build_page_table(*args, **kwargs)
"""


@pytest.mark.heavy
@pytest.mark.parametrize("with_slot", [True, False])
def test_a_jobs_slot_is_held_in_the_child_while_its_check_runs(tmp_path, monkeypatch, with_slot):
    (tmp_path / "slot_probe.py").write_text(textwrap.dedent(SLOT_PROBE))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    slot, notes = tmp_path / "slot-0", tmp_path / "notes.txt"
    monkeypatch.setenv("SLOT_PATH", str(slot))
    monkeypatch.setenv("SLOT_NOTES", str(notes))
    cfg = CheckConfig(max_bs=4, max_context_len=64, page_size=16, steps=4, buckets="pow2")
    slots = (str(slot),) if with_slot else ()
    (report,) = run_isolated(
        [Job("slot_probe:notes_its_slot", cfg, memory_slots=slots)], timeout=120
    )
    assert report.safe, report.format()
    seen = set(notes.read_text().split())
    assert seen == ({"held"} if with_slot else {"free"})
