"""Public bugs the bed cannot yet reproduce faithfully: each with why. They are listed in
``profiles/wild.md`` beside the corpus and never counted as held; one leaves this list when an
entry of ``wild/entries/`` reproduces its root cause and its fix as upstream had them."""

from __future__ import annotations

from .wild_bug import NotYetExpressible

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
    NotYetExpressible(
        ref="lightseekorg/tokenspeed#313",
        engine="TokenSpeed",
        bug_class="d",
        summary="gfx950 fp16 decode kernel prefetches the next page-table entry one iteration "
        "ahead, so the last iteration loads past the row's valid range (merged: the load "
        "masked, other=0).",
        why="the entry read past the row is never consumed: only a fault shows it, and the "
        "bed sees a reader's reads through its output (the NaN page), never an unused load",
    ),
    NotYetExpressible(
        ref="vllm-project/vllm#56862",
        engine="vLLM",
        bug_class="d",
        summary="kernel_unified_attention's tail lanes of a sequence's last tile load "
        "block-table entries past the row (an HSA memory fault on gfx1151); the lanes are "
        "discarded by tile_mask (open PR masks the loads).",
        why="numerics are identical with and without the read: an out-of-bounds address with "
        "no effect on the output is invisible to the bed on a CPU and to its judges on a GPU",
    ),
    NotYetExpressible(
        ref="microsoft/onnxruntime#32121",
        engine="ONNX Runtime",
        bug_class="f",
        summary="CudaAsyncBuffer's H2D copy from a pinned staging block is captured as a node "
        "reading the host address; the block goes back to the allocator and a prefill reuses "
        "it, so later replays copy the prefill's bytes (merged: the block is retained while "
        "capturing).",
        why="the bed stages through its own mailbox, and its emulated graph keeps every "
        "recorded host tensor alive: a host block recycled under a captured copy has no "
        "counterpart",
    ),
    NotYetExpressible(
        ref="pytorch/pytorch#172156",
        engine="PyTorch",
        bug_class="c",
        summary="A copy between pageable CPU memory and CUDA inside a graph capture is "
        "captured silently, but nothing keeps the host memory alive, so replays read garbage "
        "(#171894); the PR makes capture raise for unpinned memory.",
        why="the CPU's emulated capture already refuses host data made into device tensors, "
        "but a copy from an existing CPU tensor is a CPU-to-CPU copy here: the freed host "
        "memory a replay reads cannot be shown without CUDA",
    ),
    NotYetExpressible(
        ref="pytorch/pytorch#78549",
        engine="PyTorch",
        bug_class="c",
        summary="SyncBatchNorm's count_all[mask] (dropping ranks with empty inputs) syncs "
        "inside a capture: 'operation not permitted when stream is capturing' (fixed by "
        "#78666: the filter skipped while is_current_stream_capturing()).",
        why="the mechanism, boolean-mask indexing in a captured build, is vllm-omni-4562's; "
        "the upstream fix keeps the sync on eager calls, which the bed's eager 'sync-free "
        "builder call' judges, and the emulated capture does not report capturing to torch",
    ),
    NotYetExpressible(
        ref="pytorch/pytorch#192748",
        engine="PyTorch",
        bug_class="f",
        summary="cudagraph trees: an output of a prior generation reused as a mutated input "
        "after its generation ended; its storage is invalidated and the replay faults (open; "
        "PR #193294 rejects it).",
        why="the bed replays one graph per bucket in one pool with no generations: an output "
        "carried from one tree node into another has no runner or property yet",
    ),
    NotYetExpressible(
        ref="sgl-project/sglang#24587",
        engine="SGLang",
        bug_class="d",
        summary="aiter backend: cuda_graph_kv_indices allocated at page granularity "
        "(max_bs * ceil(max_context_len / page_size)) but filled per token, so with "
        "page_size > 1 the kernel writes past its end (merged).",
        why="the bed's CSR contract is per page: a per-token fill fails 'correct' in both "
        "twins before the undersized buffer's overrun could be the difference",
    ),
    NotYetExpressible(
        ref="huggingface/transformers#45323",
        engine="Transformers",
        bug_class="b",
        summary="continuous batching keyed its varlen CUDA graphs by (num_q_tokens, "
        "max_kv_read), but max_seqlen_q/k are launch constants baked into the graph: a stale "
        "graph replayed with another max_seqlen_k (GSM8K 0.45 to 0.23; merged: the key "
        "includes a power-of-two bucket of max_seqlen_k).",
        why="the bed keys graphs by batch bucket only; without a graph key to extend it "
        "reduces to flashattn-1164's frozen max_seqlen_k",
    ),
    NotYetExpressible(
        ref="vllm-project/vllm#40807",
        engine="vLLM",
        bug_class="c",
        summary="TurboQuant KV with MTP speculative decoding and chunked prefill: the "
        "attention's continuation-prefill branch calls query_start_loc.tolist() and "
        "seq_lens.tolist() inside FULL graph capture ('Cannot copy between CPU and CUDA "
        "tensors during CUDA graph capture'); open PR #43747 narrows the backend's graph "
        "support to single-token decode and uses CPU copies.",
        why="the branch is entered only when max_query_len != max_seq_len, i.e. for "
        "spec-decode verify batches of K+1 query tokens a row; the bed's decode step has one "
        "query token a row, so a reader syncing there would be another bug than this one",
    ),
    NotYetExpressible(
        ref="pegainfer-project/pegainfer#438",
        engine="PegaInfer",
        bug_class="b",
        summary="Qwen3 split-KV decode keyed its chunk size on the live batch's max_seq_len, "
        "so a request's chunk count (its online-softmax rescale order) changed with its "
        "batch-mates and flipped near-tie argmaxes; the merged fix keys it on "
        "max_context_tokens under --batch-invariant.",
        why="the chunk size follows the live batch at every step (nothing is frozen at "
        "capture), so a replay equals its own eager call; the bed compares the two on the same "
        "batch and has no judge of one row across batch compositions",
    ),
]
