"""SGLang's attention-metadata kernels behind pagegraph's builder contracts.

SGLang (0.5.23 and later) keeps its metadata kernels in plain files under
``sglang/kernels/ops/attention/`` that import only torch and triton. This module finds them
without importing the ``sglang`` package (its ``__init__`` needs the whole serving stack),
loads each file by path once per process (a second load would be a new ``@triton.jit``
function, compiled again) and wraps SGLang's functions in adapters of a few lines that call
them exactly as SGLang's attention backends do. Nothing of SGLang is copied here.

Adapters (``SGLANG_BUILDERS`` names those the checker's registry knows, by the name in brackets):

* ``trtllm_mha_page_table`` [``sglang_trtllm_mha_page_table``]: ``build_trtllm_mha_page_table``,
  a ``"page_table"`` builder (``pagegraph.build_page_table``'s contract, without ``errors``).
* ``trtllm_mha_graph_metadata`` [``sglang_trtllm_mha_graph_metadata``]:
  ``update_trtllm_mha_graph_metadata``, a ``"decode_metadata"`` builder
  (``build_decode_metadata``'s contract).
* ``flashmla_page_table`` [``sglang_flashmla_kv_indices``]: ``create_flashmla_kv_indices_triton``
  as the FlashMLA backend launches it for CUDA graphs, a ``"page_table"`` builder (no SWA).
* ``flashinfer_csr`` [``sglang_flashinfer_kv_indices``] and ``flashinfer_csr_token_blocks``
  [``sglang_flashinfer_kv_indices_blocks``]: the FlashInfer backend's decode CSR build at page
  size 1 (``kv_indptr`` by a torch cumsum, then ``create_flashinfer_kv_indices_triton`` on one
  program a row, or on SGLang's token-block grid), ``"csr"`` builders.
* ``normal_decode_metadata``: ``metadata.normal_decode_set_metadata`` (FlashAttention
  backend's decode), a ``"decode_metadata"`` builder without ``cu_seqlens_q``.
* ``flashinfer_kv_indices`` and ``flashmla_kv_indices``: the CSR and FlashMLA index builders
  of ``kv_indices.py`` with all their arguments, and plain-torch references of what they must
  produce (``reference_flashinfer_kv_indices``, ``reference_flashmla_kv_indices``).

Where ``build_trtllm_mha_page_table`` differs from pagegraph's page-table contract
----------------------------------------------------------------------------------
* Its grid is ``(bs, cdiv(width, 4096 // page_size))`` and each program masks by
  ``page < cdiv(seq_len, page_size)`` only, never by the width: a ``seq_len`` past
  ``width * page_size`` (speculative draft tokens, dummy rows) writes up to the next multiple
  of the block, into the next row of a contiguous table (its live first pages included,
  racing with that row's own programs), or past the end of the buffer for the last row
  (``examples/sglang_trtllm_page_table_spill.py``).
* It writes the SWA table with ``page_table.stride(0)``: an SWA table with its own row
  stride (a column slice of a wider buffer, or any other allocation) gets its rows at the
  wrong addresses (``examples/sglang_trtllm_swa_stride.py``). SGLang's own backends allocate
  both tables alike, so they do not hit it.
* No clamp of ``req_pool_indices`` into ``req_to_token``, and an overlong row reads
  ``req_to_token`` past its own row; pagegraph clamps both (the row's capacity is
  ``min(width, cdiv(req_to_token columns, page_size))``).
* Strides are constexprs: one compilation per (``req_to_token``, page table) row-stride
  pair, which CUDA-graph buckets sliced from one static buffer share. ``page_size`` must
  divide 4096. No ``errors`` counters.

Where ``update_trtllm_mha_graph_metadata`` differs from pagegraph's decode-metadata contract
--------------------------------------------------------------------------------------------
The mapping: ``seqlen_offset = draft_tokens``; ``max_seq_pages`` = the table's width;
``bs = len(seq_lens)``; with ``cu_seqlens_q``, ``q_mode = Q_MODE_STRIDED`` and
``q_stride = max(draft_tokens, 1)`` (else ``Q_MODE_NONE``). Then:

* It never writes ``cu_seqlens_k[0]`` nor ``cu_seqlens_q[0]``: SGLang sets them to 0 when it
  allocates the buffers. They are preset outputs: a checker that poisons every output before
  a replay must write 0 there once, at allocation, and then check that they keep it.
* No clamp of negative lengths: ``cache_seqlens = seq_lens + offset`` as given (int32, so a
  sum past 2^31 - 1 wraps), and the running sums include negative values; pagegraph clamps
  a negative length to 0 and saturates.
* ``BS_BLOCK = next_power_of_2(bs)`` is a constexpr (the single scanning program holds the
  whole batch in one tile): one compilation per power of two of ``bs``, by design. Warm-up
  pays for them; only a compilation at replay or inside a capture is a hazard, so compile
  counts are advice, not a safety failure. ``bs == 0`` launches nothing.
* Pages per row are clamped to ``max_seq_pages``, so no row spills into the next; but not to
  ``req_to_token``'s row, which an overlong length reads past. The SWA slot is not clamped
  into ``full_to_swa``, and a negative slot gives SWA page -1.
* As in pagegraph, the stale tail of each row is left as it was (consumers bound their reads
  by ``cache_seqlens``), and the SWA table has its own row stride.

The fused kernel's other outputs (``tests/test_sglang_formats.py``)
-------------------------------------------------------------------
* ``swa_out_cache_loc`` (with ``out_cache_loc`` and ``swa_mapping``): entry ``j`` below
  ``n = min(len(out_cache_loc), len(swa_out_cache_loc))`` gets ``full_to_swa[loc_j]``, or -1
  where ``loc_j < 0``; entries ``n`` to the end of ``swa_out_cache_loc`` get 0; nothing else is
  written. ``loc_j`` is not clamped into ``full_to_swa``: a slot at or past its end is read
  out of bounds (``build_trtllm_mha_page_table`` clamps its SWA index; this kernel, and its
  own SWA page-table lookup, do not).
* ``cu_seqlens_q``: ``Q_MODE_CUMSUM`` writes ``[1:bs+1]`` with the int32 running sum of
  ``qlens`` (no clamp of negative values), ``Q_MODE_STRIDED`` writes ``(i + 1) * q_stride``;
  neither writes entry 0 nor anything past ``bs``.
* ``skip_page_table=True`` writes ``cache_seqlens`` and ``cu_seqlens_*`` only: both page
  tables are left as they were.

``normal_decode_set_metadata`` (``metadata.py``) writes ``cu_seqlens_k[0]`` itself, adds its
offset as the constexpr ``SEQ_LEN_DELTA`` (one compilation per draft count), clamps pages to
``max_seq_pages``, does not clamp negative lengths, and has no ``cu_seqlens_q`` (the backend
presets it): the adapter refuses one.

The rest of ``metadata.py`` and ``pa_page_table.py``
----------------------------------------------------
* ``draft_extend_set_metadata`` fits the page-table part of the model but not the rest:
  ``cache_seqlens`` is ``seq_lens`` with no offset and ``cu_seqlens_q`` is the running sum
  of per-row ``extend_seq_lens``, not ``i * step``; it needs a draft-extend contract.
* ``prepare_swa_spec_page_table_triton`` concatenates two page tables row by row at a
  data-dependent split (``seq_len_a``), for ``bs * draft`` expanded rows: neither a page
  table from ``req_to_token`` nor decode metadata.
* ``get_num_kv_splits_triton`` and ``q8kv8_topk_length_from_indices`` compute split counts
  and top-k lengths, not tables.
* ``pa_page_table._build_pa_page_table`` builds a token-granular table of a prefill prefix
  plus the last ``window_size`` tokens, with ``prefill_lens`` indexed by request and
  ``kv_lens`` as an output, and allocates when no buffers are given: a sliding-window
  layout, not ``req_to_token[r, p * page_size] // page_size``.

Where ``create_flashmla_kv_indices_triton`` differs from pagegraph's page-table contract
----------------------------------------------------------------------------------------
Launched as ``FlashMLABackend``'s CUDA-graph path does (``kv_start_idx`` None, grid
``(bs, get_num_kv_index_blocks_flashmla(page_table.stride(0), page_size))``), it writes the
contract's entries on in-contract inputs, but:

* Its grid follows the table's row stride, not its width, in blocks of ``4096 // page_size``
  pages masked by ``page < cdiv(seq_len, page_size)`` only: an overlong row writes up to the
  next multiple of the block past the row stride, into the row's padding columns and then the
  next row's first columns (its live page included), or past the buffer for the last row,
  whenever the row stride rounded up to whole blocks passes the width: a width that is not a
  multiple of the block, or padding columns (``examples/sglang_flashmla_kv_indices_spill.py``).
  SGLang's own buffer is ``(max_context_len + 64) // 64`` pages wide, rarely a multiple of 64.
* ``req_pool_index * req_to_token.stride(0)`` is computed in ``req_pool_indices``' dtype:
  with int32 indices the offset wraps once ``req_to_token`` holds 2^31 slots or more (SGLang's
  graph runners pass int64 indices). No clamp of the index, nor of a row into
  ``req_to_token``'s own row.
* Strides are constexprs (one compilation per row-stride pair); ``page_size`` must divide
  4096; no SWA table; no ``errors`` counters. A negative length writes nothing, as the
  contract's clamp to 0 does.

Where the FlashInfer CSR build differs from pagegraph's ``"csr"`` contract
--------------------------------------------------------------------------
The contract: ``n_i = min(cdiv(max(len_i, 0), page_size), cdiv(cols, page_size))`` pages a
row, ``kv_indptr[i + 1] = kv_indptr[i] + n_i``, ``kv_indices[kv_indptr[i] + p] =
req_to_token[rpi_i, p * page_size] // page_size``, nothing past ``kv_indptr[bs]``. SGLang's
FlashInfer backend emits token slots, so only ``page_size == 1`` fits (the adapters refuse
others). Then:

* ``kv_indptr[1:bs+1] = torch.cumsum(seq_lens)`` runs as torch ops in the graph (the cumsum
  is a temporary tensor) and clamps nothing: a negative length makes ``kv_indptr`` decrease
  (the next row's entries overwrite those of the rows before it), and a length past
  ``req_to_token``'s row reads past that row and writes that many entries, past the
  contract's ``kv_indptr[bs]`` (and past the end of ``kv_indices`` once the running sum
  passes its capacity).
* ``kv_indptr[0]`` is never written: SGLang presets it at allocation.
* ``req_pool_indices`` is not clamped into ``req_to_token``; the stride is a runtime
  argument (one compilation for every width).

The rest of ``kv_indices.py``: ``create_flashinfer_kv_indices_triton`` with ``kv_start_idx``
(encoder-decoder rows), ``ENTRY_PAGE_SIZE > 1`` (a page-granular source table) or
``token_mapping`` (a fused full-to-SWA translation) is not a builder of pagegraph's; the
``flashinfer_kv_indices`` and ``flashmla_kv_indices`` adapters take ``kv_start_idx``.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

import torch

from .kernel_files import load_file_module

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
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        _interpreter_indexes_loaded_scalars()
    return load_file_module(key, path)


def _interpreter_indexes_loaded_scalars() -> None:
    """Let Triton's CPU interpreter use a scalar loaded from memory as a ``range`` bound.

    Under ``TRITON_INTERPRET=1`` such a scalar is a one-element array, and the interpreter
    converts it with ``int(array)``, which NumPy 2.4 refuses for anything but 0-d arrays.
    SGLang's kernels loop up to lengths they load (``range(tl.cdiv(n, BLOCK))``), so without
    this they cannot run on a machine without a GPU. The wrapper converts through ``.item()``
    and changes nothing where NumPy still accepts the conversion; compiled kernels never see it.
    """
    import numpy as np

    try:
        int(np.ones(1, dtype=np.int32))
        return
    except TypeError:
        pass
    from triton.runtime import interpreter

    original = getattr(interpreter, "_patch_lang_tensor", None)
    if original is None or getattr(original, "pagegraph_index_fix", False):
        return

    def patch_lang_tensor(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.item()))

    patch_lang_tensor.pagegraph_index_fix = True
    interpreter._patch_lang_tensor = patch_lang_tensor


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
    contract: the module docstring.
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
    ``[num_slots + 1]`` int64. Mapping and differences: the module docstring.
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


trtllm_mha_graph_metadata.pagegraph_outputs = "decode_metadata"


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


normal_decode_metadata.pagegraph_outputs = "decode_metadata"


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
    contract: the module docstring.
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


flashinfer_csr.pagegraph_outputs = "csr"
flashinfer_csr.pagegraph_page_sizes = (1,)  # SGLang's FlashInfer backend builds token slots


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


flashinfer_csr_token_blocks.pagegraph_outputs = "csr"
flashinfer_csr_token_blocks.pagegraph_page_sizes = (1,)


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
SGLANG_BUILDERS = (
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
