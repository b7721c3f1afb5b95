"""Invariant: a reader format (what the decode step's attention reads) is one module.

``pagegraph.consumers.formats`` registers ``paged`` and ``csr`` from a module each; the step
(its buffers, the graph's metadata build, the attention's call), the bench's stale entries,
the reads-only-its-row replay, the config and the consumer floor go through the registry. A
toy format written to a temporary module (the page table transposed, built in the graph, read
by a kernel of its own call shape) registers itself and runs a decode-step check with no other
change: SAFE with its correct kernel, UNSAFE with one that reads past the lengths. Outside
``consumers/formats/`` no source compares a format's name or keys a table by it.
"""

from __future__ import annotations

import dataclasses
import importlib
import re
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import pagegraph
from pagegraph.check.checker import check_decode_step
from pagegraph.check.config import CheckConfig, ConfigError, validate_config
from pagegraph.consumers import prepare_decode_attention
from pagegraph.consumers.attention_reference import live_kv, tolerances
from pagegraph.consumers.formats import (
    DEFAULT_FORMAT,
    FORMATS,
    ReaderFormat,
    reader_format,
    register_format,
)
from pagegraph.graph.step_consumer import StepShape, default_consumer

TOY = "toy-transposed"
TOY_MODULE = "pagegraph_toy_transposed_format"
TOY_SOURCE = '''
"""A toy reader format: the page table transposed (``[width, max_bs]``), built in the graph."""

import torch

from pagegraph.consumers import paged_decode_attention
from pagegraph.consumers.attention_reference import table_rows
from pagegraph.consumers.formats import FORMATS, ReaderFormat, register_format


def transposed_decode_attention(q, k_cache, v_cache, table_t, cache_seqlens, out, **kw):
    return paged_decode_attention(
        q, k_cache, v_cache, table_t.t().contiguous(), cache_seqlens, out, **kw
    )


def allocate(max_bs, width, device):
    return {"table_t": torch.zeros((width, max_bs), dtype=torch.int32, device=device)}


def build(meta, page_table, cache_seqlens, page_size):
    meta["table_t"][:, : page_table.shape[0]].copy_(page_table.t())


def arguments(meta, page_table, cache_seqlens):
    return meta["table_t"][:, : page_table.shape[0]], cache_seqlens


def rows(args, page_size, bs):
    table_t, lens = args
    return table_rows(table_t[:, :bs].t(), lens[:bs], page_size)


TRANSPOSED = register_format(
    ReaderFormat(
        name="toy-transposed",
        kernel=transposed_decode_attention,
        arguments=arguments,
        rows=rows,
        overread_visible=FORMATS["paged"].overread_visible,
        past_row="the transposed table past its row's width ({width} entries)",
        allocate=allocate,
        build=build,
        stale=lambda meta: (meta["table_t"],),
    )
)
'''


@pytest.fixture
def toy_format(tmp_path, monkeypatch):
    """The toy format's module written to a temporary folder and imported (it registers
    itself); unregistered and forgotten after the test."""
    (tmp_path / f"{TOY_MODULE}.py").write_text(textwrap.dedent(TOY_SOURCE))
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        module = importlib.import_module(TOY_MODULE)
        yield module.TRANSPOSED
    finally:
        FORMATS.pop(TOY, None)
        sys.modules.pop(TOY_MODULE, None)


def tiny(fmt: str, **changes) -> CheckConfig:
    """A config the Triton interpreter runs in seconds (width 4 pages, buckets 1, 2, 4)."""
    base = dict(
        max_bs=4,
        max_context_len=64,
        page_size=16,
        steps=4,
        seed=3,
        consumer=fmt,
        num_q_heads=4,
        num_kv_heads=2,
        head_dim=16,
    )
    return CheckConfig(**{**base, **changes})


def test_the_shipped_formats_are_registered_in_order():
    assert list(FORMATS)[:2] == ["paged", "csr"] and DEFAULT_FORMAT == "paged"
    for name, fmt in FORMATS.items():
        assert isinstance(fmt, ReaderFormat) and fmt.name == name
        assert default_consumer(name) is fmt.kernel


def test_a_second_format_of_a_name_is_refused_and_unknown_names_say_the_known():
    paged = FORMATS["paged"]
    assert register_format(paged) is paged  # the same object again: a no-op
    with pytest.raises(ValueError, match="already registered"):
        register_format(dataclasses.replace(paged, past_row="elsewhere"))
    with pytest.raises(ValueError, match=r"unknown reader format 'nope' \(known: 'paged', 'csr'"):
        reader_format("nope")
    with pytest.raises(ConfigError, match="must be 'paged' or 'csr'"):
        validate_config(tiny("nope"))


#: Where the kernels run: compiled on a GPU, the Triton interpreter without one.
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _built_batch(fmt: ReaderFormat, lens: list[int], page_size: int = 4, width: int = 5):
    """A batch's table over distinct pages and the format's metadata built from it, on
    ``DEVICE``."""
    gen = torch.Generator().manual_seed(len(lens) * 7 + width)
    bs, max_bs = len(lens), len(lens) + 2
    pages = torch.randperm(max_bs * width, generator=gen).to(torch.int32) + 1
    table = pages.view(max_bs, width).to(DEVICE)
    seqlens = torch.tensor(lens + [0] * (max_bs - bs), dtype=torch.int32, device=DEVICE)
    meta = fmt.allocate(max_bs, width, DEVICE)
    for stale in fmt.stale(meta):
        stale.fill_(-1)
    fmt.build(meta, table[:bs], seqlens[:bs], page_size)
    return fmt.arguments(meta, table[:bs], seqlens[:bs]), table, pages.numel() + 1


@pytest.mark.parametrize("with_toy", [False, True])
def test_every_format_kernel_matches_its_reference(with_toy, request):
    """Each registered format's kernel, on the metadata it builds, within tolerance of its own
    reference (``ReaderFormat.reference``), and every format reads the same rows."""
    if with_toy:
        request.getfixturevalue("toy_format")
    lens, ps, heads, dim = [5, 20, 0, 13], 4, (4, 2), 16
    gen = torch.Generator().manual_seed(1)
    q = torch.randn((len(lens), heads[0], dim), generator=gen).to(DEVICE)
    ws = prepare_decode_attention(len(lens), heads[0], dim, device=DEVICE, max_context_len=20)
    want_rows = None
    for fmt in FORMATS.values():
        args, table, num_pages = _built_batch(fmt, lens, ps)
        k = torch.randn((num_pages, ps, heads[1], dim), generator=gen).to(DEVICE)
        v = torch.randn((num_pages, ps, heads[1], dim), generator=gen).to(DEVICE)
        rows = fmt.rows(args, ps, len(lens))
        want_rows = rows if want_rows is None else want_rows
        assert rows == want_rows, fmt.name
        out = torch.empty_like(q)
        fmt.kernel(q, k, v, *args, out, page_size=ps, workspace=ws)
        ref = fmt.reference(q, k, v, *args, page_size=ps)
        atol, rtol = tolerances(q, live_kv(k, v, rows, ps))
        err = (out.float() - ref.float()).abs().flatten(1).amax(1).cpu()
        allowed = atol.cpu() + rtol * ref.float().abs().flatten(1).amax(1).cpu()
        assert bool((err <= allowed).all()), fmt.name


def test_the_step_allocates_and_poisons_through_the_format(toy_format):
    shape = StepShape(4, 5, 16, 30, 4, 2, 16, torch.bfloat16, TOY)
    assert shape.format is toy_format
    stale = toy_format.stale(toy_format.allocate(shape.max_bs, shape.width, torch.device("cpu")))
    assert [tuple(t.shape) for t in stale] == [(5, 4)]


@pytest.mark.cpu_heavy  # a decode step: long under the Triton interpreter
def test_a_toy_format_in_its_own_module_runs_a_decode_step(toy_format):
    """The toy registers from its own module and the whole decode step runs on it: SAFE with
    its kernel; a kernel of its call shape bound by the table's width instead of the lengths
    fails the over-read property, named in the toy's own words where a replay sees it."""
    report = check_decode_step("build_page_table", tiny(TOY))
    assert report.verdict == "SAFE", report.format()
    assert report.step.consumer == TOY
    statuses = {p.name: p.status for p in report.properties}
    assert statuses["output correct through the consumer"] == "pass"
    assert statuses["consumer reads only within cache_seqlens"] == "pass"

    def whole_width(q, k_cache, v_cache, table_t, cache_seqlens, out, **kw):
        full = torch.full_like(cache_seqlens, table_t.shape[0] * kw["page_size"])
        return toy_format.kernel(q, k_cache, v_cache, table_t, full, out, **kw)

    report = check_decode_step("build_page_table", tiny(TOY), consumer=whole_width)
    statuses = {p.name: p.status for p in report.properties}
    assert report.verdict == "UNSAFE", report.format()
    assert statuses["consumer reads only within cache_seqlens"] == "FAIL", report.format()


SRC = Path(pagegraph.__file__).resolve().parent
# A shipped format's name on either side of ==, !=, in or not in, or as a dict key.
NAMED = re.compile(
    r"""(==|!=|\bin)\s*\(?\s*["'](paged|csr)["']|["'](paged|csr)["']\s*(==|!=|\bin\b|:)"""
)


def test_no_format_name_is_dispatched_on_outside_the_formats_package():
    """The rest of pagegraph asks the registry (``FORMATS``, ``ReaderFormat``) instead of
    comparing a format's name or keying a table by it (``test_kinds.py`` holds the kinds to
    the same rule)."""
    formats = SRC / "consumers" / "formats"
    found = {}
    for path in sorted(SRC.rglob("*.py")):
        if formats in path.parents:
            continue
        hits = [line.strip() for line in path.read_text().splitlines() if NAMED.search(line)]
        if hits:
            found[str(path.relative_to(SRC))] = hits
    assert not found, f"format names dispatched on outside consumers/formats: {found}"
    assert NAMED.search('kernels = {"paged": paged_decode_attention}')
    assert NAMED.search('if cfg.consumer == "csr":')
