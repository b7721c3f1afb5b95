"""``pagegraph wild``: the corpus of bugs from the wild, each entry's twins through the bed.

For every entry (``pagegraph.wild``) the buggy twin must be UNSAFE through the entry's
property and the fixed twin SAFE. The job prints a line a check, writes each twin's report
(``DIR/<key>-buggy.md`` / ``.json`` and the fixed twin's) and the table by class
(``--markdown``, ``--json``), and exits 0 when every entry that can run here held, 1 when one
did not, 2 on bad usage (an unknown entry: one line, nothing runs).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from ..check.reports.report import Report
from ..runtime.device import pick_device
from ..runtime.environment import environment
from ..supervise.isolate import write_json_atomic
from ..wild import BUG_CLASSES, WildBug, entries
from ..wild.pending import NOT_YET_EXPRESSIBLE

__all__ = ["EntryResult", "add_arguments", "judge_entry", "main", "run_wild"]

#: The checks' twins, in the order they run.
TWINS = ("buggy", "fixed")


@dataclass
class EntryResult:
    """What the bed said of one entry: each twin's report (``None``: not run here, ``skipped``
    says why; or the check raised, ``errors`` says what)."""

    bug: WildBug
    reports: dict[str, Report]
    skipped: str | None = None
    errors: dict[str, str] | None = None
    seconds: float = 0.0

    @property
    def caught(self) -> bool | None:
        """The buggy twin UNSAFE through the entry's property (None when not run)."""
        r = self.reports.get("buggy")
        if r is None:
            return None
        return not r.safe and r.property(self.bug.prop).status == "FAIL"

    @property
    def fixed_safe(self) -> bool | None:
        r = self.reports.get("fixed")
        return None if r is None else r.safe

    @property
    def held(self) -> bool | None:
        """Both twins as the entry says (None when it could not run here)."""
        if self.skipped is not None:
            return None
        return bool(self.caught) and bool(self.fixed_safe) and not self.errors

    def printed(self) -> str:
        """What the check printed for the buggy twin's property (its first failure)."""
        r = self.reports.get("buggy")
        if r is None:
            return self.skipped or "; ".join((self.errors or {}).values())
        prop = r.property(self.bug.prop)
        return f"{prop.name}: {prop.status} — {prop.full_detail()}"


def judge_entry(bug: WildBug, device: torch.device) -> EntryResult:
    """Run both twins of ``bug`` on ``device`` (or say why it cannot run there)."""
    why = bug.runnable(device)
    if why is not None:
        return EntryResult(bug, {}, skipped=why)
    t0, reports, errors = time.perf_counter(), {}, {}
    for twin in TWINS:
        try:
            reports[twin] = bug.check(twin, device=device)
        except Exception as exc:  # noqa: BLE001 - an entry that raises is reported, not fatal
            errors[twin] = f"{twin} twin raised {type(exc).__name__}: {exc}"
    return EntryResult(bug, reports, errors=errors or None, seconds=time.perf_counter() - t0)


def _verdict(result: EntryResult, twin: str) -> str:
    r = result.reports.get(twin)
    if r is None:
        return "error" if result.errors and twin in result.errors else "-"
    return r.verdict


def _summary(result: EntryResult) -> str:
    held = result.held
    if held is None:
        return f"skipped ({result.skipped})"
    if held:
        return f"held: buggy UNSAFE through '{result.bug.prop}', fixed SAFE"
    parts = []
    if result.errors:
        parts += list(result.errors.values())
    if not result.caught and "buggy" in result.reports:
        parts.append(f"buggy {_verdict(result, 'buggy')}, '{result.bug.prop}' not failed")
    if not result.fixed_safe and "fixed" in result.reports:
        failed = [p.name for p in result.reports["fixed"].properties if p.status == "FAIL"]
        parts.append(f"fixed {_verdict(result, 'fixed')} ({', '.join(failed) or 'incomplete'})")
    return "NOT HELD: " + "; ".join(parts)


def _write_twin_reports(result: EntryResult, folder: Path) -> None:
    for twin, report in result.reports.items():
        stem = folder / f"{result.bug.key}-{twin}"
        head = f"# {result.bug.key}, {twin} twin\n\n{result.bug.ref}: {result.bug.symptom}\n\n"
        stem.with_suffix(".md").write_text(head + report.format() + "\n")
        write_json_atomic(str(stem.with_suffix(".json")), report.to_dict())


def _cell(text: str, limit: int = 220) -> str:
    text = " ".join(text.split()).replace("|", "\\|")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def markdown_table(results: list[EntryResult], reports_dir: str | None) -> list[str]:
    """The corpus table by class, each row linking the thread and, where written, the reports."""
    env = environment()
    where = f"{env['date']} on {env['device']} (torch {env['torch']}, triton {env['triton']})"
    rule = "each buggy twin must be UNSAFE through its property, each fixed twin SAFE."
    lines = ["# Bugs from the wild", "", f"{where}; {rule}", ""]
    held = [r.held for r in results]
    lines += [
        f"{held.count(True)} of {len(results)} entries held, {held.count(False)} not, "
        f"{held.count(None)} not run here.",
        "",
    ]
    for letter, title in BUG_CLASSES.items():
        rows = [r for r in results if r.bug.bug_class == letter]
        if not rows:
            continue
        engines = sorted({r.bug.engine for r in rows})
        further = sum(len(r.bug.fidelity.refs) for r in rows if r.bug.fidelity is not None)
        head = (
            "| entry | engine, version | state | property | buggy | fixed | what it printed "
            "| fidelity |"
        )
        lines += [
            f"## ({letter}) {title}",
            "",
            f"{len(rows)} distinct mechanism(s), one entry each ({further} further thread(s) "
            f"of the same defects); {len(engines)} engine(s): {', '.join(engines)}.",
            "",
            head,
            "|---|---|---|---|---|---|---|---|",
        ]
        for r in rows:
            b = r.bug
            cells = {}
            for twin in TWINS:
                verdict = _verdict(r, twin)
                if reports_dir and twin in r.reports:
                    verdict = f"[{verdict}]({reports_dir}/{b.key}-{twin}.md)"
                cells[twin] = verdict
            lines.append(
                f"| [{b.ref}]({b.url}) | {_cell(b.engine + ' ' + b.version, 80)} | "
                f"{_cell(b.state, 60)} | {b.prop} | {cells['buggy']} | {cells['fixed']} | "
                f"{_cell(r.printed())} | {_fidelity_cell(b)} |"
            )
        lines.append("")
    lines += _not_yet_expressible()
    return lines


def _fidelity_cell(bug: WildBug) -> str:
    """What an entry models, what stands in for what, the fix it follows (short)."""
    fid = bug.fidelity
    if fid is None:
        return "not recorded"
    parts = [f"modelled: {_cell(fid.modelled, 120)}"]
    if fid.stands_in:
        parts.append("stands in: " + "; ".join(_cell(x, 90) for x in fid.stands_in))
    parts.append(f"fix: {_cell(fid.fix, 120)}")
    if fid.refs:
        parts.append("also: " + ", ".join(fid.refs))
    return " <br> ".join(parts)


def _not_yet_expressible() -> list[str]:
    """The public bugs the bed cannot yet reproduce faithfully: listed, never counted."""
    if not NOT_YET_EXPRESSIBLE:
        return []
    lines = [
        "## Not yet expressible (never counted as held)",
        "",
        "| thread | engine | class | the bug | why not yet |",
        "|---|---|---|---|---|",
    ]
    for item in NOT_YET_EXPRESSIBLE:
        repo, number = item.ref.split("#")
        url = f"https://github.com/{repo}/issues/{number}"
        lines.append(
            f"| [{item.ref}]({url}) | {item.engine} | ({item.bug_class}) | "
            f"{_cell(item.summary, 300)} | {_cell(item.why, 400)} |"
        )
    lines.append("")
    return lines


def run_wild(
    keys: list[str],
    *,
    device: str | None,
    markdown: str | None,
    json_path: str | None,
    reports: str | None,
) -> int:
    """Check the named entries (all with none); the exit code."""
    corpus = entries()
    known = {b.key for b in corpus}
    unknown = [k for k in keys if k not in known]
    if unknown:
        print(
            f"pagegraph wild: no entry {', '.join(unknown)} (known: {', '.join(sorted(known))})",
            file=sys.stderr,
        )
        return 2
    chosen = [b for b in corpus if not keys or b.key in keys]
    dev = pick_device(device)
    folder = Path(reports) if reports else None
    if folder is not None:
        folder.mkdir(parents=True, exist_ok=True)
    results, t0 = [], time.perf_counter()
    for k, bug in enumerate(chosen, 1):
        result = judge_entry(bug, dev)
        results.append(result)
        if folder is not None:
            _write_twin_reports(result, folder)
        print(
            f"[{k}/{len(chosen)}] ({bug.bug_class}) {bug.key}: {_summary(result)} "
            f"({result.seconds:.1f} s)",
            flush=True,
        )
    held = [r.held for r in results]
    print(
        f"pagegraph wild: {held.count(True)}/{len(results)} entries held, "
        f"{held.count(False)} not held, {held.count(None)} not run here, "
        f"{time.perf_counter() - t0:.0f} s"
    )
    if markdown:
        rel = None
        if folder is not None:
            rel = os.path.relpath(folder.resolve(), Path(markdown).resolve().parent)
        Path(markdown).write_text("\n".join(markdown_table(results, rel and str(rel))) + "\n")
    if json_path:
        write_json_atomic(json_path, _json_doc(results))
    return 1 if False in held else 0


def _json_doc(results: list[EntryResult]) -> dict[str, object]:
    rows = []
    for r in results:
        b = r.bug
        rows.append(
            {
                "key": b.key,
                "engine": b.engine,
                "version": b.version,
                "ref": b.ref,
                "state": b.state,
                "class": b.bug_class,
                "property": b.prop,
                "needs": b.needs,
                "held": r.held,
                "skipped": r.skipped,
                "errors": r.errors,
                "seconds": r.seconds,
                "buggy": _verdict(r, "buggy"),
                "fixed": _verdict(r, "fixed"),
                "printed": r.printed(),
            }
        )
    return {"environment": environment(), "entries": rows}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("keys", nargs="*", metavar="ENTRY", help="entries to check (default: all)")
    p.add_argument("--device", help="default: CUDA when present, else the CPU")
    p.add_argument("--markdown", metavar="PATH", help="the table by class (profiles/wild.md)")
    p.add_argument("--json", dest="json_path", metavar="PATH", help="the table as JSON")
    p.add_argument("--reports", metavar="DIR", help="each twin's report, DIR/<key>-<twin>.md")
    p.add_argument("--list", action="store_true", help="list the entries and exit")


def main(args: argparse.Namespace) -> int:
    if args.list:
        for b in entries():
            where = "GPU only: " + b.needs if b.needs else "anywhere"
            print(f"({b.bug_class}) {b.key:24} {b.ref:34} {b.prop} [{where}]")
        return 0
    return run_wild(
        args.keys,
        device=args.device,
        markdown=args.markdown,
        json_path=args.json_path,
        reports=args.reports,
    )
