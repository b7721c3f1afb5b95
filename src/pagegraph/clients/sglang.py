"""SGLang's attention-metadata kernels behind pagegraph's builder contracts.

SGLang keeps its metadata kernels in plain files that import only torch and triton. This module
loads each by path, once per process, without importing the ``sglang`` package (whose
``__init__`` needs the whole serving stack), and wraps SGLang's functions in adapters of a few
lines that call them exactly as SGLang's attention backends do; ``SGLANG_BUILDERS`` names those
the checker knows. Each kernel's differences from the contracts: docs/ARCHITECTURE.md,
"SGLang's kernels behind the contracts".
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import torch

from ..kernels.contract import declare_outputs
from ..kernels.declarations import declare_builder
from ..kernels.file_modules import load_file_module
from .interpreter import fit_interpreter

__all__ = [
    "KERNEL_FILES",
    "SGLANG_BUILDERS",
    "TESTED_VERSION",
    "SGLangUnavailable",
    "flashinfer_csr",
    "flashinfer_csr_token_blocks",
    "flashinfer_kv_indices",
    "flashmla_kv_indices",
    "flashmla_page_table",
    "load_kernel_file",
    "normal_decode_metadata",
    "reference_flashinfer_kv_indices",
    "reference_flashmla_kv_indices",
    "sglang_kernel_dir",
    "sglang_unavailable_reason",
    "sglang_version",
    "trtllm_mha_graph_metadata",
    "trtllm_mha_page_table",
]

#: The SGLang release these adapters were written against.
TESTED_VERSION = "0.5.23"

#: SGLang's kernel files the adapters load, under ``sglang/kernels/ops/attention/``.
KERNEL_FILES = (
    "trtllm_mha_page_table",
    "trtllm_mha_graph_metadata",
    "kv_indices",
    "metadata",
    "pa_page_table",
)

_KERNEL_SUBDIR = ("kernels", "ops", "attention")
# sys.modules key of each loaded file: a key there, rather than a global of this module,
# keeps the one-load-per-process rule even if this module is reloaded.
_MODULE_KEY = "sglang_kernel_file_{}"


class SGLangUnavailable(ImportError):
    """SGLang's kernel files cannot be loaded here; the message says why."""


def sglang_kernel_dir() -> Path:
    """The folder of SGLang's attention kernel files, found without importing ``sglang``.

    ``importlib.util.find_spec`` of a top-level package locates it without running its
    ``__init__``. Raises ``SGLangUnavailable`` with the reason when there is none.
    """
    try:
        spec = importlib.util.find_spec("sglang")
    except (ImportError, ValueError) as exc:
        raise SGLangUnavailable(f"cannot locate the sglang package: {exc}") from None
    if spec is None or not spec.submodule_search_locations:
        raise SGLangUnavailable(
            f"sglang is not installed (pip install --no-deps sglang=={TESTED_VERSION}: "
            "only its kernel files are needed)"
        )
    locations = list(spec.submodule_search_locations)
    for base in locations:
        folder = Path(base, *_KERNEL_SUBDIR)
        if folder.is_dir():
            return folder
    raise SGLangUnavailable(
        f"sglang at {', '.join(locations)} has no {'/'.join(_KERNEL_SUBDIR)} folder "
        f"(the adapters need sglang {TESTED_VERSION} or a release with the same files)"
    )


def sglang_unavailable_reason() -> str | None:
    """Why the adapters cannot run here (a one-line reason), or ``None`` when they can."""
    try:
        folder = sglang_kernel_dir()
    except SGLangUnavailable as exc:
        return str(exc)
    missing = [n for n in KERNEL_FILES if not (folder / f"{n}.py").is_file()]
    if missing:
        return f"{folder} lacks {', '.join(m + '.py' for m in missing)}"
    return None


def sglang_version() -> str | None:
    """The installed sglang distribution's version, ``None`` without one (a bare folder of
    kernel files on ``PYTHONPATH`` has no metadata)."""
    try:
        return importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return None


def load_kernel_file(name: str) -> ModuleType:
    """SGLang's ``kernels/ops/attention/<name>.py`` as a module, loaded by path once per
    process; ``SGLangUnavailable`` when it cannot be found."""
    key = _MODULE_KEY.format(name)
    module = sys.modules.get(key)
    if module is not None:
        return module
    path = sglang_kernel_dir() / f"{name}.py"
    if not path.is_file():
        raise SGLangUnavailable(f"{path} is missing (the adapters need sglang {TESTED_VERSION})")
    fit_interpreter()
    return load_file_module(key, path)


# -- pagegraph's contracts ------------------------------------------------------------------


def trtllm_mha_page_table(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    page_table: torch.Tensor,
    page_size: int,
    *,
    swa_page_table: torch.Tensor | None = None,
    full_to_swa: torch.Tensor | None = None,
) -> None:
    """SGLang's ``build_trtllm_mha_page_table``, as ``TRTLLMHAAttnBackend`` calls it.

    Args as ``pagegraph.build_page_table``: ``req_to_token`` ``[max_reqs, ctx]`` int32/int64,
    ``req_pool_indices`` and ``seq_lens`` ``[bs]`` int32/int64, ``page_table`` ``[bs, width]``
    int32 (written in place), ``page_size`` dividing 4096; ``swa_page_table`` ``[bs, width]``
    int32 with ``full_to_swa`` ``[num_slots + 1]`` int64. No ``errors``. Differences from the
    contract: docs/ARCHITECTURE.md, "SGLang's kernels behind the contracts".
    """
    load_kernel_file("trtllm_mha_page_table").build_trtllm_mha_page_table(
        req_to_token=req_to_token,
        req_pool_indices=req_pool_indices,
        cache_seqlens=seq_lens,
        page_table=page_table,
        page_size=page_size,
        swa_page_table=swa_page_table,
        full_to_swa=full_to_swa,
    )


def trtllm_mha_graph_metadata(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    page_size: int,
    *,
    cache_seqlens: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    page_table: torch.Tensor,
    draft_tokens: int = 0,
    cu_seqlens_q: torch.Tensor | None = None,
    swa_page_table: torch.Tensor | None = None,
    full_to_swa: torch.Tensor | None = None,
) -> None:
    """SGLang's fused ``update_trtllm_mha_graph_metadata`` under ``build_decode_metadata``'s
    contract, as ``TRTLLMHAAttnBackend._apply_cuda_graph_metadata`` calls it.

    Args as ``build_decode_metadata``: ``cache_seqlens`` ``[bs]`` int32, ``cu_seqlens_k`` and
    ``cu_seqlens_q`` ``[bs + 1]`` int32 whose entry 0 the caller has set to 0 (SGLang never
    writes it), ``page_table``/``swa_page_table`` ``[bs, width]`` int32, ``full_to_swa``
    ``[num_slots + 1]`` int64. Mapping and differences: docs/ARCHITECTURE.md.
    """
    kernels = load_kernel_file("trtllm_mha_graph_metadata")
    strided = cu_seqlens_q is not None
    kernels.update_trtllm_mha_graph_metadata(
        req_pool_indices=req_pool_indices,
        seq_lens=seq_lens,
        req_to_token=req_to_token,
        cache_seqlens=cache_seqlens,
        cu_seqlens_k=cu_seqlens_k,
        page_table=page_table,
        bs=seq_lens.shape[0],
        seqlen_offset=draft_tokens,
        max_seq_pages=page_table.shape[1],
        page_size=page_size,
        swa_mapping=full_to_swa,
        swa_page_table=swa_page_table,
        cu_seqlens_q=cu_seqlens_q,
        # Draft-extend v2's layout: query i spans [i * stride, (i + 1) * stride).
        q_stride=max(draft_tokens, 1) if strided else 0,
        q_mode=kernels.Q_MODE_STRIDED if strided else kernels.Q_MODE_NONE,
    )


declare_outputs(trtllm_mha_graph_metadata, "decode_metadata")
# SGLang sets both prefix sums' entry 0 once, at allocation, and this kernel never writes it.
declare_builder(trtllm_mha_graph_metadata, engine_presets=("cu_seqlens_k[0]", "cu_seqlens_q[0]"))


def normal_decode_metadata(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    page_size: int,
    *,
    cache_seqlens: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    page_table: torch.Tensor,
    draft_tokens: int = 0,
    cu_seqlens_q: torch.Tensor | None = None,
    swa_page_table: torch.Tensor | None = None,
    full_to_swa: torch.Tensor | None = None,
) -> None:
    """SGLang's ``normal_decode_set_metadata`` (FlashAttention backend, static pool) under
    ``build_decode_metadata``'s contract: ``seq_len_delta = draft_tokens``,
    ``max_seq_pages`` = the table's width, SWA through the token-slot mapping.

    Shapes and dtypes as ``trtllm_mha_graph_metadata``; ``page_size`` a power of two. The
    kernel has no ``cu_seqlens_q`` (the backend presets it at allocation): passing one is a
    ``ValueError``.
    """
    if cu_seqlens_q is not None:
        raise ValueError(
            "normal_decode_set_metadata has no cu_seqlens_q: SGLang presets it at allocation"
        )
    load_kernel_file("metadata").normal_decode_set_metadata(
        cache_seqlens_int32=cache_seqlens,
        cu_seqlens_k=cu_seqlens_k,
        page_table=page_table,
        req_to_token=req_to_token,
        req_pool_indices=req_pool_indices,
        max_seq_pages=page_table.shape[1],
        seq_lens=seq_lens,
        seq_len_delta=draft_tokens,
        page_size=page_size,
        swa_page_table=swa_page_table,
        full_to_swa_index_mapping=full_to_swa,
    )


declare_outputs(normal_decode_metadata, "decode_metadata")


# -- kv_indices.py: CSR and FlashMLA formats, with their references ---------------------------


def flashinfer_kv_indices(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    kv_lens: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    *,
    kv_start_idx: torch.Tensor | None = None,
    token_blocks: int = 1,
) -> None:
    """The CSR build of SGLang's FlashInfer-style backends: ``kv_indptr[1:bs+1] =
    cumsum(kv_lens)`` with torch, then ``create_flashinfer_kv_indices_triton``.

    Args:
        req_to_token: ``[max_reqs, ctx]`` int32, token slots.
        req_pool_indices: ``[bs]`` int32/int64.
        kv_lens: ``[bs]`` int32/int64, tokens of each row (from ``kv_start_idx`` on).
        kv_indptr: ``[>= bs + 1]`` int32; entry 0 preset to 0 by the caller (at allocation).
        kv_indices: ``[>= sum(kv_lens)]`` int32; row ``i`` fills
            ``kv_indices[kv_indptr[i] : kv_indptr[i + 1]]``.
        kv_start_idx: optional ``[bs]`` int, first token of each row.
        token_blocks: programs per row (aiter's ``TOKEN_BLOCK_PARALLEL`` launch when > 1).
    """
    kernels = load_kernel_file("kv_indices")
    bs = kv_lens.shape[0]
    kv_indptr[1 : bs + 1] = torch.cumsum(kv_lens, dim=0)
    kernels.create_flashinfer_kv_indices_triton[(bs, token_blocks)](
        req_to_token,
        req_pool_indices,
        kv_lens,
        kv_indptr,
        kv_start_idx,
        kv_indices,
        req_to_token.stride(0),
        TOKEN_BLOCK_PARALLEL=token_blocks > 1,
    )


def flashmla_kv_indices(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    kv_lens: torch.Tensor,
    block_kv_indices: torch.Tensor,
    page_size: int = 64,
    *,
    kv_start_idx: torch.Tensor | None = None,
) -> None:
    """``create_flashmla_kv_indices_triton`` as FlashMLA's CUDA-graph path launches it: one
    row of programs a batch row, ``cdiv(row stride, 4096 // page_size)`` blocks wide.

    Args:
        req_to_token: ``[max_reqs, ctx]`` int32, token slots.
        req_pool_indices: ``[bs]`` int32/int64.
        kv_lens: ``[bs]`` int32/int64, tokens of each row.
        block_kv_indices: ``[>= bs, width]`` int32, inner stride 1; row ``i`` gets its
            ``cdiv(kv_lens[i], page_size)`` page ids (with no clamp to ``width``).
        page_size: the kernel's ``PAGED_SIZE``, dividing 4096.
        kv_start_idx: optional ``[bs]`` int, token offset of each row.
    """
    kernels = load_kernel_file("kv_indices")
    stride = block_kv_indices.stride(0)
    blocks = kernels.get_num_kv_index_blocks_flashmla(stride, page_size)
    kernels.create_flashmla_kv_indices_triton[(kv_lens.shape[0], blocks)](
        req_to_token,
        req_pool_indices,
        kv_lens,
        kv_start_idx,
        block_kv_indices,
        req_to_token.stride(0),
        stride,
        PAGED_SIZE=page_size,
    )


def flashmla_page_table(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    page_table: torch.Tensor,
    page_size: int,
) -> None:
    """``create_flashmla_kv_indices_triton`` under ``pagegraph.build_page_table``'s contract
    (page tables only: no SWA, no ``errors``), launched as ``FlashMLABackend`` does for CUDA
    graphs: ``kv_start_idx`` None, grid ``(bs, get_num_kv_index_blocks_flashmla(row stride,
    page_size))``.

    Args: ``req_to_token`` ``[max_reqs, ctx]`` int32/int64, ``req_pool_indices`` and
    ``seq_lens`` ``[bs]`` int32/int64, ``page_table`` ``[bs, width]`` int32 with inner stride
    1 (written in place), ``page_size`` dividing 4096 (FlashMLA's is 64). Differences from the
    contract: docs/ARCHITECTURE.md, "SGLang's kernels behind the contracts".
    """
    flashmla_kv_indices(req_to_token, req_pool_indices, seq_lens, page_table, page_size)


def _refuse_pages(page_size: int) -> None:
    if page_size != 1:
        raise ValueError(
            f"page_size {page_size}: SGLang's FlashInfer backend emits token slots (page size 1)"
        )


def flashinfer_csr(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    page_size: int,
    *,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
) -> None:
    """SGLang's FlashInfer decode CSR build in a CUDA graph, under pagegraph's ``"csr"``
    contract: ``kv_indptr[1:bs+1] = torch.cumsum(seq_lens)``, then
    ``create_flashinfer_kv_indices_triton[(bs,)]`` with ``ENTRY_PAGE_SIZE`` 1.

    Args:
        req_to_token: ``[rows, cols]`` int32/int64, token slots.
        req_pool_indices, seq_lens: ``[bs]`` int32/int64.
        page_size: must be 1 (``ValueError`` otherwise): the backend emits token slots.
        kv_indptr: ``[bs + 1]`` int32; entry 0 preset to 0 at allocation, never written.
        kv_indices: ``[capacity]`` int32; row ``i`` fills ``[kv_indptr[i], kv_indptr[i + 1])``.
    """
    _refuse_pages(page_size)
    flashinfer_kv_indices(req_to_token, req_pool_indices, seq_lens, kv_indptr, kv_indices)


declare_outputs(flashinfer_csr, "csr")
# SGLang's FlashInfer backend builds token slots, and sets kv_indptr[0] once, at allocation.
declare_builder(flashinfer_csr, page_sizes=(1,), engine_presets=("kv_indptr[0]",))


def flashinfer_csr_token_blocks(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    page_size: int,
    *,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
) -> None:
    """``flashinfer_csr`` on SGLang's token-block grid: ``(bs, kv_indices_num_token_blocks(
    cols, bs))`` programs, ``TOKEN_BLOCK_PARALLEL`` when that is more than one a row (the
    programs of a row stride over its copy loop together). Args as ``flashinfer_csr``."""
    _refuse_pages(page_size)
    kernels = load_kernel_file("kv_indices")
    blocks = kernels.kv_indices_num_token_blocks(req_to_token.shape[1], seq_lens.shape[0])
    flashinfer_kv_indices(
        req_to_token, req_pool_indices, seq_lens, kv_indptr, kv_indices, token_blocks=blocks
    )


declare_outputs(flashinfer_csr_token_blocks, "csr")
declare_builder(flashinfer_csr_token_blocks, page_sizes=(1,), engine_presets=("kv_indptr[0]",))


def _starts(kv_start_idx: torch.Tensor | None, bs: int) -> list[int]:
    return [0] * bs if kv_start_idx is None else [int(s) for s in kv_start_idx.tolist()]


def reference_flashinfer_kv_indices(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    kv_lens: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    *,
    kv_start_idx: torch.Tensor | None = None,
) -> None:
    """What the CSR build must produce, in plain torch (reads values on the host):
    ``kv_indptr[:bs+1] = [0, running sums of kv_lens]`` and, for each row ``i`` with start
    ``s``, ``kv_indices[kv_indptr[i] : kv_indptr[i+1]] = req_to_token[req_pool_indices[i],
    s : s + kv_lens[i]]``. Nothing else is written. Shapes as ``flashinfer_kv_indices``."""
    lens = [int(n) for n in kv_lens.tolist()]
    sums = [0]
    for n in lens:
        sums.append(sums[-1] + n)
    kv_indptr[: len(sums)] = torch.tensor(sums, dtype=kv_indptr.dtype)
    starts = _starts(kv_start_idx, len(lens))
    for i, req in enumerate(req_pool_indices.tolist()):
        row = req_to_token[int(req), starts[i] : starts[i] + lens[i]]
        kv_indices[sums[i] : sums[i + 1]] = row.to(kv_indices.dtype)


def reference_flashmla_kv_indices(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    kv_lens: torch.Tensor,
    block_kv_indices: torch.Tensor,
    page_size: int = 64,
    *,
    kv_start_idx: torch.Tensor | None = None,
) -> None:
    """What the FlashMLA table must hold, in plain torch (reads values on the host): for row
    ``i`` with start ``s`` and ``n = min(cdiv(kv_lens[i], page_size), width)`` pages,
    ``block_kv_indices[i, p] = req_to_token[req_pool_indices[i], s + p * page_size] //
    page_size`` for ``p < n``; nothing else is written. Shapes as ``flashmla_kv_indices``."""
    width = block_kv_indices.shape[1]
    lens = [int(n) for n in kv_lens.tolist()]
    starts = _starts(kv_start_idx, len(lens))
    for i, req in enumerate(req_pool_indices.tolist()):
        n = min(max(-(-lens[i] // page_size), 0), width)
        slots = req_to_token[int(req), starts[i] : starts[i] + n * page_size : page_size]
        block_kv_indices[i, :n] = (slots.to(torch.int64) // page_size).to(block_kv_indices.dtype)


#: SGLang's builders under pagegraph's contracts, by the name the checker knows them by;
#: empty where SGLang's kernel files are not installed.
SGLANG_BUILDERS: dict[str, Callable[..., object]] = (
    {
        "sglang_trtllm_mha_page_table": trtllm_mha_page_table,
        "sglang_trtllm_mha_graph_metadata": trtllm_mha_graph_metadata,
        "sglang_flashmla_kv_indices": flashmla_page_table,
        "sglang_flashinfer_kv_indices": flashinfer_csr,
        "sglang_flashinfer_kv_indices_blocks": flashinfer_csr_token_blocks,
    }
    if sglang_unavailable_reason() is None
    else {}
)
