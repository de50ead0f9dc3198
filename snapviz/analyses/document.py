"""The ``snapviz.summary/1`` document as code: frozen dataclasses, their JSON form, their loader
and their JSON schema, all read from the same type hints.

* :class:`Summary` is what an analysis yields (:func:`snapviz.analyses.pipeline.document_of`)
  and what the gate and the JSON, Markdown and terminal renderers take; ``--json`` only
  encodes it (:func:`to_json`).
* :func:`from_json` turns a decoded JSON object (a document written by any version of
  ``snapviz analyze --json``, or a builder's output) into a :class:`Summary`, checking every
  typed field; a malformed document raises :class:`~snapviz.errors.InputError` with one line
  naming the field.
* The what-if and fleet documents are typed the same way (:mod:`snapviz.analyses.whatif_document`,
  :mod:`snapviz.analyses.fleet_document`) and share :func:`to_json`, :func:`from_json` and
  :func:`bounded`.
* :func:`json_schema` is the JSON schema of the document (``docs/summary.schema.json`` is
  generated from it: ``python -m snapviz.analyses.document > docs/summary.schema.json``;
  a test keeps the two equal).

The machinery is generic over frozen dataclasses: :func:`to_json`, :func:`from_json`,
:func:`load_document` (a document read back, its schema string checked first) and
:func:`document_schema` serve the ``snapviz.compare/1`` document too
(:mod:`snapviz.analyses.compare_document`).

A field whose value may be left out of the JSON object (not ``null``: absent) has the type
``... | Absent`` and the default :data:`ABSENT`; the JSON keys come in field order, which is the
order the builders write them in (so encoding a built document gives it back byte for byte).
Every section is typed: :class:`Attention` or :class:`TraceAttention`, :class:`Oom`,
:class:`EndState`, :class:`Training`, the three kinds of advice (:data:`AnyAdvice`, told apart by
``kind``), :class:`AllocatorTruth` and :class:`RunInfo`. Only what is the user's own is
:data:`Json` (any JSON, checked as JSON): the values run.json gives ``run`` and
``allocator_truth``, and the allocator's settings. A key unknown to a type is refused; a key added
after documents were first written is ``| Absent`` so that those documents still load (e.g.
``oom.simulation``, ``oom.card``). Snapshot and trace documents share the type; ``kind`` (absent
for a snapshot, ``"trace"``) says which, and each kind leaves the other's fields absent.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Final, Literal, TypeAlias, TypeVar, Union

import numpy as np

from snapviz.errors import InputError
from snapviz.vocab import SUMMARY_SCHEMA


class Absent(enum.Enum):
    """The type of :data:`ABSENT`: a key left out of the JSON object."""

    ABSENT = "absent"

    def __repr__(self) -> str:
        return "ABSENT"


ABSENT: Final = Absent.ABSENT

# Any JSON value (what the user's own files hold).
Json: TypeAlias = None | bool | int | float | str | list["Json"] | dict[str, "Json"]


@dataclass(frozen=True, kw_only=True)
class Peak:
    """The device's peak: the allocator's figures at the event where allocated memory was highest."""

    allocated_bytes: int
    reserved_bytes: int | None  # None: not recorded (Bytes-only or CPU traces)
    requested_bytes: int | None  # None: a trace (no request sizes)
    event_index: int | None  # None: the memory that existed before the first recorded event
    time_us: int | None
    stage: str | None  # None: an empty snapshot (no peak)
    within_recorded_window: bool
    approximate: Literal[True] | Absent = ABSENT  # the allocator's rules could not be honoured
    exact: bool | Absent = ABSENT  # traces: the events carried the allocator's own totals


@dataclass(frozen=True, kw_only=True)
class History:
    """The recorded history: its length and what it started and ended with."""

    events: int
    truncated: bool
    baseline_allocated_bytes: int | None
    baseline_reserved_bytes: int | Absent = ABSENT
    orphan_frees: int | Absent = ABSENT
    end_state_matches: bool | None | Absent = ABSENT
    final_allocated_bytes: int | Absent = ABSENT
    final_reserved_bytes: int | Absent = ABSENT
    baseline_exact: bool | Absent = ABSENT  # traces


@dataclass(frozen=True, kw_only=True)
class SiteBytes:
    bytes: int
    site: str


@dataclass(frozen=True, kw_only=True)
class Interval:
    """One stage interval (in ``intervals``), or one numbered step of a stage (in ``steps``:
    ``step`` set, the part of the name after ``/``)."""

    name: str
    step: str | Absent = ABSENT
    peak_allocated_bytes: int | None
    peak_reserved_bytes: int | None
    start_us: int
    end_us: int
    allocated_at_entry: int | Absent = ABSENT
    allocated_at_exit: int | Absent = ABSENT
    categories_at_peak: dict[str, int] | Absent = ABSENT
    top_allocations: list[SiteBytes] | Absent = ABSENT
    duration_s: float | Absent = ABSENT
    allocator_peak_allocated_bytes: int | None | Absent = ABSENT  # run.json's figure for it
    allocator_peak_reserved_bytes: int | None | Absent = ABSENT
    rss_peak_bytes: int | Absent = ABSENT  # CPU traces: the process's resident set


@dataclass(frozen=True, kw_only=True)
class StageGroup:
    """A stage (the name before ``/``): its peak over its intervals."""

    name: str
    peak_allocated_bytes: int | None
    peak_reserved_bytes: int | None
    start_us: int
    end_us: int
    steps: list[Interval]
    intervals: list[Interval] = field(default_factory=list)  # older documents: none


@dataclass(frozen=True, kw_only=True)
class DevicePeak:
    """A snapshot's device and its replayed peaks."""

    device: int
    peak_allocated_bytes: int
    peak_reserved_bytes: int
    events: int


@dataclass(frozen=True, kw_only=True)
class TraceDevice:
    """A trace's device (``cuda:0``, ``cpu``) and the peak of its memory events."""

    device: str
    kind: str
    events: int
    exact: bool
    peak_allocated_bytes: int


@dataclass(frozen=True, kw_only=True)
class CategoryBytes:
    """Live bytes of one category at the peak."""

    category: str
    bytes: int
    count: int


@dataclass(frozen=True, kw_only=True)
class TopAllocation:
    """A block live at the peak."""

    bytes: int
    requested_bytes: int | Absent = ABSENT  # snapshots
    stage: str
    site: str
    address: int
    event_index: int | None | Absent = ABSENT  # snapshots (None: allocated before recording)
    time_us: int | Absent = ABSENT  # traces
    stack: list[str]
    op: str | Absent = ABSENT  # the profiled op that allocated it, when a trace was recorded too
    op_input_dims: str | Absent = ABSENT


# --------------------------------------------------------------------------- attention


@dataclass(frozen=True, kw_only=True)
class ScoreMatrix:
    """A snapshot's largest attention score matrix; its shape a guess from the run's geometry."""

    bytes: int
    requested_bytes: int
    shape: list[int] | None  # [batch*heads, Nq, Nk]; None: no factoring fits
    dtype: str | None
    heads: int | None
    batch: int | None
    stage: str | None  # None: no score matrix
    site: str | None


@dataclass(frozen=True, kw_only=True)
class AttentionStage:
    """Score bytes live in one stage interval (``stages``) or stage (``stage_groups``)."""

    stage: str
    peak_allocated_bytes: int
    live_bytes_at_stage_peak: int
    share_of_stage_peak: float
    max_live_bytes: int


@dataclass(frozen=True, kw_only=True)
class Attention:
    """A snapshot's attention score matrices (softmax over a matmul) and the implementation
    the run used."""

    count: int
    peak_live_bytes: int
    peak_live_event_index: int  # -1: none live
    total_bytes: int
    largest: ScoreMatrix
    implementation: str
    implementation_source: str
    materialized: bool
    fused: bool
    functions: dict[str, int]  # score allocations by the function that made them
    fused_evidence: list[str]
    stages: list[AttentionStage]
    stage_groups: list[AttentionStage]
    trace_offset_us: float | Absent = ABSENT  # a profiler trace of the same run was joined


@dataclass(frozen=True, kw_only=True)
class TraceScoreMatrix:
    """A trace's largest score matrix, with the exact shape of the op that made it."""

    bytes: int
    shape: list[int] | None
    dtype: str | None | Absent = ABSENT  # absent: no score matrix
    op: str | Absent = ABSENT
    stage: str | None | Absent = ABSENT


@dataclass(frozen=True, kw_only=True)
class TraceAttention:
    """A trace's attention ops: score matrices with their shapes, fused calls, the verdict."""

    count: int
    peak_live_bytes: int  # a lower bound: ops do not say lifetimes
    largest: TraceScoreMatrix
    source: str
    sdpa_calls: int  # calls of PyTorch's SDPA ops that ran fused
    fused_calls: int  # every fused attention call: SDPA, vLLM, flash-attn, xFormers, aiter/CK
    implementation: str


# --------------------------------------------------------------------------- run.json


@dataclass(frozen=True, kw_only=True)
class AllocatorTruth:
    """The allocator's own figures for the device, from run.json (values as the file has them:
    the collectors write integers; null where unknown)."""

    max_memory_allocated: Json
    max_memory_reserved: Json


@dataclass(frozen=True, kw_only=True)
class RunInfo:
    """How the run was made: the ``snapviz.run/1`` fields of its run.json (values as the file
    has them; null where it has none)."""

    pipeline: Json
    size: Json
    techniques: Json
    height: Json
    width: Json
    steps: Json
    batch: Json
    dtype: Json
    device_name: Json
    torch_version: Json
    diffusers_version: Json
    command: Json


# --------------------------------------------------------------------------- advice


@dataclass(frozen=True, kw_only=True)
class Advice:
    """A fix from the standard toolbox, estimated from the live set at the peak."""

    technique: str
    why: str
    saves_up_to_bytes: int | None  # None: not known
    how: str


@dataclass(frozen=True, kw_only=True)
class SimulatedAdvice:
    """An allocator setting or card the simulator ran the recorded requests under."""

    technique: str
    why: str
    saves_up_to_bytes: int | None
    how: str
    kind: Literal["simulated"]


@dataclass(frozen=True, kw_only=True)
class TrainingAdvice:
    """A training technique, estimated per phase from the training view."""

    technique: str
    kind: Literal["training"]
    why: str
    saves_up_to_bytes: int | None
    estimated_peak_bytes: int
    phase_savings_bytes: dict[str, int]  # by phase group
    how: str


AnyAdvice: TypeAlias = Advice | SimulatedAdvice | TrainingAdvice


# --------------------------------------------------------------------------- OOM


@dataclass(frozen=True, kw_only=True)
class LiveCategory:
    category: str
    bytes: int


@dataclass(frozen=True, kw_only=True)
class LiveSite:
    site: str
    bytes: int


@dataclass(frozen=True, kw_only=True)
class Shrink:
    """The largest category live at an OOM: where the bytes short would have to come from."""

    category: str
    bytes: int
    stage: str


@dataclass(frozen=True, kw_only=True)
class FittingSetting:
    """The first allocator setting under which the run fits the recorded cap (simulated)."""

    alloc_conf: str
    peak_reserved_bytes: int


@dataclass(frozen=True, kw_only=True)
class CardFit:
    """The smallest card one setting runs on (simulated, whole GiB)."""

    alloc_conf: str | None  # None: the recorded settings
    smallest_bytes: int | None  # None: none up to the search's limit
    common_card_bytes: int | None  # None: larger than the common cards
    peak_reserved_bytes: int | None


@dataclass(frozen=True, kw_only=True)
class OomSimulation:
    """What would have let the failed request fit, simulated."""

    simulated: bool
    why_not: str | None  # None: simulated
    reason: str
    setting: FittingSetting | None
    settings_tried: list[str]
    cards: list[CardFit]


@dataclass(frozen=True, kw_only=True)
class Oom:
    """The OOM that ended the run (or the last one, survived): the failed request, the
    allocator's state then, the verdict and what would have fit, with the sentences every
    sink says (``headline`` … ``card``)."""

    source: str  # "trace" (the snapshot's oom entry) or "run.json" (the collectors' record)
    count: int
    device: int
    event_index: int | None
    survived: bool
    time_us: int | None
    requested_bytes: int
    stream: int | None
    site: str | None
    stack: list[str]
    stage: str
    allocated_bytes: int
    reserved_bytes: int
    cap_bytes: int | None
    cap_source: str | None
    device_free_bytes: int | None
    free_reserved_bytes: int
    largest_free_block_bytes: int | None
    verdict: str  # "out of memory", "fragmented" or "not determined"
    bytes_short: int | None
    live_categories: list[LiveCategory]
    live_sites: list[LiveSite]
    shrink: Shrink | None
    advice: str | None
    simulation: OomSimulation | None | Absent = ABSENT  # absent: written before the simulator
    headline: str
    state: str
    verdict_text: str
    fix: str | None
    card: str | None | Absent = ABSENT  # absent: written before the simulator


# --------------------------------------------------------------------------- end state


@dataclass(frozen=True, kw_only=True)
class SiteBlocks:
    site: str
    bytes: int
    count: int


@dataclass(frozen=True, kw_only=True)
class Pool:
    """A memory pool at the end (``0,0``: the default pool; others: CUDA graphs, MemPool)."""

    pool: str
    name: str
    segments: int
    reserved_bytes: int
    allocated_bytes: int


@dataclass(frozen=True, kw_only=True)
class BeforeRecording:
    """Memory allocated before the recorded history, itemised by the end-state blocks' frames."""

    bytes: int
    itemised_bytes: int
    by_category: dict[str, int]
    sites: list[SiteBlocks]


@dataclass(frozen=True, kw_only=True)
class EndState:
    """The blocks live when the snapshot was taken, named by their own frames."""

    only: bool  # the file holds no history for the device, only this
    note: str | None
    live_bytes: int
    blocks: int
    by_category: dict[str, int]
    by_stage: dict[str, int]
    sites: list[SiteBlocks]
    pools: list[Pool]
    before_recording: BeforeRecording


# --------------------------------------------------------------------------- training


@dataclass(frozen=True, kw_only=True)
class TrainingPhase:
    """A phase interval (forward, backward, optimizer…) of an optimizer step, and its peak."""

    name: str
    step: int
    peak_allocated_bytes: int
    categories_at_peak: dict[str, int]


@dataclass(frozen=True, kw_only=True)
class TrainingStep:
    """An optimizer step: the phase interval holding its peak, and what the peak is made of."""

    step: int
    peak_phase: str
    peak_allocated_bytes: int
    categories_at_peak: dict[str, int]


@dataclass(frozen=True, kw_only=True)
class Training:
    """A training run's phases and steps; categories include ``before recording`` (they add up)."""

    categories: list[str]
    phases: list[TrainingPhase]
    steps: list[TrainingStep]


@dataclass(frozen=True, kw_only=True)
class Summary:
    """The ``snapviz.summary/1`` document of one device of one run."""

    schema: Literal["snapviz.summary/1"]
    source: str
    kind: Literal["trace"] | Absent = ABSENT  # absent: a replayed snapshot
    device: int | str | None  # a snapshot's device index; a trace's device label (None: no events)
    device_kind: str | None | Absent = ABSENT  # traces
    stage_source: str
    peak: Peak
    history: History
    devices: list[DevicePeak] | list[TraceDevice]
    stages: list[StageGroup]
    attention: Attention | TraceAttention
    categories: list[CategoryBytes] | Absent = ABSENT  # snapshots: live bytes by category at the peak
    top_allocations: list[TopAllocation]
    top_allocations_note: str | Absent = ABSENT  # traces
    allocator_truth: AllocatorTruth | None  # None: no run.json
    run: RunInfo | None  # None: no run.json
    allocator_settings: Json | Absent = ABSENT  # snapshots: the allocator's settings as the file has them
    advice: list[AnyAdvice] | Absent = ABSENT  # snapshots
    warnings: list[str]
    oom: Oom | None | Absent = ABSENT  # snapshots: the OOM explained, None: none
    not_recorded: str | None
    end_state: EndState | None | Absent = ABSENT  # snapshots
    training: Training | Absent = ABSENT  # snapshots of a training program

    @property
    def is_trace(self) -> bool:
        return self.kind == "trace"


# --------------------------------------------------------------------------- reading the user's JSON values


def obj(v: Json | Absent) -> dict[str, Json]:
    """A JSON value from the user's files (allocator settings, a run.json field) as a JSON
    object; ``{}`` when it is anything else."""
    return v if isinstance(v, dict) else {}


def arr(v: Json | Absent) -> list[Json]:
    """Such a value as a list; ``[]`` when it is anything else."""
    return v if isinstance(v, list) else []


def num(v: Json | Absent) -> int:
    """Such a value as a byte count or count; 0 when it is not an integer."""
    return v if isinstance(v, int) and not isinstance(v, bool) else 0


# --------------------------------------------------------------------------- encoding


def to_json(value: Any) -> Any:
    """The plain JSON value (dicts, lists, str, int, float, bool, None) of a document or any
    part of it: absent fields left out, keys in field order."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_json(v) for f in dataclasses.fields(value) if (v := getattr(value, f.name)) is not ABSENT}
    if isinstance(value, list):
        return [to_json(v) for v in value]
    if isinstance(value, dict):
        return {k: to_json(v) for k, v in value.items()}
    return value


def bounded_summary(doc: Summary) -> Summary:
    """The document every text sink gets: strings from the input clipped and stripped of
    control characters, non-finite numbers null, what was cut noted in ``warnings``
    (:func:`snapviz.safe_text.bounded_doc`), typed again."""
    return bounded(doc)


D = TypeVar("D")


def bounded(doc: D) -> D:
    """Any typed document (the summary, the what-if and fleet documents of
    :mod:`snapviz.analyses.whatif_document` and :mod:`snapviz.analyses.fleet_document`) as every
    text sink gets it: :func:`snapviz.safe_text.bounded_doc` of its JSON form, typed again (its
    type has ``warnings: list[str]``, absent or not, for what was cut)."""
    from snapviz.safe_text import bounded_doc

    return from_json(bounded_doc(to_json(doc)), type(doc))


# --------------------------------------------------------------------------- decoding

T = TypeVar("T")


def from_json(obj: object, cls: type[T] = Summary) -> T:  # type: ignore[assignment]
    """The typed document (or part, ``cls``) of a decoded JSON value; a malformed one raises
    :class:`InputError` naming the first bad field (``peak.allocated_bytes: expected an
    integer, got a string``). numpy scalars are taken as the Python numbers they are."""
    return typing.cast(T, _decode(obj, cls, "document"))


def field_from_json(cls: type, name: str, value: object) -> Any:
    """The value of field ``name`` of the document type ``cls`` read from its JSON form, checked
    as :func:`from_json` checks a whole document (the summary builder decodes what the user's
    files give as JSON with it: run.json's figures and fields, the allocator's settings)."""
    return _decode(value, _hints(cls)[name], name)


def load_summary(obj: object, source: str = "document") -> Summary:
    """A ``snapviz.summary/1`` document read back (``compare``/``check`` inputs): its schema
    string first, then every typed field; one line in :class:`InputError` when malformed."""
    return load_document(obj, Summary, SUMMARY_SCHEMA, source)


def load_document(obj: object, cls: type[T], schema: str, source: str = "document") -> T:
    """A document of type ``cls`` (whose ``schema`` field holds ``schema``) read back from its
    JSON form: the schema string first, then every typed field (:func:`from_json`); one line in
    :class:`InputError` naming ``source`` when it is not such a document or is malformed."""
    if not isinstance(obj, dict):
        raise InputError(f"{source}: not a {schema} document (a JSON object expected)")
    if obj.get("schema") != schema:
        raise InputError(f"{source}: not a {schema} document (schema {str(obj.get('schema'))[:60]!r})")
    try:
        return from_json(obj, cls)
    except InputError as e:
        raise InputError(f"{source}: malformed {schema} document: {e}") from None


_NAMES = {int: "an integer", float: "a number", str: "a string", bool: "true or false", type(None): "null"}


def _what(v: object) -> str:
    if isinstance(v, bool):
        return "true/false"
    if isinstance(v, (int, np.integer)):
        return "an integer"
    if isinstance(v, (float, np.floating)):
        return "a number"
    if isinstance(v, str):
        return "a string"
    if v is None:
        return "null"
    if isinstance(v, (list, tuple)):
        return "a list"
    if isinstance(v, dict):
        return "an object"
    return type(v).__name__


def _fail(path: str, expected: str, v: object) -> InputError:
    return InputError(f"{path}: expected {expected}, got {_what(v)}")


def _hints(cls: type) -> dict[str, Any]:
    cached = _HINTS.get(cls)
    if cached is None:
        cached = _HINTS[cls] = typing.get_type_hints(cls)
    return cached


_HINTS: dict[type, dict[str, Any]] = {}


def _plain(v: object) -> object:
    if isinstance(v, np.bool_):
        return bool(v)
    if isinstance(v, np.integer):
        return int(v)
    if isinstance(v, np.floating):
        return float(v)
    return v


def _is_json(tp: Any) -> bool:
    """``tp`` is the :data:`Json` alias (as written, or as ``get_type_hints`` re-made it, its
    forward references resolved or not): a union of every JSON scalar, a list and a dict."""
    if isinstance(tp, typing.ForwardRef):
        return tp.__forward_arg__ == "Json"
    if tp is Json or tp == Json:
        return True
    if typing.get_origin(tp) not in (Union, types.UnionType):
        return False
    args = typing.get_args(tp)
    origins = {typing.get_origin(a) for a in args}
    return {type(None), bool, int, float, str} <= set(args) and {list, dict} <= origins


def _decode(v: object, tp: Any, path: str) -> Any:  # noqa: C901 (one case per kind of type)
    v = _plain(v)
    if _is_json(tp):
        return _json_value(v, path)
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        options = [a for a in typing.get_args(tp) if a is not Absent]
        errors: list[InputError] = []
        for a in options:
            try:
                return _decode(v, a, path)
            except InputError as e:
                errors.append(e)
        # the most specific message: an option of the value's own kind (an object for an
        # object…), then the one that got deepest into the value
        same_kind = [e for a, e in zip(options, errors, strict=True) if _container_of(a, v)]
        deepest = max(same_kind or errors, key=lambda e: str(e).split(":", 1)[0].count("."))
        if same_kind or str(deepest).split(":", 1)[0] != path:
            raise deepest
        raise _fail(path, " or ".join(_expected(a) for a in options), v)
    if origin is Literal:
        if v in typing.get_args(tp) and type(v) is type(typing.get_args(tp)[0]):
            return v
        raise InputError(f"{path}: expected {_expected(tp)}, got {str(v)[:40]!r}")
    if origin is list:
        if not isinstance(v, list):
            raise _fail(path, "a list", v)
        (item,) = typing.get_args(tp)
        return [_decode(x, item, f"{path}[{i}]") for i, x in enumerate(v)]
    if origin is dict:
        if not isinstance(v, dict):
            raise _fail(path, "an object", v)
        _, val = typing.get_args(tp)
        return {str(k): _decode(x, val, f"{path}.{k}") for k, x in v.items()}
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        if not isinstance(v, dict):
            raise _fail(path, "an object", v)
        hints = _hints(tp)
        unknown = [k for k in v if k not in hints]
        if unknown:
            raise InputError(f"{path}: unknown field {str(unknown[0])[:60]!r}")
        kwargs = {}
        for f in dataclasses.fields(tp):
            if f.name in v:
                kwargs[f.name] = _decode(v[f.name], hints[f.name], f"{path}.{f.name}" if path != "document" else f.name)
            elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise InputError(f"{path}: missing field {f.name!r}")
        return tp(**kwargs)
    if tp is type(None):
        if v is None:
            return None
        raise _fail(path, "null", v)
    if tp is bool:
        if isinstance(v, bool):
            return v
        raise _fail(path, "true or false", v)
    if tp is int:
        if isinstance(v, int) and not isinstance(v, bool):
            return v
        raise _fail(path, "an integer", v)
    if tp is float:
        if isinstance(v, (int, float)) and not isinstance(v, bool) and (not isinstance(v, float) or math.isfinite(v)):
            return v
        raise _fail(path, "a finite number", v)
    if tp is str:
        if isinstance(v, str):
            return v
        raise _fail(path, "a string", v)
    raise TypeError(f"document.py: no rule for the type {tp!r} at {path}")  # a bug in this module


def _container_of(tp: Any, v: object) -> bool:
    """``tp`` is an object type and ``v`` an object, or both are lists."""
    if isinstance(v, dict):
        return typing.get_origin(tp) is dict or (isinstance(tp, type) and dataclasses.is_dataclass(tp))
    return isinstance(v, list) and typing.get_origin(tp) is list


def _json_value(v: object, path: str) -> Json:
    v = _plain(v)
    if v is None or isinstance(v, (bool, int, str)):
        return v
    if isinstance(v, float):
        return v  # non-finite numbers are written as null by the sinks (safe_text.bounded_doc)
    if isinstance(v, (list, tuple)):
        return [_json_value(x, f"{path}[{i}]") for i, x in enumerate(v)]
    if isinstance(v, dict):
        return {str(k): _json_value(x, f"{path}.{k}") for k, x in v.items()}
    raise _fail(path, "a JSON value", v)


def _expected(tp: Any) -> str:
    if typing.get_origin(tp) is Literal:
        return " or ".join(repr(a) for a in typing.get_args(tp))
    if typing.get_origin(tp) is list:
        return "a list"
    if typing.get_origin(tp) is dict or (isinstance(tp, type) and dataclasses.is_dataclass(tp)):
        return "an object"
    return _NAMES.get(tp, str(tp))


# --------------------------------------------------------------------------- schema


def json_schema() -> dict[str, Any]:
    """The JSON schema (draft 2020-12) of :class:`Summary`, generated from its type hints."""
    return document_schema(
        Summary,
        "urn:snapviz:schema:summary-1",
        SUMMARY_SCHEMA,
        "The document `snapviz analyze --json` writes (generated from snapviz/analyses/document.py).",
    )


def document_schema(cls: type, ident: str, title: str, description: str) -> dict[str, Any]:
    """The JSON schema (draft 2020-12) of the document type ``cls`` (any frozen dataclass whose
    fields use the types of this module), generated from its type hints: ``ident`` is its
    ``$id`` (an identifier, never fetched), ``title`` its schema string. The parts it is made
    of are ``$defs``, by class name."""
    defs: dict[str, Any] = {}
    root = _object_schema(cls, defs)
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": ident,
        "title": title,
        "description": description,
        **root,
        "$defs": dict(sorted(defs.items())),
    }


def _schema(tp: Any, defs: dict[str, Any]) -> dict[str, Any]:
    if _is_json(tp):
        return {}
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        options = [_schema(a, defs) for a in typing.get_args(tp) if a is not Absent]
        return options[0] if len(options) == 1 else {"anyOf": options}
    if origin is Literal:
        vals = list(typing.get_args(tp))
        return {"const": vals[0]} if len(vals) == 1 else {"enum": vals}
    if origin is list:
        return {"type": "array", "items": _schema(typing.get_args(tp)[0], defs)}
    if origin is dict:
        return {"type": "object", "additionalProperties": _schema(typing.get_args(tp)[1], defs)}
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        if tp.__name__ not in defs:
            defs[tp.__name__] = {}  # placeholder: a type met again while being built
            defs[tp.__name__] = _object_schema(tp, defs)
        return {"$ref": f"#/$defs/{tp.__name__}"}
    simple = {int: "integer", float: "number", str: "string", bool: "boolean", type(None): "null"}
    if tp in simple:
        return {"type": simple[tp]}
    raise TypeError(f"document.py: no schema for the type {tp!r}")


def _object_schema(tp: type, defs: dict[str, Any]) -> dict[str, Any]:
    hints = _hints(tp)
    props = {f.name: _schema(hints[f.name], defs) for f in dataclasses.fields(tp)}
    required = [
        f.name
        for f in dataclasses.fields(tp)
        if Absent not in typing.get_args(hints[f.name])
        and f.default is dataclasses.MISSING
        and f.default_factory is dataclasses.MISSING
    ]
    out: dict[str, Any] = {"type": "object"}
    if tp.__doc__:
        out["description"] = " ".join(tp.__doc__.split())
    out.update({"properties": props, "required": required, "additionalProperties": False})
    return out


def schema_text(schema: dict[str, Any] | None = None) -> str:
    """``docs/summary.schema.json`` as it must read (regenerate: ``python -m snapviz.analyses.document``),
    or the file of another document's ``schema`` (:func:`document_schema`)."""
    import json

    return json.dumps(json_schema() if schema is None else schema, indent=2) + "\n"


if __name__ == "__main__":  # writes docs/summary.schema.json's text to stdout
    import sys

    sys.stdout.write(schema_text())
