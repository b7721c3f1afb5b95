"""What a check runs and what it judges: ``CheckConfig``, its one validator, and the property
table (``PROPERTIES``) every report lists in order.

``validate_config`` is the only place that says which configs can run: the Python API calls
it as is, and scenario files (``pagegraph.check.scenario``) call it with ``strict=True`` (the
rules a file must also follow) and their own key names for the messages, after their
TOML-specific checks (unknown tables and keys, types, required keys).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NoReturn

import torch

from ..consumers.formats import FORMATS
from ..consumers.reader import PAD_SLOTS
from ..graph.buckets import PADDING, PRESETS, Buckets
from ..kernels.contract import cdiv
from ..kinds import kind_names, presettable_outputs
from ..workload.decode import Injection
from ..workload.producer import MAX_STREAMS

#: ``CheckConfig`` dtype names -> torch dtypes (index buffers, ``req_to_token``,
#: ``full_to_swa``).
INDEX_DTYPES = {"int32": torch.int32, "int64": torch.int64}
#: Values of ``CheckConfig.staging`` and ``CheckConfig.workload_process``.
STAGING_MODES = ("mixed", "host", "device")
WORKLOAD_PROCESS_MODES = ("auto", "on", "off")
ROW_ORDERS = ("low-first", "high-first")
#: Replays from which ``workload_process = "auto"`` runs the workload in a child process.
PRODUCER_MIN_STEPS = 1000
#: Values of ``CheckConfig.consumer_dtype`` -> the query and KV-cache dtype.
CONSUMER_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}
#: Values of ``CheckConfig.null_block``: what the decode step's page 0 (the null block) holds.
#: "nan": NaN, a convention whose padded rows read no page (their outputs are not judged);
#: "finite": data, a convention whose padded rows may read the null block (vLLM's block 0),
#: so their own outputs are judged ("padded rows read inside the KV pool").
NULL_BLOCKS = ("nan", "finite")

#: property -> (what it covers, what makes it fail). The order is the report's.
PROPERTIES: dict[str, tuple[str, str]] = {
    "sync-free builder call": (
        "builder",
        "a host sync in one eager call of the builder, seen by any detector that runs here",
    ),
    "no allocation in builder": (
        "builder",
        "advice: a memory allocation by the builder in an eager call or a bucket's warm-up or "
        "capture (a captured graph serves it from its private pool at no cost per replay)",
    ),
    "one compilation for all buckets": (
        "builder",
        "advice: a Triton compilation after the first bucket's warm-up (a kernel specialised "
        "per batch size: start-up time, not a replay hazard), or during capture",
    ),
    "capture": ("builder + runner", "warm-up or capture raising"),
    "replays completed": ("builder + runner", "a replay raising, or the run interrupted"),
    "staged inputs": (
        "runner",
        "static inputs after staging and padding that differ from the batch asked for, padded "
        "by the policy into the right bucket",
    ),
    "outputs unaliased": (
        "runner",
        "at set-up, two outputs (tables, vectors, error counters) whose views share a byte, or "
        "an output sharing one with an input the builder reads (pagegraph.check.judges.aliasing)",
    ),
    "correct": (
        "builder + runner",
        "a live entry (real or padded row) that differs from the reference, on a replay "
        "whose values are all in the contract",
    ),
    "bounded writes": (
        "builder + runner",
        "any entry outside the live region (stale tail, rows past the bucket, canary rows and "
        "columns) that is not the poison written before the replay, on in-contract replays",
    ),
    "graph-safe (captured short, replayed long)": (
        "builder",
        "a replay (captured with every length 1, replayed with longer rows) whose outputs "
        "differ from an eager call of the builder on the same inputs (something frozen at "
        "capture); a builder wrong eagerly too fails correct alone",
    ),
    "row containment": (
        "builder",
        "on a replay with out-of-contract values, any write outside an out-of-contract row's "
        "own [0, width) region, or any change to another row or a canary",
    ),
    "error counters": (
        "builder",
        "an errors counter that differs from the count of out-of-contract values the replay "
        "held (only for a builder that takes errors=)",
    ),
    "static buffers unmoved": (
        "runner",
        "a static buffer (inputs, tables, errors, req_to_token, full_to_swa) whose address "
        "differs from capture's",
    ),
    "no allocation in replay": (
        "runner",
        "a memory allocation while staging or replaying a graph (replaying eagerly, the "
        "runner's staging: the builder's own allocations there are advice)",
    ),
    "no memory growth": (
        "runner (with graphs); runner + builder (eager)",
        "more device memory allocated after the replays than before",
    ),
    "sync-free replay path": (
        "runner (with graphs); runner + builder (eager)",
        "a host sync inside a stage/* or replay/* range, seen by any detector that runs here",
    ),
}

#: Advice a team may promote to a failure (``CheckConfig.strict``, ``--strict``), by name ->
#: the property that reports it. Advice is shown with its figures and never changes the
#: verdict: it does not make a replay wrong or unsafe.
ADVICE: dict[str, str] = {
    "compilations": "one compilation for all buckets",
    "allocations": "no allocation in builder",
    "error-counters": "error counters",
}
#: The properties whose findings are advice, not failures (unless promoted). "error counters"
#: is a safety property for a builder that takes ``errors=``; its advice is their absence.
ADVICE_PROPERTIES = ("one compilation for all buckets", "no allocation in builder")

#: How far out of the contract a scenario's injected values go: "engine", the values engines
#: really send (lengths past a row's capacity, zero-length rows); "hostile", those too and
#: values no engine should send (negative lengths, request indices outside ``req_to_token``,
#: whose slots may fall outside ``full_to_swa``).
INJECTION_LEVELS = ("engine", "hostile")
#: The injection knobs only the hostile level allows. ``num_blocks_overrun`` breaks a host
#: guarantee of the engine state (vLLM's per-request ``num_blocks`` within the table's width),
#: so it applies to a kind that reads that state (``KindSpec.engine_state``).
HOSTILE_INJECTIONS = ("negative", "bad_index", "num_blocks_overrun")
#: Every injection knob (probabilities per step).
INJECTIONS = ("overlong", "negative", "zero_len", "bad_index", "num_blocks_overrun")

#: Properties judged over the replays (incomplete when the run stops early).
REPLAY_PROPERTIES = (
    "staged inputs",
    "correct",
    "bounded writes",
    "graph-safe (captured short, replayed long)",
    "row containment",
    "error counters",
    "static buffers unmoved",
    "no allocation in replay",
    "no memory growth",
    "sync-free replay path",
)


@dataclass
class CheckConfig:
    """One graph setup, its buffer layout and its workload (what a scenario file describes)."""

    max_bs: int = 16
    max_context_len: int = 512
    page_size: int = 16
    buckets: str | list[int] = "sglang"
    padding: str = "sglang"
    swa: bool = False
    steps: int = 40
    seed: int = 0
    finish_rate: float = 0.05
    draft_tokens: int = 0
    initial_len: tuple[int, int] | None = None
    swa_window: int | None = None
    swa_churn: float = 0.0
    near_capacity: float = 0.1
    max_reqs: int | None = None
    num_pages: int | None = None
    row_order: str = "low-first"
    index_dtype: str = "int32"
    errors: bool = False
    detectors: str | tuple[str, ...] = "auto"
    # -- layout: buffers as engines hand them over --
    #: pages per table row (default ``cdiv(max_context_len, page_size)``; narrower caps pages
    #: per request, so long rows must stop at the width)
    table_width: int | None = None
    #: extra columns in the tables' allocation: the tables are column slices of wider
    #: buffers (row stride = width + pad), as attention backends slice ``[:, :max_pages]``
    table_pad_cols: int = 0
    #: the SWA table's own pad columns (default ``table_pad_cols``): an SWA table allocated
    #: apart, with a row stride of its own
    swa_table_pad_cols: int | None = None
    #: ``req_to_token`` rows this much longer than ``max_context_len``
    r2t_extra_cols: int = 0
    #: ``req_to_token`` starts this many elements into a larger allocation
    r2t_offset: int = 0
    r2t_dtype: str = "int32"
    full_to_swa_dtype: str = "int64"
    #: vLLM's KV-cache groups, each a dict (``name``, ``kind``, ``block_size``, ``width``):
    #: a block-table or slot-mapping builder is checked over every group
    #: (``pagegraph.check.pipeline.group_checks``); empty: one group, the page size and width above
    kv_groups: tuple[dict[str, Any], ...] = ()
    # -- out-of-contract and edge values in the batches (probabilities per step) --
    #: "engine" or "hostile" (``INJECTION_LEVELS``): which injections the scenario may ask for
    injection_level: str = "hostile"
    overlong: float = 0.0
    negative: float = 0.0
    zero_len: float = 0.0
    bad_index: float = 0.0
    #: one real row's ``num_blocks`` in the engine state set past the table's width (by 1 to
    #: a whole row) before a replay: hostile, block-table builders only
    num_blocks_overrun: float = 0.0
    #: independently seeded workload streams taking turns, ``SEGMENT_STEPS`` replays each
    #: (``ProducedWorkload``): with child processes, that many pool models generate steps at
    #: once; a run shorter than one segment replays stream 0 alone
    workload_streams: int = 1
    # -- how the checker drives the runner --
    #: "mixed" alternates host lists and device tensors; "host" or "device" uses one
    staging: str = "mixed"
    #: replays between two read-backs of the device records
    chunk: int = 256
    #: "auto" (what the builder says), or a kind's name (``pagegraph.kinds.kind_names()``)
    outputs: str = "auto"
    #: where the workload's host models run: "on": a child process a stream
    #: (``ProducedWorkload``), "off": in this one, "auto": in children for CUDA-graph runs of
    #: at least ``PRODUCER_MIN_STEPS`` replays, where their start-up (a second or two) pays off
    workload_process: str = "auto"
    #: without CUDA, replay emulated graphs (``pagegraph.graph.emulate``: what the capture
    #: recorded, the builder not called again); False: replays call the builder eagerly
    emulate: bool = True
    #: advice promoted to failures (names of ``ADVICE``)
    strict: tuple[str, ...] = ()
    #: decode-metadata or CSR entries set once at allocation that the builder never writes
    #: (``pagegraph.kinds.presettable_outputs()``, the kinds' ``presets``), as engines run
    #: some builders
    preset_outputs: tuple[str, ...] = ()
    # -- the decode step: the tables consumed by paged attention in the same graph --
    #: None (the builder alone), or the attention format that consumes the builder's tables in
    #: the same CUDA graph (a name in ``pagegraph.consumers.formats.FORMATS``):
    #: ``check_decode_step`` judges the step end to end
    consumer: str | None = None
    #: query and KV-cache dtype (``CONSUMER_DTYPES``)
    consumer_dtype: str = "bfloat16"
    num_q_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    #: timed graph replays per bucket (CUDA only), for the medians of the step and the builder;
    #: 0: no timing (``pagegraph mutate`` needs only the verdict)
    timing_iters: int = 20
    #: what the decode step's null block (page 0) holds (``NULL_BLOCKS``): "nan", or
    #: "finite" where the engine's padded rows may read it (their outputs are then judged)
    null_block: str = "nan"
    #: where a padded row's new token goes in the step's cache write (``PAD_SLOTS``): "skip"
    #: (``PAD_SLOT_ID``, vLLM), "null" (slot 0, SGLang); None: by ``padding`` (``cache_pad_slot``)
    pad_slot: str | None = None
    #: the decode step's reader by name (``pagegraph.check.plan.resolve_reader``: an engine
    #: reader such as "sglang:triton_decode", or ``module:name``), used when the check is
    #: given none; None: pagegraph's attention of the consumer's format
    reader: str | None = None
    #: "replay equals eager, bitwise" judged (a failure when a replay's real rows differ from
    #: the reader's own eager call in any bit); advice when False
    bitwise: bool = False

    def replace(self, **changes: Any) -> CheckConfig:
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CheckConfig:
        """The config ``dataclasses.asdict`` made (through JSON: lists become tuples again)."""
        names = {f.name for f in dataclasses.fields(cls)}
        config = cls(**{k: v for k, v in d.items() if k in names})
        if isinstance(config.initial_len, list):
            config.initial_len = tuple(config.initial_len)
        if isinstance(config.detectors, list):
            config.detectors = tuple(config.detectors)
        config.strict = tuple(config.strict)
        config.preset_outputs = tuple(config.preset_outputs)
        config.kv_groups = tuple(dict(g) for g in config.kv_groups)
        return config

    @property
    def cache_pad_slot(self) -> str:
        """``pad_slot``, or the engine's by ``padding``: "null" for SGLang's padding over a NaN
        null block (its padded rows' ``out_cache_loc`` is slot 0), "skip" for every other
        (vLLM's ``PAD_SLOT_ID``; a null block holding data is never written)."""
        if self.pad_slot is not None:
            return self.pad_slot
        return "null" if self.padding == "sglang" and self.null_block == "nan" else "skip"

    @property
    def width(self) -> int:
        return self.table_width or cdiv(self.max_context_len, self.page_size)

    def injection(self) -> Injection:
        return Injection(self.overlong, self.negative, self.zero_len, self.bad_index)

    def hostile_injections(self) -> tuple[str, ...]:
        """The hostile knobs this config sets (``HOSTILE_INJECTIONS``): inputs no engine sends,
        or engine state past what the engine's host guarantees."""
        return tuple(k for k in HOSTILE_INJECTIONS if getattr(self, k))


# -- the one validator ---------------------------------------------------------------------------


class ConfigError(ValueError):
    """A config that cannot run: ``field`` is the ``CheckConfig`` field at fault, ``problem``
    says why (without the field's name, so a scenario file can name its own key)."""

    def __init__(self, field: str, problem: str, shown_as: str | None = None):
        self.field, self.problem = field, problem
        super().__init__(f"{shown_as or field} {problem}")


#: A field's name as the caller shows it (the field itself, or a scenario file's key).
FieldNamer = Callable[[str], str]


def validate_config(cfg: CheckConfig, name: FieldNamer = str, *, strict: bool = False) -> None:
    """Raise ``ConfigError`` (a ``ValueError``) for the first field of ``cfg`` that cannot run.

    Every caller gets the checks of values the checker cannot run with (dtypes, layout
    offsets, injection rates, how the checker drives the runner). ``strict`` (scenario
    files) adds the rules a file must also follow, which the Python API leaves to the parts
    that use the values: graph and pool sizes, buckets and padding names, workload rates and
    lengths, detector names, and no SWA setting without ``swa``. ``name`` maps a field to
    the name the messages use (scenario files pass their key names). Nothing in ``cfg`` is
    changed."""
    checks = [_check_layout, _check_injection, _check_driving, _check_advice, _check_consumer]
    if strict:
        checks += [
            _check_graph,
            _check_pool,
            _check_workload,
            _check_swa_settings,
            _check_detectors,
        ]
    for check in checks:
        check(cfg, name)


def _fail(field: str, problem: str, name: FieldNamer) -> NoReturn:
    raise ConfigError(field, problem, name(field))


def _check_layout(c: CheckConfig, name: FieldNamer) -> None:
    for field in ("index_dtype", "r2t_dtype", "full_to_swa_dtype"):
        if getattr(c, field) not in INDEX_DTYPES:
            _fail(field, f"must be 'int32' or 'int64', got {getattr(c, field)!r}", name)
    if c.table_width is not None and c.table_width < 1:
        _fail("table_width", f"must be >= 1, got {c.table_width}", name)
    for field in ("table_pad_cols", "r2t_extra_cols", "r2t_offset"):
        if getattr(c, field) < 0:
            _fail(field, f"must be >= 0, got {getattr(c, field)}", name)
    if c.kv_groups:
        from ..kinds.kv_group_layout import groups_problem

        problem = groups_problem(c)
        if problem:
            _fail("kv_groups", problem, name)
    if c.swa_table_pad_cols is not None:
        if c.swa_table_pad_cols < 0:
            _fail("swa_table_pad_cols", f"must be >= 0, got {c.swa_table_pad_cols}", name)
        if not c.swa:
            _fail("swa_table_pad_cols", "needs swa = true", name)


def _check_probabilities(c: CheckConfig, fields: tuple[str, ...], name: FieldNamer) -> None:
    for field in fields:
        value = getattr(c, field)
        if not 0 <= value <= 1:
            _fail(field, f"must be a probability in [0, 1], got {value}", name)


def _check_injection(c: CheckConfig, name: FieldNamer) -> None:
    _check_probabilities(c, INJECTIONS, name)
    if c.injection_level not in INJECTION_LEVELS:
        _fail("injection_level", f"must be 'engine' or 'hostile', got {c.injection_level!r}", name)
    if c.injection_level == "engine":
        for field in HOSTILE_INJECTIONS:
            if getattr(c, field):
                _fail(
                    field,
                    f"is a hostile injection: needs {name('injection_level')} = 'hostile'",
                    name,
                )


def _check_advice(c: CheckConfig, name: FieldNamer) -> None:
    for field in ("strict", "preset_outputs"):
        if isinstance(getattr(c, field), str):
            _fail(field, f"must be a list of names, not the string {getattr(c, field)!r}", name)
    unknown = [s for s in c.strict if s not in ADVICE]
    if unknown:
        _fail("strict", f"names no advice: {unknown} (known: {', '.join(ADVICE)})", name)
    # Outputs an engine may set once, at allocation, and a builder never write: the checker
    # writes their value after each poisoning.
    known = presettable_outputs()
    unknown = [s for s in c.preset_outputs if s not in known]
    if unknown:
        _fail(
            "preset_outputs",
            f"names no presettable output: {unknown} (known: {', '.join(known)})",
            name,
        )


def _check_driving(c: CheckConfig, name: FieldNamer) -> None:
    if c.steps < 1:
        _fail("steps", f"must be >= 1, got {c.steps}", name)
    if c.staging not in STAGING_MODES:
        _fail("staging", f"must be 'mixed', 'host' or 'device', got {c.staging!r}", name)
    if c.chunk < 1:
        _fail("chunk", f"must be >= 1, got {c.chunk}", name)
    if not 1 <= c.workload_streams <= MAX_STREAMS:
        _fail("workload_streams", f"must be in 1..{MAX_STREAMS}, got {c.workload_streams}", name)
    if c.workload_process not in WORKLOAD_PROCESS_MODES:
        _fail(
            "workload_process", f"must be 'auto', 'on' or 'off', got {c.workload_process!r}", name
        )
    if c.outputs not in ("auto", *kind_names()):
        kinds = ", ".join(f"'{k}'" for k in ("auto", *kind_names()))
        _fail("outputs", f"must be one of {kinds}, got {c.outputs!r}", name)


def _check_consumer(c: CheckConfig, name: FieldNamer) -> None:
    """The decode step's settings; it runs plain decode batches in the contract only (its
    reference is dense attention over each row's live tokens), so SWA, draft tokens and
    injected out-of-contract values are refused with a consumer."""
    if c.consumer is None:
        return
    if c.consumer not in FORMATS:
        known = " or ".join(repr(f) for f in FORMATS)
        _fail("consumer", f"must be {known}, got {c.consumer!r}", name)
    if c.consumer_dtype not in CONSUMER_DTYPES:
        _fail("consumer_dtype", f"must be 'bfloat16' or 'float16', got {c.consumer_dtype!r}", name)
    for field in ("num_q_heads", "num_kv_heads"):
        if getattr(c, field) < 1:
            _fail(field, f"must be >= 1, got {getattr(c, field)}", name)
    if not isinstance(c.emulate, bool):
        _fail("emulate", f"must be true or false, got {c.emulate!r}", name)
    if c.timing_iters < 0:
        _fail("timing_iters", f"must be >= 0 (0: no timing), got {c.timing_iters}", name)
    if c.null_block not in NULL_BLOCKS:
        _fail("null_block", f"must be 'nan' or 'finite', got {c.null_block!r}", name)
    if c.pad_slot is not None and c.pad_slot not in PAD_SLOTS:
        _fail("pad_slot", f"must be 'skip' or 'null', got {c.pad_slot!r}", name)
    if c.pad_slot == "null" and c.null_block == "finite":
        _fail(
            "pad_slot",
            "'null' (padded rows write slot 0) cannot go with a null block that holds data "
            f"({name('null_block')} = 'finite'): set it to 'skip'",
            name,
        )
    if c.num_q_heads % c.num_kv_heads:
        _fail(
            "num_q_heads",
            f"must be a multiple of {name('num_kv_heads')} ({c.num_kv_heads}), got {c.num_q_heads}",
            name,
        )
    if c.head_dim < 16 or c.head_dim & (c.head_dim - 1):
        _fail("head_dim", f"must be a power of two >= 16, got {c.head_dim}", name)
    if c.page_size > 256:
        _fail("page_size", f"must be <= 256 with a consumer, got {c.page_size}", name)
    for field in ("swa", "draft_tokens", *INJECTIONS):
        if getattr(c, field):
            _fail(
                field,
                f"is not supported with {name('consumer')} (the decode step runs "
                "plain decode batches in the contract)",
                name,
            )


# -- strict: scenario files ----------------------------------------------------------------------


def _check_graph(c: CheckConfig, name: FieldNamer) -> None:
    if c.max_bs < 1:
        _fail("max_bs", f"must be >= 1, got {c.max_bs}", name)
    if c.max_context_len < 1:
        _fail("max_context_len", f"must be >= 1, got {c.max_context_len}", name)
    if not 1 <= c.page_size <= 1024:
        _fail("page_size", f"must be in 1..1024, got {c.page_size}", name)
    if isinstance(c.buckets, str) and c.buckets not in PRESETS:
        _fail("buckets", f"unknown preset {c.buckets!r} (known: {', '.join(PRESETS)})", name)
    try:
        Buckets(c.buckets, c.max_bs)
    except ValueError as exc:
        _fail("buckets", str(exc), name)
    if c.padding not in PADDING:
        _fail("padding", f"unknown policy {c.padding!r} (known: {', '.join(PADDING)})", name)


def _check_pool(c: CheckConfig, name: FieldNamer) -> None:
    # A pool smaller than the largest bucket is an engine's that pads past its pool: real
    # batches stay within max_reqs, the padded rows point at the dummy row or stale rows.
    if c.max_reqs is not None and c.max_reqs < 1:
        _fail("max_reqs", f"must be >= 1, got {c.max_reqs}", name)
    if c.num_pages is not None and c.num_pages < 2:
        _fail("num_pages", f"must be >= 2 (page 0 is reserved), got {c.num_pages}", name)
    if c.row_order not in ROW_ORDERS:
        _fail("row_order", f"must be 'low-first' or 'high-first', got {c.row_order!r}", name)


def _check_workload(c: CheckConfig, name: FieldNamer) -> None:
    _check_probabilities(c, ("finish_rate", "near_capacity", "swa_churn"), name)
    if not 0 <= c.draft_tokens <= 64:
        _fail("draft_tokens", f"must be in 0..64, got {c.draft_tokens}", name)
    if c.initial_len is not None:
        il = c.initial_len
        if len(il) != 2 or not all(isinstance(x, int) and not isinstance(x, bool) for x in il):
            _fail("initial_len", f"must be [lo, hi] integers, got {il!r}", name)
        if not 1 <= il[0] <= il[1] <= c.max_context_len:
            _fail("initial_len", f"must satisfy 1 <= lo <= hi <= max_context_len, got {il}", name)
    if c.swa_window is not None and c.swa_window < 1:
        _fail("swa_window", f"must be >= 1, got {c.swa_window}", name)


def _check_swa_settings(c: CheckConfig, name: FieldNamer) -> None:
    """SWA settings have no effect without ``swa``: in a file, that is a mistake."""
    if c.swa:
        return
    if c.full_to_swa_dtype != "int64":
        _fail("full_to_swa_dtype", f"needs {name('swa')} = true", name)
    if c.swa_window is not None or c.swa_churn:
        field = "swa_window" if c.swa_window is not None else "swa_churn"
        _fail(field, f"needs {name('swa')} = true", name)


def _check_detectors(c: CheckConfig, name: FieldNamer) -> None:
    from ..detect.sync import parse_detectors

    try:
        parse_detectors(c.detectors)
    except ValueError as exc:
        _fail("detectors", str(exc), name)
