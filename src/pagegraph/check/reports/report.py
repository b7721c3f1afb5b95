"""What a check found: ``Report`` (the verdict, the property table, the per-bucket table),
its text (``format``) and its JSON (``to_dict`` / ``from_dict``, for a child process's
report), and the ``Failure`` a property names first. Every check reports through it: a
decode-step check adds its ``step`` section (``pagegraph.check.reports.step_report``)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from ..config import ADVICE, ADVICE_PROPERTIES, PROPERTIES, CheckConfig
from .step_report import StepSection, format_step_report


@dataclass
class Failure:
    """The first failing entry of a property."""

    replay: int
    bucket: int
    row: int
    col: int
    expected: int
    got: int
    table: str = "page_table"
    max_bs: int | None = None
    width: int | None = None

    vector: bool = False
    #: the poison the checker writes before each replay (an ``expected`` equal to it means
    #: the entry must stay untouched)
    poison: int | None = None
    #: the failing row's inputs as staged (``seq_len``, ``req_pool_index``), when a batch row
    seq_len: int | None = None
    req_pool_index: int | None = None
    #: the replay's out-of-contract rows and their values, when it had any
    injected: str = ""
    #: what the entry is, when its index alone does not say (a CSR entry's row and page)
    note: str = ""
    #: a vector's entries that must keep the poison, as its kind names them
    #: (``pagegraph.kinds.VectorSpec.untouched``)
    untouched: str = "an entry past the batch"
    #: when the wrong value is what the previous replay left there: which replay that was
    #: (``"left by replay K (bucket B, N real rows)"``)
    stale: str = ""

    def where(self) -> str:
        if self.vector:
            if self.row < 0:
                return f"{self.table}[{self.row}] (canary)"
            return f"{self.table}[{self.row}]" + (f" ({self.note})" if self.note else "")
        if self.max_bs is not None and not 0 <= self.row < self.max_bs:
            return f"{self.table} canary row {'above' if self.row < 0 else 'below'}, col {self.col}"
        cell = f"{self.table}[{self.row}, {self.col}]"
        if self.width is not None and self.col >= self.width:
            cell += " (canary column past the width)"
        return cell + (f" ({self.note})" if self.note else "")

    def meaning(self) -> str:
        """What the expected value stands for: a live entry, or the poison of an entry that
        must stay untouched (and why it must)."""
        if self.poison is None or self.expected != self.poison:
            return "the live entry" if not self.vector else "the reference value"
        if self.vector:
            return f"the poison: {self.untouched} must stay untouched"
        if self.max_bs is not None and not 0 <= self.row < self.max_bs:
            return "the poison: a canary row must stay untouched"
        if self.width is not None and self.col >= self.width:
            return "the poison: a canary column past the table's width must stay untouched"
        return (
            "the poison: an entry past the row's live pages (the stale tail, or a row past "
            "the bucket) must stay untouched"
        )

    def got_meaning(self) -> str:
        """What the value found says happened: ``" (the poison: never written)"`` for an
        entry that should have been written and kept the poison, else ``""`` (a value
        written where the poison must stay, or a wrong value written)."""
        if self.poison is not None and self.got == self.poison != self.expected:
            return " (the poison: never written)"
        if self.stale:
            return f" (stale: {self.stale})"
        return ""

    def __str__(self) -> str:
        text = (
            f"replay {self.replay} (bucket {self.bucket}): {self.where()} "
            f"expected {self.expected} ({self.meaning()}), got {self.got}{self.got_meaning()}"
        )
        if self.seq_len is not None:
            text += (
                f"; row {self.row}: seq_len {self.seq_len}, req_pool_index {self.req_pool_index}"
            )
        if self.injected:
            text += f"; the replay's out-of-contract rows: {self.injected}"
        return text


#: A property's status: only "pass" counts as passed; "advice" is a finding of an advice
#: property (``ADVICE_PROPERTIES``) that does not make a replay wrong or unsafe and never
#: changes the verdict; "skip" says why it could not run, "incomplete" that the run stopped
#: before judging it.
STATUSES = ("pass", "FAIL", "advice", "skip", "incomplete")

#: How a judged property was judged (``PropertyResult.judged``): "real" on a CUDA device with
#: the real thing (CUDA graphs for a property about graphs, the torch or cupti detector for a
#: sync property); "emulated" on the CPU standing in for the device (eager or emulated replays,
#: the Triton interpreter, the cpu sync detector), or with an emulated capture. A property not
#: judged (skip, incomplete) has "".
JUDGED = ("real", "emulated")
#: ``Report.graphs``: what the runner replayed: CUDA graphs, an emulated capture and replay,
#: or nothing captured (eager replays).
GRAPH_MODES = ("cuda", "emulated", "none")
#: The detectors that watch a real device (the cpu detector emulates them).
REAL_DETECTORS = ("torch", "cupti")


@dataclass
class PropertyResult:
    """One property's result: its status (``STATUSES``), what was judged, its first failure."""

    name: str
    status: str = "pass"
    detail: str = ""
    first_failure: Failure | str | None = None
    #: how it was judged (``JUDGED``), "" when it was not (skipped, incomplete)
    judged: str = ""
    #: what it covers, where its check's table is not ``PROPERTIES`` (the decode step's)
    scope: str = ""

    @property
    def passed(self) -> bool | None:
        """True: passed; False: failed; None: skipped or incomplete."""
        return {"pass": True, "FAIL": False}.get(self.status)

    @property
    def covers(self) -> str:
        return self.scope or PROPERTIES.get(self.name, ("?", ""))[0]

    @property
    def kind(self) -> str:
        """``"advice"`` for an advice property, else ``"safety"``."""
        return "advice" if self.name in ADVICE_PROPERTIES else "safety"

    def full_detail(self) -> str:
        """The detail, with the first failure added when failed (unless the detail says it)."""
        detail = self.detail
        if self.first_failure and self.status == "FAIL" and str(self.first_failure) not in detail:
            detail += ("; " if detail else "") + f"first failure: {self.first_failure}"
        return detail

    def fail(self, failure: Failure | str | None = None) -> None:
        self.status = "FAIL"
        if failure is not None and self.first_failure is None:
            self.first_failure = failure

    def advise(self, finding: str, strict: tuple[str, ...] = ()) -> None:
        """An advice finding: status "advice", or "FAIL" when ``strict`` promotes this
        property's advice (``ADVICE`` names). A failure already recorded stays."""
        promoted = any(ADVICE[name] == self.name for name in strict)
        if promoted or self.status == "FAIL":
            self.fail(finding)
            return
        self.status = "advice"
        if self.first_failure is None:
            self.first_failure = finding

    def skip(self, reason: str) -> None:
        self.status = "skip"
        self.detail = reason


@dataclass
class BucketStats:
    """One bucket's row of the report: replays, entries wrong or written out of bounds, syncs,
    and the host time of each replay (us)."""

    bucket: int
    replays: int = 0
    out_of_contract: int = 0
    mismatches: int = 0
    oob_writes: int = 0
    escaped_writes: int = 0
    syncs: int = 0
    replay_us: list[float] = field(default_factory=list)

    @property
    def median_replay_us(self) -> float:
        xs = sorted(self.replay_us)
        return xs[len(xs) // 2] if xs else float("nan")


@dataclass
class Report:
    """Everything one check found: the properties in ``PROPERTIES`` order, the per-bucket
    table, rates and host times; ``verdict`` is SAFE, UNSAFE or INCOMPLETE."""

    builder: str
    config: CheckConfig
    device: str
    #: ``GRAPH_MODES``: "cuda", "emulated" or "none" (a bool is read as "cuda" / "none")
    graphs: str
    properties: list[PropertyResult] = field(default_factory=list)
    buckets: dict[int, BucketStats] = field(default_factory=dict)
    replays: int = 0
    out_of_contract_replays: list[int] = field(default_factory=list)
    capture_ms: float = float("nan")
    detectors: tuple[str, ...] = ()
    errors: dict[str, int] = field(default_factory=dict)
    #: why the run stopped before its last replay, or None
    stopped: str | None = None
    #: what a crashed check process died of, where and on which inputs (stated once)
    crash: str | None = None
    #: checked replays per second, steady state (start-up and capture excluded)
    replays_per_s: float = float("nan")
    #: in-contract replays with a row longer than at capture
    long_replays: int = 0
    #: host time per replay by phase, means in us (a mean, not a median: the workload
    #: generates its steps in batches, and the rate follows the mean): the workload step
    #: (pool model and its device writes), the runner's replay() (staging + graph launch),
    #: and the checker's own work (model, upload, verification launch, bookkeeping; the
    #: read-back once a chunk is not in it); "workload receive" is the part of the workload
    #: step spent getting batches of steps (from the child processes: when it nears the
    #: whole workload step, the children's generation limits the rate)
    phase_us: dict[str, float] = field(default_factory=dict)
    #: whether the workload's host models ran in child processes (``workload_process``)
    workload_in_process: bool = False
    #: milliseconds the replays waited, after capture, for every workload child's first
    #: batch (the children's start-up, outside the steady state; 0 without children)
    workload_start_ms: float = 0.0
    #: whether the replays ran emulated graphs on the CPU (``pagegraph.graph.emulate``)
    emulated: bool = False
    #: a decode-step check's own section (``pagegraph.check.reports.step_report``), else None
    step: StepSection | None = None
    #: wall seconds of the check process by phase (``pagegraph.check.pipeline.phases``): "before"
    #: (the process's start-up, imports and planning, up to the pipeline), "set-up",
    #: "capture", "replays", "after replays", "release"
    wall_s: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if isinstance(self.graphs, bool):
            self.graphs = "cuda" if self.graphs else "none"
        if self.graphs not in GRAPH_MODES:
            raise ValueError(f"graphs must be one of {GRAPH_MODES}, got {self.graphs!r}")

    @property
    def captured(self) -> bool:
        """Whether graphs were captured (real or emulated), not replayed eagerly."""
        return self.graphs != "none"

    @property
    def on_cpu(self) -> bool:
        return not self.device.startswith("cuda")

    def checked_on(self) -> str:
        """Where the verdict stands, e.g. ``on CPU: syncs by the cpu detector, graphs not
        captured``."""
        real = [d for d in self.detectors if d in REAL_DETECTORS]
        if real:
            syncs = f"syncs by {', '.join(real)}"
        elif self.detectors:
            syncs = f"syncs by the {', '.join(self.detectors)} detector"
        else:
            syncs = "syncs not checked"
        graphs = {
            "cuda": "CUDA graphs",
            "emulated": "graphs emulated",
            "none": "graphs not captured",
        }[self.graphs]
        return f"on {'CPU' if self.on_cpu else 'CUDA'}: {syncs}, {graphs}"

    def not_checked(self) -> list[str]:
        """What this device did not check that a GPU run does (or can, for the sanitizer)."""
        missing = [d for d in REAL_DETECTORS if d not in self.detectors]
        names = {"torch": "torch sync-debug", "cupti": "CUPTI"}
        out = [names[d] for d in missing]
        if self.graphs != "cuda":
            out.append("CUDA graph capture")
        if self.on_cpu:
            out += ["compute-sanitizer", "stream ordering"]
        return out

    @property
    def safe(self) -> bool:
        """No property failed and none is incomplete (skipped ones are listed in
        ``skipped`` and do not count as passed; advice never counts against it)."""
        return all(p.status in ("pass", "skip", "advice") for p in self.properties)

    @property
    def advice(self) -> list[PropertyResult]:
        """The advice findings (status "advice"), for the report's advice section."""
        return [p for p in self.properties if p.status == "advice"]

    @property
    def verdict(self) -> str:
        if any(p.status == "FAIL" for p in self.properties):
            return "UNSAFE"
        return "SAFE" if self.safe else "INCOMPLETE"

    @property
    def skipped(self) -> list[str]:
        return [p.name for p in self.properties if p.status == "skip"]

    @property
    def incomplete(self) -> list[str]:
        return [p.name for p in self.properties if p.status == "incomplete"]

    def property(self, name: str) -> PropertyResult:
        return next(p for p in self.properties if p.name == name)

    def _safe_scope(self) -> str:
        """What a SAFE verdict stands on: where it was judged and what was not checked there
        (nothing to add on CUDA with real graphs and detectors), then the skipped properties."""
        parts = []
        missing = self.not_checked()
        if missing:
            parts.append(f"{self.checked_on()}; not checked here: {', '.join(missing)}")
        skipped = "; ".join(f"{p.name}: {p.detail}" for p in self.properties if p.status == "skip")
        if skipped:
            parts.append(f"skipped: {skipped}")
        return f" ({'; '.join(parts)})" if parts else ""

    def to_dict(self) -> dict[str, Any]:
        d = self._to_dict()
        if self.step is not None:
            d["decode_step"] = self.step.to_dict()
        return d

    def _to_dict(self) -> dict[str, Any]:
        return {
            "builder": self.builder,
            "config": dataclasses.asdict(self.config),
            "device": self.device,
            "graphs": self.graphs,
            "emulated": self.emulated,
            "verdict": self.verdict,
            "safe": self.safe,
            "complete": self.stopped is None,
            "stopped": self.stopped,
            "crash": self.crash,
            "replays": self.replays,
            "out_of_contract_replays": len(self.out_of_contract_replays),
            "out_of_contract_replay_indices": self.out_of_contract_replays,
            "capture_ms": self.capture_ms,
            "replays_per_s": self.replays_per_s,
            "long_replays": self.long_replays,
            "phase_us": self.phase_us,
            "workload_in_process": self.workload_in_process,
            "workload_start_ms": self.workload_start_ms,
            "wall_s": self.wall_s,
            "detectors": list(self.detectors),
            "checked_on": self.checked_on(),
            "not_checked": self.not_checked(),
            "errors": self.errors,
            "properties": [
                {
                    "name": p.name,
                    "kind": p.kind,
                    "covers": p.covers,
                    "scope": p.scope,
                    "status": p.status,
                    "judged": p.judged,
                    "detail": p.detail,
                    "first_failure": None if p.first_failure is None else str(p.first_failure),
                }
                for p in self.properties
            ],
            "buckets": [
                {
                    "bucket": b.bucket,
                    "replays": b.replays,
                    "out_of_contract": b.out_of_contract,
                    "mismatches": b.mismatches,
                    "oob_writes": b.oob_writes,
                    "escaped_writes": b.escaped_writes,
                    "syncs": b.syncs,
                    "median_replay_us": b.median_replay_us,
                }
                for b in sorted(self.buckets.values(), key=lambda b: b.bucket)
            ],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Report:
        """The report ``to_dict`` wrote (a child process's, say); per-replay times and the
        first failures come back as text."""
        report = cls(d["builder"], CheckConfig.from_dict(d["config"]), d["device"], d["graphs"])
        report.properties = [
            PropertyResult(
                p["name"],
                p["status"],
                p["detail"],
                p["first_failure"],
                p.get("judged", ""),
                p.get("scope", ""),
            )
            for p in d["properties"]
        ]
        for b in d["buckets"]:
            stats = BucketStats(
                b["bucket"],
                b["replays"],
                b["out_of_contract"],
                b["mismatches"],
                b["oob_writes"],
                b["escaped_writes"],
                b["syncs"],
            )
            if b["median_replay_us"] == b["median_replay_us"]:
                stats.replay_us = [b["median_replay_us"]]
            report.buckets[b["bucket"]] = stats
        report.replays = d["replays"]
        report.out_of_contract_replays = list(d.get("out_of_contract_replay_indices", []))
        report.capture_ms = d["capture_ms"]
        report.replays_per_s = d.get("replays_per_s", float("nan"))
        report.wall_s = dict(d.get("wall_s", {}))
        report.detectors = tuple(d["detectors"])
        report.errors = dict(d["errors"])
        report.stopped = d.get("stopped")
        report.crash = d.get("crash")
        report.long_replays = d.get("long_replays", 0)
        report.phase_us = dict(d.get("phase_us", {}))
        report.workload_in_process = bool(d.get("workload_in_process", False))
        report.workload_start_ms = float(d.get("workload_start_ms", 0.0))
        report.emulated = bool(d.get("emulated", False))
        if report.emulated and report.graphs == "none":  # a report written before the field
            report.graphs = "emulated"
        if d.get("decode_step") is not None:
            report.step = StepSection.from_dict(d["decode_step"], report.config.consumer)
        return report

    def wall_line(self) -> str:
        """Where the check process's wall time went, by phase (empty without figures)."""
        if not self.wall_s:
            return ""
        parts = ", ".join(f"{k} {v:.2f}" for k, v in self.wall_s.items())
        return f"wall s by phase: {parts} (total {sum(self.wall_s.values()):.2f})"

    def replay_mode(self) -> str:
        return {"cuda": "CUDA graphs", "emulated": "emulated graphs", "none": "eager"}[self.graphs]

    def format(self) -> str:
        if self.step is not None:
            return format_step_report(self)
        rate = (
            ""
            if self.replays_per_s != self.replays_per_s
            else (f", {self.replays_per_s:.0f} checked replays/s")
        )
        lines = [
            f"builder {self.builder} on {self.device} ({self.replay_mode()})"
            f", {self.replays} replays ({len(self.out_of_contract_replays)} out of contract, "
            f"{self.config.injection_level} injections)"
            f", capture {self.capture_ms:.1f} ms{rate}, detectors: "
            f"{', '.join(self.detectors) or 'none'}"
            + (
                "; host us a replay (mean): "
                + ", ".join(f"{k} {v:.0f}" for k, v in self.phase_us.items())
                if self.phase_us
                else ""
            )
            + (
                f"; workload in child processes (their start-up waited {self.workload_start_ms:.0f}"
                " ms after capture)"
                if self.workload_in_process
                else ""
            ),
            *([self.wall_line()] if self.wall_s else []),
            "",
            "| bucket | replays | out of contract | mismatches | oob writes | escaped writes "
            "| syncs | replay us (median) |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for b in sorted(self.buckets.values(), key=lambda b: b.bucket):
            lines.append(
                f"| {b.bucket} | {b.replays} | {b.out_of_contract} | {b.mismatches} | "
                f"{b.oob_writes} | {b.escaped_writes} | {b.syncs} | {b.median_replay_us:.1f} |"
            )
        lines += ["", "| property | covers | status | judged | detail |", "|---|---|---|---|---|"]
        for p in self.properties:
            cells = f"{p.name} | {p.covers} | {p.status} | {p.judged or '-'} | {p.full_detail()}"
            lines.append(f"| {cells} |")
        if self.crash:
            lines += ["", f"crash: {self.crash}"]
        advice = self.advice
        if advice:
            lines += ["", "advice (reported, not counted against the verdict; --strict promotes):"]
            lines += [f"- {p.name}: {p.first_failure or p.detail}" for p in advice]
        verdict = self.verdict
        if self.stopped and not self.crash:
            verdict += f" (stopped early: {self.stopped})"
        elif self.crash:
            verdict += " (the check process crashed: see above)"
        elif verdict == "SAFE":
            verdict += self._safe_scope()
        lines += ["", f"verdict: {verdict}"]
        return "\n".join(lines)
