"""The "metadata" section: a decode step's whole metadata in one launch, against
``build_page_table`` alone and against the unfused chain engines write.

Each variant (``DECODE_VARIANTS``) is checked exactly against ``reference_decode_metadata``
before it is timed (device time in a CUDA graph, eager host time), and ``decode_summary``
derives the targets: within 1 us of ``build_page_table`` on the device, at most 1.2x its eager
time, the unfused chain at least 3x the fused call (docs/ARCHITECTURE.md, "The bench").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ..detect.ranges import phase
from ..kernels.contract import POISON
from ..kernels.decode_metadata import build_decode_metadata, prepare_decode_metadata
from ..kernels.page_table import build_page_table
from ..kernels.reference import reference_decode_metadata, unfused_decode_metadata
from ..runtime.timing import interleaved_wall_us, paired_ratio, sync, wall_time_us
from .bench_settings import Settings, error, recover
from .configs import BenchConfig
from .inputs import BenchInputs, Rotation, make_inputs, rotate_out_of_l2
from .rows import eager_calls, eager_warmup, time_exact_graph

#: Speculative draft tokens of the second ``build_decode_metadata`` variant.
DRAFT = 4
#: ``(name, function key, draft_tokens, graph-timed)`` in table order.
DECODE_VARIANTS: tuple[tuple[str, str, int, bool], ...] = (
    ("build_page_table", "build_page_table", 0, True),
    ("build_decode_metadata", "fused", 0, True),
    (f"build_decode_metadata+draft{DRAFT}", "fused", DRAFT, True),
    ("PreparedDecodeMetadata", "prepared", 0, False),
    ("unfused_decode_metadata", "unfused", 0, True),
)
#: Calls of each variant in one round of the eager timing.
EAGER_ROUND_CALLS = 20

#: Targets: device time above build_page_table, and eager ratios.
DIFF_TARGET_US = 1.0
FUSED_RATIO_TARGET = 1.2
UNFUSED_RATIO_TARGET = 3.0
#: What the ``cache_seqlens`` / ``cu_seqlens_*`` outputs are filled with before a call.
VECTOR_POISON = -7


@dataclass
class DecodeOutputs:
    """Output buffers of one decode-metadata call on ``inp``: ``cache_seqlens [bs]``,
    ``cu_seqlens_k [bs + 1]``, ``cu_seqlens_q [bs + 1]`` int32, ``page_table`` and (SWA)
    ``swa_page_table`` ``[bs, width]`` int32; ``full_to_swa`` is the input's."""

    cache_seqlens: torch.Tensor
    cu_seqlens_k: torch.Tensor
    cu_seqlens_q: torch.Tensor
    page_table: torch.Tensor
    swa_page_table: torch.Tensor | None
    full_to_swa: torch.Tensor | None

    @classmethod
    def like(cls, inp: BenchInputs) -> DecodeOutputs:
        cfg = inp.config
        dev = inp.req_to_token.device

        def vec(n: int) -> torch.Tensor:
            return torch.full((n,), VECTOR_POISON, dtype=torch.int32, device=dev)

        table = torch.full((cfg.bs, cfg.width), POISON, dtype=torch.int32, device=dev)
        swa = torch.full_like(table, POISON) if cfg.swa else None
        return cls(vec(cfg.bs), vec(cfg.bs + 1), vec(cfg.bs + 1), table, swa, inp.full_to_swa)

    def tensors(self) -> dict[str, torch.Tensor]:
        """The outputs by name (``swa_page_table`` only with SWA)."""
        out = {
            "cache_seqlens": self.cache_seqlens,
            "cu_seqlens_k": self.cu_seqlens_k,
            "cu_seqlens_q": self.cu_seqlens_q,
            "page_table": self.page_table,
        }
        if self.swa_page_table is not None:
            out["swa_page_table"] = self.swa_page_table
        return out

    def metadata_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of a ``build_decode_metadata`` call (``draft_tokens`` aside)."""
        kwargs: dict[str, Any] = {
            "cache_seqlens": self.cache_seqlens,
            "cu_seqlens_k": self.cu_seqlens_k,
            "cu_seqlens_q": self.cu_seqlens_q,
            "page_table": self.page_table,
        }
        if self.swa_page_table is not None:
            kwargs.update(swa_page_table=self.swa_page_table, full_to_swa=self.full_to_swa)
        return kwargs

    def table_kwargs(self) -> dict[str, Any]:
        """SWA keyword arguments of a ``build_page_table`` call (empty without SWA)."""
        if self.swa_page_table is None:
            return {}
        return {"swa_page_table": self.swa_page_table, "full_to_swa": self.full_to_swa}

    def poison(self) -> None:
        for name, t in self.tensors().items():
            t.fill_(POISON if name.endswith("page_table") else VECTOR_POISON)


def first_difference(
    got: dict[str, torch.Tensor], want: dict[str, torch.Tensor], names: list[str] | None = None
) -> str | None:
    """``None`` when every tensor of ``names`` (default: all of ``want``) is equal
    (``torch.equal``) in ``got`` and ``want``, else where the first one differs:
    ``"name: K entries differ; first [i, j] got G want W"``."""
    for name in names or want:
        a, b = got[name], want[name]
        if a.shape != b.shape:
            return f"{name}: shape {tuple(a.shape)}, want {tuple(b.shape)}"
        if torch.equal(a, b):
            continue
        bad = (a != b).nonzero()
        idx = tuple(bad[0].tolist())
        where = ", ".join(str(i) for i in idx)
        return (
            f"{name}: {bad.shape[0]} entries differ; first [{where}] "
            f"got {int(a[idx])} want {int(b[idx])}"
        )
    return None


def decode_row(cfg: BenchConfig, variant: str, draft: int) -> dict[str, Any]:
    """A row of the metadata section with every field present, the measured ones ``None``."""
    return {
        "config": cfg.name,
        "bs": cfg.bs,
        "page_size": cfg.page_size,
        "max_context_len": cfg.max_context_len,
        "width": cfg.width,
        "swa": cfg.swa,
        "variant": variant,
        "draft_tokens": draft,
        "device_us": None,
        "device_warm_us": None,
        "input_sets": None,
        "eager_us": None,
        "eager_round_us": None,
        "exact": None,
        "graph_exact": None,
        "mismatch": None,
        "error": None,
    }


def _reference(inp: BenchInputs, draft: int) -> dict[str, torch.Tensor]:
    want = DecodeOutputs.like(inp)
    reference_decode_metadata(
        inp.req_to_token,
        inp.req_pool_indices,
        inp.seq_lens,
        inp.config.page_size,
        draft_tokens=draft,
        **want.metadata_kwargs(),
    )
    return want.tensors()


def _calls(
    inp: BenchInputs, key: str, draft: int, out: DecodeOutputs
) -> tuple[
    Callable[[], object],
    Callable[..., object] | None,
    tuple[Any, ...] | None,
    dict[str, Any] | None,
]:
    """``(call, rotation_fn, rest, kwargs)`` of one variant: ``call()`` runs it on the
    input's table, ``rotation_fn(table, *rest, **kwargs)`` on any table."""
    r2t, rpi, lens, ps = inp.req_to_token, inp.req_pool_indices, inp.seq_lens, inp.config.page_size
    rest: tuple[Any, ...]
    kwargs: dict[str, Any]
    if key == "build_page_table":
        rest, kwargs = (rpi, lens, out.page_table, ps), out.table_kwargs()
        fn: Callable[..., object] = build_page_table
    elif key == "prepared":
        prepared = prepare_decode_metadata(
            r2t, rpi, lens, ps, draft_tokens=draft, **out.metadata_kwargs()
        )
        return prepared, None, None, None
    else:
        fn = build_decode_metadata if key == "fused" else unfused_decode_metadata
        rest, kwargs = (rpi, lens, ps), {"draft_tokens": draft, **out.metadata_kwargs()}
    return (lambda: fn(r2t, *rest, **kwargs)), fn, rest, kwargs


def _bench_variant(
    inp: BenchInputs,
    key: str,
    draft: int,
    graphs: bool,
    want: dict[str, Any],
    s: Settings,
    row: dict[str, Any],
) -> Callable[[], object] | None:
    """Check one variant and time it on the device; returns its eager call, which
    ``bench_decode_config`` times beside the others' (``None`` if the check raised)."""
    out = DecodeOutputs.like(inp)
    # build_page_table writes the page tables only: those are what it is checked on.
    names = ["page_table", "swa_page_table"] if key == "build_page_table" else None
    names = [n for n in names if n in want] if names else None
    errors: list[str] = []
    call, fn, rest, kwargs = _calls(inp, key, draft, out)
    try:  # exactness first: an inexact variant is still timed, but flagged
        out.poison()
        call()
        sync(s.cuda)
        mismatch = first_difference(out.tensors(), want, names)
        row["exact"] = mismatch is None
        row["mismatch"] = mismatch
    except Exception as exc:  # noqa: BLE001
        errors.append(f"check: {error(exc)}")
    runs = not errors

    if s.cuda and graphs and not errors:
        # Every graphed variant has a rotation form (the prepared one alone has none).
        assert fn is not None and rest is not None and kwargs is not None
        rotation = Rotation(fn, [*inp.rotated, inp.req_to_token], rest, kwargs)
        failed = time_exact_graph(
            call, rotation, s, out.poison, lambda: first_difference(out.tensors(), want, names), row
        )
        errors += [failed] if failed else []

    if errors:
        row["error"] = "; ".join(errors)
    return call if runs else None


def bench_decode_config(cfg: BenchConfig, s: Settings) -> list[dict[str, Any]]:
    """One row per ``DECODE_VARIANTS`` entry for ``cfg``; failures are recorded in the rows,
    never raised."""
    rows = [decode_row(cfg, name, draft) for name, _, draft, _ in DECODE_VARIANTS]
    inp = None
    try:
        with phase("bench", cfg.bs):
            inp = make_inputs(cfg, "cuda" if s.cuda else "cpu")
            wants = {d: _reference(inp, d) for d in sorted({d for _, _, d, _ in DECODE_VARIANTS})}
    except Exception as exc:  # noqa: BLE001
        for row in rows:
            row["error"] = f"inputs: {error(exc)}"
        recover(s.cuda)
        return rows
    if s.cuda:
        rotate_out_of_l2(inp, s.l2_bytes, s.builds)
    calls = {}
    for i, (row, (_, key, draft, graphs)) in enumerate(zip(rows, DECODE_VARIANTS)):
        with phase("bench", cfg.bs):
            try:
                call = _bench_variant(inp, key, draft, graphs, wants[draft], s, row)
                if call is not None:
                    calls[i] = call
            except Exception as exc:  # noqa: BLE001
                row["error"] = error(exc)
    # Eager host times in alternating rounds, every variant in each: the targets are ratios
    # between variants, which a host that drifts between two separate timings would skew
    # (configs whose host path is the same can differ widely). Long rounds are not enough on
    # a noisy host: two variants with one host path (draft tokens 0 and 4) can still differ.
    # Rounds of EAGER_ROUND_CALLS: the ratios are taken round by round (paired_ratio in
    # decode_summary), so short rounds give many pairs, each within one state of the host.
    try:
        rounds: dict[int, list[float]] = {}
        with phase("bench", cfg.bs):
            eager = interleaved_wall_us(
                calls,
                eager_calls(s),
                round_calls=EAGER_ROUND_CALLS,
                warmup=eager_warmup(s),
                cuda=s.cuda,
                per_round=rounds,
            )
        for i, us in eager.items():
            rows[i]["eager_us"] = us
            rows[i]["eager_round_us"] = rounds[i]
    except Exception:  # noqa: BLE001 - then each variant alone, so a failure stays its own
        recover(s.cuda)
        for i, call in calls.items():
            try:
                rows[i]["eager_us"] = wall_time_us(
                    call, eager_calls(s), eager_warmup(s), cuda=s.cuda
                )
            except Exception as exc:  # noqa: BLE001
                rows[i]["error"] = "; ".join(
                    filter(None, [rows[i].get("error"), f"eager: {error(exc)}"])
                )
                recover(s.cuda)
    del calls, inp
    recover(s.cuda)
    return rows


# -- derived figures --------------------------------------------------------------------------


def ratio(a: float | None, b: float | None) -> float | None:
    """``a / b``, or ``None`` when either is missing or ``b`` is not positive."""
    if a is None or b is None or b <= 0:
        return None
    return a / b


def difference(a: float | None, b: float | None) -> float | None:
    """``a - b``, or ``None`` when either is missing."""
    if a is None or b is None:
        return None
    return a - b


def eager_ratio(get: Any, a: str, b: str) -> float | None:
    """Eager host time of variant ``a`` over ``b``: the median of the per-round ratios when
    both were timed in the same rounds (``timing.paired_ratio``), else the ratio of their
    medians (each timed alone after a failed round)."""
    paired = paired_ratio(get(a, "eager_round_us"), get(b, "eager_round_us"))
    return paired if paired is not None else ratio(get(a, "eager_us"), get(b, "eager_us"))


def decode_summary(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per config, from its metadata rows: ``diff_us`` / ``diff_warm_us`` (fused, draft 0,
    minus ``build_page_table``, rotated / L2-warm device us), the same with draft tokens
    (``diff_draft_us`` / ``diff_draft_warm_us``), the eager ratios ``fused_over_bpt``
    (``build_decode_metadata`` / ``build_page_table``), ``prepared_over_bpt`` and
    ``unfused_over_fused``, the device ratio ``unfused_over_fused_device`` (rotated), and
    ``exact``: every row of the config exact on its call and its graph."""
    names = [name for name, _, _, _ in DECODE_VARIANTS]
    configs: list[str] = []
    for row in rows:
        if row["config"] not in configs:
            configs.append(row["config"])
    out = []
    for config in configs:
        by = {r["variant"]: r for r in rows if r["config"] == config}

        def get(variant: str, key: str, by: dict[str, Any] = by) -> Any:
            return (by.get(variant) or {}).get(key)

        bpt, fused, draft, prep, unfused = names
        out.append(
            {
                "config": config,
                "diff_us": difference(get(fused, "device_us"), get(bpt, "device_us")),
                "diff_warm_us": difference(
                    get(fused, "device_warm_us"), get(bpt, "device_warm_us")
                ),
                "diff_draft_us": difference(get(draft, "device_us"), get(bpt, "device_us")),
                "diff_draft_warm_us": difference(
                    get(draft, "device_warm_us"), get(bpt, "device_warm_us")
                ),
                "fused_over_bpt": eager_ratio(get, fused, bpt),
                "prepared_over_bpt": eager_ratio(get, prep, bpt),
                "unfused_over_fused": eager_ratio(get, unfused, fused),
                "unfused_over_fused_device": ratio(
                    get(unfused, "device_us"), get(fused, "device_us")
                ),
                "exact": all(
                    r.get("exact") is not False and r.get("graph_exact") is not False
                    for r in by.values()
                ),
            }
        )
    return out
