"""How many rows a step of ``build_decode_metadata``'s prefix sum should take (``SCAN_BLOCK``).

Question: does the scan's tile size set the whole kernel's register count, and with it the
occupancy of every page-gathering program? A kernel's registers a thread are the maximum over
all its code paths, so program (0, 0)'s scan tile (``SCAN_BLOCK`` int64 values over 128
threads, with their running sums) is paid for by every program of the grid, including the
8,192 programs of ps1 that never scan. Compiled for sm_90, a 1,024-row tile takes 56-124
registers a thread (by dtypes and flags) against 32-40 for ``build_page_table``; a 128-row
tile 32-56.
A smaller tile means more dependent scan steps for large batches (``cdiv(bs, SCAN_BLOCK)``).

For each ``SCAN_BLOCK`` (interleaved, ``--repeats`` times, so drift between runs shows), the
bench's metadata section on every config plus two batches wider than any bench config (1,024
and 4,096 short rows: several scan steps), and the compiled kernels' registers a thread. The
kernel variants measured with it and not kept (both tile sizes compiled in, a two-pass scan
step) are described in ``profiles/bench/NOTES.md``.

Usage: ``PYTHONPATH=src python tools/experiments/scan_block.py [--json OUT]
[--blocks 1024 128 256] [--repeats 2]``
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

from pagegraph.bench import CONFIGS, BenchConfig, K, bench_decode_config, decode_summary
from pagegraph.bench.floors import DEFAULT_L2_BYTES
from pagegraph.bench.timing import GRAPH_BUILDS, GRAPH_REPLAYS, Settings
from pagegraph.kernels import decode_metadata as metadata

WIDE = (
    BenchConfig("bs1024", 1024, 64, 8 * K, ("uniform", 1, 8 * K)),
    BenchConfig("bs4096", 4096, 64, 2 * K, ("uniform", 1, 2 * K)),
)


def new_kernels(seen: set[int]) -> list:
    """Decode-metadata kernels compiled since ``seen`` (ids) was taken; adds them to it."""
    out = []
    for cache in metadata._decode_metadata_kernel.device_caches.values():
        for kernel in cache[0].values():
            if id(kernel) not in seen:
                seen.add(id(kernel))
                out.append(kernel)
    return out


def max_registers(kernels: list) -> int | None:
    """Most registers a thread among ``kernels`` (loaded first: Triton loads lazily)."""
    regs = []
    for kernel in kernels:
        init = getattr(kernel, "_init_handles", None)
        if init is not None:
            init()
        regs.append(int(getattr(kernel, "n_regs", -1)))
    return max(regs) if regs else None


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--blocks", type=int, nargs="+", default=[1024, 128, 256])
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("needs CUDA", file=sys.stderr)
        return 2
    props = torch.cuda.get_device_properties(0)
    s = Settings(True, GRAPH_BUILDS, GRAPH_REPLAYS, 200, 50, None,
                 getattr(props, "L2_cache_size", DEFAULT_L2_BYTES))  # fmt: skip
    results = []
    seen: set[int] = set()
    regs: dict[int, int | None] = {}
    for rep in range(args.repeats):
        for block in args.blocks:
            metadata.SCAN_BLOCK = block
            rows = [r for cfg in (*CONFIGS, *WIDE) for r in bench_decode_config(cfg, s)]
            summary = decode_summary(rows)
            if rep == 0:
                regs[block] = max_registers(new_kernels(seen))
            results.append({"repeat": rep, "scan_block": block, "rows": rows, "summary": summary})
            print(f"\n## SCAN_BLOCK {block} (repeat {rep})")
            print("| config | bpt us | fused us | diff | diff warm | diff draft4 | eager x | exact")
            print("|---|---:|---:|---:|---:|---:|---:|---|")
            for sm in summary:
                by = {r["variant"]: r for r in rows if r["config"] == sm["config"]}
                bpt = by["build_page_table"].get("device_us")
                fused = by["build_decode_metadata"].get("device_us")

                def f(v, d=2):
                    return "n/a" if v is None else f"{v:.{d}f}"

                print(
                    f"| {sm['config']} | {f(bpt)} | {f(fused)} | {f(sm['diff_us'])} | "
                    f"{f(sm['diff_warm_us'])} | {f(sm['diff_draft_us'])} | "
                    f"{f(sm['fused_over_bpt'])} | {sm['exact']} |"
                )
            sys.stdout.flush()
    print("\nregisters a thread by SCAN_BLOCK:", regs)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"device": props.name, "registers": regs, "runs": results}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
