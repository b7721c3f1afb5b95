"""The decode step's judges of the reader itself (the attention call ``StepConsumer.consume``
runs, with its launch arguments' host work): it does not sync the host, it writes every real
row of ``out``, a replay gives what its own eager call gives bit for bit, it reads no
table entry outside its row, and it writes nothing past the end of a workspace tensor. Each
is a property of ``STEP_PROPERTIES``; docs/ARCHITECTURE.md ("The decode step end to end")
says what each replay holds.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import numpy as np
import torch

from ...consumers.reader import Reader
from ...detect.sync import record_device_syncs
from ...detect.sync_events import DetectorUnavailable, SyncEvent
from ...graph.step_consumer import OUT_POISON, quiet_interpreter
from ..reports.report import PropertyResult
from .padded_rows import nan_page as nan_page_id
from .protocol import Judge, JudgedAtOnce
from .step_judges import StepBatch, StepRun, StepSeen, changed_rows
from .table_judges import _CAPTURE_ERROR, _sync_site

__all__ = [
    "BITWISE",
    "OWN_ROW",
    "SYNC_FREE",
    "WORKSPACE",
    "WRITES_ROWS",
    "canary_replay",
    "compares_eagerly",
    "eager_rows",
    "ReaderSyncWatch",
    "reader_details",
    "reader_judges",
    "reader_sync_capture_cause",
    "ulp_distance",
]

SYNC_FREE = "sync-free reader"
#: Replay E with canary columns, and the eager comparison where it is advice, run on one step
#: in this many (``sampled``).
CANARY_EVERY = 3
WRITES_ROWS = "reader writes every real row"
BITWISE = "replay equals eager, bitwise"
OWN_ROW = "reader reads only its row"
WORKSPACE = "reader stays inside its workspace"


# -- sync-free reader ----------------------------------------------------------------------------


def _site(event: SyncEvent, reader: Reader) -> str:
    """``WHAT at FILE:LINE`` of a sync: the cpu detector's name says it already; torch's
    comes with a stack, whose innermost frame in the reader's file (else outside pagegraph,
    torch and triton) is the line."""
    name = event.name.removeprefix("sync_debug: ")
    if " at " in name and event.detector == "cpu":
        return name
    return f"{name} at {_sync_site(event.stack, reader.attend)}"


class ReaderSyncWatch:
    """The sync detector around the reader's second call of the capture: a warm-up (eager, on
    the capture's batch: one token a row) after the first, which may set up once what the
    reader keeps, under the device's detector (cpu without CUDA, torch's sync-debug mode
    with it). ``judge`` then fails "sync-free
    reader" naming the first sync's file:line."""

    def __init__(self, run: StepRun) -> None:
        self.run = run
        self.detector = "torch" if run.graphs.device.type == "cuda" else "cpu"
        self.events: list[SyncEvent] = []
        self.bs: int | None = None
        self.unavailable: str | None = None
        run.graphs.consumer.watch = self._after_first

    @contextlib.contextmanager
    def _after_first(self, bs: int) -> Iterator[None]:
        """The reader's first call runs unwatched, as an engine's first warm-up sets up what it
        keeps (pointer tensors, scratch); the watch is set for the next call."""
        try:
            yield
        finally:
            self.run.graphs.consumer.watch = self._watch

    @contextlib.contextmanager
    def _watch(self, bs: int) -> Iterator[None]:
        self.bs = bs
        try:
            rec_cm = record_device_syncs(self.detector)
            rec = rec_cm.__enter__()
        except DetectorUnavailable as exc:
            self.unavailable = str(exc)
            yield
            return
        try:
            yield
        finally:
            rec_cm.__exit__(None, None, None)
            self.events = list(rec.events)

    def judge(self) -> list[str]:
        """Judge "sync-free reader"; the syncs seen (``WHAT at FILE:LINE``)."""
        g, prop = self.run.graphs, self.run.props[SYNC_FREE]
        g.consumer.watch = None
        if self.unavailable is not None:
            prop.skip(f"no sync detector: {self.unavailable}")
            return []
        if self.bs is None:
            return []  # the reader was never called: the capture says why
        reader = g.consumer.reader
        seen = [_site(e, reader) for e in self.events]
        if not seen:
            prop.detail = (
                f"the reader's second warm-up call on the capture's batch (bs={self.bs}) under "
                f"the {self.detector} detector: 0 syncs"
            )
            return []
        prop.fail(
            f"eager call of reader {reader.name!r} on bs={self.bs} (a warm-up of the capture): "
            f"{seen[0]}" + (f"; {len(seen)} sync(s) in all" if len(seen) > 1 else "")
        )
        return seen


def reader_sync_capture_cause(exc: BaseException, syncs: list[str]) -> str | None:
    """The line for a capture that raised because the reader synchronises (the eager call
    before it saw ``syncs``, and the exception reads as a capture error); else None."""
    if not syncs or not _CAPTURE_ERROR.search(str(exc)):
        return None
    return (
        f"capture failed: the reader synchronised ({syncs[0]}), which a CUDA graph cannot "
        f"capture ({type(exc).__name__})"
    )


# -- the replays' extra calls --------------------------------------------------------------------


def sampled(batch: StepBatch) -> bool:
    """Whether a sampled check runs on this step: the first, then one in ``CANARY_EVERY``."""
    return batch.index % CANARY_EVERY == 0


def compares_eagerly(run: StepRun, batch: StepBatch) -> bool:
    """Whether this step's replay is compared with the reader's own eager call: at every step
    where the scenario judges it (``[consumer] bitwise = true``), on the sampled steps where
    it is advice."""
    return run.cfg.bitwise or sampled(batch)


def eager_rows(run: StepRun, batch: StepBatch) -> torch.Tensor:
    """The reader's own eager call (outside the graph) on the bucket, on what the last replay
    left: the staged inputs, the builder's tables, the queries, the cache, the host lengths.
    Returns its real rows (``out`` is overwritten; the next replay poisons it)."""
    g = run.graphs
    quiet = quiet_interpreter() if g.device.type != "cuda" else contextlib.nullcontext()
    with quiet:
        g.consume(batch.bucket)
    if g.plan_space is not None:
        g.plan_space.check_canaries("the reader's eager call (after replay B)")
    return g.out[: len(batch.rpi)].clone()


def canary_replay(
    run: StepRun, batch: StepBatch
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Replay E (after C: padded queries finite; stale tails other live pages): every table
    entry outside the rows the graph reads (the page table's rows past the bucket and its
    canary columns after every row's width, ``StepGraphs.canary``; the reader format's stale
    entries past what the graph builds, ``ReaderFormat.stale``: CSR's ``kv_indices`` past
    every span) names the NaN page, the table's restored after. Returns the
    real rows and, where padded rows are judged (``null_block = "finite"``: their queries are
    finite since C and their entries name pages of data), the padded rows; each None where it
    was not run: E runs where a real row's read past its row lands outside every row (with
    canary columns, always; else ``overread_visible``: in the page-table format, the last real
    row's pages must fill the table's width), or padded rows are judged."""
    g = run.graphs
    n = len(batch.rpi)
    padded = g.null_block != "nan" and n < batch.bucket
    # With canary columns a read past any row shows at every step: one step in CANARY_EVERY
    # runs E (a reader that reads past its row does so whatever the step). Without them, the
    # steps where the format's over-read lands outside every row.
    if g.canary is not None:
        visible = sampled(batch)
    else:
        visible = g.shape.format.overread_visible(batch.lens, g.shape.page_size, g.shape.width)
    if not visible and not padded:
        return None, None
    page = nan_page_id(g.null_block)
    outside = [g.page_table[batch.bucket :]]
    if g.canary is not None:
        outside.append(g.canary[: batch.bucket])
    saved = [t.clone() for t in outside]
    for t in outside:
        t.fill_(page)
    for stale in g.stale:
        stale.fill_(page)
    try:
        g.replay()
        return g.out[:n].clone(), g.out[n : batch.bucket].clone() if padded else None
    finally:
        for t, values in zip(outside, saved):
            t.copy_(values)


def ulp_distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Per element, how many representable values of the dtype lie between ``a`` and ``b``
    (int64; 0 for equal bits, NaN included)."""
    bits = {2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    top = 1 << (8 * a.element_size() - 1)

    def ordered(t: torch.Tensor) -> torch.Tensor:
        v = t.contiguous().view(bits).to(torch.int64)
        return torch.where(v < 0, -(v + top), v)  # sign-magnitude to a monotonic order

    return (ordered(a) - ordered(b)).abs()


# -- the judges --------------------------------------------------------------------------------


def _unwritten(out: torch.Tensor) -> list[int]:
    """Rows holding the poison ``StepGraphs.replay`` wrote into ``out`` before the replay."""
    bits = {2: torch.int16, 4: torch.int32}[out.element_size()]
    poison = OUT_POISON[out.element_size()]
    left = (out.contiguous().view(bits) == poison).flatten(1).any(1)
    return np.flatnonzero(left.cpu().numpy()).tolist()


class WritesEveryRow(JudgedAtOnce):
    """Every element of every real row of each replay's ``out`` written (``out`` holds a
    poison bit pattern, out of any attention output's range, before each replay)."""

    property_name = WRITES_ROWS

    def __init__(self) -> None:
        self.replays = 0

    def observe(self, seen: StepSeen) -> None:
        batch, r = seen.batch, seen.replays
        named = [("A", r.out_a), ("B", r.out_b), ("D", r.out_plan), ("D0", r.out_fresh)]
        named.append(("C", r.out_c))
        named.append(("E", r.out_canary))
        for which, out in named:
            if out is None:
                continue
            self.replays += 1
            rows = _unwritten(out)
            if rows:
                seen.run.props[self.property_name].fail(
                    f"{batch.where(rows[0])}, replay {which} of the step: left unwritten (the "
                    f"poison put in out before the replay stayed); {len(rows)} real row(s)"
                )
                return


class ReplayEqualsEager(JudgedAtOnce):
    """Replay B's real rows bit-identical with the reader's own eager call on the same state;
    the largest ULP difference is kept. A failure with ``[consumer] bitwise = true``, advice
    otherwise."""

    property_name = BITWISE

    def __init__(self) -> None:
        self.steps = 0
        self.max_ulp = 0

    def observe(self, seen: StepSeen) -> None:
        run, batch, r = seen.run, seen.batch, seen.replays
        if r.out_eager is None:
            return
        self.steps += 1
        changed = changed_rows(r.out_b, r.out_eager)
        if not changed:
            return
        ulp = ulp_distance(r.out_b, r.out_eager).flatten(1).max(1).values.cpu()
        worst = int(ulp.max())
        self.max_ulp = max(self.max_ulp, worst)
        prop = run.props[self.property_name]
        what = (
            f"{batch.where(changed[0])}: replay B and the reader's eager call on the same "
            f"inputs differ by up to {int(ulp[changed[0]])} ULP; {len(changed)} row(s) differ, "
            f"largest {worst} ULP"
        )
        if run.cfg.bitwise:
            prop.fail(what)
        else:
            prop.advise(what + " ([consumer] bitwise = false: advice)")


class ReadsOnlyItsRow(JudgedAtOnce):
    """Replay E's real rows finite: with every entry outside the rows the graph reads naming
    the NaN page, and the stale tails other live pages, a NaN came from past a row's end.
    Where padded rows are judged (``null_block = "finite"``), a padded row finite in replay C
    and non-finite in E read past its row too (a dummy row whose length passes its width)."""

    property_name = OWN_ROW

    def __init__(self) -> None:
        self.replays = 0
        #: replays E whose padded rows were judged too (``null_block = "finite"``)
        self.padded = 0

    def observe(self, seen: StepSeen) -> None:
        run, batch, r = seen.run, seen.batch, seen.replays
        out = r.out_canary
        if out is None:
            return
        self.replays += 1
        finite = torch.isfinite(out.float()).flatten(1).all(1).cpu().numpy()
        bad = np.flatnonzero(~finite).tolist()
        if not bad and r.pad_canary is not None and r.pad_c is not None:
            self._judge_padded(seen, r.pad_canary, r.pad_c)
        if bad:
            shape = run.graphs.shape
            where = shape.format.past_row.format(width=shape.width)
            run.props[self.property_name].fail(
                f"{batch.where(bad[0])}: non-finite when only the entries outside every real "
                f"row (the NaN page) and the padded rows' entries could hold NaN: it read "
                f"{where}; {len(bad)} real row(s) non-finite"
            )

    def _judge_padded(self, seen: StepSeen, pad_e: torch.Tensor, pad_c: torch.Tensor) -> None:
        """A padded row finite in replay C and non-finite in E read an entry outside every
        row (E differs from C only there); one non-finite in C already fails "padded rows
        read inside the KV pool"."""
        run, batch = seen.run, seen.batch
        self.padded += 1

        def finite(t: torch.Tensor) -> np.ndarray:
            return torch.isfinite(t.float()).flatten(1).all(1).cpu().numpy()

        bad = np.flatnonzero(finite(pad_c) & ~finite(pad_e)).tolist()
        if not bad:
            return
        n = len(batch.rpi)
        run.props[self.property_name].fail(
            f"replay {batch.index} (bucket {batch.bucket}): padded row {n + bad[0]} (of rows "
            f"{n}..{batch.bucket - 1}, {run.cfg.padding} padding) finite in replay C, "
            f"non-finite in E, where only the page table's rows past the bucket changed (to "
            f"the NaN page): it read past its row (width {run.graphs.shape.width}); "
            f"{len(bad)} padded row(s)"
        )


class StaysInWorkspace(JudgedAtOnce):
    """No write past the end of any of the reader's workspace tensors: each is handed over as
    the head of a longer allocation whose trailing canary holds a poison
    (``pagegraph.graph.plan_workspace``), read back after capture, each plan, each replay and
    each eager call. A changed canary fails, naming the tensor, the step and its bucket, the
    call, and how far past the end it wrote."""

    property_name = WORKSPACE

    def __init__(self) -> None:
        self.steps = 0

    def observe(self, seen: StepSeen) -> None:
        run, batch = seen.run, seen.batch
        space = run.graphs.plan_space
        if space is None:
            return
        self.steps += 1
        found = space.take_overruns()
        if not found:
            return
        first = found[0]
        lens = f"host lengths up to {max(batch.lens, default=0)}"
        where = (
            f"at capture (buckets {sorted(run.graphs.buckets)}, one token a row)"
            if first.during.startswith("capture")
            else f"replay {batch.index} (bucket {batch.bucket}, {len(batch.rpi)} real rows, {lens})"
        )
        more = f"; {len(found)} overruns in this step" if len(found) > 1 else ""
        run.props[self.property_name].fail(f"{where}: {first.describe()}{more}")


def reader_judges() -> tuple[Judge[StepSeen], ...]:
    """Fresh judges of the reader for one run (they keep the run's tallies)."""
    return (WritesEveryRow(), ReplayEqualsEager(), ReadsOnlyItsRow(), StaysInWorkspace())


def reader_details(run: StepRun, judges: tuple[Judge[StepSeen], ...]) -> dict[str, str]:
    """The pass details of the reader's properties, from the run's judges."""
    text: dict[str, str] = {}
    for judge in judges:
        if isinstance(judge, WritesEveryRow):
            text[WRITES_ROWS] = (
                f"{judge.replays} replays with a poison bit pattern in out before each: every "
                "real row written"
            )
        elif isinstance(judge, ReplayEqualsEager):
            mode = (
                "judged at every step"
                if run.cfg.bitwise
                else f"advice ([consumer] bitwise = false), one step in {CANARY_EVERY}"
            )
            text[BITWISE] = (
                f"{judge.steps} replays compared with the reader's eager call on the same "
                f"inputs: largest difference {judge.max_ulp} ULP ({mode})"
            )
        elif isinstance(judge, StaysInWorkspace):
            space = run.graphs.plan_space
            text[WORKSPACE] = (
                "the reader has no workspace: nothing to check (passes trivially)"
                if space is None
                else f"{space.checks} read-backs of the {space.canary_size} canary entries after "
                f"its {len(space.tensors)} workspace tensor(s) (after capture, each plan, each "
                f"replay and eager call, {judge.steps} steps): none changed"
            )
        elif isinstance(judge, ReadsOnlyItsRow):
            padded = f", and padded rows finite in {judge.padded} of them" if judge.padded else ""
            text[OWN_ROW] = (
                f"{judge.replays} replays with the NaN page in every entry outside the rows "
                f"the graph reads: real rows finite{padded}"
                if judge.replays
                else "no replay whose last real row filled the table's width (nor with padded "
                "rows judged): nothing to check"
            )
    return text


def set_details(props: dict[str, PropertyResult], text: dict[str, str]) -> None:
    """``text``'s details on the properties that passed."""
    for name, detail in text.items():
        if props[name].status == "pass":
            props[name].detail = detail
