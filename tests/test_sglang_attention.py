"""SGLang's Triton attention backend's decode as the decode step's reader
(``sglang:triton_decode``), run from SGLang's own kernel files: the step with it is SAFE (its
output within tolerance of dense attention, its cache write exact), the scenario names it, and
the split counts a batch asks for never exceed the ``max_kv_splits`` the workspace was sized
for. Without SGLang installed, every test skips with the reason.

Under the Triton interpreter bf16 dots are widened by value first (the interpreter's own
``tl.dot`` multiplies bf16's raw bits: ``pagegraph.clients.interpreter.fit_interpreter``).
"""

from __future__ import annotations

import sys

import pytest
import torch

from pagegraph.check.checker import check_decode_step
from pagegraph.check.config import CheckConfig
from pagegraph.check.plan import plan_check
from pagegraph.check.scenario import load_scenario
from pagegraph.clients import sglang_attention as sa
from pagegraph.clients.engine_readers import engine_reader

REASON = sa.attention_unavailable_reason()
needs_sglang = pytest.mark.skipif(REASON is not None, reason=f"SGLang unavailable: {REASON}")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
SCENARIO = "graphs/sglang-triton-decode.toml"


def tiny(page_size: int, **changes) -> CheckConfig:
    """A decode step the interpreter runs in seconds, with padded rows, SGLang's way."""
    base = dict(
        max_bs=4,
        max_context_len=128,
        page_size=page_size,
        steps=4,
        seed=11,
        consumer="paged",
        num_q_heads=4,
        num_kv_heads=2,
        head_dim=16,
        buckets=[2, 4],
        initial_len=(20, 100),
        timing_iters=0,
        finish_rate=0.3,
        padding="sglang",
        pad_slot="null",
        null_block="nan",
    )
    return CheckConfig(**{**base, **changes})


@needs_sglang
@pytest.mark.parametrize(
    # page size 1: ~25 s under the interpreter (make test-heavy)
    "page_size",
    [pytest.param(1, marks=pytest.mark.cpu_heavy), pytest.param(16, marks=pytest.mark.cpu_heavy)],
)
def test_the_step_with_sglangs_triton_decode_is_safe(page_size):
    report = check_decode_step("build_page_table", tiny(page_size), consumer="sglang:triton_decode")
    assert report.verdict == "SAFE", report.format()
    props = {p.name: p for p in report.properties}
    assert props["cache write exact"].status == "pass"
    assert "sglang_attention:set_kv_buffer" in props["cache write exact"].detail
    assert props["output correct through the consumer"].status == "pass"


@needs_sglang
def test_the_scenario_names_its_reader():
    cfg = load_scenario(SCENARIO).config
    assert cfg.reader == "sglang:triton_decode"
    assert (cfg.page_size, cfg.padding, cfg.cache_pad_slot) == (1, "sglang", "null")
    plan, _ = plan_check("build_page_table", cfg)
    assert plan.reader == "sglang:triton_decode"
    reader = engine_reader(plan.reader)
    assert reader is sa.TRITON_DECODE and reader.inputs and reader.write_cache is not None


@needs_sglang
def test_decode_attention_loads_without_sglang_in_sys_modules():
    had = {k for k in sys.modules if k == "sglang" or k.startswith("sglang.")}
    module = sa.load_decode_attention()
    assert callable(module.decode_attention_fwd)
    now = {k for k in sys.modules if k == "sglang" or k.startswith("sglang.")}
    assert now == had  # stand-ins answer through the file's own __import__ only
    refuse = sa._importer({})
    with pytest.raises(ImportError, match="not stubbed"):
        refuse("sglang.srt.runtime_context", fromlist=("get_exec",))


@needs_sglang
@pytest.mark.parametrize("cores", [132, 1, 2048])
def test_split_counts_never_exceed_the_workspaces_max_kv_splits(cores):
    """``get_num_kv_splits_triton`` for padded SGLang batches (padded rows' length 1, real
    rows up to the context): every row's count is in ``[1, max_kv_splits]``, so stage 1 never
    writes past ``attn_logits``' split axis and stage 2 never reads past it."""
    gen = torch.Generator().manual_seed(cores)
    max_splits = sa.DEFAULT_MAX_KV_SPLITS
    for trial in range(12):
        bs = int(torch.randint(1, 65, (1,), generator=gen))
        real = int(torch.randint(1, bs + 1, (1,), generator=gen))
        hi = int(torch.randint(1, 131073, (1,), generator=gen))
        lens = torch.ones(bs, dtype=torch.int32)
        lens[:real] = torch.randint(1, hi + 1, (real,), generator=gen, dtype=torch.int32)
        out = torch.full((bs,), -1, dtype=torch.int32)
        lens_d, out_d = lens.to(DEVICE), out.to(DEVICE)
        sa.num_kv_splits(out_d, lens_d, 32, 8, max_splits, core_count=cores)
        got = out_d.cpu()
        assert int(got.min()) >= 1 and int(got.max()) <= max_splits, (trial, lens, got)
