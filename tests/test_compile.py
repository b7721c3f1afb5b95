"""Invariant: every kernel variant the contract allows compiles for sm_90, on a machine without
a GPU: every dtype of req_to_token, req_pool_indices, seq_lens and full_to_swa (or none),
with and without the error counters, 32- and 64-bit in-row offsets, page sizes from 1 to 256,
the work counter, every bug of the mutant kernel, and the CSR builder's kernel.

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

# Compiles in child processes: scheduled first in a parallel run (see conftest.py).
pytestmark = pytest.mark.heavy

INT = {"int32": "i32", "int64": "i64"}
PAGE_SIZES = [1, 3, 16, 64, 256]
# (req_to_token, req_pool_indices, seq_lens, full_to_swa or None, errors, 32-bit offsets,
#  work counter, page size): the full product of the dtypes and flags, page sizes cycled.
VARIANTS = [
    (r, i, s_, f, e, narrow, False, PAGE_SIZES[k % len(PAGE_SIZES)])
    for k, (r, i, s_, f, e, narrow) in enumerate(
        itertools.product(INT, INT, INT, [None, "int32", "int64"], [False, True], [True, False])
    )
] + [
    ("int32", "int32", "int32", None, False, True, True, 16),
    ("int64", "int64", "int32", "int64", True, False, True, 64),
]


def variant_id(v) -> str:
    r, i, s_, f, e, narrow, work, p = v
    return (
        f"r2t_{r}-rpi_{i}-sl_{s_}-{'f2s_' + f if f else 'full'}-{'err' if e else 'noerr'}"
        f"-ps{p}{'' if narrow else '-row64'}{'-work' if work else ''}"
    )


def compile_variant(r2t, rpi, sl, f2s, has_errors, row_i32, has_work, page_size) -> dict:
    """Compile one specialisation for sm_90; return facts about the output."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from pagegraph.kernels.page_table import (
        BLOCK_PAGES,
        NUM_WARPS,
        ROWS_PER_PROGRAM,
        UNROLL,
        _page_table_kernel,
    )

    has_swa = f2s is not None
    sig = {
        "req_to_token_ptr": "*" + INT[r2t],
        "req_pool_indices_ptr": "*" + INT[rpi],
        "seq_lens_ptr": "*" + INT[sl],
        "page_table_ptr": "*i32",
        "swa_page_table_ptr": "*i32",
        "full_to_swa_ptr": "*" + INT[f2s] if has_swa else "*i32",
        "errors_ptr": "*i32",
        "work_ptr": "*i32",
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
        "HAS_WORK": "constexpr",
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
        (names.index("HAS_WORK"),): has_work,
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


def compile_mutant(bug: int, swa: bool) -> dict:
    """The mutant zoo's kernel with one bug switched in (they run only through the JIT on a
    GPU: compiling them here keeps a broken mutant from passing as "killed")."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from pagegraph.mutants.page_table_mutants import BLOCK, HARD_CODED, _mutant_kernel

    sig = {
        "req_to_token_ptr": "*i64",
        "req_pool_indices_ptr": "*i64",
        "seq_lens_ptr": "*i64",
        "page_table_ptr": "*i32",
        "swa_page_table_ptr": "*i32",
        "full_to_swa_ptr": "*i32",
        "errors_ptr": "*i32",
        "r2t_stride": "i64",
        "r2t_rows": "i32",
        "pt_stride": "i32",
        "swa_stride": "i32",
        "width": "i32",
        "r2t_pages": "i32",
        "f2s_len": "i64",
        "bs": "i32",
        "PAGE_SIZE": "constexpr",
        "HAS_SWA": "constexpr",
        "HAS_ERRORS": "constexpr",
        "BUG": "constexpr",
        "HARD_PS": "constexpr",
        "BLOCK": "constexpr",
    }
    names = list(sig)
    values = {
        "PAGE_SIZE": 16,
        "HAS_SWA": swa,
        "HAS_ERRORS": True,
        "BUG": bug,
        "HARD_PS": HARD_CODED,
        "BLOCK": BLOCK,
    }
    constexprs = {(names.index(k),): v for k, v in values.items()}
    src = ASTSource(fn=_mutant_kernel, signature=sig, constexprs=constexprs)
    out = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
    return {"cubin_bytes": len(out.asm["cubin"]), "sm90": ".target sm_90" in out.asm["ptx"]}


MUTANT_BUGS = list(range(0, 19))
#: The runner's stage node: static input dtypes (req_pool_indices, seq_lens) and padding of
#: request indices.
STAGE_VARIANTS = list(itertools.product(INT, INT, [False, True]))


def stage_id(v) -> str:
    return f"stage-rpi_{v[0]}-sl_{v[1]}-{'pad_rpi' if v[2] else 'keep_rpi'}"


def compile_stage(rpi: str, sl: str, pad_rpi: bool) -> dict:
    """The graph's stage node (``pagegraph.graph.staging``), which reads pinned host memory."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from pagegraph.graph.staging import HEADER, SLOTS, STAGE_BLOCK, stage_inputs_kernel

    sig = {
        "mailbox": "*i64",
        "counter": "*i64",
        "consumed": "*i64",
        "rpi_dst": "*" + INT[rpi],
        "sl_dst": "*" + INT[sl],
        "bucket": "i32",
        "pad_len": "i32",
        "pad_rpi": "i32",
        "slot_size": "i32",
        "PAD_RPI": "constexpr",
        "SLOTS": "constexpr",
        "HEADER": "constexpr",
        "BLOCK": "constexpr",
    }
    names = list(sig)
    values = {"PAD_RPI": pad_rpi, "SLOTS": SLOTS, "HEADER": HEADER, "BLOCK": STAGE_BLOCK}
    constexprs = {(names.index(k),): v for k, v in values.items()}
    src = ASTSource(fn=stage_inputs_kernel, signature=sig, constexprs=constexprs)
    out = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
    ptx = out.asm["ptx"]
    return {
        "cubin_bytes": len(out.asm["cubin"]),
        "sm90": ".target sm_90" in ptx,
        "volatile_loads": re.search(r"ld\.volatile", ptx) is not None,
    }


#: build_kv_indices (the CSR builder): (req_to_token, req_pool_indices, seq_lens, page size).
KV_INDICES_VARIANTS = [
    (r, i, s_, p) for (r, i, s_), p in zip(itertools.product(INT, INT, INT), [1, 16] * 4)
]


def kv_indices_id(v) -> str:
    return f"kv_indices-r2t_{v[0]}-rpi_{v[1]}-sl_{v[2]}-ps{v[3]}"


def compile_kv_indices(r2t: str, rpi: str, sl: str, page_size: int) -> dict:
    """``pagegraph.kernels.kv_indices``' kernel."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from pagegraph.kernels.kv_indices import KV_INDICES_BLOCK, SCAN, _kv_indices_kernel

    sig = {
        "req_to_token_ptr": "*" + INT[r2t],
        "req_pool_indices_ptr": "*" + INT[rpi],
        "seq_lens_ptr": "*" + INT[sl],
        "kv_indptr_ptr": "*i32",
        "kv_indices_ptr": "*i32",
        "r2t_stride": "i32",
        "r2t_rows": "i32",
        "row_pages": "i32",
        "capacity": "i64",
        "PAGE_SIZE": "constexpr",
        "BLOCK": "constexpr",
        "SCAN": "constexpr",
    }
    names = list(sig)
    values = {"PAGE_SIZE": page_size, "BLOCK": KV_INDICES_BLOCK, "SCAN": SCAN}
    constexprs = {(names.index(k),): v for k, v in values.items()}
    src = ASTSource(fn=_kv_indices_kernel, signature=sig, constexprs=constexprs)
    out = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
    return {"cubin_bytes": len(out.asm["cubin"]), "sm90": ".target sm_90" in out.asm["ptx"]}


#: The block-table kinds' kernels (``kernels.block_table``, ``kernels.slot_mapping``): row
#: strides and sizes that fit 32 bits or not, or equal to 1 (which Triton's JIT turns into
#: constexprs), and page sizes (the slot kernel's constexpr).
GATHER_VARIANTS = ["i32", "i64", "one"]
SLOT_VARIANTS = [("i32", 1), ("i32", 16), ("i64", 16), ("i32", 528), ("one", 1)]
#: The size arguments a "one" variant passes as the constexpr 1.
ONES = (
    "src_stride",
    "out_stride",
    "max_reqs",
    "width",
    "bt_stride",
    "row_tokens",
    "max_num_tokens",
    "token_limit",
)


def _sizes_as_ones(sig: dict, constexprs: dict) -> None:
    """Every size argument of ``sig`` in ``ONES`` becomes the constexpr 1, in place."""
    names = list(sig)
    for name in ONES:
        if name in sig:
            sig[name] = "constexpr"
            constexprs[(names.index(name),)] = 1


def compile_gather(ints: str) -> dict:
    """``pagegraph.kernels.block_table``'s kernel, strides and sizes typed ``ints``."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from pagegraph.kernels.block_table import GATHER_BLOCK, _gather_kernel

    sig = {
        "block_table_ptr": "*i32",
        "num_blocks_ptr": "*i32",
        "idx_mapping_ptr": "*i32",
        "out_ptr": "*i32",
        "src_stride": ints,
        "out_stride": ints,
        "max_reqs": "i32",
        "width": "i32",
        "num_reqs": "i32",
        "BLOCK": "constexpr",
    }
    constexprs = {(list(sig).index("BLOCK"),): GATHER_BLOCK}
    if ints == "one":
        _sizes_as_ones(sig, constexprs)
    src = ASTSource(fn=_gather_kernel, signature=sig, constexprs=constexprs)
    out = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
    ptx = out.asm["ptx"]
    return {
        "cubin_bytes": len(out.asm["cubin"]),
        "sm90": ".target sm_90" in ptx,
        "atomics": re.search(r"^\s*(@%p\d+\s+)?(atom|red)\.", ptx, re.M) is not None,
    }


def compile_slots(ints: str, page_size: int) -> dict:
    """``pagegraph.kernels.slot_mapping``'s kernel, strides and sizes typed ``ints``."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from pagegraph.kernels.slot_mapping import PAD_SLOT_ID, SLOT_BLOCK, _slot_mapping_kernel

    sig = {
        "block_table_ptr": "*i32",
        "idx_mapping_ptr": "*i32",
        "qsl_ptr": "*i32",
        "positions_ptr": "*i64",
        "slot_mapping_ptr": "*i64",
        "bt_stride": ints,
        "max_reqs": "i32",
        "row_tokens": ints,
        "max_num_tokens": "i32",
        "token_limit": "i32",
        "PAGE_SIZE": "constexpr",
        "PAD_ID": "constexpr",
        "BLOCK": "constexpr",
    }
    names = list(sig)
    values = {"PAGE_SIZE": page_size, "PAD_ID": PAD_SLOT_ID, "BLOCK": SLOT_BLOCK}
    constexprs = {(names.index(k),): v for k, v in values.items()}
    if ints == "one":
        _sizes_as_ones(sig, constexprs)
    src = ASTSource(fn=_slot_mapping_kernel, signature=sig, constexprs=constexprs)
    out = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
    ptx = out.asm["ptx"]
    return {
        "cubin_bytes": len(out.asm["cubin"]),
        "sm90": ".target sm_90" in ptx,
        "atomics": re.search(r"^\s*(@%p\d+\s+)?(atom|red)\.", ptx, re.M) is not None,
    }


def compile_vllm(name: str) -> dict:
    """vLLM's kernel ``name`` (``gather`` or ``slot_mappings``) as ``pagegraph.clients.vllm``
    loads it (stubbed imports), with the arguments the adapters pass."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from pagegraph.clients.vllm_files import load_vllm_kernels, vllm_unavailable_reason

    if vllm_unavailable_reason() is not None:
        return {"unavailable": vllm_unavailable_reason()}
    kernels = load_vllm_kernels()
    if name == "gather":
        sig = {
            "batch_idx_to_req_idx": "*i32",
            "src_block_table_ptrs": "*u64",
            "dst_block_table_ptrs": "*u64",
            "block_table_strides": "*i64",
            "num_blocks_ptr": "*i32",
            "num_blocks_stride": "i32",
            "num_reqs": "i32",
            "num_computed_tokens_ptr": "*i32",
            "sliding_window_reach_ptr": "*i32",
            "block_sizes_ptr": "*i32",
            "MASK_SLIDING_WINDOW": "constexpr",
            "BLOCK_SIZE": "constexpr",
        }
        values = {"MASK_SLIDING_WINDOW": False, "BLOCK_SIZE": 1024}
    else:
        sig = {
            "max_num_tokens": "i32",
            "idx_mapping": "*i32",
            "query_start_loc": "*i32",
            "pos": "*i64",
            "block_table_ptrs": "*u64",
            "block_table_strides": "*i64",
            "block_sizes": "*i32",
            "slot_mapping_enabled": "*i1",
            "dcp_sharded": "*i1",
            "slot_mappings_ptr": "*i64",
            "slot_mappings_stride": "i32",
            "cp_rank": "i32",
            "CP_SIZE": "constexpr",
            "CP_INTERLEAVE": "constexpr",
            "PAD_ID": "constexpr",
            "TRITON_BLOCK_SIZE": "constexpr",
        }
        values = {"CP_SIZE": 1, "CP_INTERLEAVE": 1, "PAD_ID": -1, "TRITON_BLOCK_SIZE": 1024}
    names = list(sig)
    constexprs = {(names.index(k),): v for k, v in values.items()}
    src = ASTSource(fn=getattr(kernels, name), signature=sig, constexprs=constexprs)
    out = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
    return {"cubin_bytes": len(out.asm["cubin"]), "sm90": ".target sm_90" in out.asm["ptx"]}


VLLM_KERNELS = ["gather", "slot_mappings"]


def gather_id(v) -> str:
    return f"gather-{v}"


def slots_id(v) -> str:
    return f"slots-{v[0]}-ps{v[1]}"


#: The compiles in parts, each one a fixture call: a parallel run (make test on a GPU) gives
#: each part's tests to one worker (``xdist_group``), so the parts compile at once.
PARTS = ("kernel-0", "kernel-1", "kernel-2", "mutants-stage", "kinds")


def kernel_part(variant) -> str:
    return f"kernel-{VARIANTS.index(variant) % 3}"


def _jobs(part: str) -> list:
    """``(key, compile function, arguments)`` of one part."""
    if part.startswith("kernel-"):
        return [(variant_id(v), compile_variant, v) for v in VARIANTS if kernel_part(v) == part]
    if part == "kinds":
        return (
            [(gather_id(v), compile_gather, (v,)) for v in GATHER_VARIANTS]
            + [(slots_id(v), compile_slots, v) for v in SLOT_VARIANTS]
            + [(f"vllm-{k}", compile_vllm, (k,)) for k in VLLM_KERNELS]
        )
    mutants = [
        (f"mutant-{bug}-{'swa' if swa else 'full'}", compile_mutant, (bug, swa))
        for bug in MUTANT_BUGS
        for swa in (False, True)
    ]
    return (
        mutants
        + [(stage_id(v), compile_stage, v) for v in STAGE_VARIANTS]
        + [(kv_indices_id(v), compile_kv_indices, v) for v in KV_INDICES_VARIANTS]
    )


def compile_part(part: str) -> dict:
    results = {}
    for key, fn, args in _jobs(part):
        try:
            results[key] = fn(*args)
        except Exception as exc:  # reported per variant by the test
            results[key] = {"error": f"{type(exc).__name__}: {exc}"}
    return results


_compiled: dict[str, dict] = {}


def compiled(part: str) -> dict:
    """One part's results, compiled once a process."""
    from pagegraph.kernels.contract import interpreter_active

    if part not in _compiled:
        if not interpreter_active():
            _compiled[part] = compile_part(part)
        else:
            # Triton's library functions are in interpreter form once TRITON_INTERPRET=1 is
            # set: compile in a child process with it unset.
            env = dict(os.environ, TRITON_INTERPRET="0")
            proc = subprocess.run(
                [sys.executable, __file__, part],
                env=env,
                capture_output=True,
                text=True,
                timeout=600,
            )
            assert proc.returncode == 0, proc.stderr[-4000:]
            _compiled[part] = json.loads(proc.stdout.strip().splitlines()[-1])
    return _compiled[part]


def in_part(values, part_of, ids) -> list:
    """``values`` as ``pytest.param``s, each in its part's ``xdist_group``."""
    return [
        pytest.param(v, id=ids(v), marks=pytest.mark.xdist_group(f"sm90-{part_of(v)}"))
        for v in values
    ]


@pytest.mark.parametrize("variant", in_part(VARIANTS, kernel_part, variant_id))
def test_compiles_for_sm90(variant):
    result = compiled(kernel_part(variant))[variant_id(variant)]
    assert "error" not in result, result.get("error")
    assert result["sm90"] and result["cubin_bytes"] > 0
    has_swa, has_errors, has_work = variant[3] is not None, variant[4], variant[6]
    # The error counters and the work counter are compiled out unless requested: zero cost
    # when not asked for.
    assert result["atomics"] == (has_errors or has_work)
    # One register layout from gather to store: no shared-memory shuffle between them (the
    # SWA error count is a block reduction, which may use shared memory).
    if not (has_swa and has_errors):
        assert not result["shared_memory"]


@pytest.mark.parametrize("bug", MUTANT_BUGS)
@pytest.mark.parametrize("swa", [False, True], ids=["full", "swa"])
@pytest.mark.xdist_group("sm90-mutants-stage")
def test_mutant_kernel_compiles_for_sm90(bug, swa):
    result = compiled("mutants-stage")[f"mutant-{bug}-{'swa' if swa else 'full'}"]
    assert "error" not in result, result.get("error")
    assert result["sm90"] and result["cubin_bytes"] > 0


@pytest.mark.parametrize("variant", STAGE_VARIANTS, ids=stage_id)
@pytest.mark.xdist_group("sm90-mutants-stage")
def test_stage_kernel_compiles_for_sm90(variant):
    result = compiled("mutants-stage")[stage_id(variant)]
    assert "error" not in result, result.get("error")
    assert result["sm90"] and result["cubin_bytes"] > 0
    # The mailbox is written by the host between replays: its reads must not be cached.
    assert result["volatile_loads"]


@pytest.mark.parametrize("variant", KV_INDICES_VARIANTS, ids=kv_indices_id)
@pytest.mark.xdist_group("sm90-mutants-stage")
def test_kv_indices_kernel_compiles_for_sm90(variant):
    result = compiled("mutants-stage")[kv_indices_id(variant)]
    assert "error" not in result, result.get("error")
    assert result["sm90"] and result["cubin_bytes"] > 0


@pytest.mark.parametrize("variant", GATHER_VARIANTS, ids=gather_id)
@pytest.mark.xdist_group("sm90-kinds")
def test_gather_block_tables_kernel_compiles_for_sm90(variant):
    result = compiled("kinds")[gather_id(variant)]
    assert "error" not in result, result.get("error")
    assert result["sm90"] and result["cubin_bytes"] > 0 and not result["atomics"]


@pytest.mark.parametrize("variant", SLOT_VARIANTS, ids=slots_id)
@pytest.mark.xdist_group("sm90-kinds")
def test_slot_mapping_kernel_compiles_for_sm90(variant):
    result = compiled("kinds")[slots_id(variant)]
    assert "error" not in result, result.get("error")
    assert result["sm90"] and result["cubin_bytes"] > 0 and not result["atomics"]


@pytest.mark.parametrize("name", VLLM_KERNELS)
@pytest.mark.xdist_group("sm90-kinds")
def test_vllm_kernel_compiles_for_sm90(name):
    """vLLM's own kernels compile as pagegraph loads them (the stubs suffice off the
    interpreter too)."""
    result = compiled("kinds")[f"vllm-{name}"]
    if "unavailable" in result:
        pytest.skip(f"vLLM unavailable: {result['unavailable']}")
    assert "error" not in result, result.get("error")
    assert result["sm90"] and result["cubin_bytes"] > 0


if __name__ == "__main__":
    print(json.dumps(compile_part(sys.argv[1])))


def test_every_dtype_and_flag_combination_is_compiled():
    """The variants above cover the contract's whole product of dtypes and flags (a variant
    left out, like an int32 full_to_swa, would reach users uncompiled by CI)."""
    have = {v[:6] for v in VARIANTS}
    want = set(
        itertools.product(INT, INT, INT, [None, "int32", "int64"], [False, True], [True, False])
    )
    assert want <= have, sorted(want - have)[:5]
    assert {v[7] for v in VARIANTS} == set(PAGE_SIZES) and any(v[6] for v in VARIANTS)
    # Every compile belongs to a part, and every part has compiles.
    assert {kernel_part(v) for v in VARIANTS} | {"mutants-stage", "kinds"} == set(PARTS)
    assert sum(len(_jobs(p)) for p in PARTS) == (
        len(VARIANTS)
        + 2 * len(MUTANT_BUGS)
        + len(STAGE_VARIANTS)
        + len(KV_INDICES_VARIANTS)
        + len(GATHER_VARIANTS)
        + len(SLOT_VARIANTS)
        + len(VLLM_KERNELS)
    )
    # The CSR kernel: every dtype of its three index inputs, and two page sizes.
    assert {v[:3] for v in KV_INDICES_VARIANTS} == set(itertools.product(INT, INT, INT))
    assert {v[3] for v in KV_INDICES_VARIANTS} == {1, 16}
