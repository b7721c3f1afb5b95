"""The decode step's section of a ``Report`` (``StepSection``) and the step report's text.

A check of the decode step (``pagegraph.check.pipeline.step_bed``) reports through the same
``Report`` as every check: its properties (``STEP_PROPERTIES``, each ``PropertyResult``
carrying what it covers), its buckets, replays, capture time, stop and crash. What only the
step has (the consumer, the shapes shrunk for the CPU, the real rows checked, the per-bucket
device times of the step, the builder and the consumer) is its ``step`` section, written to
JSON under ``"decode_step"``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..config import CheckConfig

__all__ = ["STEP_PROPERTIES", "StepReport", "StepSection", "format_step_report", "share"]

#: property -> (what it covers, what makes it fail). The order is the report's.
STEP_PROPERTIES: dict[str, tuple[str, str]] = {
    "capture": ("builder + consumer", "warm-up or capture of a bucket's step raised"),
    "cache write exact": (
        "cache write",
        "after a replay, a real row's new K/V not at the slot the host model gives its new "
        "token, or any other slot of the pool changed (a padded row's write not discarded as "
        "[consumer] pad_slot says)",
    ),
    "output correct through the consumer": (
        "builder + consumer",
        "a real row's output non-finite or outside the reference's tolerance (dense fp32 "
        "attention over the host model's pages, up to its length)",
    ),
    "consumer reads only within cache_seqlens": (
        "consumer (+ builder)",
        "a real row's output that changes when only entries past its length change (the "
        "table's stale tail, other live pages' ids; its last page's slots past the length)",
    ),
    "padded rows contained": (
        "builder + consumer",
        "a real row non-finite, or changed, when the padded rows' queries go from NaN/Inf to "
        "finite values",
    ),
    "padded rows read inside the KV pool": (
        "builder + consumer",
        "with [consumer] null_block = 'finite': a padded row's output non-finite with finite "
        "queries (it read the NaN guard page before page 0, e.g. through a -1 block id, or the "
        "NaN sentinel); skipped with null_block = 'nan'",
    ),
    "null block and guard page untouched": (
        "builder + consumer",
        "the guard page before page 0 changed after capture or a replay, or (null_block = "
        "'finite') page 0, the null block padded rows read, changed after a replay: a write "
        "from a padded row outside the pages requests hold",
    ),
    "sentinel page untouched": (
        "builder + consumer",
        "the KV page past every allocated page changed after capture or a replay",
    ),
    "reader reads only what the current plan wrote": (
        "reader's plan + run",
        "a planned reader's real row that changes when only the workspace entries the step's "
        "plan did not write and an earlier plan did (an earlier plan's values) get other "
        "values (passes trivially without a plan)",
    ),
    "reader reads only workspace a plan wrote": (
        "reader's plan + run",
        "a planned reader's real row that changes when only the workspace entries no plan has "
        "written since allocation get other values (an engine's allocation leaves anything "
        "there; passes trivially without a plan)",
    ),
    "reader stays inside its workspace": (
        "reader's plan + run",
        "a write past the end of a workspace tensor of the reader (each is followed by a "
        "canary holding a poison, read back after capture, each plan, each replay and each "
        "eager call): named by tensor, step, bucket and call, with how far past the end it "
        "wrote (a run-time split count past what the capture sized the workspace for); passes "
        "trivially without a workspace",
    ),
    "sync-free reader": (
        "reader (launch arguments + attention)",
        "a host sync (.item(), .tolist(), indexing with a 0-dim device tensor, ...) in one eager "
        "call of the reader on the capture's batch (the capture's warm-up), under the device's "
        "sync detector (cpu without CUDA, torch's sync-debug mode with it); names its file:line",
    ),
    "reader writes every real row": (
        "reader",
        "a real row of out still holding the poison bit pattern put there before the replay "
        "(named by replay, bucket and row); a length-0 real row must be written too (zeros)",
    ),
    "replay equals eager, bitwise": (
        "reader (graph vs eager)",
        "with [consumer] bitwise = true: replay B's real rows differ in any bit from the "
        "reader's own eager call on the same inputs (the largest ULP difference named); "
        "advice otherwise",
    ),
    "reader reads only its row": (
        "reader",
        "a real row non-finite in replay E, where every table entry outside the rows the graph "
        "reads (page-table rows past the bucket, CSR entries past every span) names the NaN "
        "page: a read past the last real row's width or span",
    ),
    "replays completed": (
        "builder + consumer",
        "a replay raised, or the check process died (run in a child process)",
    ),
}


def share(part: float, whole: float) -> float:
    """``part / whole``, NaN when either is NaN or ``whole`` is not positive."""
    if part != part or whole != whole or whole <= 0:
        return float("nan")
    return part / whole


@dataclass
class StepSection:
    """What a decode-step report holds besides a ``Report``'s fields: the consumer, a note on
    shrunk shapes, the real rows checked and per-bucket timing: ``bucket -> (step us,
    builder us, consumer us)``, device time per call (CUDA only; ``timing_method`` says how
    it was taken)."""

    consumer: str = "paged"
    shrunk: str | None = None
    timing: dict[int, tuple[float, float, float]] = field(default_factory=dict)
    timing_skipped: str | None = None
    timing_method: str | None = None
    rows_checked: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "consumer": self.consumer,
            "shrunk": self.shrunk,
            "rows_checked": self.rows_checked,
            "timing_skipped": self.timing_skipped,
            "timing_method": self.timing_method,
            "timing": [
                {
                    "bucket": b,
                    "step_us": s,
                    "builder_us": u,
                    "consumer_us": c,
                    "builder_share": share(u, s),
                }
                for b, (s, u, c) in sorted(self.timing.items())
            ],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any], consumer: str | None) -> StepSection:
        return cls(
            consumer=d.get("consumer") or consumer or "paged",
            shrunk=d.get("shrunk"),
            rows_checked=d.get("rows_checked", 0),
            timing_skipped=d.get("timing_skipped"),
            timing_method=d.get("timing_method"),
            timing={
                t["bucket"]: (t["step_us"], t["builder_us"], t["consumer_us"])
                for t in d.get("timing", [])
            },
        )


class _BucketRow(Protocol):
    """A bucket's row as the step report reads it
    (``pagegraph.check.reports.report.BucketStats``)."""

    @property
    def bucket(self) -> int: ...
    @property
    def replays(self) -> int: ...
    @property
    def mismatches(self) -> int: ...


class _PropertyRow(Protocol):
    """A property as the step report reads it
    (``pagegraph.check.reports.report.PropertyResult``)."""

    @property
    def name(self) -> str: ...
    @property
    def covers(self) -> str: ...
    @property
    def status(self) -> str: ...
    def full_detail(self) -> str: ...


class StepReport(Protocol):
    """A ``Report`` as its decode-step text reads it (``pagegraph.check.reports.report.Report``,
    which
    imports this module for its ``step`` section)."""

    @property
    def builder(self) -> str: ...
    @property
    def config(self) -> CheckConfig: ...
    @property
    def device(self) -> str: ...
    @property
    def step(self) -> StepSection | None: ...
    @property
    def replays(self) -> int: ...
    @property
    def capture_ms(self) -> float: ...
    @property
    def wall_s(self) -> Mapping[str, float]: ...
    @property
    def buckets(self) -> Mapping[int, _BucketRow]: ...
    @property
    def properties(self) -> Sequence[_PropertyRow]: ...
    @property
    def crash(self) -> str | None: ...
    @property
    def stopped(self) -> str | None: ...
    @property
    def verdict(self) -> str: ...
    def replay_mode(self) -> str: ...
    def wall_line(self) -> str: ...


def format_step_report(report: StepReport) -> str:
    """The text of a decode-step ``Report`` (``report.step`` set): the setup, the per-bucket
    table with the device times, the property table and the verdict."""
    c, step = report.config, report.step
    assert step is not None, "a decode-step report has its step section"
    lines = [
        f"decode step: builder {report.builder} + {step.consumer} attention "
        f"({c.consumer_dtype}, {c.num_q_heads} q heads over {c.num_kv_heads} kv heads, "
        f"head_dim {c.head_dim}, page size {c.page_size}, max_bs {c.max_bs}, context "
        f"{c.max_context_len}) on {report.device} "
        f"({report.replay_mode()}), {report.replays} replays, "
        f"{step.rows_checked} real rows checked, capture {report.capture_ms:.1f} ms",
    ]
    if report.wall_s:
        lines.append(report.wall_line())
    if step.shrunk:
        lines.append(step.shrunk)
    lines += [
        "",
        "| bucket | replays | wrong rows | step us | builder us | consumer us | builder share |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    nan = float("nan")
    for b in sorted(report.buckets.values(), key=lambda b: b.bucket):
        times = step.timing.get(b.bucket, (nan, nan, nan))
        part = share(times[1], times[0])
        pct = "-" if part != part else f"{100 * part:.0f}%"
        cells = " | ".join("-" if t != t else f"{t:.1f}" for t in times)
        lines.append(f"| {b.bucket} | {b.replays} | {b.mismatches} | {cells} | {pct} |")
    if step.timing_method:
        lines.append(f"(device us per call: {step.timing_method})")
    if step.timing_skipped:
        lines.append(f"(timing skipped: {step.timing_skipped})")
    lines += ["", "| property | covers | status | detail |", "|---|---|---|---|"]
    for p in report.properties:
        lines.append(f"| {p.name} | {p.covers} | {p.status} | {p.full_detail()} |")
    if report.crash:
        lines += ["", f"crash: {report.crash}"]
    verdict = report.verdict
    if report.crash:
        verdict += " (the check process crashed: see above)"
    elif report.stopped:
        verdict += f" (stopped early: {report.stopped})"
    return "\n".join([*lines, "", f"verdict: {verdict}"])
