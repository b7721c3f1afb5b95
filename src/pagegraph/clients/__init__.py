"""Real engines' metadata builders behind pagegraph's builder contracts.

Each client module loads an engine's own kernel files (never a copy of them) and exposes thin
adapters with pagegraph's signatures, so the checker and the tests run the engine's code
exactly as its serving stack does: ``pagegraph.clients.sglang`` (``SGLANG_BUILDERS``) and
``pagegraph.clients.vllm`` (``VLLM_BUILDERS``). An engine that is not installed makes its
adapters raise its ``*Unavailable`` error with the reason; importing a client never fails.
"""

from collections.abc import Callable

__all__ = ["CLIENT_BUILDERS"]


def CLIENT_BUILDERS() -> dict[str, Callable[..., object]]:  # noqa: N802 - reads as the table it returns
    """Every engine's adapters by name (those of an engine whose files are missing still
    resolve, and raise its ``*Unavailable`` error with the reason when called)."""
    from .sglang import SGLANG_BUILDERS
    from .vllm import VLLM_BUILDERS

    return {**SGLANG_BUILDERS, **VLLM_BUILDERS}
