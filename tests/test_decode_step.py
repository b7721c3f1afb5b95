"""Invariant: the decode step, a builder's tables consumed by paged attention in the same graph,
is judged on the attention's output, and each of its properties fails for the bug it names.

A correct builder + consumer pair is SAFE in both formats (page table + ``cache_seqlens``, and
FlashInfer's CSR built in the graph). Planted bugs: a consumer bound by the table's static
width instead of ``cache_seqlens`` (alone, and with a builder that writes the whole width from
``req_to_token``), a CSR consumer that ignores ``kv_last_page_len``, a consumer that lets a
padded row's output into a real row, and one that writes the KV pool's sentinel page. On a CPU
the shapes are tiny and the graphs run eagerly; GPU tests run the shipped scenarios' shapes.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from pagegraph import build_page_table
from pagegraph.check.checker import check_decode_step
from pagegraph.check.config import CheckConfig
from pagegraph.check.pipeline import step_bed as decode_step
from pagegraph.check.pipeline.step_bed import CPU_LIMITS, shrink_for_cpu
from pagegraph.check.reports.report import BucketStats, Report
from pagegraph.check.reports.step_report import share
from pagegraph.check.scenario import ScenarioError, load_scenario
from pagegraph.cli import main
from pagegraph.consumers import csr_decode_attention, paged_decode_attention
from pagegraph.graph.step_consumer import StepShape, default_consumer
from pagegraph.graph.step_graphs import TIMED_PARTS, StepGraphs
from pagegraph.kinds import PAGE_TABLE
from pagegraph.runtime.timing import HostClock, per_call_us, time_interleaved

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = {name: ROOT / "graphs" / f"{name}.toml" for name in ("decode-step", "decode-step-csr")}
CUDA = torch.cuda.is_available()
gpu = pytest.mark.skipif(not CUDA, reason="needs a GPU")

PROPS = (
    "output correct through the consumer",
    "consumer reads only within cache_seqlens",
    "padded rows contained",
    "sentinel page untouched",
    "replays completed",
)


def tiny(fmt: str = "paged", **changes) -> CheckConfig:
    """A config the Triton interpreter runs in seconds (width 4 pages, buckets 1, 2, 4)."""
    base = dict(
        max_bs=4,
        max_context_len=64,
        page_size=16,
        steps=6,
        seed=3,
        consumer=fmt,
        num_q_heads=4,
        num_kv_heads=2,
        head_dim=16,
    )
    return CheckConfig(**{**base, **changes})


def statuses(report) -> dict[str, str]:
    return {p.name: p.status for p in report.properties}


# -- planted consumers -------------------------------------------------------------------------


def static_width_consumer(
    q, k_cache, v_cache, page_table, cache_seqlens, out, *, page_size, workspace
):
    """Bounds every row by the table's static width, not by ``cache_seqlens``."""
    full = torch.full_like(cache_seqlens, page_table.shape[1] * page_size)
    return paged_decode_attention(
        q, k_cache, v_cache, page_table, full, out, page_size=page_size, workspace=workspace
    )


def one_page_over_consumer(
    q, k_cache, v_cache, page_table, cache_seqlens, out, *, page_size, workspace
):
    """Reads one page past every row's length (within the width): the smallest over-read."""
    over = (cache_seqlens + page_size).clamp_max(page_table.shape[1] * page_size)
    return paged_decode_attention(
        q, k_cache, v_cache, page_table, over, out, page_size=page_size, workspace=workspace
    )


def full_last_page_consumer(
    q, k_cache, v_cache, kv_indptr, kv_indices, kv_last_page_len, out, *, page_size, workspace
):
    """Reads every row's last page whole, ignoring ``kv_last_page_len``."""
    full = torch.full_like(kv_last_page_len, page_size)
    return csr_decode_attention(
        q,
        k_cache,
        v_cache,
        kv_indptr,
        kv_indices,
        full,
        out,
        page_size=page_size,
        workspace=workspace,
    )


def padded_leak_consumer(
    q, k_cache, v_cache, page_table, cache_seqlens, out, *, page_size, workspace
):
    """Correct, then mixes the bucket's last row (padded when the batch is short) into row 0:
    zero times a finite value is harmless, zero times NaN is not."""
    paged_decode_attention(
        q,
        k_cache,
        v_cache,
        page_table,
        cache_seqlens,
        out,
        page_size=page_size,
        workspace=workspace,
    )
    out[0].add_(out[out.shape[0] - 1] * 0)
    return out


def sentinel_writer_consumer(
    q, k_cache, v_cache, page_table, cache_seqlens, out, *, page_size, workspace
):
    """Correct, then writes into the sentinel page, past every page of the KV pool (the last
    page of the cache is the discard page, where a masked write may go)."""
    paged_decode_attention(
        q,
        k_cache,
        v_cache,
        page_table,
        cache_seqlens,
        out,
        page_size=page_size,
        workspace=workspace,
    )
    k_cache[k_cache.shape[0] - 2, 0].add_(1)
    return out


def masked_read_consumer(
    q, k_cache, v_cache, page_table, cache_seqlens, out, *, page_size, workspace
):
    """Correct, then loads every entry of each row's table up to the width, stale ones too,
    and masks what it loaded by a multiplication by zero: invisible while stale entries name
    pages of finite data."""
    paged_decode_attention(
        q,
        k_cache,
        v_cache,
        page_table,
        cache_seqlens,
        out,
        page_size=page_size,
        workspace=workspace,
    )
    loaded = k_cache[page_table[: out.shape[0]].long()].float()  # [bs, width, ps, kvh, d]
    out.add_((loaded.sum(dim=(1, 2, 3)) * 0)[:, None, :].to(out.dtype))
    return out


# -- CPU: the correct pairs, the planted bugs ---------------------------------------------------


@pytest.mark.parametrize("fmt", ["paged", "csr"])
@pytest.mark.parametrize(
    "builder",
    ["build_page_table", pytest.param("build_decode_metadata", marks=pytest.mark.cpu_heavy)],
)
def test_correct_pair_is_safe(fmt, builder):
    report = check_decode_step(builder, tiny(fmt))
    assert report.verdict == "SAFE", report.format()
    assert all(statuses(report)[name] == "pass" for name in PROPS)
    assert report.replays == 6 and report.step.rows_checked > 6
    assert "padded rows" in report.property("padded rows contained").detail


@pytest.mark.cpu_heavy  # a decode step: long under the Triton interpreter
def test_static_width_consumer_fails():
    report = check_decode_step("build_page_table", tiny(), consumer=static_width_consumer)
    s = statuses(report)
    assert report.verdict == "UNSAFE"
    assert s["consumer reads only within cache_seqlens"] == "FAIL", report.format()
    assert s["output correct through the consumer"] == "FAIL"
    assert "changed when only entries past the length" in str(
        report.property("consumer reads only within cache_seqlens").first_failure
    )


@pytest.mark.cpu_heavy  # a decode step: long under the Triton interpreter
def test_masked_read_of_stale_entries_fails_on_the_nan_tail_replays(monkeypatch):
    report = check_decode_step("build_page_table", tiny(), consumer=masked_read_consumer)
    assert statuses(report)["output correct through the consumer"] == "FAIL", report.format()
    assert "non-finite" in str(report.property("output correct through the consumer").first_failure)
    # Without the NaN-page replays the masked read is invisible: that is what they are for.
    monkeypatch.setattr(decode_step, "NAN_TAIL_EVERY", 10**6)
    report = check_decode_step("build_page_table", tiny(), consumer=masked_read_consumer)
    assert statuses(report)["output correct through the consumer"] == "pass", report.format()


@pytest.mark.cpu_heavy  # a decode step: long under the Triton interpreter
def test_one_page_over_read_fails():
    report = check_decode_step("build_page_table", tiny(), consumer=one_page_over_consumer)
    assert statuses(report)["consumer reads only within cache_seqlens"] == "FAIL", report.format()


@pytest.mark.cpu_heavy  # a decode step: long under the Triton interpreter
def test_static_width_consumer_trusts_a_whole_width_builder():
    """A builder that writes the whole width (the tail from ``req_to_token``: zeros, padding's
    NaN page, or freed requests' pages) hides the stale tail from the re-run, but a consumer
    bound by the width then reads that tail: the output is wrong."""
    report = check_decode_step("static_width_gather", tiny(), consumer=static_width_consumer)
    assert statuses(report)["output correct through the consumer"] == "FAIL", report.format()


@pytest.mark.cpu_heavy  # a decode step: long under the Triton interpreter
def test_whole_width_builder_with_a_bounded_consumer_is_safe():
    """What the builder writes past the lengths is invisible to a consumer bounded by them."""
    report = check_decode_step("static_width_gather", tiny())
    assert report.verdict == "SAFE", report.format()
    assert all(statuses(report)[name] == "pass" for name in PROPS), report.format()


@pytest.mark.cpu_heavy  # a decode step: long under the Triton interpreter
def test_csr_consumer_ignoring_last_page_len_fails():
    report = check_decode_step("build_page_table", tiny("csr"), consumer=full_last_page_consumer)
    assert statuses(report)["consumer reads only within cache_seqlens"] == "FAIL", report.format()


@pytest.mark.cpu_heavy  # a decode step: long under the Triton interpreter
def test_padded_row_leak_fails():
    report = check_decode_step("build_page_table", tiny(), consumer=padded_leak_consumer)
    s = statuses(report)
    assert s["padded rows contained"] == "FAIL", report.format()
    assert "NaN/Inf queries in padded rows" in str(
        report.property("padded rows contained").first_failure
    )
    assert s["sentinel page untouched"] == "pass"


@pytest.mark.cpu_heavy  # a decode step: long under the Triton interpreter
def test_sentinel_writer_fails():
    report = check_decode_step("build_page_table", tiny(), consumer=sentinel_writer_consumer)
    s = statuses(report)
    assert s["sentinel page untouched"] == "FAIL", report.format()
    assert s["output correct through the consumer"] == "pass"


def test_consumer_that_raises_is_reported():
    def broken(*args, **kwargs):
        raise RuntimeError("planted")

    report = check_decode_step("build_page_table", tiny(), consumer=broken)
    assert statuses(report)["capture"] == "FAIL" and report.verdict == "UNSAFE"
    assert all(statuses(report)[name] == "incomplete" for name in PROPS)


def test_consumer_that_raises_in_a_replay_fails_replays_completed():
    """Eagerly (no graphs, emulated ones included) the consumer's Python runs at every
    replay: one that raises after the warm-up stops the run, and the replay is named."""
    if CUDA:
        pytest.skip("under CUDA graphs the consumer's Python runs only at capture")
    calls = [0]

    def late(*args, **kwargs):
        calls[0] += 1
        if calls[0] > 3:  # the warm-up: one call per bucket (1, 2, 4)
            raise RuntimeError("planted")
        return paged_decode_attention(*args, **kwargs)

    report = check_decode_step("build_page_table", tiny(), consumer=late, emulate=False)
    done = report.property("replays completed")
    assert done.status == "FAIL" and report.verdict == "UNSAFE", report.format()
    assert "replay 0 raised RuntimeError: planted" in str(done.first_failure)
    assert statuses(report)["output correct through the consumer"] == "incomplete"


def test_report_to_dict_and_timing():
    phases = []
    report = check_decode_step("build_page_table", tiny(steps=2), on_phase=phases.append)
    d = report.to_dict()
    assert d["decode_step"]["consumer"] == "paged" and d["verdict"] == "SAFE"
    assert phases == ["setup", "capture", "replay 0", "replay 1", "timing"]  # as every check
    if CUDA:
        assert [t["bucket"] for t in d["decode_step"]["timing"]] == [1, 2, 4]
        assert "back-to-back" in d["decode_step"]["timing_method"]
    else:
        assert "needs a GPU" in d["decode_step"]["timing_skipped"]
        assert "needs a GPU" in report.format()
        assert d["decode_step"]["timing"] == [] and d["decode_step"]["timing_method"] is None


@pytest.mark.cpu_heavy  # a decode step: long under the Triton interpreter
def test_stop_on_failure_stops_at_the_first_failing_replay():
    """Mutation testing: a planted bug stops the run at its first failing replay, untimed;
    a correct pair with the same flag runs every replay."""
    cfg = tiny(steps=12)
    report = check_decode_step(
        "build_page_table", cfg, consumer=static_width_consumer, stop_on_failure=True
    )
    assert report.verdict == "UNSAFE" and report.replays < cfg.steps, report.format()
    assert report.stopped == f"stopped at the first failure, after {report.replays} replays"
    assert "stopped early" in report.format() and not report.step.timing
    safe = check_decode_step("build_page_table", cfg, stop_on_failure=True)
    assert safe.verdict == "SAFE" and safe.replays == cfg.steps and safe.stopped is None


@pytest.mark.parametrize("stop_at", [None, "timing"])
def test_a_stop_after_the_replays_keeps_the_verdict_and_drops_the_timing(stop_at):
    """A stop that arrives once every replay was judged ends the check with its whole verdict
    (no ``CheckInterrupted``), the timing skipped and saying why; without one the timing runs
    (CUDA) or says it needs a GPU."""
    from pagegraph.check.signals import request_stop, stop_on_signals

    def on_phase(phase: str) -> None:
        if phase == stop_at:
            request_stop()

    with stop_on_signals():
        report = check_decode_step("build_page_table", tiny(steps=3), on_phase=on_phase)
    assert report.verdict == "SAFE" and report.replays == 3 and report.stopped is None
    if stop_at:
        assert report.step.timing_skipped == "a stop was requested after the replays"
        assert not report.step.timing
    else:
        assert bool(report.step.timing) == CUDA
        assert (report.step.timing_skipped is None) == CUDA


def test_timing_iters_zero_means_no_timing():
    report = check_decode_step("build_page_table", tiny(steps=2, timing_iters=0))
    assert report.verdict == "SAFE" and not report.step.timing and report.step.timing_method is None
    if CUDA:
        assert report.step.timing_skipped == "timing_iters = 0"
    with pytest.raises(ValueError, match="timing_iters must be >= 0"):
        check_decode_step("build_page_table", tiny(steps=2, timing_iters=-1))


def test_report_round_trips_with_its_timing():
    report = check_decode_step("build_page_table", tiny("csr", steps=1))
    report.step.timing = {1: (20.0, 5.0, 14.0), 4: (40.0, 6.0, 33.0)}
    for bucket in report.step.timing:  # _timing lists every timed bucket
        report.buckets.setdefault(bucket, BucketStats(bucket))
    report.step.timing_method = "a graph of 20 back-to-back calls"
    back = Report.from_dict(report.to_dict())
    assert back.format() == report.format() and back.step.consumer == "csr"
    assert back.property("replays completed").covers == "builder + consumer"
    rows = {t["bucket"]: t for t in report.to_dict()["decode_step"]["timing"]}
    # The consumer's time is its own measurement, not step minus builder.
    assert rows[1]["consumer_us"] == 14.0 and rows[1]["builder_share"] == 0.25
    assert "| 20.0 | 5.0 | 14.0 | 25% |" in report.format()
    assert "(device us per call: a graph of 20 back-to-back calls)" in report.format()


# -- timing: graphs of N calls, medians over N ------------------------------------------------


def test_per_call_us_is_the_median_replay_over_the_calls():
    assert per_call_us([2.0, 1.0, 100.0], 20) == pytest.approx(100.0)  # 2 ms / 20 = 100 us
    assert per_call_us([1.0, 3.0], 4) == pytest.approx(500.0)
    with pytest.raises(ValueError):
        per_call_us([], 20)
    assert share(5.0, 20.0) == 0.25
    assert share(5.0, 0.0) != share(5.0, 0.0)  # NaN
    assert share(float("nan"), 1.0) != share(float("nan"), 1.0)


class VirtualClock:
    """``HostClock``'s interface over a virtual time the timed bodies advance."""

    def __init__(self):
        self.now, self.begun = 0.0, []

    def begin(self, replays):
        self.begun.append(replays)

    def mark(self):
        return self.now

    def end(self):
        pass

    @staticmethod
    def elapsed_ms(a, b):
        return b - a


def test_time_interleaved_leaves_the_warm_up_out_and_divides_by_the_calls():
    clock = VirtualClock()
    seen = {"step": 0, "builder": 0}
    cost = {"step": 4.0, "builder": 1.0}  # ms a replay of each graph takes, once warm

    def body(name):
        def replay():
            seen[name] += 1
            clock.now += 1000.0 if seen[name] <= 2 else cost[name]  # the warm-up is slow

        return replay

    us = time_interleaved({n: body(n) for n in seen}, calls=10, repeats=5, clock=clock, warmup=2)
    assert us == {"step": pytest.approx(400.0), "builder": pytest.approx(100.0)}
    assert seen == {"step": 7, "builder": 7} and clock.begun == [10]


def _small_step(fmt: str, device: str, lens=(), **kw):
    """A pool on ``device`` with requests of ``lens`` tokens, and ``StepGraphs`` of
    ``build_page_table`` and the format's attention over it (buckets 1, 2, 4)."""
    from pagegraph.check.pipeline.workload_setup import pool_kwargs
    from pagegraph.workload.pool import KVPool

    cfg = tiny(fmt)
    pool = KVPool(**pool_kwargs(cfg), device=device)
    rows = [pool.alloc(n) for n in lens]
    pool.flush()
    shape = StepShape(
        max_bs=4,
        width=cfg.width,
        page_size=cfg.page_size,
        num_pages=pool.num_pages,
        num_q_heads=4,
        num_kv_heads=2,
        head_dim=16,
        dtype=torch.bfloat16,
        fmt=fmt,
    )
    graphs = StepGraphs(
        build_page_table,
        PAGE_TABLE,
        default_consumer(fmt),
        shape,
        pool.req_to_token,
        [1, 2, 4],
        seed=0,
        **kw,
    )
    return pool, rows, graphs


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU path; the GPU times with events")
def test_step_timing_path_runs_eagerly_without_cuda():
    """The timing graphs' bodies (step, builder alone, consumer alone) run and are timed by
    ``HostClock`` when there is no CUDA; the batch loaded through the runner
    (``load_timed_batch``) is in the buffers and the host's lengths, and is kept."""
    _, _, g = _small_step("csr", "cpu")
    g.capture()
    g.load_timed_batch([1, 2], [5, 40])
    assert g.host_lens == [5, 40]
    g.capture_timing(calls=2)
    assert g.seq_lens[:2].tolist() == [5, 40] and g.req_pool_indices[:2].tolist() == [1, 2]
    assert set(g._timing_bodies) == set(TIMED_PARTS) and not g.timing_graphs["step"]
    step, build, consume = g.time_bucket(2, repeats=1, clock=HostClock())
    assert step > 0 and build > 0 and consume > 0
    g.close()


@pytest.mark.parametrize("padding", ["sglang", "vllm"])
def test_the_steps_replays_stage_and_pad_through_the_runner(padding):
    """``StepGraphs.replay()`` is the runner's replay of the staged batch: the real rows'
    inputs are written, the bucket's padded rows get the padding's length, the consumer's
    output comes from the same replay; a replay before ``stage`` is refused."""
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    pool, rows, g = _small_step("paged", dev, lens=(9, 40, 23), padding=padding)
    g.capture()
    with pytest.raises(RuntimeError, match="before stage"):
        g.replay()
    rpi, lens = pool.batch(rows)
    g.stage(rpi, lens)
    g.q[:4].normal_()
    g.out.fill_(float("nan"))
    g.replay()
    assert g.runner.last_bucket == 4 and g.host_lens == lens
    assert g.req_pool_indices[:3].tolist() == rpi and g.seq_lens[:3].tolist() == lens
    assert int(g.seq_lens[3]) == g.runner.padding.seq_len
    assert torch.isfinite(g.out[:3].float()).all(), "the consumer ran in the same replay"
    g.close()


def test_shrink_for_cpu_says_what_changed():
    cfg = load_scenario(SCENARIOS["decode-step"]).config
    small, note = shrink_for_cpu(cfg)
    assert small.num_q_heads == CPU_LIMITS["num_q_heads"] and small.head_dim == 16
    assert small.max_bs == 4 and small.width >= 4
    assert "num_q_heads 32 -> 4" in note and "no CUDA" in note
    assert shrink_for_cpu(small) == (small, None)


# -- scenarios and the command line -------------------------------------------------------------


def test_scenarios_load_with_their_consumer():
    paged = load_scenario(SCENARIOS["decode-step"]).config
    csr = load_scenario(SCENARIOS["decode-step-csr"]).config
    assert (paged.consumer, paged.consumer_dtype, paged.num_q_heads, paged.num_kv_heads) == (
        "paged",
        "bfloat16",
        32,
        8,
    )
    assert paged.head_dim == 128 and paged.max_bs == 64 and paged.buckets == "sglang"
    assert (csr.consumer, csr.consumer_dtype, csr.page_size) == ("csr", "float16", 16)


@pytest.mark.parametrize(
    "body, key",
    [
        ('[consumer]\nformat = "ragged"\n', "consumer.format"),
        (
            '[consumer]\nformat = "paged"\nnum_q_heads = 6\nnum_kv_heads = 4\n',
            "consumer.num_q_heads",
        ),
        ('[consumer]\nformat = "paged"\nhead_dim = 24\n', "consumer.head_dim"),
        ('[consumer]\nformat = "paged"\ndtype = "float32"\n', "consumer.dtype"),
        ('[consumer]\nformat = "paged"\n[workload]\noverlong = 0.1\n', "workload.overlong"),
        ("[consumer]\nshade = 1\n", "consumer.shade"),
        ('[consumer]\ndtype = "float16"\n', "consumer.format"),
    ],
)
def test_bad_consumer_keys_fail_on_load(tmp_path, body, key):
    f = tmp_path / "bad.toml"
    f.write_text("[graph]\nmax_bs = 4\nmax_context_len = 64\npage_size = 16\n" + body)
    with pytest.raises(ScenarioError) as info:
        load_scenario(f)
    assert info.value.key == key


def test_cli_runs_the_decode_step(capsys):
    code = main(["check", "decode-step", "--replays", "3"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "consumer reads only within cache_seqlens" in out and "verdict: SAFE" in out
    if not CUDA:
        assert "shapes shrunk" in out


# -- GPU: the shipped scenarios' shapes --------------------------------------------------------


@gpu
@pytest.mark.heavy
@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_scenario_shapes_on_gpu(name):
    s = load_scenario(SCENARIOS[name])
    report = check_decode_step(s.builder, s.config.replace(steps=40))
    assert report.verdict == "SAFE" and report.graphs == "cuda", report.format()
    assert set(report.step.timing) == set(report.buckets) and report.step.shrunk is None
    assert all(
        step > build > 0 and consume > 0 for step, build, consume in report.step.timing.values()
    )
    assert "back-to-back" in report.step.timing_method


@gpu
@pytest.mark.parametrize("page_size", [16, 64])
def test_static_width_consumer_fails_on_gpu(page_size):
    cfg = load_scenario(SCENARIOS["decode-step"]).config.replace(steps=10, page_size=page_size)
    report = check_decode_step("build_page_table", cfg, consumer=static_width_consumer)
    assert statuses(report)["consumer reads only within cache_seqlens"] == "FAIL"


@gpu
def test_padded_leak_fails_on_gpu():
    cfg = load_scenario(SCENARIOS["decode-step"]).config.replace(steps=20)
    report = check_decode_step("build_page_table", cfg, consumer=padded_leak_consumer)
    assert statuses(report)["padded rows contained"] == "FAIL", report.format()


def test_check_replay_safety_runs_the_decode_step_a_config_asks_for():
    """``check_replay_safety`` honours a config's consumer: the step end to end, judged on
    the attention's output, with the same report type the CLI prints."""
    from pagegraph.check.checker import check_replay_safety

    seen = []
    report = check_replay_safety("build_page_table", tiny(steps=3), on_chunk=seen.append)
    assert type(report) is Report and report.step is not None, type(report)
    assert statuses(report)["output correct through the consumer"] == "pass", report.format()
    assert seen and seen[-1] is report
    report = check_replay_safety("build_page_table", tiny(steps=3), consumer=None)
    assert "output correct through the consumer" not in statuses(report)
