"""What the report of a check says when its child died or its device faulted: the cause read
from the child's stderr (``crash_cause``), the crash stated once in ``Report.crash`` with the
properties it cut short pointing to it (``crash_report``), and a replay that raised a CUDA
error told apart from a verdict (``device_fault``, ``explain_fault``). The serialised re-run
that explains them is ``pagegraph.supervise.isolate``'s.
"""

from __future__ import annotations

import re
import signal
from typing import Any, Protocol

from ..check.config import CheckConfig
from ..check.reports.report import PropertyResult, Report
from ..check.reports.step_report import StepSection
from ..check.run_end import (
    STEP_BED_PROPERTIES,
    TABLE_BED_PROPERTIES,
    Ending,
    RunEnd,
    mark_unfinished,
)


class CrashedJob(Protocol):
    """What a crash report reads of a job (``pagegraph.supervise.isolate.Job``)."""

    @property
    def builder(self) -> str: ...

    @property
    def config(self) -> CheckConfig: ...


def death(returncode: int | None, timed_out: bool) -> str:
    """How a child ended without a final report, from its exit status."""
    if timed_out:
        return "timed out (killed)"
    if returncode in (128 + signal.SIGINT, 128 + signal.SIGTERM):
        # the child's own handler ended it (a stop it was told, or could not obey in time)
        return f"stopped by {signal.Signals(returncode - 128).name}"
    if returncode is not None and returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"killed by {name}"
    return f"exited with code {returncode} without a report"


#: How a CUDA error reads on a child's stderr (torch's message or the driver's text).
CUDA_ERROR = re.compile(
    r"(CUDA error: [^\n]+|an illegal memory access was encountered|device-side assert "
    r"triggered|misaligned address|unspecified launch failure|illegal instruction)"
)


def crash_cause(stderr: str) -> str:
    """The error a dead child's stderr names: its CUDA error if any, else its last line that
    is not the fault handler's (its thread headers, frames, list of extension modules);
    ``""`` when it printed nothing."""
    found = CUDA_ERROR.search(stderr)
    if found:
        text = found.group(1).strip()
        return text if text.startswith("CUDA error") else f"CUDA error: {text}"
    lines = [ln.strip() for ln in stderr.strip().splitlines() if ln.strip()]
    # faulthandler's thread headers read "Thread 0x..." or "Current thread 0x...".
    frames = ("Extension modules:", "File ", "Thread ", "Current thread ")
    lines = [ln for ln in lines if not ln.startswith(frames)]
    return lines[-1][:300] if lines else ""


def report_from_dict(d: dict[str, Any]) -> Report:
    """A child's report from its JSON (a decode-step check's with its ``step`` section)."""
    return Report.from_dict(d)


def _blank_report(job: CrashedJob) -> Report:
    """The report of a check whose child died before writing one: every property
    incomplete."""
    if job.config.consumer:
        from ..check.pipeline.step_bed import step_properties

        report = Report(
            job.builder, job.config, "?", "none", step=StepSection(consumer=job.config.consumer)
        )
        report.properties = list(step_properties("incomplete").values())
        return report
    report = Report(job.builder, job.config, "?", "none")
    report.properties = [
        PropertyResult(name, "incomplete", "") for name in TABLE_BED_PROPERTIES.names
    ]
    return report


#: How a crash or a fault states what the serialised re-run found.
RERUN_FOUND = ". Replayed again with launches serialised, it came from "


def crash_report(
    job: CrashedJob,
    partial: dict[str, Any] | None,
    cause: str,
    phase: str,
    stderr: str,
    explained: str | None = None,
) -> Report:
    """The report of a check whose child died: what it had found, plus the crash, stated
    once (``Report.crash``); the properties it cut short point to it. ``explained``: what a
    serialised re-run found about the crashing replay."""
    report = report_from_dict(partial) if partial is not None else _blank_report(job)
    error = crash_cause(stderr)
    if cause.startswith(("killed", "timed out", "stopped")):
        cause = f"was {cause}"
    crash = f"the check process {cause} during {phase or 'start-up'}"
    if error:
        crash += f": {error}"
    if explained:
        if error and explained.endswith(f": {error}"):
            explained = explained[: -len(f": {error}")]  # the same error: said once
        crash += RERUN_FOUND + explained
    props = {p.name: p for p in report.properties}
    target = "capture" if phase in ("setup", "capture", "") else "replays completed"
    short = f"the check process {cause} during {phase or 'start-up'} (see crash)"
    props[target].status = "FAIL"
    props[target].detail = short
    props[target].first_failure = props[target].first_failure or short
    # A decode step times its graphs after judging every replay: a crash there is a crash of
    # the builder or consumer, but it leaves nothing unjudged (``STEP_BED_PROPERTIES``).
    bed = STEP_BED_PROPERTIES if job.config.consumer else TABLE_BED_PROPERTIES
    why = "not finished: the check process crashed (see crash)"
    mark_unfinished(props, bed, RunEnd(Ending.CRASHED, why, phase))
    report.stopped = short
    report.crash = crash
    return report


#: torch's advice after a CUDA error's message: the same lines after every error.
_TORCH_ADVICE = (
    "Search for `cuda",
    "CUDA kernel errors might",
    "For debugging consider",
    "Compile with `TORCH_USE_CUDA_DSA`",
)


def _one_line(text: str) -> str:
    """``text`` on one line, torch's advice after a CUDA error left out."""
    lines = [ln.strip() for ln in text.splitlines()]
    return " ".join(ln for ln in lines if ln and not ln.startswith(_TORCH_ADVICE))


#: A replay that raised torch's CUDA error type (``AcceleratorError``; ``RuntimeError``
#: before it), the replay's own words up to the error's text.
_RAISED_BY_TORCH = re.compile(r"replay \d+\b[^\n]*? raised (?:AcceleratorError|RuntimeError): ")


def device_fault(report: Report) -> bool:
    """Whether the check's replays ended on a CUDA error that a replay raised (the child
    lived on, but the context is lost, and the error may surface replays after the launch
    that caused it)."""
    stopped = report.stopped or ""
    raised = _RAISED_BY_TORCH.match(stopped)
    return raised is not None and bool(CUDA_ERROR.match(stopped, raised.end()))


def explain_fault(report: Report, explained: str | None) -> None:
    """State a device fault once in ``report.crash``, with what a serialised re-run found."""
    fault = _one_line(report.stopped or "").split(" raised ")[0]
    report.crash = f"{fault} ended on a CUDA error" + (
        RERUN_FOUND + _one_line(explained)
        if explained
        else " (a serialised re-run could not tell which replay caused it)"
    )
