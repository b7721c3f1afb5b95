"""Shared test helpers: seeded inputs, canary-framed output buffers, exact comparison."""

from __future__ import annotations

import torch

CANARY = -31337
#: Rows and columns of canary around every output view.
MARGIN = 2


def framed(bs: int, width: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """A canary-filled ``[bs + 2*MARGIN, width + 2*MARGIN + 3]`` int32 buffer and the
    ``[bs, width]`` view inside it (row stride larger than the width)."""
    big = torch.full((bs + 2 * MARGIN, width + 2 * MARGIN + 3), CANARY, dtype=torch.int32)
    big = big.to(device)
    return big, big[MARGIN : MARGIN + bs, MARGIN : MARGIN + width]


def assert_equal_tables(got: torch.Tensor, want: torch.Tensor, what: str = "table") -> None:
    """Exact equality; on failure name the first differing rows and columns."""
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    if torch.equal(got, want):
        return
    diff = (got != want).nonzero().tolist()
    rows = sorted({r for r, _ in diff})
    first = diff[:5]
    details = ", ".join(f"[{r},{c}] got {int(got[r, c])} want {int(want[r, c])}" for r, c in first)
    raise AssertionError(
        f"{what}: {len(diff)} entries differ in rows {rows[:10]}{'...' if len(rows) > 10 else ''}; "
        f"first: {details}"
    )


def random_inputs(
    gen: torch.Generator,
    *,
    bs: int,
    rows: int,
    ctx: int,
    page_size: int,
    lengths: list[int],
    swa: bool,
    r2t_dtype=torch.int32,
    idx_dtype=torch.int32,
    f2s_dtype=torch.int64,
    num_slots: int = 1 << 20,
    device="cpu",
):
    """Random ``req_to_token`` (any slots), request rows and the given lengths (cycled)."""
    r2t = torch.randint(0, num_slots, (rows, ctx), generator=gen, dtype=torch.int64)
    rpi = torch.randint(0, rows, (bs,), generator=gen, dtype=torch.int64)
    sl = torch.tensor([lengths[i % len(lengths)] for i in range(bs)], dtype=torch.int64)
    sl = sl[torch.randperm(bs, generator=gen)]
    f2s = None
    if swa:
        f2s = torch.randint(0, num_slots, (num_slots + 1,), generator=gen, dtype=torch.int64)
        f2s = f2s.to(device, f2s_dtype)
    return (
        r2t.to(device, r2t_dtype),
        rpi.to(device, idx_dtype),
        sl.to(device, idx_dtype),
        f2s,
    )


def edge_lengths(page_size: int, capacity_tokens: int) -> list[int]:
    """0, 1, page_size, page_size + 1, exact capacity and capacity plus several pages."""
    return [
        0,
        1,
        page_size,
        page_size + 1,
        capacity_tokens,
        capacity_tokens + 3 * page_size,
        max(1, capacity_tokens // 2 + 1),
    ]


def assert_passed(report, *names: str) -> None:
    """Each named property of ``report`` has status ``"pass"``: a SAFE verdict (or
    ``report.safe``) also accepts a skip, so a property that silently turned into a skip
    would pass a test that meant a pass."""
    statuses = {p.name: p.status for p in report.properties}
    for name in names:
        assert name in statuses, f"the report has no property {name!r}: {sorted(statuses)}"
        assert statuses[name] == "pass", f"{name}: {statuses[name]}\n{report.format()}"


def table_row(text: str, name: str) -> str:
    """The row of a printed table whose first cell is ``name`` (also inside pytest's ``E   ``
    lines). With ``CI`` set, pytest repeats the whole failure message in its short summary:
    every copy of the row must then agree."""
    import re

    lines = (re.sub(r"^E\s+", "", line).strip() for line in text.splitlines())
    rows = [line for line in lines if line.startswith(f"| {name} |")]
    assert rows, f"no row for {name!r} in:\n{text}"
    assert len(set(rows)) == 1, f"rows for {name!r} disagree in:\n{text}"
    return rows[0]


def table_cells(text: str, name: str) -> list[str]:
    """The cells of ``table_row(text, name)``, stripped (the first is ``name``)."""
    return [cell.strip() for cell in table_row(text, name).split("|")[1:-1]]


def assert_passed_in_text(text: str, *names: str) -> None:
    """``assert_passed`` on a printed report: each named property's row says ``pass``."""
    import re

    for name in names:
        rows = re.findall(rf"^\| {re.escape(name)} \| [^|\n]* \| (\w+) \|", text, re.M)
        assert rows, f"no row for {name!r} in the report:\n{text}"
        assert all(s == "pass" for s in rows), f"{name}: {rows}\n{text}"


#: The properties a correct page-table builder passes on the CPU too (the Triton interpreter,
#: eager replays); "row containment" where the replays go out of contract. Not "sync-free
#: builder call" nor "graph-safe (captured short, replayed long)", whose CPU status is not
#: a pass by design (no detector; nothing captured).
CPU_PASSES = (
    "correct",
    "bounded writes",
    "staged inputs",
    "capture",
    "replays completed",
    "static buffers unmoved",
)
