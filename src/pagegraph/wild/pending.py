"""Public bugs the bed cannot yet reproduce faithfully: each with why. They are listed in
``profiles/wild.md`` beside the corpus and never counted as held; one leaves this list when an
entry of ``wild/entries/`` reproduces its root cause and its fix as upstream had them."""

from __future__ import annotations

from .record import NotYetExpressible

__all__ = ["NOT_YET_EXPRESSIBLE"]

NOT_YET_EXPRESSIBLE: list[NotYetExpressible] = [
    NotYetExpressible(
        ref="NVIDIA/TensorRT-LLM#13151",
        engine="TensorRT-LLM",
        bug_class="f",
        summary="Under MTP with CUDA-graph padding, the padding dummies had no permanent Mamba "
        "state slot and aliased the slots of live requests the overlap scheduler had parked "
        "outside the batch; the state update scattered through them. The fix reserves a "
        "permanent sentinel slot that every padding entry uses.",
        why="The bed's decode workload puts every running request in each step's batch: there "
        "is no live request parked outside the batch (the overlap scheduler's) whose slot a "
        "dummy could alias, and no per-request state slot apart from the KV pages. The former "
        "entry aliased padded rows to the batch's own first row and dropped padded writes, "
        "which is not the upstream mechanism.",
    ),
]
