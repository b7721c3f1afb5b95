"""The benchmark shapes: ``BenchConfig``, the eight named ``CONFIGS``, and their smoke versions.

A config fixes the batch size, the page size, the static context (so the table width) and how
the request lengths are drawn. ``smoke_config`` scales one down to what the Triton interpreter
can run on a CPU in seconds.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..kernels.contract import cdiv

K = 1024


@dataclass(frozen=True)
class BenchConfig:
    """One benchmark shape. ``lengths`` is ``("uniform", lo, hi)`` (tokens drawn uniformly in
    ``lo..hi``) or ``("skewed", long, short)`` (one request of ``long`` tokens, the rest
    ``short``)."""

    name: str
    bs: int
    page_size: int
    max_context_len: int
    lengths: tuple[str, int, int]
    swa: bool = False

    @property
    def width(self) -> int:
        """Pages per table row: ``cdiv(max_context_len, page_size)``."""
        return cdiv(self.max_context_len, self.page_size)

    def describe_lengths(self) -> str:
        kind, a, b = self.lengths
        if kind == "uniform":
            return f"uniform {tokens(a)}..{tokens(b)}"
        return f"one at {tokens(a)}, the rest {tokens(b)}"


CONFIGS: tuple[BenchConfig, ...] = (
    BenchConfig("decode-small", 8, 64, 128 * K, ("uniform", 1, 4 * K)),
    BenchConfig("decode-mid", 64, 64, 128 * K, ("uniform", 1, 32 * K)),
    BenchConfig("decode-large", 256, 64, 128 * K, ("uniform", 1, 128 * K)),
    BenchConfig("skewed", 256, 64, 128 * K, ("skewed", 128 * K, 100)),
    BenchConfig("long-1m", 64, 64, 1024 * K, ("uniform", 1, 1024 * K)),
    BenchConfig("ps1", 256, 1, 32 * K, ("uniform", 1, 32 * K)),
    BenchConfig("swa", 128, 16, 64 * K, ("uniform", 1, 64 * K), swa=True),
    BenchConfig("ps256", 256, 256, 128 * K, ("uniform", 1, 128 * K)),
)
CONFIG_NAMES = tuple(c.name for c in CONFIGS)

#: Configs the kernel-parameter sweep (``--tune``) covers by default.
TUNE_CONFIGS = ("decode-small", "decode-large", "skewed", "long-1m", "ps1", "swa")

# Smoke run without CUDA: tiny shapes under the interpreter.
SMOKE_BS = 4
SMOKE_CONTEXT = 256


def get_config(name: str) -> BenchConfig:
    """The config called ``name`` (``ValueError`` naming the known ones otherwise)."""
    for cfg in CONFIGS:
        if cfg.name == name:
            return cfg
    raise ValueError(f"unknown bench config {name!r}: use one of {', '.join(CONFIG_NAMES)}")


def smoke_config(cfg: BenchConfig) -> BenchConfig:
    """``cfg`` scaled down for the interpreter: bs 4, context 256, page size / 4, lengths
    scaled by the context ratio."""
    ctx = SMOKE_CONTEXT
    scale = ctx / cfg.max_context_len
    kind, a, b = cfg.lengths
    if kind == "uniform":
        lengths = ("uniform", 1, max(2, min(ctx, round(b * scale))))
    else:
        lengths = ("skewed", min(ctx, max(1, round(a * scale))), max(1, round(b * scale)))
    return BenchConfig(cfg.name, SMOKE_BS, max(1, cfg.page_size // 4), ctx, lengths, swa=cfg.swa)


def tokens(n: int) -> str:
    """A token count as the tables print it: ``4K``, ``1M``, or the plain number."""
    if n >= K and n % (K * K) == 0:
        return f"{n // (K * K)}M"
    if n >= K and n % K == 0:
        return f"{n // K}K"
    return str(n)
