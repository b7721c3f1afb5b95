"""SGLang #24401: the graph runner's ``positions`` tail is not reset when the batch shrinks.

When the real batch is smaller than the captured bucket, the runner copied the real rows'
positions and left the padded rows with an earlier, larger batch's values; the padded rows
then read and wrote through stale positions (an illegal memory access after hours of NGRAM
speculative decoding). The fix resets the tail whenever the sizes differ.
"""

from __future__ import annotations

from ...graph.runner import GraphRunner
from ..record import Twin, WildBug
from ..stale_inputs import TailKeptRunner

BUG = WildBug(
    key="sglang-24401",
    engine="SGLang",
    version="0.5.10.post1",
    ref="sgl-project/sglang#24401",
    state="merged (fixes #24361)",
    bug_class="a",
    symptom="Intermittent illegal memory access in the verify step's attention plan after "
    "hours of speculative decoding with CUDA graphs.",
    cause="The main graph runner's padding path copied positions for the real rows only; when "
    "raw_bs < the captured bs the tail kept a previous batch's positions.",
    prop="staged inputs",
    buggy=Twin("build_page_table", runner=TailKeptRunner),
    fixed=Twin("build_page_table", runner=GraphRunner),
)
