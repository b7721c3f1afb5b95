"""Invariant: checks too big to run on every worker at once share a few slots, so a parallel
``pagegraph mutate`` does not run out of GPU memory and call a correct builder NOT SAFE.

A slot is an exclusive ``flock`` on a lock file (``isolate.memory_slot``): a second holder waits
until the first lets go, and a process that dies frees its slot. ``mutate.memory_slots`` gives
slots only to the scenarios that need more than an equal share of the GPU's memory (the
host's without CUDA); the kill
table keeps the scenarios' order whatever order each builder ran them in.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import torch

from pagegraph.check.isolate import memory_slot
from pagegraph.check.scenario import load_scenario
from pagegraph.jobs import mutate
from pagegraph.jobs.check_job import memory_need

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
        [sys.executable, "-c",
         "import fcntl, sys, time; f = open(sys.argv[1], 'a'); fcntl.flock(f, fcntl.LOCK_EX); "
         "print('held', flush=True); time.sleep(60)", path],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
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


def test_only_scenarios_over_an_equal_share_get_slots(monkeypatch, tmp_path):
    loaded = [load_scenario(ROOT / "graphs" / f"{n}.toml") for n in ("big-pool", "default")]
    big = memory_need(loaded[0].config)[0]
    assert big > 8 * 2**30 > 50 * memory_need(loaded[1].config)[0]
    fake_gpu(monkeypatch, 139)
    slots = mutate.memory_slots(loaded, 16, tmp_path)
    assert set(slots) == {"big-pool"}
    assert len(slots["big-pool"]) == int(0.8 * 139 * 2**30 / 2 // big) >= 1
    assert mutate.memory_slots(loaded, 1, tmp_path) == {}  # one job: nothing to share
    assert mutate.memory_slots(loaded, 4, tmp_path) == {}  # a share holds big-pool
    fake_gpu(monkeypatch, 10)  # smaller than one big check: still one slot
    assert len(mutate.memory_slots(loaded, 16, tmp_path)["big-pool"]) == 1


def test_without_cuda_the_hosts_memory_is_the_budget(monkeypatch, tmp_path):
    loaded = [load_scenario(ROOT / "graphs" / f"{n}.toml") for n in ("big-pool", "default")]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    pages = {"SC_PHYS_PAGES": 24 * 2**30 // 4096, "SC_PAGE_SIZE": 4096}  # a 24 GiB host
    monkeypatch.setattr(mutate.os, "sysconf", lambda name: pages[name])
    slots = mutate.memory_slots(loaded, 2, tmp_path)
    assert set(slots) == {"big-pool"} and len(slots["big-pool"]) == 1
    pages["SC_PHYS_PAGES"] *= 10  # 240 GiB: a share holds big-pool
    assert mutate.memory_slots(loaded, 2, tmp_path) == {}


def test_reports_keep_the_scenarios_order_whatever_order_they_ran_in(monkeypatch):
    loaded = [load_scenario(ROOT / "graphs" / f"{n}.toml") for n in ("default", "spec-metadata")]
    ran = []

    def fake_run_isolated(jobs, timeout=None):
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
