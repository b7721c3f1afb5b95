"""What `make sanitize` runs under compute-sanitizer (GPU only).

Usage (normally through ``tools/sanitize.sh``)::

    python tools/sanitize_workload.py kernel   # eager builds over shapes, exact buffers
    python tools/sanitize_workload.py graphs   # captured buckets, replays of a workload

Run ``kernel`` with PYTORCH_NO_CUDA_MEMORY_CACHING=1: every tensor is then its own device
allocation, exactly sized, so memcheck sees a write one element past a buffer (the caching
allocator would hide it inside a larger block). Every output is also compared exactly with the
reference, so a run that the sanitizer passes is also a correct one.
"""

from __future__ import annotations

import collections
import os
import sys

import torch

from pagegraph import ERROR_KINDS, build_page_table
from pagegraph.check.checker import check_replay_safety
from pagegraph.check.config import CheckConfig
from pagegraph.kernels.table_reference import expected_tables


def kernel_cases() -> int:
    gen = torch.Generator().manual_seed(0)
    bad = 0
    cases = [
        (1, 64, 1, False),
        (7, 300, 3, True),
        (17, 4096, 16, True),
        (64, 32768, 64, False),
        (256, 4096, 1, False),
        (33, 131072, 256, True),
    ]
    for bs, ctx, ps, swa in cases:
        width = -(-ctx // ps)
        slots = (bs + 1) * width * ps + 1
        r2t = torch.randint(0, slots, (bs + 1, ctx), generator=gen, dtype=torch.int32).cuda()
        rpi = torch.randint(0, bs + 1, (bs,), generator=gen).cuda()
        # Edge lengths included: 0, exact capacity, overlong (clamped), negative.
        sl = torch.randint(0, ctx + 1, (bs,), generator=gen)
        sl[: min(bs, 4)] = torch.tensor([0, ctx, ctx + 5 * ps, -3])[: min(bs, 4)]
        sl = sl.cuda()
        f2s = torch.randint(0, slots, (slots + 1,), generator=gen).cuda() if swa else None
        pt = torch.empty((bs, width), dtype=torch.int32, device="cuda").fill_(-1)
        kw = {"swa_page_table": torch.full_like(pt, -1), "full_to_swa": f2s} if swa else {}
        errors = torch.zeros(len(ERROR_KINDS), dtype=torch.int32, device="cuda")
        build_page_table(r2t, rpi, sl, pt, ps, errors=errors, **kw)
        want, want_swa = expected_tables(r2t, rpi, sl, width, ps, f2s, fill=-1)
        ok = torch.equal(pt, want) and (not swa or torch.equal(kw["swa_page_table"], want_swa))
        bad += not ok
        print(f"kernel bs={bs} ctx={ctx} ps={ps} swa={swa}: {'exact' if ok else 'MISMATCH'}")
    return bad


def graph_cases() -> int:
    bad = 0
    for swa in (False, True):
        cfg = CheckConfig(
            max_bs=64,
            max_context_len=16384,
            page_size=16,
            steps=40,
            swa=swa,
            swa_window=2048 if swa else None,
            swa_churn=0.3 if swa else 0.0,
            detectors=(),
        )
        _record_allocations(True)
        report = check_replay_safety("build_page_table", cfg)
        print(f"graphs swa={swa}: {report.replays} replays, safe={report.safe}")
        for prop in report.properties:
            if prop.passed is False:
                print(f"  FAIL {prop.name}: {prop.detail}")
                if prop.name == "no memory growth":
                    explain_live_memory()
        _record_allocations(False)
        bad += not report.safe
    return bad


def _record_allocations(on: bool) -> None:
    """Allocation history with Python stacks, so a growth can name its allocation sites
    (off with ``PAGEGRAPH_ALLOC_HISTORY=0``)."""
    if os.environ.get("PAGEGRAPH_ALLOC_HISTORY", "1") == "0":
        return
    try:
        if on:
            torch.cuda.memory._record_memory_history(max_entries=200_000)
        else:
            torch.cuda.memory._record_memory_history(enabled=None)
    except Exception as exc:  # noqa: BLE001 - a diagnostic only
        print(f"  (no allocation history: {exc})")


def explain_live_memory(top: int = 6) -> None:
    """Print the allocation sites of the device memory still allocated, largest first, and
    what a garbage collection and a device sync change about it."""
    import gc

    before = torch.cuda.memory_allocated()
    gc.collect()
    after_gc = torch.cuda.memory_allocated()
    torch.cuda.synchronize()
    after_sync = torch.cuda.memory_allocated()
    print(f"  allocated: {before} bytes; after gc.collect() {after_gc}; after a sync {after_sync}")
    # Python-visible tensors on the device: if the live blocks are not theirs, the frees are
    # the allocator's (deferred), not a reference kept somewhere.
    tensors = [o for o in gc.get_objects() if isinstance(o, torch.Tensor) and o.is_cuda]
    held = sum(t.untyped_storage().nbytes() for t in tensors)
    print(f"  {len(tensors)} CUDA tensors reachable from Python, {held} bytes of storage")
    # What holds the largest of them: two levels of referrers, by type (and frame code).
    for t in sorted(tensors, key=lambda x: -x.untyped_storage().nbytes())[:2]:
        chain = []
        for ref in gc.get_referrers(t):
            if ref is tensors:
                continue
            desc = type(ref).__name__
            if hasattr(ref, "f_code"):
                desc += f"({ref.f_code.co_filename.rsplit('/', 1)[-1]}:{ref.f_code.co_name})"
            up = [
                type(r).__name__ + (f"({r.f_code.co_name})" if hasattr(r, "f_code") else "")
                for r in gc.get_referrers(ref)
                if r is not tensors
            ][:4]
            chain.append(f"{desc} <- {up}")
        print(f"  tensor {tuple(t.shape)} held by: {chain[:4]}")
    torch.empty(1, device="cuda")  # an allocation processes the allocator's pending frees
    after_alloc = torch.cuda.memory_allocated()
    torch.cuda.empty_cache()
    after_empty = torch.cuda.memory_allocated()
    print(
        f"  after one allocation {after_alloc}; after empty_cache() {after_empty}; "
        f"backend {torch.cuda.get_allocator_backend()}"
    )
    sites: collections.Counter = collections.Counter()
    try:
        snapshot = torch.cuda.memory._snapshot()
    except Exception as exc:  # noqa: BLE001
        print(f"  (no snapshot: {exc})")
        return
    for segment in snapshot.get("segments", []):
        for block in segment.get("blocks", []):
            if block.get("state") != "active_allocated":
                continue
            frames = [
                f"{f['filename'].rsplit('/', 1)[-1]}:{f['line']} {f['name']}"
                for f in block.get("frames", [])
                if "pagegraph" in f.get("filename", "") or "tools/" in f.get("filename", "")
            ]
            sites[" <- ".join(frames[:3]) or "(no Python frame)"] += block.get("size", 0)
    for site, nbytes in sites.most_common(top):
        print(f"  {nbytes:>12} bytes live from {site}")


if __name__ == "__main__":
    mode = sys.argv[1] if len(sys.argv) > 1 else "kernel"
    sys.exit(1 if (kernel_cases() if mode == "kernel" else graph_cases()) else 0)
