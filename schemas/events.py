"""The event contract: the envelope, every payload type, the JSON codec, upcasting and JSON Schema.

Events are frozen msgspec Structs named in the past tense. Each payload class declares its wire
`TYPE` and current `VERSION`; older versions on the wire are upcast on read so processors only
ever see the current shape. One set of types drives decoding, validation and JSON Schema: the
types carry the bounds (`msgspec.Meta`), msgspec checks them in C while it parses, and a record
it refuses is re-read slowly only to name the event id, type and field in the error. Writing
stays on orjson: msgspec spells large floats `1e16` where orjson (and every log written so
far) has `1e+16`, and the log's bytes, hence its digests, must not change.
"""
from __future__ import annotations

import hashlib
import math
import re
import typing
from collections.abc import Mapping
from typing import TYPE_CHECKING, Annotated, Any, Callable, ClassVar, Final, Literal, Union

import msgspec
import orjson
from msgspec import Meta, Struct

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

# --- bounds: numbers finite and within what HTCondor (or arithmetic) can use ---------------
#
# JSON cannot carry NaN or Infinity (the decoders refuse `1e999`), but a finite 1e308
# overflows the first product it enters, and strings ("big:1e999") parse to infinity. Every
# number an event brings in is checked at decoding, once; the folds may then trust them.

#: event times: from the epoch to the last second `datetime` (hence every output) can show
TS_MIN, TS_MAX = 0.0, 253402300799.0
#: SlotWeight, resource quantities and other magnitudes: far beyond any real pool, far below
#: where sums, decays and products overflow
MAX_QUANTITY = 1e15
#: a concurrency limit's increment (HTCondor: `name:inc`; the maxima are knobs)
MAX_LIMIT_INCREMENT = 1e9
#: how deep JSON containers may nest inside an ad or other JSON-valued field (ClassAd lists of
#: nested ads need two levels); bounded because a type, not a walk, checks every value
JSON_DEPTH = 4

EventTime = Annotated[float, Meta(ge=TS_MIN, le=TS_MAX)]
Quantity = Annotated[float, Meta(ge=0.0, le=MAX_QUANTITY)]
#: an integer a ClassAd (64-bit) and orjson can carry back out
Int64 = Annotated[int, Meta(ge=-2**63, le=2**63 - 1)]
#: a float the folds derived: finite (JSON cannot say otherwise; `decode_dict` input can)
Finite = Annotated[float, Meta(ge=-1.7976931348623157e308, le=1.7976931348623157e308)]
NonEmptyStr = Annotated[str, Meta(min_length=1)]
#: what a terminal obeys rather than prints (C0 controls but the tab, C1 controls, DEL, the
#: bidirectional overrides and isolates): no text of an event that is printed may hold one.
#: Checked after decoding (`_text_problem`), not by a pattern msgspec would run on every
#: string: `str.isprintable` clears the common case in C.
_CONTROL = "\\x00-\\x08\\x0a-\\x1f\\x7f-\\x9f\\u202a-\\u202e\\u2066-\\u2069"
#: text printed as it is (ids, sources, daemon and slot names, reasons, knob values): a tab
#: may stay (a condor_config value may hold one; a terminal only moves to the next stop)
Printable = Annotated[str, Meta(max_length=1 << 20,
                                extra_json_schema={"pattern": f"^[^{_CONTROL}]*$"})]
#: a submitter or group name as HTCondor takes one (IsValidSubmitterName: no whitespace, as
#: the name keys the accountant's log) and no control character either
SubmitterName = Annotated[str, Meta(min_length=1, max_length=1024,
                                    extra_json_schema={"pattern": f"^[^\\s{_CONTROL}]+$"})]
#: the same, or empty (a v1 `job.stopped` named no submitter)
MaybeSubmitterName = Annotated[str, Meta(max_length=1024,
                                         extra_json_schema={"pattern": f"^[^\\s{_CONTROL}]*$"})]
#: negotiation cycle numbers: one a second for 68 years; a forged 2**63-1 would leave the next
#: cycle nothing to be numbered with
MAX_CYCLE = 2**31 - 1
CycleNumber = Annotated[int, Meta(ge=0, le=MAX_CYCLE)]
#: how far a cycle's `now` may lie from its envelope's time (writers set them equal): the
#: skew bound on `ts` then bounds `now` too, so a cycle cannot make the next one due in 9999
CYCLE_TIME_SLACK = 1.0


def _json_value(depth: int, integer: Any = Int64, number: Any = float) -> Any:
    """A JSON value whose containers nest at most `depth` deep, integers 64-bit."""
    if depth == 0:
        return Union[None, bool, integer, number, str]
    inner = _json_value(depth - 1)
    return Union[None, bool, integer, number, str, list[inner], dict[str, inner]]  # type: ignore[valid-type]


if TYPE_CHECKING:
    JsonObject = dict[str, Any]
    Resources = dict[str, Any]
else:
    JsonObject = dict[str, _json_value(JSON_DEPTH)]
    #: a job's resources: quantities within [0, MAX_QUANTITY], any other JSON value as is
    Resources = dict[str, _json_value(JSON_DEPTH, Annotated[int, Meta(ge=0, le=int(MAX_QUANTITY))],
                                      Quantity)]


class Payload(Struct, frozen=True, gc=False):
    """Base of every payload: a frozen Struct with a wire type name and a version.

    gc=False: an event holds only JSON data, never itself, so it cannot be part of a cycle and
    the collector need not track the millions a replay makes."""

    TYPE: ClassVar[str]
    VERSION: ClassVar[int] = 1


class AdUpdated(Payload, frozen=True):
    """A daemon published its ClassAd (collector update)."""

    TYPE: ClassVar[str] = "ad.updated"
    ad_type: Printable
    name: Printable
    ad: JsonObject


class AdInvalidated(Payload, frozen=True):
    """A daemon (or the collector) withdrew an ad."""

    TYPE: ClassVar[str] = "ad.invalidated"
    ad_type: Printable
    name: Printable


class AdRefresh(Struct, frozen=True, gc=False):
    """One ad's heartbeats that the collector endpoint did not log one by one: updates
    `first`..`last` of its update stream `source` (`received` of them arrived; the rest were
    lost), the latest heard at `heard`, and the attributes in which that latest ad differs
    from the ad as logged (only volatile ones, by construction)."""

    ad_type: str
    name: str
    source: str
    heard: EventTime
    first: Annotated[int, Meta(ge=1, le=2**63 - 1)]
    last: Annotated[int, Meta(ge=1, le=2**63 - 1)]
    received: Annotated[int, Meta(ge=1, le=2**63 - 1)]
    ad: JsonObject = {}


class AdsRefreshed(Payload, frozen=True):
    """The collector endpoint's keep-alive: ads still heard from whose updates changed only
    volatile attributes, written when the folds would otherwise expire them (see
    services.collector.backend). Each refresh moves its ad's expiry to `heard` plus its
    lifetime and counts its updates, so expiry and condor_updates_stats stay exact while the
    log does not grow with heartbeats."""

    TYPE: ClassVar[str] = "ad.refreshed"
    refreshes: list[AdRefresh]


class JobSubmitted(Payload, frozen=True):
    """A job entered a schedd's queue."""

    TYPE: ClassVar[str] = "job.submitted"
    job_id: Printable
    schedd: Printable
    submitter: SubmitterName
    ad: JsonObject


class JobStarted(Payload, frozen=True):
    """A claim was activated: the job runs on `slot` with that slot's SlotWeight."""

    TYPE: ClassVar[str] = "job.started"
    job_id: Printable
    schedd: Printable
    submitter: SubmitterName
    slot: Printable
    slot_weight: Quantity
    resources: Resources = {}
    concurrency_limits: Printable = ""


class JobStopped(Payload, frozen=True):
    """A job left its slot. v2 added `schedd` and `submitter` so stops route by submitter."""

    TYPE: ClassVar[str] = "job.stopped"
    VERSION: ClassVar[int] = 2
    job_id: Printable
    slot: Printable
    reason: StopReason
    schedd: Printable = ""
    submitter: MaybeSubmitterName = ""


class JobHistory(Payload, frozen=True):
    """The final job ClassAd, as written to the history file when the job leaves the queue."""

    TYPE: ClassVar[str] = "job.history"
    ad: JsonObject


class NegotiationCycled(Payload, frozen=True):
    """A negotiation cycle ran at `now`; carries the positions it read and its statistics."""

    TYPE: ClassVar[str] = "negotiation.cycle"
    negotiator: Printable
    cycle: CycleNumber
    now: EventTime
    positions: JsonObject = {}
    submitters: JsonObject = {}
    duration: Quantity = 0.0
    matches: Int64 = 0
    rejections: JsonObject = {}


class Matched(Payload, frozen=True):
    """The negotiator matched a job to a slot, possibly preempting its current claim."""

    TYPE: ClassVar[str] = "match"
    negotiator: Printable
    cycle: CycleNumber
    job_id: Printable
    schedd: Printable
    submitter: SubmitterName
    group: SubmitterName
    slot: Printable
    reason: MatchReason
    preempts: str | None = None


class AdminCommanded(Payload, frozen=True):
    """An administrator edited the accountant (condor_userprio); who, why and for how long.

    `by` is the identity that appended the event, as the appending process authenticated
    it. v2 added `claimed_by`: the `by` an imported event carried, kept as a claim only (an
    import is appended by, and authorized as, the importer)."""

    TYPE: ClassVar[str] = "admin.command"
    VERSION: ClassVar[int] = 2
    op: AdminOp
    target: SubmitterName
    value: float | str | None = None
    by: Printable = ""
    reason: Printable = ""
    duration: Quantity | None = None
    claimed_by: Printable = ""


class ConfigChanged(Payload, frozen=True):
    """A knob was changed; it overrides the config files from this event's time on.
    `by` and (v2) `claimed_by` as in AdminCommanded."""

    TYPE: ClassVar[str] = "config.changed"
    VERSION: ClassVar[int] = 2
    knob: Printable
    value: Printable
    by: Printable = ""
    claimed_by: Printable = ""


class PriorityChanged(Payload, frozen=True):
    """Derived: a submitter's or group's priority record changed because of event `cause`:
    its priority, factor, usage, floor or ceiling (old values where they existed)."""

    TYPE: ClassVar[str] = "priority.changed"
    name: SubmitterName
    priority: Finite
    factor: Finite
    effective_priority: Finite
    cause: Printable
    old_priority: Finite | None = None
    old_factor: Finite | None = None
    resources_used: Finite = 0.0
    weighted_resources_used: Finite = 0.0
    floor: Finite = 0.0
    ceiling: Finite = -1.0
    old_floor: Finite | None = None
    old_ceiling: Finite | None = None


class QuotaComputed(Payload, frozen=True):
    """Derived: a group's quotas were recomputed because of event `cause`.

    `effective_quota` is HTCondor's EffectiveQuota (the quota assigned to the group, before
    surplus); v2 added `allocated`, the surplus-adjusted allocation the group is negotiated
    with. A v1 event carried the allocation as `effective_quota` (upcast: both are it)."""

    TYPE: ClassVar[str] = "quota.computed"
    VERSION: ClassVar[int] = 2
    group: SubmitterName
    config_quota: Finite
    effective_quota: Finite
    subtree_quota: Finite
    cause: Printable
    allocated: Finite = 0.0


class LimitChanged(Payload, frozen=True):
    """Derived: a concurrency limit's usage or maximum changed because of event `cause`."""

    TYPE: ClassVar[str] = "limit.changed"
    limit: str
    max: Finite
    in_use: Finite
    cause: str


PAYLOAD_TYPES: tuple[type[Payload], ...] = (
    AdUpdated, AdInvalidated, AdsRefreshed, JobSubmitted, JobStarted, JobStopped, JobHistory,
    NegotiationCycled, Matched, AdminCommanded, ConfigChanged,
    PriorityChanged, QuotaComputed, LimitChanged,
)
BY_TYPE: dict[str, type[Payload]] = {cls.TYPE: cls for cls in PAYLOAD_TYPES}
DERIVED_TYPES = frozenset({"priority.changed", "quota.computed", "limit.changed"})
#: events that change priorities or knobs: only ADMINISTRATOR appends them, import included
AUTHORITY_TYPES = frozenset({AdminCommanded.TYPE, ConfigChanged.TYPE})


class Envelope(Struct, frozen=True, gc=False):
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
    return Envelope(id if id is not None else f"{source}:{seq}", payload.TYPE, payload.VERSION,
                    float(ts), source, seq, payload)


def reissued(env: Envelope, by: str) -> Envelope:
    """An imported AUTHORITY_TYPES event as appended by `by` (its importer): the `by` it
    carried becomes `claimed_by`, a claim kept for the record that authorizes nothing; an
    event whose `by` is the importer already is returned as it is (its bytes unchanged)."""
    if env.data.by == by:
        return env
    data = msgspec.structs.replace(env.data, by=by, claimed_by=env.data.by)
    return Envelope(env.id, env.type, data.VERSION, env.ts, env.source, env.seq, data)


def _wire(cls: type[Payload]) -> type[Struct]:
    """The envelope as it is read for one payload type: `type` is the tag that picks it, every
    field carries its bounds; `v` any version this reader can upcast."""
    return msgspec.defstruct(
        f"{cls.__name__}Event",
        [("id", NonEmptyStr),
         ("v", Annotated[int, Meta(ge=1, le=cls.VERSION)]), ("ts", EventTime),
         ("source", str), ("seq", Int64), ("data", cls)],
        tag_field="type", tag=cls.TYPE, frozen=True, gc=False, module=__name__)


WIRE: dict[str, type[Struct]] = {cls.TYPE: _wire(cls) for cls in PAYLOAD_TYPES}
_ANY_EVENT: Any = Union[tuple(WIRE.values())]
_DECODER: Final = msgspec.json.Decoder(_ANY_EVENT)
#: untyped, for naming what the typed decoder refused (1e999 read as inf, to be named)
_LOOSE: Final = msgspec.json.Decoder(float_hook=float)


# --- upcasting ---------------------------------------------------------------------------

Upcaster = Callable[[dict[str, Any]], dict[str, Any]]
# (type, from_version) -> function turning a from_version payload into from_version + 1.
UPCASTERS: dict[tuple[str, int], Upcaster] = {
    ("job.stopped", 1): lambda d: {**d, "schedd": d.get("schedd", ""),
                                   "submitter": d.get("submitter", "")},
    ("admin.command", 1): lambda d: {**d, "claimed_by": ""},
    ("config.changed", 1): lambda d: {**d, "claimed_by": ""},
    ("quota.computed", 1): lambda d: {**d, "allocated": d.get("effective_quota", 0.0)},
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


# --- bounds no type can state: they parse a string or depend on another field --------------

_INCREMENT = re.compile(r"\s*[-+]?(\d+\.?\d*([eE][-+]?\d+)?|\.\d+([eE][-+]?\d+)?|inf(inity)?|nan)",
                        re.IGNORECASE)
_LIMIT_TOKENS = re.compile(r"[\s,]+")


def _out_of_range(value: float, low: float, high: float) -> str | None:
    if not math.isfinite(value):
        return f"{value!r} is not a finite number"
    if not low <= value <= high:
        return f"{value!r} is outside [{low:g}, {high:g}]"
    return None


#: the resource attributes of a slot ad (and of a job's `resources`), lower-cased: HTCondor
#: keeps them non-negative and a pool's are far below MAX_QUANTITY; SlotWeight weighs the pie
RESOURCE_ATTRS: Final = frozenset(a.lower() for a in (
    "Cpus", "Memory", "Disk", "GPUs", "Swap", "VirtualMemory", "SlotWeight",
    "TotalCpus", "TotalMemory", "TotalDisk", "TotalGPUs", "TotalSlots", "TotalVirtualMemory",
    "TotalSlotCpus", "TotalSlotMemory", "TotalSlotDisk", "TotalSlotGPUs",
    "DetectedCpus", "DetectedMemory"))


def _resource_value(name: str, value: Any) -> str | None:
    """Why `value` cannot be resource attribute `name`'s (None: it can): a number in
    [0, MAX_QUANTITY], an expression (`/Expr(...)/`, evaluated where it is read) or undefined."""
    kind = type(value)
    if kind is int or kind is float:
        if not 0 <= value <= MAX_QUANTITY:  # NaN fails the comparison too
            return f"{name} = {value!r} is outside [0, {MAX_QUANTITY:g}]"
        return None
    if value is None or (kind is str and value.startswith("/Expr(") and value.endswith(")/")):
        return None
    return f"{name} = {value!r} is not a number"


#: per tuple of attribute names (as an ad spells them, in its order), those naming a
#: resource: the ads of a pool share a few such tuples, so an ad's names are not lower-cased
#: one by one. Bounded: at most _CACHE_MAX entries (cleared when full), each of at most
#: _CACHED_CHARS characters (a larger ad is checked without the cache)
_RESOURCE_NAMES: dict[tuple[str, ...], tuple[str, ...]] = {}
#: per concurrency-limits text, what `_check_limits` found (bounded likewise)
_LIMITS_CHECKED: dict[str, tuple[str, str] | None] = {}
_CACHE_MAX: Final = 256
_CACHED_CHARS: Final = 16384


def _check_resources(ad: Mapping[str, Any], what: str) -> tuple[str, str] | None:
    """The first resource attribute of `ad` out of its bounds: (field, reason)."""
    keys = tuple(ad)
    names = _RESOURCE_NAMES.get(keys)
    if names is None:
        names = tuple(k for k in keys if k.lower() in RESOURCE_ATTRS)
        if len(keys) <= _CACHED_CHARS and sum(map(len, keys)) <= _CACHED_CHARS:
            if len(_RESOURCE_NAMES) >= _CACHE_MAX:
                _RESOURCE_NAMES.clear()
            _RESOURCE_NAMES[keys] = names
    for name in names:
        value = ad[name]
        kind = type(value)
        if (kind is int or kind is float) and 0 <= value <= MAX_QUANTITY:
            continue  # the common case, without a call
        found = _resource_value(name, value)
        if found is not None:
            return f"{what}.{name}", found
    return None


def _check_ad(p: Any) -> tuple[str, str] | None:
    return _check_resources(p.ad, "ad")


def _check_started(p: Any) -> tuple[str, str] | None:
    if p.resources and (bad := _check_resources(p.resources, "resources")) is not None:
        return bad
    text = p.concurrency_limits
    if ":" not in text:  # no increments (the common case): nothing to parse
        return None
    if text in _LIMITS_CHECKED:  # a pool's jobs name a few limits texts: each parsed once
        return _LIMITS_CHECKED[text]
    found = _check_limits(text)
    if len(text) <= _CACHED_CHARS:
        if len(_LIMITS_CHECKED) >= _CACHE_MAX:
            _LIMITS_CHECKED.clear()
        _LIMITS_CHECKED[text] = found
    return found


def _check_limits(text: str) -> tuple[str, str] | None:
    """The first increment of concurrency limits `text` out of its bounds: (field, reason)."""
    for token in _LIMIT_TOKENS.split(text):
        head, colon, inc = token.partition(":")
        m = _INCREMENT.match(inc) if colon else None
        if m is not None:
            found = _out_of_range(float(m.group(0)), -MAX_LIMIT_INCREMENT,
                                  MAX_LIMIT_INCREMENT)
            if found:
                return "concurrency_limits", f"{token!r}: the increment {found}"
    return None


def _check_admin(p: Any) -> tuple[str, str] | None:
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


def _check_refreshed(p: Any) -> tuple[str, str] | None:
    for i, r in enumerate(p.refreshes):
        if not r.first <= r.last or r.received > r.last - r.first + 1:
            return (f"refreshes[{i}]", f"updates {r.first}..{r.last} cannot hold "
                                       f"{r.received} received")
    return None


#: per payload class, the check the types cannot make: (field, reason) of the first culprit
BOUNDS: dict[type, Callable[[Any], tuple[str, str] | None]] = {
    JobStarted: _check_started, AdminCommanded: _check_admin, AdUpdated: _check_ad,
    AdsRefreshed: _check_refreshed}


# --- codec -------------------------------------------------------------------------------

def payload_to_dict(payload: Payload) -> dict[str, Any]:
    """The payload's fields as a JSON-ready dict."""
    out = msgspec.structs.asdict(payload)
    if type(payload) is AdsRefreshed:  # the one payload that nests Structs
        out["refreshes"] = [msgspec.structs.asdict(r) for r in payload.refreshes]
    return out


def encode(env: Envelope) -> bytes:
    """The envelope as compact JSON bytes (the wire and `.jsonl` form)."""
    return orjson.dumps(env.to_dict())


def decode(raw: bytes | str) -> Envelope:
    """Parse and validate one wire event; raises EventValidationError naming id, type and field."""
    try:
        wire = _DECODER.decode(raw)
    except msgspec.MsgspecError as exc:
        try:
            obj = _LOOSE.decode(raw)
        except (msgspec.DecodeError, RecursionError) as bad:
            try:
                orjson.loads(raw)
            except orjson.JSONDecodeError as where:  # says line and column, msgspec does not
                raise EventValidationError(f"not valid JSON: {where}") from None
            raise EventValidationError(f"not valid JSON: {bad}") from None
        return _decode_refused(obj, exc)
    return _finish(wire, raw)


def decode_dict(obj: Any) -> Envelope:
    """Validate an already-parsed envelope object and upcast its payload."""
    try:
        wire = msgspec.convert(obj, _ANY_EVENT)
    except msgspec.ValidationError as exc:
        return _decode_refused(obj, exc)
    return _finish(wire, obj)


def _finish(wire: Any, source: Any) -> Envelope:
    """The envelope of a record the types accepted: upcast if old, the bounds no type states."""
    data = wire.data
    cls = data.__class__
    if wire.v != cls.VERSION:
        return _decode_older(source if isinstance(source, dict) else _LOOSE.decode(source), cls,
                             wire.v, wire.id)
    check = BOUNDS.get(cls)
    if check is not None and (bad := check(data)) is not None:
        raise EventValidationError(bad[1], event_id=wire.id, event_type=cls.TYPE,
                                   field=f"data.{bad[0]}")
    text = _text_problem(wire, data)
    if text is not None:
        raise EventValidationError(text[1], event_id=wire.id, event_type=cls.TYPE,
                                   field=text[0])
    if cls is NegotiationCycled and abs(data.now - wire.ts) > CYCLE_TIME_SLACK:
        raise EventValidationError(f"the cycle's time {data.now!r} is not its event time "
                                   f"{wire.ts!r}", event_id=wire.id, event_type=cls.TYPE,
                                   field="data.now")
    return Envelope(wire.id, cls.TYPE, wire.v, wire.ts, wire.source, wire.seq, data)


def _decode_older(obj: dict[str, Any], cls: type[Payload], v: int, eid: str | None) -> Envelope:
    """An event of an older version: its payload upcast, then decoded as the current one."""
    data = obj.get("data")
    if not isinstance(data, dict):
        raise EventValidationError("payload must be a JSON object", event_id=eid,
                                   event_type=cls.TYPE, field="data")
    return decode_dict({**obj, "v": cls.VERSION, "data": upcast(cls.TYPE, v, data, eid)})


def _decode_refused(obj: Any, exc: msgspec.MsgspecError) -> Envelope:
    """A record the types refused: upcast and decoded again if it is of an older version,
    else the error naming the event id, type and field."""
    if not isinstance(obj, dict):
        raise EventValidationError("an event must be a JSON object")
    event_id, type_, v = obj.get("id"), obj.get("type"), obj.get("v")
    eid = event_id if isinstance(event_id, str) and event_id else None
    etype = type_ if isinstance(type_, str) else None
    cls = BY_TYPE.get(etype) if etype is not None else None
    if cls is not None and type(v) is int and 1 <= v < cls.VERSION:
        return _decode_older(obj, cls, v, eid)
    # the envelope before its payload (msgspec names a missing field only at the object's end)
    for name in ENVELOPE_FIELDS:
        if name not in obj:
            raise EventValidationError("required envelope field is missing", event_id=eid,
                                       event_type=etype, field=name)
    if cls is None:
        raise EventValidationError("unknown event type", event_id=eid, event_type=etype,
                                   field="type")
    field, reason = _explain(str(exc), obj, WIRE[cls.TYPE])
    raise EventValidationError(reason, event_id=eid, event_type=etype, field=field)


def validated(env: Envelope) -> Envelope:
    """`env` as every reader will decode it: what a writer checks before appending, so it
    never appends an event every reader dead-letters. Raises EventValidationError (naming
    the event id, type and field) where a reader would refuse it."""
    return decode(encode(env))


_CANONICAL: Final = msgspec.msgpack.Encoder(order="deterministic")


def _canonical(env: Envelope) -> bytes:
    """The event's content (all but its id) as MessagePack with sorted dict keys: equal
    events, equal bytes (and cheaper than JSON: each snapshot takes it of the ledger's
    recent events)."""
    return _CANONICAL.encode((env.type, env.v, env.ts, env.source, env.seq, env.data))


def content_digest(env: Envelope) -> bytes:
    """What tells two events with one id apart: their content, canonically (sorted keys)."""
    return hashlib.blake2b(_canonical(env), digest_size=16).digest()


def content_checksum(env: Envelope) -> int:
    """`content_digest`'s short form, a 64-bit BLAKE2b (a CRC could be forged to match): what
    a snapshot keeps of the ledger's recent events and what a conflicting duplicate's
    dead-letter reason names, to tell a redelivery from another event reusing an id (`Dedup`)."""
    return int.from_bytes(hashlib.blake2b(_canonical(env), digest_size=8).digest(), "big")


def conflict(old: Envelope, new: Envelope) -> str:
    """Both versions of an event id that names two different events, in one line: the
    fields (and ad attributes) whose values differ, the log's value first."""
    a, b = old.to_dict(), new.to_dict()
    diffs = [f"{k} {a.get(k)!r} vs {b.get(k)!r}" for k in ENVELOPE_FIELDS[:-1] if a.get(k) != b.get(k)]
    da, db = a["data"], b["data"]
    for key in sorted(set(da) | set(db)):
        va, vb = da.get(key, _MISSING), db.get(key, _MISSING)
        if va == vb:
            continue
        if isinstance(va, dict) and isinstance(vb, dict):  # an ad: its attributes
            diffs += [f"{key}.{k} {_shown(va.get(k, _MISSING))} vs {_shown(vb.get(k, _MISSING))}"
                      for k in sorted(set(va) | set(vb)) if va.get(k, _MISSING) != vb.get(k, _MISSING)]
        else:
            diffs.append(f"{key} {_shown(va)} vs {_shown(vb)}")
    more = f" and {len(diffs) - 4} more" if len(diffs) > 4 else ""
    return (f"event {new.id} is already in the log as a different {old.type}: "
            f"{'; '.join(diffs[:4])}{more} (the log's version vs this one)")


def _shown(value: Any) -> str:
    if value is _MISSING:
        return "(absent)"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def payload_from_dict(type_: str, data: Any, event_id: str | None = None) -> Payload:
    """Validate `data` against the current version of `type_` and build the payload."""
    cls = BY_TYPE.get(type_)
    if cls is None:
        raise EventValidationError("unknown event type", event_id=event_id, event_type=type_,
                                   field="type")
    if not isinstance(data, dict):
        raise EventValidationError("payload must be a JSON object", event_id=event_id,
                                   event_type=type_, field="data")
    try:
        return msgspec.convert(data, cls)
    except msgspec.ValidationError as exc:
        field, reason = _explain(str(exc), data, cls, within="data")
        raise EventValidationError(reason, event_id=event_id, event_type=type_,
                                   field=field) from None


# --- naming what msgspec refused -----------------------------------------------------------
#
# msgspec says what it expected and where (`... - at `$.data.slot_weight``; dict values as
# `[...]`); the value, the bounds and the choices are looked up in the record and the types.

_STEP = re.compile(r"\.(\w+)|\[(\d+|\.\.\.)\]")
_ENVELOPE_REASONS = {"id": "must be a non-empty string", "v": "must be a positive integer",
                     "ts": "must be a number of seconds", "source": "must be a string",
                     "seq": "must be an integer", "data": "payload must be a JSON object"}
_MISSING = object()


def _members(tp: Any) -> list[Any]:
    """The alternatives of `tp` (itself if not a Union), Annotated kept on each."""
    base = typing.get_args(tp)[0] if typing.get_origin(tp) is Annotated else tp
    if typing.get_origin(base) is Union:
        return list(typing.get_args(base))
    return [tp]


def _strip(tp: Any) -> tuple[Any, Meta | None]:
    if typing.get_origin(tp) is Annotated:
        base, *metas = typing.get_args(tp)
        return base, next((m for m in metas if isinstance(m, Meta)), None)
    return tp, None


def _field_type(tp: Any, name: str) -> Any:
    for member in _members(tp):
        base, _ = _strip(member)
        if isinstance(base, type) and issubclass(base, Struct):
            for f in msgspec.structs.fields(base):
                if f.name == name:
                    return f.type
    return None


def _container(tp: Any, kind: type) -> Any:
    """The item (list) or value (dict) type of the `kind` alternative of `tp`."""
    for member in _members(tp):
        base, _ = _strip(member)
        if typing.get_origin(base) is kind:
            return typing.get_args(base)[-1]
    return None


def _fits(value: Any, tp: Any) -> bool:
    try:
        msgspec.convert(value, tp)
    except msgspec.ValidationError:
        return False
    return True


def _explain(message: str, obj: Any, root: Any, within: str = "") -> tuple[str | None, str]:
    """(field, reason) for msgspec's `message` about `obj`, read with type `root`; `within`
    names the field `obj` is (a payload: "data"), empty for a whole envelope."""
    what, _, where = message.partition(" - at `")
    path = where.rstrip("`") if where else "$"
    missing = re.fullmatch(r"Object missing required field `(\w+)`", what)
    if missing:
        path += f".{missing.group(1)}"
    value, tp, names = obj, root, [within] if within else []
    for name, index in _STEP.findall(path.removeprefix("$")):
        if name:
            names.append(name)
            tp = _field_type(tp, name)
            value = value.get(name, _MISSING) if isinstance(value, dict) else _MISSING
        elif index == "...":  # a dict value: find which key holds the culprit
            tp = _container(tp, dict)
            key = next((k for k, v in value.items() if not _fits(v, tp)), None) \
                if isinstance(value, dict) and tp is not None else None
            names.append(str(key) if key is not None else "[...]")
            value = value[key] if key is not None else _MISSING
        else:
            tp = _container(tp, list)
            names[-1:] = [f"{names[-1] if names else ''}[{index}]"]
            value = value[int(index)] if isinstance(value, list) and int(index) < len(value) \
                else _MISSING
    field = ".".join(names) or None
    envelope_field = not within and len(names) == 1 and names[0] in _ENVELOPE_REASONS
    if missing:
        return field, ("required envelope field is missing" if len(names) == 1 and not within
                       else "required field is missing")
    if field is None:
        return None, "an event must be a JSON object" if what.startswith("Expected `object`") \
            else what
    return field, _reason(what, value, tp, names[-1] if envelope_field else None)


def _reason(what: str, value: Any, tp: Any, envelope_field: str | None) -> str:
    """The reason for one refused value, as precise as the value and its type allow."""
    if type(value) is float and not math.isfinite(value):
        return f"{value!r} is not a finite number"
    if envelope_field == "v" and type(value) is int and value > 1:
        return f"version {value} is newer than this reader's {_strip(tp)[1].le}"  # type: ignore[union-attr]
    if envelope_field is not None and not (envelope_field == "ts" and type(value) in (int, float)):
        return _ENVELOPE_REASONS[envelope_field]
    if what.startswith("Invalid enum value"):
        choices = [c for m in _members(tp) for c in typing.get_args(_strip(m)[0])
                   if typing.get_origin(_strip(m)[0]) is Literal]
        return f"{value!r} is not one of {', '.join(map(str, choices))}"
    if what.startswith("Expected `bool | int | float | str | null`, got `"):
        return f"nested deeper than {JSON_DEPTH} levels"
    if type(value) in (int, float) and re.match(r"Expected `\w+` [<>]=", what):
        # the alternative that read the value: an int's own, else float's (which takes ints)
        members = sorted(_members(tp), key=lambda m: _strip(m)[0] is not type(value))
        for member in members:
            base, meta = _strip(member)
            if base in (type(value), float) and meta is not None:
                low, high = meta.ge, meta.le
                span = f"[{low:g}, {high:g}]" if base is float else f"[{low}, {high}]"
                where = "event time " if envelope_field == "ts" else ""
                return f"{where}{value!r} is outside {span}"
    if what.startswith("Expected `") and ", got `" in what and value is not _MISSING:
        expected = what.split("`")[1]
        return f"expected {expected}, got {type(value).__name__} {value!r:.60}"
    return what


_CONTROL_CHAR = re.compile(f"[{_CONTROL}]")
_NAME_TYPES = (SubmitterName, MaybeSubmitterName)


def _text_fields(cls: type[Payload]) -> tuple[tuple[str, bool], ...]:
    """(field, is a submitter or group name) of each printed text field of `cls`."""
    return tuple((f.name, f.type in _NAME_TYPES) for f in msgspec.structs.fields(cls)
                 if f.type == Printable or f.type in _NAME_TYPES)


#: per payload class, its printed text fields (see `_text_problem`)
TEXT_FIELDS: dict[type, tuple[tuple[str, bool], ...]] = {
    cls: _text_fields(cls) for cls in PAYLOAD_TYPES}


def _text_problem(wire: Any, data: Payload) -> tuple[str, str] | None:
    """(field, reason) of the first printed text of the event holding what a terminal would
    obey, or a submitter or group name holding whitespace; None for the usual event."""
    if wire.id.isprintable() and wire.source.isprintable():
        for field, name in TEXT_FIELDS[data.__class__]:
            value = getattr(data, field)
            if not value.isprintable() or name and " " in value:
                break
        else:
            return None  # the common case, in a few C calls
    for field, value, name in (("id", wire.id, False), ("source", wire.source, False),
                               *((f"data.{f}", getattr(data, f), n)
                                 for f, n in TEXT_FIELDS[data.__class__])):
        if _CONTROL_CHAR.search(value) or (name and re.search(r"\s", value)):
            return field, _text_reason(value)
    return None


def _text_reason(value: str) -> str:
    """Why a name or text was refused: the first character a terminal would obey, or the
    whitespace HTCondor refuses in a submitter or group name."""
    bad = _CONTROL_CHAR.search(value)
    if bad is not None:
        return (f"holds the control character {bad.group(0)!r} at {bad.start()}: a terminal "
                "would obey it")
    space = re.search(r"\s", value)
    if space is not None:
        return (f"holds whitespace {space.group(0)!r} at {space.start()}: HTCondor's submitter "
                "and group names hold none")
    return f"{value[:60]!r} is not a valid name"


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

def _inline(node: Any, defs: dict[str, Any]) -> Any:
    """`node` with every `$ref` into `defs` replaced by the definition (payloads nest no
    Struct in themselves, so this ends)."""
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str):
            return _inline(defs[ref.rsplit("/", 1)[-1]], defs)
        return {k: _inline(v, defs) for k, v in node.items()}
    if isinstance(node, list):
        return [_inline(v, defs) for v in node]
    return node


def json_schema(cls: type[Payload]) -> dict[str, Any]:
    """JSON Schema (draft 2020-12) of a whole envelope carrying a `cls` payload, generated by
    msgspec from the same types that decode it."""
    (ref,), defs = msgspec.json.schema_components([WIRE[cls.TYPE]])
    envelope = _inline(ref, defs)
    envelope.pop("title", None)
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": f"poolledger/{cls.TYPE}/v{cls.VERSION}",
        "title": cls.TYPE,
        "description": (cls.__doc__ or "").strip().splitlines()[0],
        **envelope,
        "required": list(ENVELOPE_FIELDS),
    }
