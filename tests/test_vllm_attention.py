"""Invariant: vLLM 0.34.0's TRITON_ATTN decode step, run from vLLM's own files
(``pagegraph.clients.vllm_attention``: the slot-mapping kernel, ``triton_reshape_and_cache_flash``
and ``unified_attention``, their vLLM imports stubbed), writes each real row's new K/V at
exactly the slot its block table and position give, skips padded rows (PAD_SLOT_ID), and
reads the cache as pagegraph's reference does: the decode step with ``build_page_table`` is
SAFE through the reader ("cache write exact", "output correct through the consumer").

Without vLLM's files every test skips with the reason. Under the CPU interpreter the step runs
in float16: bfloat16 ``unified_attention`` returns garbage there (an interpreter limit; on a GPU
the scenario runs bf16).
"""

from __future__ import annotations

import pytest
import torch

from pagegraph.check.checker import check_decode_step
from pagegraph.clients import vllm_attention as va
from pagegraph.clients.engine_readers import engine_reader
from pagegraph.consumers.reader import PAD_SLOT_ID, CacheWrite, StepInputs
from test_cache_write import tiny

REASON = va.vllm_attention_unavailable_reason()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"vLLM unavailable: {REASON}")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def test_engine_reader_names_resolve_to_triton_attn():
    assert engine_reader("vllm:triton_attn") is va.TRITON_ATTN
    assert engine_reader("vllm:triton_unified_attention") is va.TRITON_ATTN


def test_backend_host_values():
    c = va.load_vllm_attention().constants
    assert c == {"MIN_LAUNCH_GRID_SIZE_2D": 128, "NUM_PAR_SOFTMAX_SEGMENTS": 16}
    # 8 KV heads: 128 // 8 = 16, a capture size; scratch rows min(16, max_num_seqs).
    cfg = va.triton_attn_config(64, 32, 8, 128, c)
    assert (cfg["seq_threshold_3D"], cfg["rows"], cfg["num_par_softmax_segments"]) == (16, 16, 16)
    # 2 KV heads on max_bs 4: the capture size closest to 64 is 4.
    assert va.triton_attn_config(4, 4, 2, 16, c)["seq_threshold_3D"] == 4
    assert va.triton_attn_config(64, 32, 8, 96, c)["head_dim_padded"] == 128


def test_slot_mapping_and_reshape_and_cache_write_exactly_the_expected_slots():
    torch.manual_seed(0)
    ps, pages, hkv, d, bs = 16, 10, 2, 16, 4
    k_cache = torch.randn(pages + 2, ps, hkv, d, dtype=torch.float16, device=DEVICE)
    v_cache = torch.randn_like(k_cache)
    k0, v0 = k_cache.clone(), v_cache.clone()
    table = torch.randperm(pages, device=DEVICE)[: bs * 2].view(bs, 2).to(torch.int32)
    positions = torch.tensor([3, 17, 0, 0], dtype=torch.int64, device=DEVICE)
    idx = torch.tensor([0, 1, 2, -1], dtype=torch.int32, device=DEVICE)  # row 3 padded
    k_new = torch.randn(bs, hkv, d, dtype=torch.float16, device=DEVICE)
    v_new = torch.randn_like(k_new)
    empty = torch.zeros(bs, dtype=torch.int64, device=DEVICE)
    w = CacheWrite(
        k_new, v_new, k_cache, v_cache, empty, positions, idx, table,
        torch.zeros(bs, dtype=torch.int32, device=DEVICE), ps, (pages + 1) * ps,
        StepInputs(table, empty, empty),
    )  # fmt: skip
    plan = va.TRITON_ATTN.workspace(bs, 2, ps, torch.device(DEVICE))
    va.TRITON_ATTN.write_cache(w, plan=plan, **va.TRITON_ATTN.arguments(_host(bs, ps)))
    expected = [int(table[i, positions[i] // ps]) * ps + int(positions[i] % ps) for i in range(3)]
    assert plan["slot_mapping"].tolist() == [*expected, PAD_SLOT_ID]
    k_flat, v_flat = k0.view(-1, hkv, d), v0.view(-1, hkv, d)
    for i, slot in enumerate(expected):
        k_flat[slot], v_flat[slot] = k_new[i], v_new[i]
    # Bitwise: the real rows' slots hold their new K/V, every other slot is untouched.
    assert torch.equal(k_cache.view(torch.int16), k0.view(torch.int16))
    assert torch.equal(v_cache.view(torch.int16), v0.view(torch.int16))


def _host(bs: int, ps: int):
    from pagegraph.consumers.reader import HostBatch

    return HostBatch((1,) * bs, bs, ps, 8)


def test_unified_attention_matches_dense_attention():
    torch.manual_seed(1)
    bs, hq, hkv, d, ps, pages = 3, 4, 2, 16, 16, 12
    k_cache = torch.randn(pages + 2, ps, hkv, d, dtype=torch.float16, device=DEVICE)
    v_cache = torch.randn_like(k_cache)
    table = torch.randint(0, pages, (bs, 8), dtype=torch.int32, device=DEVICE)
    lens = torch.tensor([5, 40, 100], dtype=torch.int32, device=DEVICE)
    q = torch.randn(bs, hq, d, dtype=torch.float16, device=DEVICE)
    out = torch.zeros_like(q)
    plan = va.TRITON_ATTN.workspace(4, 8, ps, torch.device(DEVICE))
    launch = va.TRITON_ATTN.arguments(_host(bs, ps))
    va.TRITON_ATTN.attend(q, k_cache, v_cache, table, lens, out, page_size=ps, workspace=None,
                          plan=plan, **launch)  # fmt: skip
    for i in range(bs):
        n = int(lens[i])
        rows = table[i, : (n + ps - 1) // ps].long()
        k = k_cache[rows].reshape(-1, hkv, d)[:n].float().repeat_interleave(hq // hkv, 1)
        v = v_cache[rows].reshape(-1, hkv, d)[:n].float().repeat_interleave(hq // hkv, 1)
        p = (torch.einsum("hd,lhd->hl", q[i].float(), k) * d**-0.5).softmax(-1)
        ref = torch.einsum("hl,lhd->hd", p, v)
        torch.testing.assert_close(out[i].float(), ref, atol=2e-3, rtol=2e-3)


@pytest.mark.cpu_heavy
def test_decode_step_through_vllms_triton_attn_is_safe():
    # vLLM's own gather builds the table eagerly before each replay, as its model runner does.
    cfg = tiny(padding="vllm", null_block="finite", steps=4)
    report = check_decode_step("vllm_gather_block_tables", cfg, consumer="vllm:triton_attn")
    assert report.verdict == "SAFE", report.format()
    props = {p.name: p for p in report.properties}
    assert props["cache write exact"].status == "pass"
    assert "vllm_attention" in props["cache write exact"].detail
    assert props["output correct through the consumer"].status == "pass"


def test_the_scenario_names_its_reader():
    from pagegraph.check.scenario import load_scenario

    cfg = load_scenario("graphs/vllm-triton-attn.toml").config
    assert cfg.reader == "vllm:triton_attn" and cfg.padding == "vllm"
