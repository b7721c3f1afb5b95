"""Invariant: every kernel variant compiles for sm_90, on a machine without a GPU.

The Triton interpreter accepts programs the compiler rejects (globals that are not constexpr,
some loop forms, dtype mixes), so CI also compiles each specialisation for Hopper. Triton's
own library functions are defined in interpreter form once ``TRITON_INTERPRET=1`` is set, so
under the interpreter the compilation runs in a child process with it unset.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import subprocess
import sys

import pytest

INT = {"int32": "i32", "int64": "i64"}
# (req_to_token dtype, index dtype, SWA, errors, page size, 32-bit in-row offsets)
VARIANTS = [
    (r, i, s, e, p, True)
    for r, i, s, e, p in itertools.product(INT, INT, [False, True], [False, True], [64, 1])
    if not (p == 1 and e)
] + [
    ("int64", "int64", True, True, 3, False),
    ("int32", "int32", False, False, 16, False),
]


def variant_id(v) -> str:
    r, i, s, e, p, narrow = v
    return f"r2t_{r}-idx_{i}-{'swa' if s else 'full'}-{'err' if e else 'noerr'}-ps{p}" + (
        "" if narrow else "-row64"
    )


def compile_variant(r2t, idx, has_swa, has_errors, page_size, row_i32) -> dict:
    """Compile one specialisation for sm_90; return facts about the output."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from pagegraph.kernel import (
        BLOCK_PAGES,
        NUM_WARPS,
        ROWS_PER_PROGRAM,
        UNROLL,
        _page_table_kernel,
    )

    sig = {
        "req_to_token_ptr": "*" + INT[r2t],
        "req_pool_indices_ptr": "*" + INT[idx],
        "seq_lens_ptr": "*" + INT[idx],
        "page_table_ptr": "*i32",
        "swa_page_table_ptr": "*i32",
        "full_to_swa_ptr": "*i64" if has_swa else "*i32",
        "errors_ptr": "*i32",
        "r2t_stride": "i64",
        "r2t_rows": "i32",
        "pt_stride": "i32",
        "swa_stride": "i32",
        "capacity": "i32" if row_i32 else "i64",
        "f2s_len": "i64",
        "bs": "i32",
        "PAGE_SIZE": "constexpr",
        "HAS_SWA": "constexpr",
        "HAS_ERRORS": "constexpr",
        "ROW_I32": "constexpr",
        "BLOCK": "constexpr",
        "UNROLL": "constexpr",
        "ROWS": "constexpr",
    }
    names = list(sig)
    constexprs = {
        (names.index("PAGE_SIZE"),): page_size,
        (names.index("HAS_SWA"),): has_swa,
        (names.index("HAS_ERRORS"),): has_errors,
        (names.index("ROW_I32"),): row_i32,
        (names.index("BLOCK"),): BLOCK_PAGES,
        (names.index("UNROLL"),): UNROLL,
        (names.index("ROWS"),): ROWS_PER_PROGRAM,
    }
    src = ASTSource(fn=_page_table_kernel, signature=sig, constexprs=constexprs)
    out = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": NUM_WARPS})
    ptx = out.asm["ptx"]
    return {
        "cubin_bytes": len(out.asm["cubin"]),
        "sm90": ".target sm_90" in ptx,
        "atomics": re.search(r"^\s*(@%p\d+\s+)?(atom|red)\.", ptx, re.M) is not None,
        "shared_memory": re.search(r"^\s*(@%p\d+\s+)?(ld|st)\.shared", ptx, re.M) is not None,
    }


def compile_all() -> dict:
    results = {}
    for v in VARIANTS:
        try:
            results[variant_id(v)] = compile_variant(*v)
        except Exception as exc:  # reported per variant by the test
            results[variant_id(v)] = {"error": f"{type(exc).__name__}: {exc}"}
    return results


@pytest.fixture(scope="module")
def compiled():
    from pagegraph.contract import interpreter_active

    if not interpreter_active():
        return compile_all()
    env = dict(os.environ, TRITON_INTERPRET="0")
    proc = subprocess.run(
        [sys.executable, __file__], env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("variant", VARIANTS, ids=variant_id)
def test_compiles_for_sm90(compiled, variant):
    result = compiled[variant_id(variant)]
    assert "error" not in result, result.get("error")
    assert result["sm90"] and result["cubin_bytes"] > 0
    has_errors = variant[3]
    # The error counters are compiled out unless requested: zero cost when not asked for.
    assert result["atomics"] == has_errors
    # One register layout from gather to store: no shared-memory shuffle between them (the
    # SWA error count is a block reduction, which may use shared memory).
    if not (variant[2] and has_errors):
        assert not result["shared_memory"]


if __name__ == "__main__":
    print(json.dumps(compile_all()))
