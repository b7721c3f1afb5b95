"""The consumer against the DRAM floor: ``pagegraph bench --consumer-floor``.

For the ``sglang-h200`` shapes, per ``(batch, context)`` case, the device time of decode
attention in each reader format (``pagegraph.consumers.formats.FORMATS``: paged and CSR; a
CUDA graph of ``CALLS`` calls, cycled over copies that keep it out of the L2) beside the time
a ``torch.sum`` over as many bytes of the same pool takes in the same process, each case's
outputs checked first; written as ``consumer-floor.md`` and ``.json``. Without CUDA it exits 2.
The method: docs/ARCHITECTURE.md, "The consumer against the DRAM floor".
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch

from ..check.scenario import load_scenario, scenario_path
from ..consumers import prepare_decode_attention
from ..consumers.attention_reference import attend, live_kv, tolerances
from ..consumers.formats import FORMATS, Metadata, ReaderFormat
from ..graph.buckets import Buckets
from ..runtime.timing import device_time_us
from .bench_settings import bench_environment, error, recover
from .floors import measure_bandwidth

#: The scenario whose page size and batch buckets the cases take.
SCENARIO = "sglang-h200"
NUM_Q_HEADS = 32
NUM_KV_HEADS = 8
HEAD_DIM = 128
DTYPE = torch.bfloat16
CONTEXTS = (4096, 16384, 65536)
BATCHES = (1, 16, 64, 160)
#: Calls per captured graph, and its timed replays.
CALLS = 20
REPLAYS = 30
#: One replay's footprint is at least this many L2 caches (the rotation over disjoint sets).
L2_ROTATION = 4
#: Used when the device does not report its L2 size (the H200's).
DEFAULT_L2_BYTES = 60 * 10**6
#: The H200's peak DRAM bandwidth: a reference column, not the floor.
H200_PEAK_BYTES_PER_S = 4.8e12
#: Elements per reduction of the floor (2 GiB of bf16): each indexes with 32-bit offsets.
FLOOR_CHUNK = 2**30
#: GPU memory left free besides the pool (workspace, graphs, the reference check).
HEADROOM_BYTES = 4 * 2**30


def kv_bytes(lengths: Any, num_kv_heads: int, head_dim: int, itemsize: int) -> int:
    """Bytes of K and V a decode call reads: ``sum(lengths) * num_kv_heads * head_dim * 2 *
    itemsize`` (negative lengths count as 0)."""
    return sum(max(int(n), 0) for n in lengths) * num_kv_heads * head_dim * 2 * itemsize


def rotation_sets(nbytes: int, l2_bytes: int, calls: int = CALLS) -> int:
    """Disjoint copies a graph of ``calls`` calls cycles over so that one replay reads at
    least ``L2_ROTATION * l2_bytes`` (at least 1, at most ``calls``)."""
    if nbytes <= 0:
        return 1
    return max(1, min(calls, math.ceil(L2_ROTATION * l2_bytes / nbytes)))


@dataclass(frozen=True)
class Case:
    """One measured shape: ``bs`` rows of ``context`` tokens, ``sets`` disjoint copies."""

    bs: int
    context: int
    sets: int
    page_size: int

    @property
    def width(self) -> int:
        return -(-self.context // self.page_size)

    @property
    def pages(self) -> int:
        """Pool pages the case's copies hold."""
        return self.sets * self.bs * self.width

    @property
    def nbytes(self) -> int:
        return kv_bytes([self.context] * self.bs, NUM_KV_HEADS, HEAD_DIM, DTYPE.itemsize)


def page_bytes(page_size: int) -> int:
    """Bytes of one page of K and V together."""
    return page_size * NUM_KV_HEADS * HEAD_DIM * DTYPE.itemsize * 2


def plan_cases(
    page_size: int,
    buckets: list[int],
    l2_bytes: int,
    free_bytes: int | None,
    batches: Any = BATCHES,
    contexts: Any = CONTEXTS,
) -> tuple[list[Case], list[str]]:
    """The cases to measure, and a note for each one left out: a batch that is not one of
    ``buckets``, or KV (with its copies) that does not fit ``free_bytes`` less
    ``HEADROOM_BYTES`` (``None``: no limit)."""
    cases, notes = [], []
    budget = None if free_bytes is None else free_bytes - HEADROOM_BYTES
    for bs in batches:
        if bs not in buckets:
            notes.append(f"batch {bs} skipped: not a bucket of {SCENARIO}")
            continue
        for ctx in contexts:
            nbytes = kv_bytes([ctx] * bs, NUM_KV_HEADS, HEAD_DIM, DTYPE.itemsize)
            case = Case(bs, ctx, rotation_sets(nbytes, l2_bytes), page_size)
            need = (case.pages + 1) * page_bytes(page_size)
            if budget is not None and need > budget:
                notes.append(
                    f"batch {bs} x context {ctx} skipped: its KV needs {need / 2**30:.1f} GiB, "
                    f"{max(budget, 0) / 2**30:.1f} GiB free"
                )
                continue
            cases.append(case)
    return cases, notes


# -- the measurement (CUDA) --------------------------------------------------------------------


class _Cycle:
    """A callable that runs its calls in turn, one per call: captured ``CALLS`` times in a
    graph, it binds each copy of the case in order."""

    def __init__(self, calls: list[Any]) -> None:
        self.calls, self.i = calls, 0

    def __call__(self) -> None:
        self.calls[self.i % len(self.calls)]()
        self.i += 1


@dataclass
class _Pool:
    """The KV pool every case draws its pages from (page 0 unused)."""

    k: torch.Tensor
    v: torch.Tensor

    @classmethod
    def make(cls, pages: int, page_size: int, device: str | torch.device = "cuda") -> _Pool:
        dims = (pages + 1, page_size, NUM_KV_HEADS, HEAD_DIM)
        k = torch.empty(dims, dtype=DTYPE, device=device).normal_()
        v = torch.empty(dims, dtype=DTYPE, device=device).normal_()
        return cls(k, v)


def _case_inputs(case: Case, pool: _Pool, gen: torch.Generator) -> dict[str, Any]:
    """A case's tensors: per copy a page table over pages of its own (random, disjoint), and
    per reader format each copy's metadata of the same pages (``ReaderFormat.build``, run once
    here) and its call's positional arguments; one ``q``, ``out`` and workspace."""
    dev = pool.k.device
    pages = torch.randperm(pool.k.shape[0] - 1, generator=gen)[: case.pages] + 1
    tables = pages.to(torch.int32).view(case.sets, case.bs, case.width).to(dev)
    lens = torch.full((case.bs,), case.context, dtype=torch.int32, device=dev)
    metadata: dict[str, list[Metadata]] = {}
    args: dict[str, list[tuple[torch.Tensor, ...]]] = {}
    for name, fmt in FORMATS.items():
        metadata[name], args[name] = [], []
        for s in range(case.sets):
            meta = fmt.allocate(case.bs, case.width, dev)
            fmt.build(meta, tables[s], lens, case.page_size)
            metadata[name].append(meta)
            args[name].append(fmt.arguments(meta, tables[s], lens))
    q = torch.randn((case.bs, NUM_Q_HEADS, HEAD_DIM), generator=gen).to(DTYPE).to(dev)
    ws = prepare_decode_attention(
        case.bs, NUM_Q_HEADS, HEAD_DIM, device=dev, max_context_len=case.width * case.page_size
    )
    return {
        "tables": tables,
        "lens": lens,
        "metadata": metadata,
        "args": args,
        "q": q,
        "out": torch.empty_like(q),
        "ws": ws,
    }


def _calls(case: Case, pool: _Pool, t: dict[str, Any]) -> dict[str, list[Any]]:
    """Per format (and ``floor``), one call per copy of the case."""
    ps, q, out, ws = case.page_size, t["q"], t["out"], t["ws"]

    def attention(fmt: ReaderFormat, s: int) -> None:
        fmt.kernel(q, pool.k, pool.v, *t["args"][fmt.name][s], out, page_size=ps, workspace=ws)

    # The floor reads as many bytes from each of K and V, copy s at offset s * half, in
    # chunks a reduction indexes with 32-bit offsets.
    half = case.nbytes // 2 // DTYPE.itemsize
    kf, vf = pool.k.view(-1), pool.v.view(-1)
    spans = [(a, min(a + FLOOR_CHUNK, half)) for a in range(0, half, FLOOR_CHUNK)]
    acc = torch.zeros(2 * len(spans), dtype=torch.float32, device=pool.k.device)

    def floor(s: int) -> None:
        for j, (a, b) in enumerate(spans):
            for i, flat in enumerate((kf, vf)):
                part = flat[s * half + a : s * half + b]
                torch.sum(part, 0, dtype=torch.float32, out=acc[2 * j + i])

    calls = {
        name: [partial(attention, fmt, s) for s in range(case.sets)]
        for name, fmt in FORMATS.items()
    }
    calls["floor"] = [partial(floor, s) for s in range(case.sets)]
    return calls


def _check(case: Case, pool: _Pool, t: dict[str, Any], calls: dict[str, Any]) -> str | None:
    """Why the case's outputs are wrong, or None: every format bit-identical to the first on
    copy 0, row 0 within the reference's tolerance (read through the first format)."""
    first, *others = FORMATS
    calls[first][0]()
    want = t["out"].clone()
    for name in others:
        calls[name][0]()
        if not torch.equal(want.view(torch.int16), t["out"].view(torch.int16)):
            return f"{first} and {name} outputs differ on the same pages"
    row = FORMATS[first].rows(t["args"][first][0], case.page_size, case.bs)[0]
    kv = live_kv(pool.k, pool.v, [row], case.page_size)
    ref = attend(t["q"][:1], kv)
    atol, rtol = tolerances(t["q"][:1], kv)
    err = (want[:1].float() - ref.float()).abs()
    allowed = float(atol[0]) + rtol * ref.float().abs()
    if not bool(torch.isfinite(want[:1]).all()) or bool((err > allowed).any()):
        return f"row 0 outside the reference's tolerance (max |out - ref| {float(err.max()):.3g})"
    return None


def measure_case(
    case: Case, pool: _Pool, gen: torch.Generator, calls: int = CALLS, replays: int = REPLAYS
) -> dict[str, Any]:
    """One row: the case, its KV bytes, and per format and the floor, device us per call and
    bytes per second; failures go into ``error``, never raised."""
    row: dict[str, Any] = {
        "bs": case.bs,
        "context": case.context,
        "sets": case.sets,
        "kv_bytes": case.nbytes,
        "checked": None,
        "error": None,
    }
    for name in ("floor", *FORMATS):
        row[f"{name}_us"] = row[f"{name}_bytes_per_s"] = None
    try:
        t = _case_inputs(case, pool, gen)
        fns = _calls(case, pool, t)
        problem = _check(case, pool, t, fns)
        row["checked"] = problem is None
        row["error"] = problem
        for name in ("floor", *FORMATS):
            us, graph = device_time_us(_Cycle(fns[name]), calls, replays)
            del graph
            row[f"{name}_us"] = us
            row[f"{name}_bytes_per_s"] = case.nbytes / (us * 1e-6)
    except Exception as exc:  # noqa: BLE001 - the row says what failed, the next case runs
        row["error"] = error(exc)
    finally:
        recover(True)
    derive(row)
    return row


def derive(row: dict[str, Any]) -> dict[str, Any]:
    """Ratios of a row: ``{fmt}_over_floor`` (time over the floor's) and ``{fmt}_of_peak``
    (achieved bandwidth over ``H200_PEAK_BYTES_PER_S``), ``floor_of_peak``; None where a
    time is missing."""
    floor = row.get("floor_us")
    for name in FORMATS:
        us = row.get(f"{name}_us")
        row[f"{name}_over_floor"] = us / floor if us and floor else None
    for name in ("floor", *FORMATS):
        bw = row.get(f"{name}_bytes_per_s")
        row[f"{name}_of_peak"] = bw / H200_PEAK_BYTES_PER_S if bw else None
    return row


def git_commit() -> str:
    """``$PAGEGRAPH_COMMIT`` when set (the caller knows what it copied), else the checkout's
    short commit, else ``"unknown"`` (a copy of the tree without its ``.git``)."""
    if os.environ.get("PAGEGRAPH_COMMIT"):
        return os.environ["PAGEGRAPH_COMMIT"]
    root = Path(__file__).resolve().parents[3]
    try:
        out = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
        )
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return "unknown"


def bench_consumer_floor(
    out_dir: str | Path, batches: Any = BATCHES, contexts: Any = CONTEXTS
) -> dict[str, Any]:
    """Measure every case that fits (CUDA only) and write ``consumer-floor.json`` and
    ``consumer-floor.md`` into ``out_dir``; returns the result (``env``, ``shape``,
    ``rows``, ``notes``)."""
    scenario = load_scenario(scenario_path(SCENARIO))
    cfg = scenario.config
    buckets = Buckets(cfg.buckets, cfg.max_bs).sizes
    env = bench_environment(True)
    env["commit"] = git_commit()
    l2 = env.get("l2_bytes") or DEFAULT_L2_BYTES
    notes: list[str] = []
    try:
        env["copy_bytes_per_s"] = measure_bandwidth()
    except Exception as exc:  # noqa: BLE001 - a reference only: the floor is per case
        env["copy_bytes_per_s"] = None
        notes.append(f"device-to-device copy bandwidth not measured: {error(exc)}")
        recover(True)
    free, _ = torch.cuda.mem_get_info()
    cases, skipped = plan_cases(cfg.page_size, buckets, l2, free, batches, contexts)
    notes += skipped
    rows = []
    if cases:
        pool = _Pool.make(max(c.pages for c in cases), cfg.page_size)
        gen = torch.Generator().manual_seed(0)
        for case in cases:
            print(
                f"[consumer floor] batch {case.bs} x context {case.context} ...",
                file=sys.stderr,
                flush=True,
            )
            rows.append(measure_case(case, pool, gen))
        del pool
        recover(True)
    shape = {
        "scenario": SCENARIO,
        "page_size": cfg.page_size,
        "num_q_heads": NUM_Q_HEADS,
        "num_kv_heads": NUM_KV_HEADS,
        "head_dim": HEAD_DIM,
        "dtype": str(DTYPE),
        "calls": CALLS,
        "replays": REPLAYS,
        "l2_bytes": l2,
        "l2_rotation": L2_ROTATION,
        "peak_bytes_per_s": H200_PEAK_BYTES_PER_S,
    }
    result = {"env": env, "shape": shape, "rows": rows, "notes": notes}
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "consumer-floor.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
    markdown = format_markdown(result)
    (out / "consumer-floor.md").write_text(markdown)
    print(markdown)
    return result


def _num(x: Any, scale: float = 1.0, fmt: str = ".1f") -> str:
    return "-" if x is None else format(x * scale, fmt)


def format_markdown(result: dict[str, Any]) -> str:
    """The report: where and how it was measured, one table row per case, the notes."""
    env, shape = result["env"], result["shape"]
    copy = env.get("copy_bytes_per_s")
    timed = ("floor", *FORMATS)
    lines = [
        "# Paged decode attention against the DRAM floor",
        "",
        f"{env['date']} on {env['device']}, commit {env.get('commit', 'unknown')} "
        f"(torch {env['torch']}, triton {env['triton']}, CUDA {env['cuda']})",
        "",
        f"Shapes of `{shape['scenario']}` (page size {shape['page_size']}): GQA "
        f"{shape['num_q_heads']} query heads over {shape['num_kv_heads']} KV heads, head_dim "
        f"{shape['head_dim']}, {shape['dtype'].removeprefix('torch.')} pages, every row at the "
        "context length. KV = bytes of K and V a call reads (sum of lengths x KV heads x "
        "head_dim x 2 x itemsize).",
        "",
        f"Device us per call: a CUDA graph of {shape['calls']} back-to-back calls, median of "
        f"{shape['replays']} event-timed replays over {shape['calls']}, warm-up replays "
        f"untimed; each graph cycles over `sets` disjoint copies of the case, so that one "
        f"replay reads at least {shape['l2_rotation']}x the L2 ({shape['l2_bytes'] / 1e6:.0f} "
        "MB). Floor: `torch.sum` over as many bytes of the same KV pool, timed the same way "
        "(measured here, not assumed). x floor = the consumer's time over the floor's. "
        f"% of peak: over {shape['peak_bytes_per_s'] / 1e12:.1f} TB/s, the H200's peak, a "
        "reference only.",
        "",
        f"Device-to-device copy (read + write) in the same process: {_num(copy, 1e-9, '.0f')} "
        "GB/s.",
        "",
        "| "
        + " | ".join(
            [
                "batch",
                "context",
                "KV MiB",
                "sets",
                *(f"{n} us" for n in timed),
                *(f"{n} GB/s" for n in timed),
                *(f"{n} x floor" for n in FORMATS),
                *(f"{n} % of peak" for n in timed),
                "checked",
            ]
        )
        + " |",
        "|" + "---:|" * (4 + 3 * len(timed) + len(FORMATS)) + ":---:|",
    ]
    for r in result["rows"]:
        checked = {True: "yes", False: "NO", None: "-"}[r["checked"]]
        cells = [
            str(r["bs"]),
            str(r["context"]),
            f"{r['kv_bytes'] / 2**20:.0f}",
            str(r["sets"]),
            *(_num(r[f"{n}_us"]) for n in timed),
            *(_num(r[f"{n}_bytes_per_s"], 1e-9, ".0f") for n in timed),
            *(_num(r[f"{n}_over_floor"], 1, ".2f") for n in FORMATS),
            *(_num(r[f"{n}_of_peak"], 100, ".0f") for n in timed),
            checked,
        ]
        lines.append("| " + " | ".join(cells) + " |")
    problems = [
        f"batch {r['bs']} x context {r['context']}: {r['error']}"
        for r in result["rows"]
        if r["error"]
    ]
    notes = [*result["notes"], *problems]
    if notes:
        lines += ["", *(f"- {n}" for n in notes)]
    return "\n".join(lines) + "\n"


def run(out_dir: str | Path) -> int:
    """``pagegraph bench --consumer-floor``: 2 without CUDA (one line on stderr), 1 when a
    case failed or was wrong, else 0."""
    if not torch.cuda.is_available():
        print(
            "pagegraph bench --consumer-floor: needs CUDA (a GPU): nothing to measure here",
            file=sys.stderr,
        )
        return 2
    result = bench_consumer_floor(out_dir)
    bad = [r for r in result["rows"] if r["error"] or r["checked"] is False]
    return 1 if bad or not result["rows"] else 0


def main(argv: list[str] | None = None) -> int:
    """``python -m pagegraph.bench.consumer_floor [--out DIR]``."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m pagegraph.bench.consumer_floor",
        description="Paged decode attention against the DRAM floor (CUDA only).",
    )
    parser.add_argument("--out", default="profiles/decode-step", help="output folder")
    return run(parser.parse_args(argv).out)


if __name__ == "__main__":
    sys.exit(main())
