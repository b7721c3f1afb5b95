"""SGLang #10892 (and #24401): a CUDA-graph runner resets the padded rows of its static inputs
but not ``positions``, so a batch smaller than its bucket replays the padded rows with a larger
batch's positions.

#10892 fixed the EAGLE draft and draft-extend runners, #24401 (fixing #24361) the main graph
runner's padding path used by the NGRAM verify step, each by resetting ``positions`` whenever
``raw_bs`` differs from the captured bucket: one defect, two runners. Modelled with the bed's
staged inputs: the runner stages each batch into its bucket's static buffers and leaves the
rows past the real batch as the last, larger batch left them (``TailKeptRunner``); the fixed
runner pads them by the engine's policy.
"""

from __future__ import annotations

from ...graph.runner import GraphRunner
from ..stale_inputs import TailKeptRunner
from ..wild_bug import Fidelity, Twin, WildBug

BUG = WildBug(
    key="sglang-10892",
    engine="SGLang",
    version="main, 2025-09 (EAGLE draft runners); 0.5.10.post1 (main runner, #24401)",
    ref="sgl-project/sglang#10892",
    state="merged (and #24401, merged, fixes #24361)",
    bug_class="a",
    symptom="Illegal memory access in speculative decoding's CUDA graphs (EAGLE draft runners; "
    "the NGRAM verify step's attention plan after hours of serving).",
    cause="The runners staged positions for the real rows only; with raw_bs below the captured "
    "bucket, the padded rows kept a previous, larger batch's positions.",
    prop="staged inputs",
    buggy=Twin("build_decode_metadata", runner=TailKeptRunner),
    fixed=Twin("build_decode_metadata", runner=GraphRunner),
    fidelity=Fidelity(
        modelled="A runner's padded rows not reset when a batch shrinks below its bucket: they "
        "replay the previous, larger batch's values (the staged-input failure names them).",
        stands_in=(
            "the staged request indices and lengths for positions (in a decode step, seq_len - 1)",
            "pagegraph's decode metadata for the draft and verify steps' attention plans",
        ),
        fix="#10892 and #24401: reset the padded rows' positions whenever raw_bs differs from "
        "the captured bucket (the fixed runner pads every row past the batch by its policy).",
        refs=("sgl-project/sglang#24401",),
    ),
)
