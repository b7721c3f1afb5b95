"""vLLM's TRITON_ATTN decode step as a pagegraph ``Reader``: vLLM 0.34.0's own cache write
(``triton_reshape_and_cache_flash``, slots from ``_compute_slot_mappings_kernel``) and its own
attention (``unified_attention``), loaded by path from vLLM's files as ``vllm_files`` loads
``block_table.py``: each file's imports from the rest of vLLM are answered by the stand-ins of
``STUBBED_IMPORTS`` through the file's own ``__import__``, never ``sys.modules``.

The reader passes what vLLM's ``TritonAttentionImpl.forward`` / ``do_kv_cache_update`` pass for
a decode batch (one query token a row, no window, no soft cap, ``kv_cache_dtype="auto"``), with
the host values ``TritonAttentionMetadataBuilder`` decides under full CUDA graphs:
docs/ARCHITECTURE.md, "vLLM's TRITON_ATTN step".
"""

from __future__ import annotations

import ast
import builtins
import enum
import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import torch

from ..consumers.reader import CacheWrite, HostBatch, Reader
from ..kernels.file_modules import load_file_module
from .vllm_files import KERNEL_FILES, TESTED_VERSION, VLLMUnavailable, load_vllm_kernels, vllm_root

__all__ = [
    "ATTENTION_FILES",
    "BACKEND_FILE",
    "DEVICE_FILES",
    "STUBBED_IMPORTS",
    "TRITON_ATTN",
    "backend_constants",
    "load_vllm_attention",
    "triton_attn_config",
    "vllm_attention_unavailable_reason",
]

#: The files run, relative to the folder that holds ``vllm/`` (helpers first: the attention
#: file imports it).
ATTENTION_FILES = (
    "vllm/v1/attention/ops/triton_attention_helpers.py",
    "vllm/v1/attention/ops/triton_reshape_and_cache_flash.py",
    "vllm/v1/attention/ops/triton_unified_attention.py",
)
#: The TRITON_ATTN backend: parsed (``ast``), never run, for its launch constants.
BACKEND_FILE = "vllm/v1/attention/backends/triton_attn.py"
#: Where ``KVQuantMode``'s values are parsed from (never run: it imports much of vLLM).
KV_CACHE_INTERFACE_FILE = "vllm/v1/kv_cache_interface.py"
#: Every file the reader needs, as they lie in the wheel (the block-table files included).
REQUIRED_FILES = (*KERNEL_FILES, *ATTENTION_FILES, BACKEND_FILE)
#: What a machine without a network needs in ``.device/vllm-lite`` (paths inside the wheel).
DEVICE_FILES = (
    *REQUIRED_FILES,
    "vllm/v1/attention/backends/utils.py",
    KV_CACHE_INTERFACE_FILE,
)

#: The backend's launch constants as vLLM 0.34.0 defines them, used where the file lacks one.
_BACKEND_DEFAULTS = {"MIN_LAUNCH_GRID_SIZE_2D": 128, "NUM_PAR_SOFTMAX_SEGMENTS": 16}
#: vLLM 0.34.0's ``KVQuantMode`` values, used where ``kv_cache_interface.py`` is missing.
_KV_QUANT_MODES = {"NONE": 0, "FP8_PER_TENSOR": 1, "INT8_PER_TOKEN_HEAD": 2,
                   "FP8_PER_TOKEN_HEAD": 3, "INT4_PER_TOKEN_HEAD": 4}  # fmt: skip
#: The cache dtypes vLLM stores as they are (``_NATIVE_KV_CACHE_DTYPES``).
_NATIVE = {"auto", "float16", "bfloat16", "float32", "half", "float"}

#: Every name the three files import from vLLM that pagegraph answers itself.
STUBBED_IMPORTS: dict[str, str] = {
    "vllm.triton_utils.triton / tl": "the installed triton / triton.language",
    "vllm.envs": "VLLM_BATCH_INVARIANT=False, VLLM_TRITON_USE_TD=None (vLLM's defaults)",
    "vllm.logger.init_logger": "logging.getLogger with vLLM's debug_once/info_once/warning_once",
    "vllm.platforms.current_platform": (
        "an NVIDIA sm_90 (is_cuda; not ROCm, XPU or CPU; fp8 dtype float8_e4m3fn; "
        "device capability 9.0, family 90); under the CPU interpreter the same answers"
    ),
    "vllm.v1.kv_cache_interface.KVQuantMode": (
        f"an IntEnum with the values parsed from vLLM's {KV_CACHE_INTERFACE_FILE} "
        "(vLLM 0.34.0's where the file is missing)"
    ),
    "vllm.v1.kv_cache_interface.is_quantized_kv_cache": (
        "False for vLLM's native cache dtypes ('auto', 'bfloat16', ...), True otherwise"
    ),
    "vllm.model_executor.layers.quantization.utils.quant_utils.FP8_DTYPE / get_fp8_min_max": (
        "torch.float8_e4m3fn and its finfo (min, max), as on CUDA"
    ),
    "torch.cuda.get_device_capability (reshape_and_cache, CPU tensors only)": (
        "(9, 0) for a tensor off CUDA (the interpreter), the real call for a CUDA tensor"
    ),
}

_MODULE_KEY = "pagegraph_vllm_attention_{}"
_loaded: SimpleNamespace | None = None


def _module_constants(path: Path, names: set[str]) -> dict[str, object]:
    """Module-level ``NAME = literal`` assignments of ``path`` (parsed, never run)."""
    found: dict[str, object] = {}
    if not path.is_file():
        return found
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            if isinstance(target, ast.Name) and target.id in names:
                try:
                    found[target.id] = ast.literal_eval(node.value)
                except ValueError:
                    pass
    return found


def backend_constants(root: Path) -> dict[str, int]:
    """``MIN_LAUNCH_GRID_SIZE_2D`` and ``NUM_PAR_SOFTMAX_SEGMENTS`` from vLLM's
    ``triton_attn.py`` under ``root`` (vLLM 0.34.0's values for any it lacks)."""
    found = _module_constants(root / BACKEND_FILE, set(_BACKEND_DEFAULTS))
    return {k: int(found.get(k, v)) for k, v in _BACKEND_DEFAULTS.items()}  # type: ignore[call-overload]


def _kv_quant_mode(root: Path) -> type[enum.IntEnum]:
    """``KVQuantMode``'s members with the values vLLM's file gives them."""
    values: dict[str, int] = {}
    path = root / KV_CACHE_INTERFACE_FILE
    if path.is_file():
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef) and node.name == "KVQuantMode":
                for item in node.body:
                    if (
                        isinstance(item, ast.Assign)
                        and isinstance(item.targets[0], ast.Name)
                        and isinstance(item.value, ast.Constant)
                        and isinstance(item.value.value, int)
                    ):
                        values[item.targets[0].id] = item.value.value
    return enum.IntEnum("KVQuantMode", values or _KV_QUANT_MODES)  # type: ignore[return-value]


class _OnceLogger(logging.LoggerAdapter[logging.Logger]):
    """vLLM's logger: a standard one with ``*_once`` methods."""

    def __init__(self, name: str) -> None:
        super().__init__(logging.getLogger(name), {})
        self._seen: set[tuple[str, str]] = set()

    def _once(self, level: str, msg: str, *args: object, **kwargs: object) -> None:
        if (level, msg) not in self._seen:
            self._seen.add((level, msg))
            kwargs.pop("scope", None)
            getattr(self, level)(msg, *args, **kwargs)

    def debug_once(self, msg: str, *args: object, **kwargs: object) -> None:
        self._once("debug", msg, *args, **kwargs)

    def info_once(self, msg: str, *args: object, **kwargs: object) -> None:
        self._once("info", msg, *args, **kwargs)

    def warning_once(self, msg: str, *args: object, **kwargs: object) -> None:
        self._once("warning", msg, *args, **kwargs)


class _Platform:
    """``current_platform`` of an NVIDIA sm_90 (an H100/H200), the CPU interpreter included."""

    capability = (9, 0)

    def is_cuda(self) -> bool:
        return True

    def is_rocm(self) -> bool:
        return False

    def is_xpu(self) -> bool:
        return False

    def is_cpu(self) -> bool:
        return False

    def fp8_dtype(self) -> torch.dtype:
        return torch.float8_e4m3fn

    def has_device_capability(self, capability: int | tuple[int, ...], device_id: int = 0) -> bool:
        if isinstance(capability, tuple):
            capability = capability[0] * 10 + capability[1]
        return self.capability[0] * 10 + self.capability[1] >= capability

    def is_device_capability(self, capability: int | tuple[int, ...], device_id: int = 0) -> bool:
        if isinstance(capability, tuple):
            return tuple(capability) == self.capability
        return self.capability[0] * 10 + self.capability[1] == capability

    def is_device_capability_family(self, capability: int, device_id: int = 0) -> bool:
        return (self.capability[0] * 10 + self.capability[1]) // 10 == capability // 10

    def get_device_capability(self, device_id: int = 0) -> SimpleNamespace:
        return SimpleNamespace(major=self.capability[0], minor=self.capability[1])

    def num_compute_units(self, device_id: int = 0) -> int:
        return 132


class _TorchOffCuda(ModuleType):
    """``torch`` for ``triton_reshape_and_cache_flash.py``: the real module, but
    ``torch.cuda.get_device_capability`` of a tensor off CUDA answers the platform's (9, 0)."""

    def __init__(self) -> None:
        super().__init__("torch")
        real_cuda = torch.cuda

        def get_device_capability(device: torch.types.Device = None) -> tuple[int, int]:
            if device is not None and torch.device(device).type != "cuda":
                return _Platform.capability
            return real_cuda.get_device_capability(device)

        cuda = ModuleType("torch.cuda")
        cuda.__getattr__ = lambda name: getattr(real_cuda, name)  # type: ignore[method-assign]
        cuda.get_device_capability = get_device_capability  # type: ignore[attr-defined]
        self.cuda = cuda

    def __getattr__(self, name: str) -> Any:
        return getattr(torch, name)


def _stand_ins(root: Path) -> dict[str, ModuleType]:
    import triton
    import triton.language as tl

    def module(name: str, **names: object) -> ModuleType:
        m = ModuleType(f"pagegraph_vllm_stub.{name}")
        m.__dict__.update(names)
        return m

    kv_quant_mode = _kv_quant_mode(root)
    fp8 = torch.finfo(torch.float8_e4m3fn)
    return {
        "vllm.triton_utils": module("vllm.triton_utils", triton=triton, tl=tl),
        "vllm.envs": module("vllm.envs", VLLM_BATCH_INVARIANT=False, VLLM_TRITON_USE_TD=None),
        "vllm.logger": module("vllm.logger", init_logger=_OnceLogger),
        "vllm.platforms": module("vllm.platforms", current_platform=_Platform()),
        "vllm.v1.kv_cache_interface": module(
            "vllm.v1.kv_cache_interface",
            KVQuantMode=kv_quant_mode,
            is_quantized_kv_cache=lambda dtype: dtype not in _NATIVE,
        ),
        "vllm.model_executor.layers.quantization.utils.quant_utils": module(
            "quant_utils",
            FP8_DTYPE=torch.float8_e4m3fn,
            get_fp8_min_max=lambda: (fp8.min, fp8.max),
        ),
    }


def _importer(
    answers: dict[str, ModuleType], overrides: dict[str, ModuleType]
) -> Callable[..., ModuleType]:
    """An ``__import__`` answering ``answers``' names (``from vllm.x import y`` and
    ``import vllm.x as y``) and ``overrides`` (non-vLLM modules), refusing any other vLLM."""
    real = builtins.__import__

    def isolated_import(
        name: str,
        globals: Mapping[str, object] | None = None,
        locals: Mapping[str, object] | None = None,
        fromlist: Sequence[str] = (),
        level: int = 0,
    ) -> ModuleType:
        if level == 0 and name in overrides:
            return overrides[name]
        if level == 0 and (name == "vllm" or name.startswith("vllm.")):
            if name in answers:
                if fromlist:
                    return answers[name]
                # ``import vllm.envs as envs``: the top package, attributes down to the module.
                parts = name.split(".")
                top = node = ModuleType("vllm")
                for part in parts[1:-1]:
                    child = ModuleType(f"{node.__name__}.{part}")
                    setattr(node, part, child)
                    node = child
                setattr(node, parts[-1], answers[name])
                return top
            raise ImportError(
                f"vLLM's attention files import {name}, which pagegraph does not stub "
                f"(written against vLLM {TESTED_VERSION})"
            )
        return real(name, globals, locals, fromlist, level)

    return isolated_import


def vllm_attention_unavailable_reason() -> str | None:
    """Why vLLM's TRITON_ATTN files cannot be loaded here (one line), or ``None``."""
    try:
        vllm_root(REQUIRED_FILES)
    except VLLMUnavailable as exc:
        return str(exc)
    return None


def load_vllm_attention() -> SimpleNamespace:
    """vLLM's TRITON_ATTN functions, loaded once per process: ``reshape_and_cache``
    (``triton_reshape_and_cache_flash``), ``unified_attention``, ``kernels`` (the block-table
    kernels, ``load_vllm_kernels()``), ``constants`` (``backend_constants``) and ``root``."""
    global _loaded
    if _loaded is not None:
        return _loaded
    root = vllm_root(REQUIRED_FILES)
    kernels = load_vllm_kernels()  # fits the interpreter to the engines' files (bf16 dots)
    answers = _stand_ins(root)

    def load(path: str, overrides: dict[str, ModuleType] | None = None) -> ModuleType:
        name = Path(path).stem
        own = dict(builtins.__dict__, __import__=_importer(answers, overrides or {}))
        return load_file_module(_MODULE_KEY.format(name), root / path, own)

    helpers = load(ATTENTION_FILES[0])
    answers["vllm.v1.attention.ops.triton_attention_helpers"] = helpers
    off_cuda: dict[str, ModuleType] = {"torch": _TorchOffCuda()}
    cache = load(ATTENTION_FILES[1], off_cuda)
    attention = load(ATTENTION_FILES[2])
    _loaded = SimpleNamespace(
        reshape_and_cache=cache.triton_reshape_and_cache_flash,
        unified_attention=attention.unified_attention,
        kernels=kernels,
        constants=backend_constants(root),
        root=root,
    )
    return _loaded


# --- the reader -------------------------------------------------------------------------------


def capture_sizes(max_bs: int) -> list[int]:
    """vLLM's default ``cudagraph_capture_sizes`` up to ``max_bs`` (pagegraph's "vllm"
    buckets): what the backend picks ``seq_threshold_3D`` from."""
    # vLLM's default list: 1, 2, 4, every multiple of 8 up to 256, then of 16.
    defaults = (1, 2, 4, *range(8, 257, 8), *range(272, max(max_bs, 272) + 1, 16))
    return [b for b in defaults if b <= max_bs] or [max_bs]


def triton_attn_config(
    max_bs: int, num_q_heads: int, num_kv_heads: int, head_dim: int, constants: dict[str, int]
) -> dict[str, int]:
    """The host values ``TritonAttentionMetadataBuilder.__init__`` decides with full decode
    CUDA graphs on an sm_90, no speculation: ``seq_threshold_3D`` (the capture size closest to
    ``MIN_LAUNCH_GRID_SIZE_2D // num_kv_heads``), ``num_par_softmax_segments`` and the 3D
    scratch's rows (``min(seq_threshold_3D, max_num_seqs) * 1``)."""
    threshold = constants["MIN_LAUNCH_GRID_SIZE_2D"] // num_kv_heads
    threshold = min(capture_sizes(max_bs), key=lambda x: abs(x - threshold))
    segments = constants["NUM_PAR_SOFTMAX_SEGMENTS"]
    return {
        "seq_threshold_3D": threshold,
        "num_par_softmax_segments": segments,
        "rows": min(threshold, max_bs),
        "head_dim_padded": 1 << (head_dim - 1).bit_length(),
        "num_q_heads": num_q_heads,
    }


def _workspace(
    max_bs: int, width: int, page_size: int, device: torch.device
) -> dict[str, torch.Tensor]:
    """The buffers vLLM keeps for a step, allocated once: ``slot_mapping`` ``[max_bs]`` int64,
    ``query_start_loc`` ``[max_bs + 1]`` int32 (``0..max_bs``: one token a row) and the unit
    ``k_scale`` / ``v_scale`` (``layer._k_scale``). The 3D scratch, sized by the heads, is
    added at the first call (the warm-up before capture), as the backend allocates it once."""
    return {
        "slot_mapping": torch.zeros(max_bs, dtype=torch.int64, device=device),
        "query_start_loc": torch.arange(max_bs + 1, dtype=torch.int32, device=device),
        "k_scale": torch.ones(1, dtype=torch.float32, device=device),
        "v_scale": torch.ones(1, dtype=torch.float32, device=device),
    }


def _launch_args(host: HostBatch) -> dict[str, int]:
    """What the engine passes from the host, frozen at capture: ``max_seqlen_k`` as vLLM's
    model runner builds it for a capture (``max_model_len``: the table's capacity here; the
    non-INT4 kernels never read it) and ``max_seqlen_q`` 1 (decode)."""
    return {"max_seqlen_k": host.capacity, "max_seqlen_q": 1}


def _write_cache(w: CacheWrite, *, plan: dict[str, torch.Tensor], **_: object) -> None:
    """vLLM's cache write for a decode batch: ``_compute_slot_mappings_kernel`` from the block
    table (``idx_mapping`` -1 rows get ``PAD_SLOT_ID``), then ``triton_reshape_and_cache_flash``
    (negative slots skipped)."""
    from .vllm import vllm_compute_slot_mappings

    vllm = load_vllm_attention()
    bs = w.k_new.shape[0]
    slots = plan["slot_mapping"][:bs]
    vllm_compute_slot_mappings(
        w.page_table, w.idx_mapping, plan["query_start_loc"][: bs + 1], w.positions, slots,
        w.page_size,
    )  # fmt: skip
    vllm.reshape_and_cache(
        w.k_new, w.v_new, w.k_cache, w.v_cache, slots, "auto", plan["k_scale"], plan["v_scale"]
    )


def _scratch(
    plan: dict[str, torch.Tensor], q: torch.Tensor, k_cache: torch.Tensor
) -> dict[str, int]:
    """The backend's host values for these shapes, its 3D scratch allocated in ``plan`` on
    the first call (the warm-up before capture)."""
    vllm = load_vllm_attention()
    max_bs = plan["slot_mapping"].shape[0]
    c = triton_attn_config(max_bs, q.shape[1], k_cache.shape[2], q.shape[2], vllm.constants)
    if "softmax_segm_max" not in plan:
        rows, heads, segs = c["rows"], c["num_q_heads"], c["num_par_softmax_segments"]
        f32, dev = torch.float32, q.device
        plan["softmax_segm_output"] = torch.empty(
            (rows, heads, segs, c["head_dim_padded"]), dtype=f32, device=dev
        )
        plan["softmax_segm_max"] = torch.empty((rows, heads, segs), dtype=f32, device=dev)
        plan["softmax_segm_expsum"] = torch.empty((rows, heads, segs), dtype=f32, device=dev)
    return c


def _attend(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, page_table: torch.Tensor,
    cache_seqlens: torch.Tensor, out: torch.Tensor, *, page_size: int, workspace: object,
    plan: dict[str, torch.Tensor], max_seqlen_k: int, max_seqlen_q: int = 1, **_: object,
) -> None:  # fmt: skip
    """``unified_attention`` as ``TritonAttentionImpl.forward`` calls it for a decode batch."""
    vllm = load_vllm_attention()
    config = _scratch(plan, q, k_cache)
    bs, kv_heads = q.shape[0], k_cache.shape[2]
    descale = (bs, kv_heads)  # layer._k_scale.expand((num_seqs, num_kv_heads))
    vllm.unified_attention(
        q=q,
        k=k_cache,
        v=v_cache,
        out=out,
        cu_seqlens_q=plan["query_start_loc"][: bs + 1],
        max_seqlen_q=max_seqlen_q,
        seqused_k=cache_seqlens,
        max_seqlen_k=max_seqlen_k,
        softmax_scale=float(q.shape[2] ** -0.5),
        causal=True,
        alibi_slopes=None,
        use_alibi_sqrt=False,
        window_size=(-1, -1),
        block_table=page_table,
        softcap=0,
        q_descale=None,
        k_descale=plan["k_scale"].expand(descale),
        v_descale=plan["v_scale"].expand(descale),
        seq_threshold_3D=config["seq_threshold_3D"],
        num_par_softmax_segments=config["num_par_softmax_segments"],
        softmax_segm_output=plan["softmax_segm_output"],
        softmax_segm_max=plan["softmax_segm_max"],
        softmax_segm_expsum=plan["softmax_segm_expsum"],
        sinks=None,
        output_scale=None,
        mm_prefix_range=None,
        rswa_prefix_lens=None,
        rswa_window=None,
        chunk_lookback=-1,
        use_td=False,
        mm_prefix_clamp_sliding_window=False,
    )


#: vLLM's TRITON_ATTN decode: its cache write and ``unified_attention`` (``--reader
#: vllm:triton_attn``).
TRITON_ATTN = Reader(
    "vllm:triton_attn",
    _attend,
    launch_args=_launch_args,
    workspace=_workspace,
    write_cache=_write_cache,
)
