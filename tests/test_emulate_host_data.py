"""The emulated capture refuses what a CUDA stream capture refuses outright: a device tensor
made from host data (a copy from pageable host memory), so a builder that makes one at every
call fails "capture" on the CPU too; the same values made on the device pass."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pagegraph import check_replay_safety
from pagegraph.check.config import CheckConfig
from pagegraph.graph.emulate import EmulatedGraph, EmulationError

SMALL = CheckConfig(
    max_bs=4,
    max_context_len=256,
    page_size=16,
    buckets=[2, 4],
    steps=6,
    seed=5,
    initial_len=(1, 200),
)


@pytest.mark.parametrize(
    "make",
    [
        lambda dev: torch.tensor([1, 2, 3], device=dev),
        lambda dev: torch.as_tensor(np.arange(3), device=dev),
        lambda dev: torch.tensor(5, dtype=torch.int64, device=dev).expand(3),
    ],
    ids=["tensor-list", "as_tensor-numpy", "tensor-number"],
)
def test_a_device_tensor_from_host_data_is_refused_in_capture(make):
    out = torch.zeros(3, dtype=torch.int64)
    make(out.device)  # outside a capture: fine
    graph = EmulatedGraph()
    with pytest.raises(EmulationError, match="Cannot copy between CPU and CUDA tensors"):
        with graph.capture():
            out.copy_(make(out.device))
    assert not graph.captured


def test_host_tensors_and_device_made_values_are_captured():
    out = torch.zeros(3, dtype=torch.int64)
    graph = EmulatedGraph()
    with graph.capture():
        host = torch.tensor([7, 8])  # a host tensor: no copy to the device
        same = torch.as_tensor(out, device=out.device)  # a tensor already there: no copy
        torch.mul(torch.arange(3, device=same.device), int(host.numel()), out=out)
    out.zero_()
    graph.replay()
    assert out.tolist() == [0, 2, 4]


def _bounded_build(req_to_token, req_pool_indices, seq_lens, page_table, page_size, bounds):
    bs, width = page_table.shape
    pages = torch.div(seq_lens[:bs].long() + page_size - 1, page_size, rounding_mode="floor")
    live = torch.arange(width) < torch.clamp(pages, bounds[0], bounds[1])[:, None]
    rows = req_pool_indices[:bs].long().clamp(0, req_to_token.shape[0] - 1)
    ids = torch.div(req_to_token[:, ::page_size][:, :width][rows], page_size, rounding_mode="floor")
    page_table.copy_(torch.where(live, ids.to(page_table.dtype), page_table))


def host_bounds(req_to_token, req_pool_indices, seq_lens, page_table, page_size):
    bounds = torch.tensor([0, page_table.shape[1]], device=page_table.device)
    _bounded_build(req_to_token, req_pool_indices, seq_lens, page_table, page_size, bounds)


def device_bounds(req_to_token, req_pool_indices, seq_lens, page_table, page_size):
    bounds = torch.arange(2, device=page_table.device) * page_table.shape[1]
    _bounded_build(req_to_token, req_pool_indices, seq_lens, page_table, page_size, bounds)


def test_a_builder_making_a_device_tensor_from_a_list_fails_capture_on_the_cpu():
    report = check_replay_safety(host_bounds, SMALL, device="cpu")
    capture = report.property("capture")
    assert capture.status == "FAIL" and report.verdict == "UNSAFE"
    assert "Cannot copy between CPU and CUDA tensors" in str(capture.first_failure)
    assert "test_emulate_host_data.py" in str(capture.first_failure)  # the builder's line
    # The eager call before it is legal (no sync), as on CUDA.
    assert report.property("sync-free builder call").status == "pass"
    assert check_replay_safety(device_bounds, SMALL, device="cpu").safe


#: Bodies assigning a Python number into a device tensor: (name, body, refused on CUDA).
ASSIGNMENTS = [
    ("one-element", lambda t: t.__setitem__((0, 1), 3), True),
    ("one-element-of-a-row", lambda t: t.__setitem__((1, ..., 2), 5), True),
    ("a-slice", lambda t: t.__setitem__(slice(1, 3), 3), False),
    ("a-row", lambda t: t.__setitem__(2, 7), False),
]


@pytest.mark.parametrize("name,body,refused", ASSIGNMENTS, ids=[a[0] for a in ASSIGNMENTS])
def test_a_number_assigned_to_one_element_is_refused_in_capture(name, body, refused):
    out = torch.zeros(4, 4, dtype=torch.int64)
    graph = EmulatedGraph()
    if refused:
        with pytest.raises(EmulationError, match="one element"):
            with graph.capture():
                body(out)
        assert not graph.captured
        return
    with graph.capture():
        body(out)
    out.zero_()
    graph.replay()
    assert out.count_nonzero().item() > 0  # the fill was recorded and ran again


@pytest.mark.skipif(not torch.cuda.is_available(), reason="a real stream capture needs CUDA")
@pytest.mark.parametrize("name,body,refused", ASSIGNMENTS, ids=[a[0] for a in ASSIGNMENTS])
def test_cuda_capture_refuses_the_same_assignments(name, body, refused):
    out = torch.zeros(4, 4, dtype=torch.int64, device="cuda")
    graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    try:
        with torch.cuda.stream(stream), torch.cuda.graph(graph):
            body(out)
        captured = True
    except RuntimeError as error:
        assert "Cannot copy between CPU and CUDA tensors" in str(error) or "capture" in str(error)
        captured = False
    torch.cuda.synchronize()
    assert captured != refused


def _zeroes_first_element(req_to_token, req_pool_indices, seq_lens, page_table, page_size):
    device_bounds(req_to_token, req_pool_indices, seq_lens, page_table, page_size)
    page_table[0, 0] = page_table[0, 0]  # a tensor value: a device copy, legal
    page_table[-1, -1] = 0  # a Python number into one element: a host copy on CUDA


def test_a_builder_assigning_a_number_to_one_element_fails_capture_on_the_cpu():
    report = check_replay_safety(_zeroes_first_element, SMALL, device="cpu")
    capture = report.property("capture")
    assert capture.status == "FAIL" and "one element" in str(capture.first_failure)
