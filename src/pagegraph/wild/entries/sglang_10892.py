"""SGLang #10892: the EAGLE draft runners' ``positions`` tail is not reset for a smaller batch.

The draft and draft-extend CUDA-graph runners of speculative decoding copied positions for
the real rows and kept the rest from an earlier, larger batch whenever ``raw_bs`` was below the
captured bucket: illegal memory accesses in speculative decoding. The fix resets positions in
those runners when the sizes differ.
"""

from __future__ import annotations

from ...graph.runner import GraphRunner
from ..record import Twin, WildBug
from ..stale_inputs import TailKeptRunner

BUG = WildBug(
    key="sglang-10892",
    engine="SGLang",
    version="main, 2025-09 (EAGLE draft runners)",
    ref="sgl-project/sglang#10892",
    state="merged",
    bug_class="a",
    symptom="Illegal memory access in speculative decoding's draft CUDA graphs.",
    cause="The draft runners staged positions for the real rows only; with raw_bs below the "
    "captured bucket, the padded rows kept a previous batch's positions.",
    prop="staged inputs",
    buggy=Twin("build_decode_metadata", runner=TailKeptRunner),
    fixed=Twin("build_decode_metadata", runner=GraphRunner),
)
