"""TurboQuant #12: the KV quantizer's sign packing made its powers-of-two lookup with
``torch.tensor([1, 2, ..., 128], device=...)`` on every call, a pageable host-to-device copy
inside the captured cache write (vLLM's graph capture refuses it); the fix builds the lookup
once a device and reuses it.

Modelled as the decode step's cache write: each new key's and value's sign bits are packed into
bytes with the lookup and unpacked again (a lossless round trip here, so the cache stays exact),
then the row is written at its ``out_cache_loc`` (padded rows' ``PAD_SLOT_ID`` to the discard
slot). Buggy: the lookup made from a Python list at every call; fixed: made once, on the first
(eager) call, and cached by device. Property "capture".
"""

from __future__ import annotations

import torch

from ...consumers import paged_decode_attention
from ...consumers.reader import CacheWrite, Reader
from ..wild_bug import Fidelity, Twin, WildBug

_BITS = [1 << b for b in range(8)]
#: the lookup a device, built on first use (the fix's per-device cache)
_LOOKUP: dict[torch.device, torch.Tensor] = {}


def _cached_powers(device: torch.device) -> torch.Tensor:
    powers = _LOOKUP.get(device)
    if powers is None:
        powers = torch.tensor(_BITS, dtype=torch.uint8).to(device)  # once, before capture
        _LOOKUP[device] = powers
    return powers


def _fresh_powers(device: torch.device) -> torch.Tensor:
    return torch.tensor(_BITS, dtype=torch.uint8, device=device)  # every call


def _sign_round_trip(x: torch.Tensor, powers: torch.Tensor) -> torch.Tensor:
    """``x`` ``[bs, H, D]`` with its sign bits packed eight to a byte and unpacked again."""
    d = x.shape[-1]
    neg = torch.signbit(x).to(torch.uint8)
    pad = (-d) % 8
    if pad:
        neg = torch.nn.functional.pad(neg, (0, pad))
    packed = (neg.reshape(*neg.shape[:-1], -1, 8) * powers).sum(dim=-1, dtype=torch.uint8)
    bits = (packed.unsqueeze(-1) & powers) > 0
    neg_back = bits.reshape(*x.shape[:-1], -1)[..., :d]
    mag = x.abs()
    return torch.where(neg_back, -mag, mag)


def _write(w: CacheWrite, powers: torch.Tensor) -> None:
    slots = torch.where(w.out_cache_loc >= 0, w.out_cache_loc, w.discard_slot)
    heads, dim = w.k_new.shape[1:]
    for cache, new in ((w.k_cache, w.k_new), (w.v_cache, w.v_new)):
        cache.view(-1, heads, dim).index_copy_(0, slots, _sign_round_trip(new, powers))


def write_packing_with_fresh_lookup(w: CacheWrite, **_: object) -> None:
    """Buggy: the powers-of-two lookup made from a Python list on the device at every call."""
    _write(w, _fresh_powers(w.k_new.device))


def write_packing_with_cached_lookup(w: CacheWrite, **_: object) -> None:
    """Fixed: the lookup made once a device (the first, eager call) and reused."""
    _write(w, _cached_powers(w.k_new.device))


BUG = WildBug(
    key="turboquant-12",
    engine="TurboQuant (vLLM KV-cache plugin)",
    version="main, April 2026 (capture_only and hybrid modes under vLLM CUDA graphs)",
    ref="0xSero/turboquant#12",
    state="merged",
    bug_class="c",
    symptom="vLLM's determine_available_memory() capture aborts with 'Cannot copy between CPU "
    "and CUDA tensors during CUDA graph capture unless the CPU tensor is pinned'; only "
    "--enforce-eager runs (20-30% slower decode).",
    cause="_pack_qjl_signs / _unpack_qjl_signs built torch.tensor([1, 2, ..., 128], "
    "device=...) inside the quantizer's hot path: a pageable host-to-device copy on every "
    "call, inside the captured KV-cache write.",
    prop="capture",
    buggy=Twin(
        reader=Reader(
            "sign packing, lookup from a list each call",
            paged_decode_attention,
            write_cache=write_packing_with_fresh_lookup,
        )
    ),
    fixed=Twin(
        reader=Reader(
            "sign packing, lookup cached by device",
            paged_decode_attention,
            write_cache=write_packing_with_cached_lookup,
        )
    ),
    fidelity=Fidelity(
        modelled="a constant lookup tensor made from a Python list on the device at every call "
        "of the KV-cache write path, recorded inside the step's capture (refused as a pageable "
        "host-to-device copy)",
        stands_in=(
            "a lossless pack / unpack of the new K/V's sign bits for the QJL sign packing of "
            "TurboQuant's quantizer (the cache keeps the model's dtype, not packed codes)",
        ),
        fix="PR #12: a module-level cache of the powers tensor a device (_qjl_powers), built "
        "on first use outside capture and reused by both pack and unpack",
    ),
)
