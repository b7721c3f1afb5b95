"""Invariant: every mutant of the ``"block_table"`` and ``"slot_mapping"`` kinds differs from the
oracle on some seeded, realistic input, and every correct builder of the kind (pagegraph's
Triton builder, the mutants' torch base, vLLM's kernel where its files are found) agrees with
the oracle exactly on all of them.

Each scenario is a short sequence of calls on the same output buffers (the frozen-host-value
mutants need a second call to show their bug); builder and oracle start from the same random
stale contents, and the whole buffers are compared after every call.
"""

from __future__ import annotations

import pytest
import torch

from pagegraph.clients import vllm as vl
from pagegraph.kernels.block_table import gather_block_tables
from pagegraph.kernels.slot_mapping import compute_slot_mappings
from pagegraph.kernels.vllm_reference import reference_block_table, reference_slot_mapping
from pagegraph.kinds import BatchContext
from pagegraph.mutants.vllm_mutants import (
    BLOCK_TABLE_BUGS,
    SLOT_MAPPING_BUGS,
    plain_block_table,
    plain_slot_mapping,
    reset_caches,
)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


# -- block_table -------------------------------------------------------------------------------


def block_table_scenarios(hostile: bool = True):
    """``(name, inputs, [BatchContext, ...])``: inputs as the kind takes them, the output
    ``max_bs`` rows of random stale ids, contiguous (vLLM's kernel shares one row stride).
    With ``hostile``, also one whose ``num_blocks`` pass the width (up to twice it: a spare
    row past the table keeps a trusting reader inside the allocation), a broken host
    guarantee that builders clamp."""
    out = []
    cases = [
        (1, 37, [(5, 8), (3, 8), (7, 8)], False),  # num_reqs shrinking then growing
        (2, 1300, [(7, 8), (13, 16)], False),
    ]
    if hostile:
        cases.append((3, 29, [(6, 8), (16, 16)], True))
    for seed, width, steps, past_width in cases:
        gen = torch.Generator().manual_seed(seed)
        max_bs = 16
        max_reqs = max_bs + 6
        rows = torch.randint(1, 1 << 24, (max_reqs + 1, width), generator=gen, dtype=torch.int32)
        table = rows.to(DEVICE)[:max_reqs]  # the view keeps the spare row on any device
        top = width // 4 if past_width else width
        counts = torch.randint(1, top, (max_reqs,), generator=gen, dtype=torch.int32)
        idx = torch.randperm(max_reqs, generator=gen)[:max_bs].to(torch.int32)
        if past_width:  # two rows' counts past the width, the rows after them short
            counts[idx[[1, 4]].long()] = width + torch.randint(
                width // 2, width + 1, (2,), generator=gen, dtype=torch.int32
            )
        # a spare row past the output too, where the last real row may spill
        stale = torch.randint(
            1, 1 << 24, (max_bs + past_width, width), generator=gen, dtype=torch.int32
        )
        inputs = [t.to(DEVICE) for t in (table, counts, idx, stale)]
        out.append((f"seed{seed}", inputs, [BatchContext(r, n, max_bs) for r, n in steps]))
    return out


def block_table_differs(builder, hostile: bool = True) -> bool:
    """Whether ``builder`` and the oracle write different buffers in some scenario (the
    hostile one too, with ``hostile``)."""
    differs = False
    for _, (table, counts, idx, stale), batches in block_table_scenarios(hostile):
        reset_caches()
        got, want = stale.clone(), stale.clone()
        for batch in batches:
            builder(table, counts, idx, got, batch=batch)
            reference_block_table(table, counts, idx, want, batch=batch)
            differs |= not torch.equal(got, want)
    return differs


@pytest.mark.parametrize("name", sorted(BLOCK_TABLE_BUGS))
def test_block_table_mutant_differs_from_oracle(name):
    builder = BLOCK_TABLE_BUGS[name]
    assert builder.pagegraph_outputs == "block_table"
    assert builder.__doc__.strip()
    assert block_table_differs(builder), f"{name} is not caught by any scenario"


CORRECT_BLOCK_TABLE = {
    "gather_block_tables": gather_block_tables,
    "plain_block_table": plain_block_table,
    "vllm_gather_block_tables": vl.vllm_gather_block_tables,
}


@pytest.mark.parametrize("name", sorted(CORRECT_BLOCK_TABLE))
def test_correct_block_table_builders_agree(name):
    if name.startswith("vllm") and not vl.vllm_available():
        pytest.skip(f"vLLM unavailable: {vl.vllm_unavailable_reason()}")
    # vLLM's kernel is correct under vLLM's contract: its host never passes num_blocks past
    # the width, so the hostile case is not its to pass.
    vllm = name.startswith("vllm")
    assert not block_table_differs(CORRECT_BLOCK_TABLE[name], hostile=not vllm)


def test_vllms_gather_trusts_num_blocks_past_the_width():
    if not vl.vllm_available():
        pytest.skip(f"vLLM unavailable: {vl.vllm_unavailable_reason()}")
    assert block_table_differs(vl.vllm_gather_block_tables, hostile=True)


# -- slot_mapping ------------------------------------------------------------------------------


def slot_mapping_scenarios():
    """``(inputs, page_size)`` pairs: decode-like and prefill-like batches with padded rows,
    and a big pool whose slots pass 2^31."""
    out = []
    for seed, rows, page_size, width, big in [
        (1, 7, 16, 37, False),
        (2, 13, 1, 300, False),
        (3, 5, 16, 9, True),
    ]:
        gen = torch.Generator().manual_seed(seed)
        max_reqs = rows + 5
        lo = (1 << 27) if big else 1
        table = torch.randint(
            lo, lo + (1 << 24), (max_reqs, width), generator=gen, dtype=torch.int32
        )
        counts = torch.randint(1, 6, (rows,), generator=gen)
        qsl = torch.cat([torch.zeros(1, dtype=torch.int64), counts.cumsum(0)]).to(torch.int32)
        idx = torch.randperm(max_reqs, generator=gen)[:rows].to(torch.int32)
        idx[-2:] = -1
        total = int(qsl[-1])
        positions = torch.randint(0, width * page_size, (total,), generator=gen)
        stale = torch.randint(0, 1 << 30, (total + 23,), generator=gen)
        inputs = [t.to(DEVICE) for t in (table, idx, qsl, positions, stale)]
        out.append((inputs, page_size))
    return out


def slot_mapping_differs(builder) -> bool:
    differs = False
    for (table, idx, qsl, positions, stale), page_size in slot_mapping_scenarios():
        got, want = stale.clone(), stale.clone()
        builder(table, idx, qsl, positions, got, page_size)
        reference_slot_mapping(table, idx, qsl, positions, want, page_size)
        differs |= not torch.equal(got, want)
    return differs


@pytest.mark.parametrize("name", sorted(SLOT_MAPPING_BUGS))
def test_slot_mapping_mutant_differs_from_oracle(name):
    builder = SLOT_MAPPING_BUGS[name]
    assert builder.pagegraph_outputs == "slot_mapping"
    assert builder.__doc__.strip()
    assert slot_mapping_differs(builder), f"{name} is not caught by any scenario"


CORRECT_SLOT_MAPPING = {
    "compute_slot_mappings": compute_slot_mappings,
    "plain_slot_mapping": plain_slot_mapping,
}


@pytest.mark.parametrize("name", sorted(CORRECT_SLOT_MAPPING))
def test_correct_slot_mapping_builders_agree(name):
    assert not slot_mapping_differs(CORRECT_SLOT_MAPPING[name])


def test_vllm_slot_mapping_wraps_past_2_31():
    """vLLM's kernel agrees with the oracle on the realistic scenarios and differs exactly
    where a slot passes 2^31 (``block_id * block_size`` in 32 bits): the big-pool scenario."""
    if not vl.vllm_available():
        pytest.skip(f"vLLM unavailable: {vl.vllm_unavailable_reason()}")
    results = []
    for (table, idx, qsl, positions, stale), page_size in slot_mapping_scenarios():
        got, want = stale.clone(), stale.clone()
        vl.vllm_compute_slot_mappings(table, idx, qsl, positions, got, page_size)
        reference_slot_mapping(table, idx, qsl, positions, want, page_size)
        results.append(torch.equal(got, want))
        if not results[-1]:
            bad = got != want
            # The difference is exactly 2^32 (a wrapped 32-bit product), on slots >= 2^31.
            assert torch.all(want[bad] >= 2**31)
            assert torch.all((want[bad] - got[bad]) % 2**32 == 0)
    assert results == [True, True, False]
