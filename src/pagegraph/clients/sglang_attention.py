"""SGLang's Triton attention backend's decode as a decode step's reader (``sglang:triton_decode``).

SGLang's ``TritonAttnBackend`` builds its own CSR from the request pool, not from a page
table: before each graph replay (``init_forward_metadata_replay_cuda_graph``, eager, on the
padded batch) it writes ``kv_indptr[1:bs+1] = cumsum(seq_lens)``, gathers each row's token
slots with ``create_flashinfer_kv_indices_triton`` and sizes each row's split-K with
``get_num_kv_splits_triton``; the captured ``forward_decode`` then writes the new token's K/V
(``set_kv_buffer``: ``k_buffer[out_cache_loc] = k``) and runs ``decode_attention_fwd``.
``TRITON_DECODE`` runs that metadata inside the captured step instead: the same device work on
the same padded inputs (the runner's staged ``req_to_token`` / ``req_pool_indices`` /
``seq_lens``), so what the graph reads is what SGLang's replay would have written. The
builder's page table is not read (SGLang's triton backend has none): a scenario pairs the
reader with any page-table builder, whose table only the bed's other judges look at.

SGLang's kernel files are loaded by path from the installed ``sglang`` (``sglang.py``'s
``sglang_kernel_dir``), never copied. ``decode_attention.py`` imports three other SGLang
modules: ``score_mod.py`` is SGLang's own file, loaded by path too (it imports only triton);
the other two are answered by stand-ins (``STUBBED_IMPORTS``) through the file's own
``__import__``, never through ``sys.modules``, so a real ``sglang`` is never shadowed.
"""

from __future__ import annotations

import builtins
import math
import sys
from collections.abc import Callable, Mapping, Sequence
from types import ModuleType, SimpleNamespace

import torch

from ..consumers.reader import CacheWrite, Reader, StepInputs
from ..kernels.file_modules import load_file_module
from .interpreter import fit_interpreter
from .sglang import (
    _MODULE_KEY,
    SGLangUnavailable,
    load_kernel_file,
    sglang_kernel_dir,
)

__all__ = [
    "ATTENTION_FILES",
    "DEFAULT_MAX_KV_SPLITS",
    "STUBBED_IMPORTS",
    "TRITON_DECODE",
    "attention_unavailable_reason",
    "device_core_count",
    "load_decode_attention",
    "num_kv_splits",
    "set_kv_buffer",
    "triton_decode",
]

#: SGLang's files this reader runs, under ``sglang/kernels/ops/attention/`` (``kv_indices``
#: and ``metadata`` are also ``sglang.KERNEL_FILES``).
ATTENTION_FILES = ("decode_attention", "score_mod", "kv_indices", "metadata")

#: ``--triton-attention-num-kv-splits``'s default (``exec_.py``): the backend's
#: ``max_kv_splits`` for a non-MLA model without deterministic inference.
DEFAULT_MAX_KV_SPLITS = 8

#: H100 SXM's SM count: the ``device_core_count`` the split schedule is given without CUDA
#: (SGLang reads the GPU's; with 0 it would fill every row with ``max_kv_splits`` and skip
#: ``get_num_kv_splits_triton``, which the bed means to run).
CPU_CORE_COUNT = 132

#: What stands in for each name ``decode_attention.py`` imports from SGLang (besides
#: ``sglang.kernels.ops.attention.score_mod``, SGLang's own file loaded by path).
STUBBED_IMPORTS: dict[str, str] = {
    "sglang.srt.environ.envs.SGLANG_TRITON_DECODE_ATTN_STATIC_KV_SPLITS": (
        "get() -> False (read on the MLA tuning path only, HIP)"
    ),
    "sglang.srt.environ.envs.SGLANG_MLA_DECODE_TUNE": "get() -> False (HIP MLA tuning only)",
    "sglang.srt.environ.envs.SGLANG_FORCE_LEAN_GRID_CU_MULT": "get() -> 1.0 (HIP Lean only)",
    "sglang.srt.utils.is_hip": "torch.version.hip is not None (SGLang's test)",
    "sglang.srt.utils.is_gfx95_supported": "returns False (HIP only)",
    "sglang.srt.utils.is_gfx1250_supported": "returns False (HIP only)",
    "sglang.srt.utils.get_device_core_count": (
        "the CUDA device's SM count, 0 without CUDA (SGLang's own rule)"
    ),
}


def device_core_count(device_id: int = 0) -> int:
    """SGLang's ``get_device_core_count``: the CUDA device's SM count, 0 without CUDA."""
    if torch.cuda.is_available():
        return torch.cuda.get_device_properties(device_id).multi_processor_count
    return 0


def attention_unavailable_reason() -> str | None:
    """Why this reader cannot run here (one line), or ``None`` when it can."""
    try:
        folder = sglang_kernel_dir()
    except SGLangUnavailable as exc:
        return str(exc)
    missing = [n for n in ATTENTION_FILES if not (folder / f"{n}.py").is_file()]
    if missing:
        return f"{folder} lacks {', '.join(m + '.py' for m in missing)}"
    return None


class _Env:
    def __init__(self, value: object) -> None:
        self.value = value

    def get(self) -> object:
        return self.value


def _stand_ins(score_mod: ModuleType) -> dict[str, object]:
    def module(name: str, **names: object) -> ModuleType:
        m = ModuleType(f"pagegraph_sglang_stub.{name}")
        m.__dict__.update(names)
        return m

    envs = SimpleNamespace(
        SGLANG_TRITON_DECODE_ATTN_STATIC_KV_SPLITS=_Env(False),
        SGLANG_MLA_DECODE_TUNE=_Env(False),
        SGLANG_FORCE_LEAN_GRID_CU_MULT=_Env(1.0),
    )
    return {
        "sglang.kernels.ops.attention.score_mod": score_mod,
        "sglang.srt.environ": module("sglang.srt.environ", envs=envs),
        "sglang.srt.utils": module(
            "sglang.srt.utils",
            is_hip=lambda: torch.version.hip is not None,
            is_gfx95_supported=lambda: False,
            is_gfx1250_supported=lambda: False,
            get_device_core_count=device_core_count,
        ),
    }


def _importer(answers: dict[str, object]) -> Callable[..., object]:
    """An ``__import__`` answering ``answers``' names and refusing any other ``sglang``."""
    real = builtins.__import__

    def isolated_import(
        name: str,
        globals: Mapping[str, object] | None = None,
        locals: Mapping[str, object] | None = None,
        fromlist: Sequence[str] = (),
        level: int = 0,
    ) -> object:
        if level == 0 and (name == "sglang" or name.startswith("sglang.")):
            if name in answers and fromlist:
                return answers[name]
            raise ImportError(f"SGLang's decode_attention.py imports {name}, not stubbed here")
        return real(name, globals, locals, fromlist, level)

    return isolated_import


def load_decode_attention() -> ModuleType:
    """SGLang's ``decode_attention.py``, loaded by path once per process (``score_mod.py``
    with it); ``SGLangUnavailable`` when the files are missing."""
    key = _MODULE_KEY.format("decode_attention")
    module = sys.modules.get(key)
    if module is not None:
        return module
    score_mod = load_kernel_file("score_mod")
    path = sglang_kernel_dir() / "decode_attention.py"
    fit_interpreter()
    own = dict(builtins.__dict__, __import__=_importer(_stand_ins(score_mod)))
    return load_file_module(key, path, own)


# -- SGLang's backend, step by step ---------------------------------------------------------


def num_kv_splits(
    out: torch.Tensor,
    seq_lens: torch.Tensor,
    num_head: int,
    num_kv_head: int,
    max_kv_splits: int = DEFAULT_MAX_KV_SPLITS,
    core_count: int | None = None,
) -> None:
    """``TritonAttnBackend.get_num_kv_splits`` for a decode batch (``num_group`` 1, no
    deterministic tile, static splits off): ``get_num_kv_splits_triton[(1,)]`` into ``out``
    ``[bs]`` int32 from ``seq_lens`` ``[bs]``. ``core_count``: the GPU's SMs (default: the
    CUDA device's, ``CPU_CORE_COUNT`` without one); SGLang fills ``max_kv_splits`` when 0."""
    cores = (device_core_count() or CPU_CORE_COUNT) if core_count is None else core_count
    if cores <= 0:
        out.fill_(max_kv_splits)
        return
    num_seq = seq_lens.shape[0]
    schedule = 256 if num_seq < 256 else 1 << (num_seq - 1).bit_length()
    load_kernel_file("metadata").get_num_kv_splits_triton[(1,)](
        out,
        seq_lens,
        num_seq,
        1,
        num_head,
        num_kv_head,
        max_kv_splits,
        cores,
        MAX_NUM_SEQ=schedule,
    )


def set_kv_buffer(w: CacheWrite, **_: object) -> None:
    """``MHATokenToKVPool.set_kv_buffer`` for an unquantized pool, as SGLang's torch path
    writes it: ``k_buffer[out_cache_loc] = k`` (``v`` alike), every row, padded ones included
    (their ``out_cache_loc`` is 0, SGLang's padding slot, under ``pad_slot = "null"``). On CUDA
    SGLang uses its JIT ``store_cache`` kernel for the same scatter."""
    heads, dim = w.k_new.shape[1:]
    w.k_cache.view(-1, heads, dim)[w.out_cache_loc] = w.k_new
    w.v_cache.view(-1, heads, dim)[w.out_cache_loc] = w.v_new


def _workspace(
    max_bs: int, width: int, page_size: int, device: torch.device
) -> dict[str, torch.Tensor]:
    """The backend's CUDA-graph buffers (``init_cuda_graph_state``) that do not depend on the
    heads: ``kv_indptr`` ``[max_bs + 1]``, ``kv_indices`` ``[max_bs * context]`` (token slots),
    ``num_kv_splits`` ``[max_bs]`` int32. ``attn_logits`` / ``attn_lse`` (``[max_bs, Hq,
    max_kv_splits(, D)]`` fp32) are added at the first call, which knows the heads."""
    i32 = torch.int32
    return {
        "kv_indptr": torch.zeros(max_bs + 1, dtype=i32, device=device),
        "kv_indices": torch.zeros(max_bs * width * page_size, dtype=i32, device=device),
        "num_kv_splits": torch.full((max_bs,), DEFAULT_MAX_KV_SPLITS, dtype=i32, device=device),
    }


def _split_buffers(plan: dict[str, torch.Tensor], q: torch.Tensor, max_kv_splits: int) -> None:
    max_bs = plan["kv_indptr"].shape[0] - 1
    heads, dim = q.shape[1:]
    logits = plan.get("attn_logits")
    if logits is not None:
        if tuple(logits.shape) != (max_bs, heads, max_kv_splits, dim):
            raise ValueError(f"attn_logits {tuple(logits.shape)} was sized for other heads")
        return
    if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        raise RuntimeError("the split-K buffers are allocated at the first, eager, call")
    f32 = torch.float32
    plan["attn_logits"] = torch.zeros(
        (max_bs, heads, max_kv_splits, dim), dtype=f32, device=q.device
    )
    plan["attn_lse"] = torch.zeros((max_bs, heads, max_kv_splits), dtype=f32, device=q.device)


def triton_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    page_table: torch.Tensor,
    cache_seqlens: torch.Tensor,
    out: torch.Tensor,
    *,
    page_size: int,
    workspace: object = None,
    plan: dict[str, torch.Tensor],
    inputs: StepInputs,
    max_kv_splits: int = DEFAULT_MAX_KV_SPLITS,
) -> None:
    """SGLang's triton-backend decode on rows ``:bs``: its replay metadata from ``inputs``
    (CSR of token slots, split counts), then ``decode_attention_fwd`` over ``k_cache`` /
    ``v_cache`` ``[pages, page_size, Hkv, D]`` viewed as SGLang's ``[slots, Hkv, D]`` buffers
    (slot = ``page * page_size + offset``, ``req_to_token``'s values). ``page_table`` and
    ``cache_seqlens`` (the builder's) and ``workspace`` (pagegraph's split-K) are unused."""
    bs, heads, dim = q.shape
    kv_heads = k_cache.shape[2]
    _split_buffers(plan, q, max_kv_splits)
    kv_indptr = plan["kv_indptr"][: bs + 1]
    kv_indices, splits = plan["kv_indices"], plan["num_kv_splits"][:bs]
    seq_lens, rows = inputs.seq_lens[:bs], inputs.req_pool_indices[:bs]
    req_to_token = inputs.req_to_token
    # _fill_kv_indptr_and_indices: a static pool's read stream is req_to_token itself.
    kv_indptr[1:] = torch.cumsum(seq_lens, dim=0)
    load_kernel_file("kv_indices").create_flashinfer_kv_indices_triton[(bs, 1)](
        req_to_token,
        rows,
        seq_lens,
        kv_indptr,
        None,
        kv_indices,
        req_to_token.stride(0),
        ENTRY_PAGE_SIZE=1,
        TOKEN_BLOCK_PARALLEL=False,
    )
    num_kv_splits(splits, seq_lens, heads, kv_heads, max_kv_splits)
    load_decode_attention().decode_attention_fwd(
        q,
        k_cache.view(-1, kv_heads, dim),
        v_cache.view(-1, kv_heads, dim),
        out,
        kv_indptr,
        kv_indices,
        plan["attn_logits"],
        plan["attn_lse"],
        splits,
        max_kv_splits,
        1.0 / math.sqrt(dim),
        1.0,
        1.0,
        page_size=page_size,
    )


#: SGLang's Triton attention backend's decode (page size as the scenario's: SGLang's
#: ``PAGE_SIZE`` specialisation; 1 is its default) with its KV write.
TRITON_DECODE = Reader(
    "sglang:triton_decode",
    triton_decode,
    workspace=_workspace,
    write_cache=set_kv_buffer,
    inputs=True,
)
