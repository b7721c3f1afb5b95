"""Invariant: the cpu sync detector flags, with its file:line, every operation that would make
the host wait on CUDA when it reads a device-side tensor (scalar reads, copies to the host,
outputs whose shape depends on the data, explicit waits), and none of their sync-free twins,
nor host tensors, nor the Triton interpreter's own argument copies; without CUDA, ``auto``
runs it, so a check fails a syncing builder's "sync-free builder call" and passes (pass, not
skip) a sync-free one."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import numpy as np
import pytest
import torch
import triton
import triton.language as tl

from pagegraph import build_page_table
from pagegraph.check.checker import check_replay_safety
from pagegraph.check.config import CheckConfig
from pagegraph.check.pipeline.table_bed import resolve_detectors
from pagegraph.detect import ranges, sync_cpu, sync_record
from pagegraph.detect.sync import (
    DeviceSyncError,
    available_detectors,
    mark_host,
    no_device_sync,
    parse_detectors,
    record_device_syncs,
)
from pagegraph.kernels.contract import interpreter_active
from pagegraph.kernels.decode_metadata import build_decode_metadata
from pagegraph.kernels.kv_indices import build_kv_indices

CUDA = torch.cuda.is_available()
cpu_only = pytest.mark.skipif(CUDA, reason="the CPU's choice of detectors")
ROOT = Path(__file__).resolve().parent.parent
N = 12


def _t() -> torch.Tensor:
    """A device-side int64 tensor of ``N`` seeded values in [-3, 9) (made outside the region,
    as the bed's buffers are)."""
    g = torch.Generator().manual_seed(7)
    return torch.randint(-3, 9, (N,), generator=g)


# Each pair: a planted operation that waits on CUDA, on the line marked "# SYNC", and a twin
# that keeps the work on the device. Both take the device-side tensor.


def item_sync(t):
    return t.max().item()  # SYNC


def item_twin(t):
    return t.max()


def int_sync(t):
    return int(t[0])  # SYNC


def int_twin(t):
    return t[0] + 1


def float_sync(t):
    return float(t.float().mean())  # SYNC


def float_twin(t):
    return t.float().mean()


def bool_sync(t):
    return t + 1 if bool((t > 0).any()) else t  # SYNC


def bool_twin(t):
    return torch.where((t > 0).any(), t + 1, t)


def index_sync(t):
    return list(range(N))[t[1]]  # SYNC


def index_twin(t):
    return t.index_select(0, t[1:2].clamp(0, N - 1))


def format_sync(t):
    return f"{t[0]}"  # SYNC


def format_twin(t):
    return f"{t.shape[0]} {t.dtype}"


def tolist_sync(t):
    return t.tolist()  # SYNC


def tolist_twin(t):
    return t.clone()


def cpu_sync(t):
    return t.cpu()  # SYNC


def cpu_twin(t):
    return t.to(t.device)


def to_cpu_sync(t):
    return t.to("cpu")  # SYNC


def to_cpu_twin(t):
    return t.to(torch.int32)


def numpy_sync(t):
    return t.numpy()  # SYNC


def numpy_twin(t):
    return t.view(-1)


def asarray_sync(t):
    return np.asarray(t)  # SYNC


def asarray_twin(t):
    return t.reshape(3, -1)


def copy_to_host_sync(t):
    return torch.empty(N, dtype=t.dtype, device="cpu").copy_(t)  # SYNC


def copy_to_host_twin(t):
    return torch.empty(N, dtype=t.dtype, device=t.device).copy_(t)


def nonzero_sync(t):
    return t.nonzero()  # SYNC


def nonzero_twin(t):
    return torch.nonzero_static(t, size=N, fill_value=-1)


def argwhere_sync(t):
    return torch.argwhere(t > 2)  # SYNC


def argwhere_twin(t):
    return torch.nonzero_static(t > 2, size=N)


def where1_sync(t):
    return torch.where(t > 2)  # SYNC


def where1_twin(t):
    return torch.where(t > 2, t, 0)


def mask_index_sync(t):
    return t[t > 2]  # SYNC


def mask_index_twin(t):
    return torch.where(t > 2, t, 0)


def mask_put_sync(t):
    u = t.clone()
    u[u < 0] = 0  # SYNC
    return u


def mask_put_twin(t):
    return t.clone().clamp_(min=0)


def masked_select_sync(t):
    return torch.masked_select(t, t > 2)  # SYNC


def masked_select_twin(t):
    return t * (t > 2)


def repeat_interleave_sync(t):
    return torch.repeat_interleave(t, t.clamp(0, 2))  # SYNC


#: The output's length, known on the host ahead (an engine knows its bound without reading).
RI_SIZE = int(_t().clamp(0, 2).sum())


def repeat_interleave_twin(t):
    return torch.repeat_interleave(t, t.clamp(0, 2), output_size=RI_SIZE)


def unique_sync(t):
    return torch.unique(t)  # SYNC


def unique_twin(t):
    return torch.sort(t).values


def unique_consecutive_sync(t):
    return torch.unique_consecutive(t)  # SYNC


def unique_consecutive_twin(t):
    return torch.diff(t)


def bincount_sync(t):
    return torch.bincount(t.clamp(min=0))  # SYNC


def bincount_twin(t):
    return torch.zeros(9, dtype=t.dtype).scatter_add_(0, t.clamp(0, 8), torch.ones_like(t))


def equal_sync(t):
    return torch.equal(t, t + 0)  # SYNC


def equal_twin(t):
    return torch.eq(t, t + 0).all()


def histc_sync(t):
    return torch.histc(t.float(), bins=4)  # SYNC


def histc_twin(t):
    return torch.histc(t.float(), bins=4, min=-3, max=9)


def created_in_region_sync(t):
    return torch.arange(N).sum().item()  # SYNC


def created_in_region_twin(t):
    return torch.tensor([3, 1, 2]).max().item()  # a host tensor: no device value read


def synchronize_sync(t):
    try:
        torch.cuda.synchronize()  # SYNC
    except (AssertionError, RuntimeError):  # a CPU-only torch cannot, after the event
        pass
    return t


def synchronize_twin(t):
    torch.cuda.is_available()  # a host query of the CUDA module: no wait
    return t


PAIRS = {
    "item": ("scalar read", item_sync, item_twin),
    "int": ("scalar read", int_sync, int_twin),
    "float": ("scalar read", float_sync, float_twin),
    "bool": ("scalar read", bool_sync, bool_twin),
    "__index__": ("scalar read", index_sync, index_twin),
    "format": ("scalar read", format_sync, format_twin),
    "tolist": (".tolist()", tolist_sync, tolist_twin),
    "cpu": (".cpu()", cpu_sync, cpu_twin),
    "to_cpu": ('.to("cpu")', to_cpu_sync, to_cpu_twin),
    "numpy": (".numpy()", numpy_sync, numpy_twin),
    "np.asarray": ("numpy array", asarray_sync, asarray_twin),
    "copy_ to host": ("copy_ into a host tensor", copy_to_host_sync, copy_to_host_twin),
    "nonzero": ("nonzero", nonzero_sync, nonzero_twin),
    "argwhere": ("nonzero", argwhere_sync, argwhere_twin),
    "where(cond)": ("nonzero", where1_sync, where1_twin),
    "bool mask index": ("boolean mask", mask_index_sync, mask_index_twin),
    "bool mask index_put": ("index_put with a boolean mask", mask_put_sync, mask_put_twin),
    "masked_select": ("masked_select", masked_select_sync, masked_select_twin),
    "repeat_interleave": ("repeat_interleave", repeat_interleave_sync, repeat_interleave_twin),
    "unique": ("unique", unique_sync, unique_twin),
    "unique_consecutive": (
        "unique_consecutive",
        unique_consecutive_sync,
        unique_consecutive_twin,
    ),
    "bincount": ("bincount", bincount_sync, bincount_twin),
    "equal": ("equal", equal_sync, equal_twin),
    "histc": ("histc", histc_sync, histc_twin),
    "factory in the region": ("scalar read", created_in_region_sync, created_in_region_twin),
    "synchronize": ("torch.cuda.synchronize()", synchronize_sync, synchronize_twin),
}


def _sync_line(fn) -> int:
    lines, start = inspect.getsourcelines(fn)
    marked = [start + i for i, line in enumerate(lines) if line.rstrip().endswith("# SYNC")]
    assert len(marked) == 1, fn.__name__
    return marked[0]


@pytest.fixture(autouse=True)
def _no_leaked_ranges(no_leaked_ranges):
    """Every test here leaves no NVTX range open (``conftest.no_leaked_ranges``)."""


@pytest.mark.parametrize("case", list(PAIRS))
def test_each_planted_operation_fires_with_its_file_line_and_its_twin_does_not(case):
    what, planted, twin = PAIRS[case]
    t = _t()
    with record_device_syncs("cpu") as rec, ranges.phase("replay", 4):
        planted(t)
    assert rec.detectors == ("cpu",)
    site = f"test_sync_cpu.py:{_sync_line(planted)}"
    assert len(rec.events) == 1, rec.report()
    event = rec.events[0]
    assert event.detector == "cpu" and event.range == "replay/bs=4"
    assert what in event.name and site in event.name, event.name
    assert event.stack and f"line {_sync_line(planted)}" in event.stack
    with record_device_syncs("cpu") as rec:
        twin(t)
    assert rec.events == [], rec.report()


def test_host_tensors_are_not_device_side():
    """Reads of host tensors (made from Python data, with device="cpu", computed from host
    tensors alone, or marked) wait for nothing on CUDA; their device-side twins do."""
    t = _t()
    staging = torch.zeros(N, dtype=torch.int64)
    mark_host(staging)
    with record_device_syncs("cpu") as rec:
        host = torch.tensor([5, 1, 4])
        (host * 2).sum().item()
        torch.from_numpy(np.arange(4)).tolist()
        torch.zeros(3, device="cpu").numpy()
        staging[:4].tolist()
        staging.copy_(staging.flip(0))  # host to host
    assert rec.events == [], rec.report()
    with record_device_syncs("cpu") as rec:
        t.to(device="cpu")  # a copy to the host, and on a CPU no new tensor: t stays device-side
        torch.as_tensor(t, device="cpu")
        (torch.tensor([5, 1, 4]) + t[:3]).sum().item()  # mixed with a device value
        torch.tensor([5, 1, 4], device=t.device).tolist()  # made on the device
        staging.copy_(t)  # a device value into host memory
    assert [e.name.split(" (")[0] for e in rec.events] == [
        '.to("cpu")',
        'torch.as_tensor(tensor, device="cpu")',
        "scalar read",
        ".tolist()",
        "copy_ into a host tensor",
    ], rec.report()


def test_pause_and_resume_stop_and_restart_watching():
    t = _t()
    with record_device_syncs("cpu") as rec:
        rec.pause()
        t.tolist()
        rec.resume()
        t.cpu()
    assert rec.names() and all(".cpu()" in n for n in rec.names()), rec.report()


def test_no_device_sync_with_the_cpu_detector_raises_listing_every_call():
    t = _t()
    with pytest.raises(DeviceSyncError) as info:
        with no_device_sync("cpu"):
            item_sync(t)
            tolist_sync(t)
    text = str(info.value)
    assert "[cpu] scalar read" in text and "[cpu] .tolist()" in text
    assert f"test_sync_cpu.py:{_sync_line(tolist_sync)}" in text
    with no_device_sync("cpu"):
        item_twin(t)


def test_the_detector_leaves_no_mode_or_wrapper_behind():
    from torch.overrides import _get_current_function_mode_stack
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    sync_before = torch.cuda.synchronize
    with record_device_syncs("cpu"):
        assert torch.cuda.synchronize is not sync_before
        assert len(_get_current_dispatch_mode_stack()) == 1
    assert torch.cuda.synchronize is sync_before
    assert not _get_current_dispatch_mode_stack() and not _get_current_function_mode_stack()


# -- the Triton interpreter ------------------------------------------------------------------


@triton.jit
def _add_one(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=mask) + 1, mask=mask)


@pytest.mark.skipif(CUDA, reason="the Triton interpreter runs without CUDA only")
def test_reads_inside_the_interpreters_launch_are_its_own_and_not_counted(monkeypatch):
    """What runs inside an interpreted launch (the interpreter's argument copies, its
    pre-run hooks) is the launch's, not the caller's: the same read outside it fires."""
    t = _t()
    y = torch.empty_like(t)
    seen = []
    monkeypatch.setattr(_add_one, "pre_run_hooks", [lambda x, *a, **k: seen.append(x.tolist())])
    with record_device_syncs("cpu") as rec:
        _add_one[(1,)](t, y, N, BLOCK=16)
    assert seen and rec.events == [], rec.report()
    assert torch.equal(y, t + 1)
    monkeypatch.setattr(sync_cpu, "_interpreter_codes", set())  # the exclusion off
    with record_device_syncs("cpu") as rec:
        _add_one[(1,)](t, y, N, BLOCK=16)
    assert any(".tolist()" in n for n in rec.names()), rec.report()


def _page_table_args(seed: int):
    g = torch.Generator().manual_seed(seed)
    bs, ps, width = 6, 4, 8
    r2t = torch.randint(0, 1000, (bs + 1, ps * width), generator=g, dtype=torch.int32)
    rpi = torch.randperm(bs + 1, generator=g)[:bs].to(torch.int32)
    sl = torch.randint(1, ps * width, (bs,), generator=g, dtype=torch.int32)
    return r2t, rpi, sl, bs, ps, width


def test_pagegraphs_triton_builders_make_no_event():
    """The kernels on the device they run on (the CPU under the interpreter, else CUDA)."""
    dev = "cpu" if interpreter_active() else "cuda"
    r2t, rpi, sl, bs, ps, width = (
        x.to(dev) if isinstance(x, torch.Tensor) else x for x in _page_table_args(3)
    )
    i32 = {"dtype": torch.int32, "device": dev}
    table = torch.full((bs, width), -1, **i32)
    meta = {
        "page_table": torch.full((bs, width), -1, **i32),
        "cache_seqlens": torch.zeros(bs, **i32),
        "cu_seqlens_k": torch.zeros(bs + 1, **i32),
        "cu_seqlens_q": torch.zeros(bs + 1, **i32),
    }
    indptr = torch.zeros(bs + 1, **i32)
    indices = torch.full((bs * width,), -1, **i32)
    with record_device_syncs("cpu") as rec:
        build_page_table(r2t, rpi, sl, table, ps)
        build_decode_metadata(r2t, rpi, sl, ps, **meta)
        build_kv_indices(r2t, rpi, sl, ps, kv_indptr=indptr, kv_indices=indices)
    assert rec.events == [], rec.report()
    # They ran: the first row's pages are there.
    pages = -(-int(sl[0]) // ps)
    want = r2t[int(rpi[0]), ::ps][:pages] // ps
    assert torch.equal(table[0, :pages], want.to(torch.int32))
    assert int(indptr[-1]) == int((-(-sl // ps)).sum())


# -- choosing detectors ----------------------------------------------------------------------


def test_cpu_is_a_detector_that_runs_everywhere():
    assert parse_detectors("cpu") == ("cpu",)
    assert parse_detectors("torch,cpu") == ("torch", "cpu")
    assert available_detectors()["cpu"] is None
    assert sync_record.auto_detectors("cpu") == ("cpu",)
    assert sync_record.auto_detectors("cuda") == ("torch", "cupti")


@cpu_only
def test_the_check_chooses_the_cpu_detector_without_cuda():
    assert resolve_detectors("auto", torch.device("cpu")) == (("cpu",), None)
    assert resolve_detectors("cpu", torch.device("cpu")) == (("cpu",), None)
    assert resolve_detectors("none", torch.device("cpu"))[0] == ()


# -- end to end: the check on a CPU --------------------------------------------------------------

SMALL = CheckConfig(
    max_bs=8,
    max_context_len=256,
    page_size=16,
    num_pages=200,
    steps=6,
    swa=False,
    workload_process="off",
    seed=11,
)


def host_max_builder(
    req_to_token,
    req_pool_indices,
    seq_lens,
    page_table,
    page_size,
    *,
    swa_page_table=None,
    full_to_swa=None,
):
    """A plain-torch builder that reads the batch's longest row on the host."""
    bs, width = page_table.shape
    n = int(seq_lens[:bs].max().item())  # SYNC
    pages = min(-(-max(n, 0) // page_size), width)
    cols = torch.arange(pages, device=page_table.device)
    live = cols[None, :] * page_size < seq_lens[:bs, None]
    rows = req_pool_indices[:bs].long().clamp(0, req_to_token.shape[0] - 1)
    slots = req_to_token[rows][:, ::page_size][:, :pages] // page_size
    torch.where(live, slots.to(page_table.dtype), page_table[:, :pages], out=page_table[:, :pages])


def _readme_builder(tmp_path: Path) -> str:
    text = (ROOT / "README.md").read_text()
    saved = re.search(r"saved as `mybuilder\.py`:\s*```python\n(.*?)```", text, re.S)
    assert saved, "the README's mybuilder.py example is gone"
    path = tmp_path / "mybuilder.py"
    path.write_text(saved.group(1))
    return f"{path}:build"


@cpu_only
def test_check_on_a_cpu_fails_a_builder_that_reads_a_device_value_naming_its_line():
    report = check_replay_safety(host_max_builder, SMALL)
    prop = report.property("sync-free builder call")
    assert prop.status == "FAIL" and prop.judged == "emulated", report.format()
    site = f"test_sync_cpu.py:{_sync_line(host_max_builder)}"
    assert site in str(prop.first_failure), report.format()
    assert site in report.format() and "verdict: UNSAFE" in report.format()
    # Emulated graph replays do not call the builder (its read is frozen at capture, which a
    # GPU would refuse: the capture says so); eager replays do, and sync there.
    assert report.property("sync-free replay path").status == "pass", report.format()
    assert "frozen at capture, a sync on a GPU" in report.property("capture").detail
    eager = check_replay_safety(host_max_builder, SMALL.replace(emulate=False))
    assert eager.property("sync-free replay path").status == "FAIL", eager.format()


@cpu_only
def test_check_on_a_cpu_passes_the_readme_builder_with_the_sync_properties_judged(tmp_path):
    report = check_replay_safety(_readme_builder(tmp_path), SMALL)
    assert report.detectors == ("cpu",)
    for name in ("sync-free builder call", "sync-free replay path"):
        prop = report.property(name)
        assert prop.status == "pass" and prop.judged == "emulated", report.format()
        assert "(cpu)" in prop.detail or prop.detail == "0 sync(s)", prop.detail
    assert report.verdict == "SAFE", report.format()
    graph_safe = report.property("graph-safe (captured short, replayed long)")
    assert graph_safe.status == "pass" and graph_safe.judged == "emulated", report.format()
    verdict = report.format().splitlines()[-1]
    assert verdict.startswith(
        "verdict: SAFE (on CPU: syncs by the cpu detector, graphs "
        "emulated; not checked here: torch sync-debug, CUPTI"
    )
