"""The event contract: the envelope, every payload type, the JSON codec, upcasting and JSON Schema.

Events are frozen and named in the past tense. Each payload class declares its wire `TYPE`
and current `VERSION`; older versions on the wire are upcast on read so processors only ever
see the current shape. Validation is table-driven (one spec per payload class, computed once)
because decoding sits on the hot path of every runner.
"""
from __future__ import annotations

import dataclasses
import math
import re
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Literal, Union

import orjson

from schemas.errors import EventValidationError

ENVELOPE_FIELDS = ("id", "type", "v", "ts", "source", "seq", "data")

StopReason = Literal["completed", "evicted", "preempted", "removed", "held", "vacated"]
MatchReason = Literal["NoPreemption", "Rank", "Priority"]
AdminOp = Literal[
    "setfactor", "setprio", "setaccum", "setbegin", "setlast", "resetusage", "resetall",
    "delete", "setceil", "setfloor", "cancelceillease", "cancelfloorlease", "cancelfactorlease",
]
ADMIN_OPS: tuple[str, ...] = typing.get_args(AdminOp)
STOP_REASONS: tuple[str, ...] = typing.get_args(StopReason)
MATCH_REASONS: tuple[str, ...] = typing.get_args(MatchReason)


class Payload:
    """Base of every payload: a frozen dataclass with a wire type name and a version."""

    TYPE: ClassVar[str]
    VERSION: ClassVar[int] = 1


@dataclass(frozen=True, slots=True)
class AdUpdated(Payload):
    """A daemon published its ClassAd (collector update)."""

    TYPE: ClassVar[str] = "ad.updated"
    ad_type: str
    name: str
    ad: dict[str, Any]


@dataclass(frozen=True, slots=True)
class AdInvalidated(Payload):
    """A daemon (or the collector) withdrew an ad."""

    TYPE: ClassVar[str] = "ad.invalidated"
    ad_type: str
    name: str


@dataclass(frozen=True, slots=True)
class JobSubmitted(Payload):
    """A job entered a schedd's queue."""

    TYPE: ClassVar[str] = "job.submitted"
    job_id: str
    schedd: str
    submitter: str
    ad: dict[str, Any]


@dataclass(frozen=True, slots=True)
class JobStarted(Payload):
    """A claim was activated: the job runs on `slot` with that slot's SlotWeight."""

    TYPE: ClassVar[str] = "job.started"
    job_id: str
    schedd: str
    submitter: str
    slot: str
    slot_weight: float
    resources: dict[str, Any] = field(default_factory=dict)
    concurrency_limits: str = ""


@dataclass(frozen=True, slots=True)
class JobStopped(Payload):
    """A job left its slot. v2 added `schedd` and `submitter` so stops route by submitter."""

    TYPE: ClassVar[str] = "job.stopped"
    VERSION: ClassVar[int] = 2
    job_id: str
    slot: str
    reason: StopReason
    schedd: str = ""
    submitter: str = ""


@dataclass(frozen=True, slots=True)
class JobHistory(Payload):
    """The final job ClassAd, as written to the history file when the job leaves the queue."""

    TYPE: ClassVar[str] = "job.history"
    ad: dict[str, Any]


@dataclass(frozen=True, slots=True)
class NegotiationCycled(Payload):
    """A negotiation cycle ran at `now`; carries the positions it read and its statistics."""

    TYPE: ClassVar[str] = "negotiation.cycle"
    negotiator: str
    cycle: int
    now: float
    positions: dict[str, Any] = field(default_factory=dict)
    submitters: dict[str, Any] = field(default_factory=dict)
    duration: float = 0.0
    matches: int = 0
    rejections: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Matched(Payload):
    """The negotiator matched a job to a slot, possibly preempting its current claim."""

    TYPE: ClassVar[str] = "match"
    negotiator: str
    cycle: int
    job_id: str
    schedd: str
    submitter: str
    group: str
    slot: str
    reason: MatchReason
    preempts: str | None = None


@dataclass(frozen=True, slots=True)
class AdminCommanded(Payload):
    """An administrator edited the accountant (condor_userprio); who, why and for how long."""

    TYPE: ClassVar[str] = "admin.command"
    op: AdminOp
    target: str
    value: float | str | None = None
    by: str = ""
    reason: str = ""
    duration: float | None = None


@dataclass(frozen=True, slots=True)
class ConfigChanged(Payload):
    """A knob was changed; it overrides the config files from this event's time on."""

    TYPE: ClassVar[str] = "config.changed"
    knob: str
    value: str
    by: str = ""


@dataclass(frozen=True, slots=True)
class PriorityChanged(Payload):
    """Derived: a submitter's or group's priority record changed because of event `cause`:
    its priority, factor, usage, floor or ceiling (old values where they existed)."""

    TYPE: ClassVar[str] = "priority.changed"
    name: str
    priority: float
    factor: float
    effective_priority: float
    cause: str
    old_priority: float | None = None
    old_factor: float | None = None
    resources_used: float = 0.0
    weighted_resources_used: float = 0.0
    floor: float = 0.0
    ceiling: float = -1.0
    old_floor: float | None = None
    old_ceiling: float | None = None


@dataclass(frozen=True, slots=True)
class QuotaComputed(Payload):
    """Derived: a group's quotas were recomputed because of event `cause`."""

    TYPE: ClassVar[str] = "quota.computed"
    group: str
    config_quota: float
    effective_quota: float
    subtree_quota: float
    cause: str


@dataclass(frozen=True, slots=True)
class LimitChanged(Payload):
    """Derived: a concurrency limit's usage or maximum changed because of event `cause`."""

    TYPE: ClassVar[str] = "limit.changed"
    limit: str
    max: float
    in_use: float
    cause: str


PAYLOAD_TYPES: tuple[type[Payload], ...] = (
    AdUpdated, AdInvalidated, JobSubmitted, JobStarted, JobStopped, JobHistory,
    NegotiationCycled, Matched, AdminCommanded, ConfigChanged,
    PriorityChanged, QuotaComputed, LimitChanged,
)
BY_TYPE: dict[str, type[Payload]] = {cls.TYPE: cls for cls in PAYLOAD_TYPES}
DERIVED_TYPES = frozenset({"priority.changed", "quota.computed", "limit.changed"})


@dataclass(frozen=True, slots=True)
class Envelope:
    """One event on the log: identity, type, version, event time, origin and payload."""

    id: str
    type: str
    v: int
    ts: float
    source: str
    seq: int
    data: Any  # a Payload instance

    def to_dict(self) -> dict[str, Any]:
        """The wire form as plain JSON-ready data."""
        return {"id": self.id, "type": self.type, "v": self.v, "ts": self.ts,
                "source": self.source, "seq": self.seq, "data": payload_to_dict(self.data)}


def make_event(payload: Payload, *, ts: float, source: str, seq: int,
               id: str | None = None) -> Envelope:
    """An envelope for `payload`; the id defaults to `<source>:<seq>` as DESIGN.md names it."""
    return Envelope(id=id if id is not None else f"{source}:{seq}", type=payload.TYPE,
                    v=payload.VERSION, ts=float(ts), source=source, seq=seq, data=payload)


# --- upcasting ---------------------------------------------------------------------------

Upcaster = Callable[[dict[str, Any]], dict[str, Any]]
# (type, from_version) -> function turning a from_version payload into from_version + 1.
UPCASTERS: dict[tuple[str, int], Upcaster] = {
    ("job.stopped", 1): lambda d: {**d, "schedd": d.get("schedd", ""),
                                   "submitter": d.get("submitter", "")},
}


def upcast(type_: str, version: int, data: dict[str, Any], event_id: str | None = None) -> dict[str, Any]:
    """Migrate `data` from `version` to the current version of `type_`."""
    current = BY_TYPE[type_].VERSION
    if version > current:
        raise EventValidationError(f"version {version} is newer than this reader's {current}",
                                   event_id=event_id, event_type=type_, field="v")
    while version < current:
        step = UPCASTERS.get((type_, version))
        if step is None:
            raise EventValidationError(f"no upcaster from version {version}",
                                       event_id=event_id, event_type=type_, field="v")
        data = step(data)
        version += 1
    return data


# --- table-driven validation --------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class _FieldSpec:
    name: str
    accepts: tuple[type, ...]
    required: bool
    choices: tuple[str, ...] | None
    is_float: bool


def _accepts(tp: Any) -> tuple[tuple[type, ...], tuple[str, ...] | None, bool]:
    """The runtime types a JSON value may have for annotation `tp`, its choices, float-ness."""
    origin = typing.get_origin(tp)
    if origin is Literal:
        return (str,), tuple(typing.get_args(tp)), False
    if origin in (Union, types.UnionType):
        accepts: list[type] = []
        is_float = False
        for arg in typing.get_args(tp):
            sub, _, f = _accepts(arg)
            accepts.extend(sub)
            is_float = is_float or f
        return tuple(accepts), None, is_float
    if origin is dict or tp is dict:
        return (dict,), None, False
    if tp is type(None):
        return (type(None),), None, False
    if tp is float:
        return (float, int), None, True
    if tp is int:
        return (int,), None, False
    if tp is str:
        return (str,), None, False
    if tp is Any:
        return (object,), None, False
    raise TypeError(f"unsupported payload annotation {tp!r}")


def _specs(cls: type[Payload]) -> tuple[_FieldSpec, ...]:
    hints = typing.get_type_hints(cls)
    specs = []
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        accepts, choices, is_float = _accepts(hints[f.name])
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        specs.append(_FieldSpec(f.name, accepts, required, choices, is_float))
    return tuple(specs)


SPECS: dict[str, tuple[_FieldSpec, ...]] = {cls.TYPE: _specs(cls) for cls in PAYLOAD_TYPES}


# --- bounds: numbers finite and within what HTCondor (or arithmetic) can use ---------------
#
# JSON cannot carry NaN or Infinity (orjson refuses them), but a finite 1e308 overflows the
# first product it enters, and strings ("big:1e999") parse to infinity. Every number an event
# brings in is checked here, once, at validation; the folds may then trust them.

#: event times: from the epoch to the last second `datetime` (hence every output) can show
TS_MIN, TS_MAX = 0.0, 253402300799.0
#: SlotWeight, resource quantities and other magnitudes: far beyond any real pool, far below
#: where sums, decays and products overflow
MAX_QUANTITY = 1e15
#: a concurrency limit's increment (HTCondor: `name:inc`; the maxima are knobs)
MAX_LIMIT_INCREMENT = 1e9
_INCREMENT = re.compile(r"\s*[-+]?(\d+\.?\d*([eE][-+]?\d+)?|\.\d+([eE][-+]?\d+)?|inf(inity)?|nan)",
                        re.IGNORECASE)
def _out_of_range(value: float, low: float, high: float) -> str | None:
    if not math.isfinite(value):
        return f"{value!r} is not a finite number"
    if not low <= value <= high:
        return f"{value!r} is outside [{low:g}, {high:g}]"
    return None


def _quantity(value: Any) -> float | None:
    """A JSON number as a float (None for anything else: bools, strings, objects)."""
    t = type(value)
    return float(value) if t is float or t is int else None


def _check_started(p: Any) -> tuple[str, str] | None:
    found = _out_of_range(p.slot_weight, 0.0, MAX_QUANTITY)
    if found:
        return "slot_weight", found
    for name, value in p.resources.items():
        q = _quantity(value)
        if q is not None and (found := _out_of_range(q, 0.0, MAX_QUANTITY)):
            return f"resources.{name}", found
    for token in re.split(r"[\s,]+", p.concurrency_limits):
        head, colon, inc = token.partition(":")
        m = _INCREMENT.match(inc) if colon else None
        if m is not None:
            found = _out_of_range(float(m.group(0)), -MAX_LIMIT_INCREMENT,
                                  MAX_LIMIT_INCREMENT)
            if found:
                return "concurrency_limits", f"{token!r}: the increment {found}"
    return None


def _check_cycle(p: Any) -> tuple[str, str] | None:
    found = _out_of_range(p.now, TS_MIN, TS_MAX)
    if found:
        return "now", found
    found = _out_of_range(p.duration, 0.0, MAX_QUANTITY)
    return ("duration", found) if found else None


def _check_admin(p: Any) -> tuple[str, str] | None:
    if p.duration is not None and (found := _out_of_range(p.duration, 0.0, MAX_QUANTITY)):
        return "duration", found
    value = p.value
    if type(value) is str:
        try:
            value = float(value)
        except ValueError:
            return None  # not a number at all: the accountant names that (AdminCommandError)
    if value is None:
        return None
    # finite and of a sane magnitude here; each op's own lower bound (setfactor >= 1,
    # setaccum >= 0, ...) is the accountant's (validate_admin), which rejects the event with
    # condor_userprio's message
    if p.op in ("setbegin", "setlast"):
        found = _out_of_range(value, TS_MIN, TS_MAX)
    else:
        found = _out_of_range(value, -MAX_QUANTITY, MAX_QUANTITY)
    return ("value", f"-{p.op}: {found}") if found else None


def _check_floats(cls: type[Payload]) -> Callable[[Any], tuple[str, str] | None]:
    """Every float field of `cls` finite (derived events: their values come from the folds)."""
    names = tuple(spec.name for spec in SPECS[cls.TYPE] if spec.is_float)

    def check(p: Any) -> tuple[str, str] | None:
        for name in names:
            value = getattr(p, name)
            if type(value) is float and not math.isfinite(value):
                return name, f"{value!r} is not a finite number"
        return None
    return check


#: per event type, the check of its numbers: (field, reason) of the first out of bounds
BOUNDS: dict[str, Callable[[Any], tuple[str, str] | None]] = {
    JobStarted.TYPE: _check_started, NegotiationCycled.TYPE: _check_cycle,
    AdminCommanded.TYPE: _check_admin,
    **{cls.TYPE: _check_floats(cls) for cls in (PriorityChanged, QuotaComputed, LimitChanged)},
}


# --- hot path: generated constructors and validators ---------------------------------------
#
# A frozen dataclass's __init__ sets each field through object.__setattr__; setting the slots
# through their member descriptors does the same, in half the time. Each payload type also
# gets a straight-line validator for the common case (exact JSON types, current version):
# it either builds the payload exactly as `payload_from_dict` would, or returns None and the
# table-driven path runs, so every error (and its message) still comes from one place.

_NO_DEFAULT = object()


def _fast_init(cls: type) -> None:
    fields = dataclasses.fields(cls)
    ns: dict[str, Any] = {"_new_default": _NO_DEFAULT}
    params, body = [], []
    for f in fields:
        ns[f"_set_{f.name}"] = getattr(cls, f.name).__set__
        if f.default is not dataclasses.MISSING:
            ns[f"_default_{f.name}"] = f.default
            params.append(f"{f.name}=_default_{f.name}")
        elif f.default_factory is not dataclasses.MISSING:
            ns[f"_factory_{f.name}"] = f.default_factory
            params.append(f"{f.name}=_new_default")
            body.append(f"    if {f.name} is _new_default: {f.name} = _factory_{f.name}()")
        else:
            params.append(f.name)
        body.append(f"    _set_{f.name}(self, {f.name})")
    src = f"def __init__(self, {', '.join(params)}):\n" + "\n".join(body or ["    pass"]) + "\n"
    exec(src, ns)  # noqa: S102 - generated from the dataclass's own field list
    init = ns["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    cls.__init__ = init  # type: ignore[misc]


_BUILDERS: dict[type, Callable[..., Any]] = {}
_TWINS: dict[type, type] = {}  # the twin class each builder stores fields into


def builder(cls: type) -> Callable[..., Any]:
    """A constructor of `cls` (a frozen slots dataclass here) taking every field positionally.

    Same instance as `cls(*fields)`, built faster: the fields are stored into an instance of a
    twin class with the same slots (plain attribute stores, no frozen `__setattr__`), whose
    class is then set to `cls` (allowed: the layouts are identical). For hot paths that already
    hold every value (decoding, derived events); no defaults, no checks.
    """
    found = _BUILDERS.get(cls)
    if found is not None:
        return found
    slots = tuple(f.name for f in dataclasses.fields(cls))
    assert tuple(cls.__dict__["__slots__"]) == slots, cls
    twin = type(f"_{cls.__name__}Builder", cls.__bases__, {"__slots__": slots})
    _TWINS[cls] = twin
    ns: dict[str, Any] = {"_new": object.__new__, "_twin": twin, "_cls": cls}
    body = "\n".join(f"    self.{name} = {name}" for name in slots)
    exec(f"def build({', '.join(slots)}):\n    self = _new(_twin)\n{body}\n"  # noqa: S102
         f"    self.__class__ = _cls\n    return self\n", ns)
    fn: Callable[..., Any] = ns["build"]
    fn.__qualname__ = f"build_{cls.__name__}"
    _BUILDERS[cls] = fn
    return fn


def _check_code(spec: _FieldSpec, var: str) -> list[str]:
    """Lines that accept `var` when the table-driven check surely would (else return None)."""
    acc = set(spec.accepts)
    if object in acc:
        return []
    if spec.choices is not None:
        return [f"    if type({var}) is not str or {var} not in _choices_{spec.name}: return None"]
    ok = []
    for t, name in ((str, "str"), (dict, "dict"), (float, "float")):
        if t in acc:
            ok.append(f"type({var}) is {name}")
    if type(None) in acc:
        ok.append(f"{var} is None")
    lines = []
    if int in acc and spec.is_float:
        lines.append(f"    if type({var}) is int: {var} = float({var})")
    elif int in acc:
        ok.append(f"type({var}) is int")
    lines.append(f"    if not ({' or '.join(ok) or 'False'}): return None")
    return lines


def _validator_lines(cls: type[Payload], ns: dict[str, Any]) -> list[str]:
    """Lines (one indent) that check a payload dict `data` of `cls` the way the table-driven
    check surely would accept it, leaving each field in `v_<name>` (else `return None`);
    the names they use are put in `ns`."""
    specs = SPECS[cls.TYPE]
    defaults = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    lines = []
    # the required fields are read in one try block (a missing one: None, as the check would)
    required = [spec for spec in specs if spec.required]
    if required:
        lines.append("    try:")
        lines.extend(f"        v_{spec.name} = data[{spec.name!r}]" for spec in required)
        lines.append("    except KeyError:")
        lines.append("        return None")
    for spec in specs:
        var = f"v_{spec.name}"
        if spec.choices is not None:
            ns[f"_choices_{spec.name}"] = frozenset(spec.choices)
        if spec.required:
            lines.extend(_check_code(spec, var))
        else:
            f = defaults[spec.name]
            if f.default is not dataclasses.MISSING:
                ns[f"_default_{spec.name}"] = f.default
                missing = f"_default_{spec.name}"
            else:
                ns[f"_factory_{spec.name}"] = f.default_factory
                missing = f"_factory_{spec.name}()"
            lines.append(f"    if {spec.name!r} in data:")
            lines.append(f"        {var} = data[{spec.name!r}]")
            lines.extend("    " + line for line in _check_code(spec, var))
            lines.append("    else:")
            lines.append(f"        {var} = {missing}")
    return lines


def _fast_decoder(cls: type[Payload]) -> Callable[[dict[str, Any], str], Envelope | None]:
    """`decode_dict`'s fast path for one payload type fused into one function: the envelope
    fields checked, the payload validated (`_validator_lines`), both instances built
    (`builder`'s stores, inlined). None whenever that path would not answer."""
    builder(cls)
    builder(Envelope)
    ns: dict[str, Any] = {"_new": object.__new__, "_ptwin": _TWINS[cls], "_pcls": cls,
                          "_etwin": _TWINS[Envelope], "_ecls": Envelope, "_version": cls.VERSION,
                          "_ts_min": TS_MIN, "_ts_max": TS_MAX, "_bounds": BOUNDS.get(cls.TYPE)}
    lines = ["def decode_fast(obj, type_):",
             "    try:",
             "        event_id, v, ts = obj['id'], obj['v'], obj['ts']",
             "        source, seq, data = obj['source'], obj['seq'], obj['data']",
             "    except KeyError:",
             "        return None",
             "    if not (type(event_id) is str and event_id and type(v) is int and v == _version",
             "            and (type(ts) is float or type(ts) is int) and type(source) is str",
             "            and type(seq) is int and type(data) is dict):",
             "        return None",
             "    if not _ts_min <= ts <= _ts_max: return None",
             *_validator_lines(cls, ns),
             "    p = _new(_ptwin)",
             *(f"    p.{s.name} = v_{s.name}" for s in SPECS[cls.TYPE]),
             "    p.__class__ = _pcls",
             *(["    if _bounds(p) is not None: return None"] if cls.TYPE in BOUNDS else []),
             "    e = _new(_etwin)",
             "    e.id = event_id", "    e.type = type_", "    e.v = v", "    e.ts = float(ts)",
             "    e.source = source", "    e.seq = seq", "    e.data = p",
             "    e.__class__ = _ecls",
             "    return e"]
    exec("\n".join(lines) + "\n", ns)  # noqa: S102 - generated from the payload's field specs
    fn: Callable[[dict[str, Any], str], Envelope | None] = ns["decode_fast"]
    return fn


for _cls in (*PAYLOAD_TYPES, Envelope):
    _fast_init(_cls)
_FAST: dict[str, Callable[[dict[str, Any], str], Envelope | None]] = {
    cls.TYPE: _fast_decoder(cls) for cls in PAYLOAD_TYPES}


def payload_from_dict(type_: str, data: Any, event_id: str | None = None) -> Payload:
    """Validate `data` against the current version of `type_` and build the payload."""
    cls = BY_TYPE.get(type_)
    if cls is None:
        raise EventValidationError("unknown event type", event_id=event_id, event_type=type_,
                                   field="type")
    if not isinstance(data, dict):
        raise EventValidationError("payload must be a JSON object", event_id=event_id,
                                   event_type=type_, field="data")
    kwargs: dict[str, Any] = {}
    for spec in SPECS[type_]:
        if spec.name not in data:
            if spec.required:
                raise EventValidationError("required field is missing", event_id=event_id,
                                           event_type=type_, field=f"data.{spec.name}")
            continue
        value = data[spec.name]
        if not isinstance(value, spec.accepts) or (isinstance(value, bool) and bool not in spec.accepts
                                                   and object not in spec.accepts):
            names = "/".join(sorted({t.__name__ for t in spec.accepts}))
            raise EventValidationError(f"expected {names}, got {type(value).__name__} {value!r:.60}",
                                       event_id=event_id, event_type=type_, field=f"data.{spec.name}")
        if spec.choices is not None and value not in spec.choices:
            raise EventValidationError(f"{value!r} is not one of {', '.join(spec.choices)}",
                                       event_id=event_id, event_type=type_, field=f"data.{spec.name}")
        if spec.is_float and type(value) is int:
            value = float(value)
        kwargs[spec.name] = value
    return cls(**kwargs)


def payload_to_dict(payload: Payload) -> dict[str, Any]:
    """The payload's fields as a JSON-ready dict."""
    return {spec.name: getattr(payload, spec.name) for spec in SPECS[payload.TYPE]}


# --- codec -------------------------------------------------------------------------------

def encode(env: Envelope) -> bytes:
    """The envelope as compact JSON bytes (the wire and `.jsonl` form)."""
    return orjson.dumps(env.to_dict())


def decode_dict(obj: Any) -> Envelope:
    """Validate an already-parsed envelope object and upcast its payload."""
    if type(obj) is dict and len(obj) >= 7:
        # the common case, checked straight through (`_fast_decoder`); any doubt takes the
        # full path below
        type_ = obj.get("type")
        if type(type_) is str:
            fast = _FAST.get(type_)
            if fast is not None:
                env = fast(obj, type_)
                if env is not None:
                    return env
    return _decode_dict_checked(obj)


def _decode_dict_checked(obj: Any) -> Envelope:
    if not isinstance(obj, dict):
        raise EventValidationError("an event must be a JSON object")
    event_id = obj.get("id")
    type_ = obj.get("type")
    eid = event_id if isinstance(event_id, str) else None
    etype = type_ if isinstance(type_, str) else None
    for name in ENVELOPE_FIELDS:
        if name not in obj:
            raise EventValidationError("required envelope field is missing", event_id=eid,
                                       event_type=etype, field=name)
    if not isinstance(event_id, str) or not event_id:
        raise EventValidationError("must be a non-empty string", event_type=etype, field="id")
    if not isinstance(type_, str) or type_ not in BY_TYPE:
        raise EventValidationError("unknown event type", event_id=eid, event_type=etype, field="type")
    v, ts, source, seq = obj["v"], obj["ts"], obj["source"], obj["seq"]
    if type(v) is not int or v < 1:
        raise EventValidationError("must be a positive integer", event_id=eid, event_type=etype, field="v")
    if type(ts) not in (int, float):
        raise EventValidationError("must be a number of seconds", event_id=eid, event_type=etype, field="ts")
    found = _out_of_range(float(ts), TS_MIN, TS_MAX)
    if found:
        raise EventValidationError(f"event time {found}", event_id=eid, event_type=etype, field="ts")
    if not isinstance(source, str):
        raise EventValidationError("must be a string", event_id=eid, event_type=etype, field="source")
    if type(seq) is not int:
        raise EventValidationError("must be an integer", event_id=eid, event_type=etype, field="seq")
    data = obj["data"]
    if v != BY_TYPE[type_].VERSION:
        if not isinstance(data, dict):
            raise EventValidationError("payload must be a JSON object", event_id=eid,
                                       event_type=etype, field="data")
        data = upcast(type_, v, data, eid)
    payload = payload_from_dict(type_, data, eid)
    check = BOUNDS.get(type_)
    bad = None if check is None else check(payload)
    if bad is not None:
        raise EventValidationError(bad[1], event_id=eid, event_type=etype, field=f"data.{bad[0]}")
    return Envelope(event_id, type_, payload.VERSION, float(ts), source, seq, payload)


def decode(raw: bytes | str) -> Envelope:
    """Parse and validate one wire event; raises EventValidationError naming id, type and field."""
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise EventValidationError(f"not valid JSON: {exc}") from None
    return decode_dict(obj)


def partition_key(env: Envelope) -> str:
    """The key that keeps related events ordered on one partition (DESIGN.md: by submitter)."""
    d = env.data
    if isinstance(d, (JobStarted, JobSubmitted, Matched)):
        return d.submitter
    if isinstance(d, JobStopped):
        return d.submitter or d.job_id
    if isinstance(d, AdminCommanded):
        return d.target
    if isinstance(d, (AdUpdated, AdInvalidated)):
        return f"{d.ad_type}/{d.name}"
    if isinstance(d, NegotiationCycled):
        return d.negotiator
    if isinstance(d, PriorityChanged):
        return d.name
    if isinstance(d, QuotaComputed):
        return d.group
    if isinstance(d, LimitChanged):
        return d.limit
    if isinstance(d, ConfigChanged):
        return "config"
    return env.source


# --- JSON Schema -------------------------------------------------------------------------

def _json_type(spec: _FieldSpec) -> dict[str, Any]:
    names = {bool: "boolean", int: "integer", float: "number", str: "string", dict: "object",
             type(None): "null"}
    if object in spec.accepts:
        return {}
    kinds = sorted({names[t] for t in spec.accepts if not (t is int and spec.is_float)})
    schema: dict[str, Any] = {"type": kinds[0] if len(kinds) == 1 else kinds}
    if spec.choices:
        schema["enum"] = list(spec.choices)
    return schema


def json_schema(cls: type[Payload]) -> dict[str, Any]:
    """JSON Schema (draft 2020-12) of a whole envelope carrying a `cls` payload."""
    specs = SPECS[cls.TYPE]
    data = {
        "type": "object",
        "properties": {s.name: _json_type(s) for s in specs},
        "required": [s.name for s in specs if s.required],
    }
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": f"poolledger/{cls.TYPE}/v{cls.VERSION}",
        "title": cls.TYPE,
        "description": (cls.__doc__ or "").strip().splitlines()[0],
        "type": "object",
        "required": list(ENVELOPE_FIELDS),
        "properties": {
            "id": {"type": "string", "minLength": 1},
            "type": {"const": cls.TYPE},
            "v": {"type": "integer", "minimum": 1, "maximum": cls.VERSION},
            "ts": {"type": "number"},
            "source": {"type": "string"},
            "seq": {"type": "integer"},
            "data": data,
        },
    }
