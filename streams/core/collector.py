"""The collector's view of the pool, folded from `ad.updated` / `ad.invalidated` events.

Why a fold and not a table of last updates: HTCondor's collector forgets an ad that has not
been refreshed for CLASSAD_LIFETIME seconds, may keep an expiring startd ad as *absent*
(ABSENT_REQUIREMENTS), and counts lost updates from sequence numbers (condor_updates_stats).
All of that depends on time, so here time is the event time only: an ad expires when some
later event's `ts` passes its deadline, which every runner sees identically.

Pool size (the negotiator's pie) is the sum of SlotWeight over current, non-absent Machine
ads. A partitionable slot counts its full resources (TotalSlot<Res>), and a dynamic slot
carved from a partitionable slot that is present is then not counted again.
"""
from __future__ import annotations

import heapq
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from fractions import Fraction
from typing import Any, Final

import orjson

from schemas.classads import ClassAd, ExprTree, Value, ad_from_json, compile_expr, evaluate
from schemas.config import Knobs, SettingsLike, knob_bool, knob_float, knob_str
from schemas.errors import ClassAdError
from schemas.events import (AdInvalidated, AdRefresh, AdsRefreshed, AdUpdated, ConfigChanged,
                            Envelope, Payload)
from streams.core.overrides import Effective

__all__ = [
    "PoolConfig", "PoolState", "AdRecord", "UpdateStats",
    "apply", "step", "stale", "tick", "pool_size", "slot_weight", "attr_value", "is_number",
    "current_ads", "keyed_ads", "get_ad", "update_stats",
    "DEFAULT_CLASSAD_LIFETIME", "DEFAULT_ABSENT_EXPIRE_ADS_AFTER",
]

DEFAULT_CLASSAD_LIFETIME: Final = 900.0
DEFAULT_ABSENT_EXPIRE_ADS_AFTER = 30 * 86400.0
_RESOURCES = ("Cpus", "Memory", "Disk", "GPUs")
_POOL_KNOBS = frozenset({"CLASSAD_LIFETIME", "ABSENT_REQUIREMENTS", "ABSENT_EXPIRE_ADS_AFTER",
                         "EXPIRE_INVALIDATED_ADS", "SLOT_WEIGHT", "NEGOTIATOR_USE_SLOT_WEIGHTS"})


def is_number(value: Any) -> bool:
    """A real number (not a bool, not UNDEFINED/ERROR, which are IntEnum members)."""
    return isinstance(value, (int, float)) and not isinstance(value, (bool, Value))


# --- config ------------------------------------------------------------------------------

@dataclass(frozen=True)
class PoolConfig:
    """The collector knobs this fold reads. Build it with `from_settings`."""

    classad_lifetime: float = DEFAULT_CLASSAD_LIFETIME
    absent_requirements: str | None = None
    absent_expire_ads_after: float = DEFAULT_ABSENT_EXPIRE_ADS_AFTER
    expire_invalidated_ads: bool = False
    slot_weight: str = "Cpus"
    use_slot_weights: bool = True
    source: SettingsLike | None = field(default=None, compare=False, repr=False)

    @classmethod
    def from_settings(cls, settings: SettingsLike | None) -> PoolConfig:
        lifetime = knob_float(settings, "CLASSAD_LIFETIME", DEFAULT_CLASSAD_LIFETIME)
        absent_after = knob_float(settings, "ABSENT_EXPIRE_ADS_AFTER", DEFAULT_ABSENT_EXPIRE_ADS_AFTER)
        return cls(
            classad_lifetime=lifetime if lifetime and lifetime > 0 else DEFAULT_CLASSAD_LIFETIME,
            absent_requirements=knob_str(settings, "ABSENT_REQUIREMENTS"),
            absent_expire_ads_after=max(0.0, absent_after or 0.0),
            expire_invalidated_ads=knob_bool(settings, "EXPIRE_INVALIDATED_ADS", False),
            slot_weight=knob_str(settings, "SLOT_WEIGHT", "Cpus") or "Cpus",
            use_slot_weights=knob_bool(settings, "NEGOTIATOR_USE_SLOT_WEIGHTS", True),
            source=settings,
        )

    def with_overrides(self, overrides: Mapping[str, str]) -> PoolConfig:
        """This config with `config.changed` overrides layered over its settings."""
        if not overrides:
            return self
        return PoolConfig.from_settings(Knobs(overrides, self.source))


# --- state -------------------------------------------------------------------------------

@dataclass
class AdRecord:
    """One ad the collector holds, with what the fold derived from it at update time."""

    ad_type: str
    name: str
    ad: dict[str, Any]
    updated: float
    expires: float | None
    source: str = ""
    absent: bool = False
    weight: float = 1.0
    kind: str = "s"  # "s" static/other slot, "p" partitionable, "d" dynamic
    machine: str | None = None
    slot_id: int | None = None

    def __init__(self, ad_type: str, name: str, ad: dict[str, Any], updated: float,
                 expires: float | None, source: str = "", absent: bool = False,
                 weight: float = 1.0, kind: str = "s", machine: str | None = None,
                 slot_id: int | None = None) -> None:
        # written out: the compiled core compiles this one, while the __init__ @dataclass
        # generates runs interpreted (one per ad update)
        self.ad_type, self.name, self.ad, self.updated = ad_type, name, ad, updated
        self.expires, self.source, self.absent, self.weight = expires, source, absent, weight
        self.kind, self.machine, self.slot_id = kind, machine, slot_id

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        # copy and pickle rebuild through __init__: the compiled class's __new__ runs it
        return AdRecord, (self.ad_type, self.name, self.ad, self.updated, self.expires,
                          self.source, self.absent, self.weight, self.kind, self.machine,
                          self.slot_id)

    def to_obj(self) -> dict[str, Any]:
        return {"ad_type": self.ad_type, "name": self.name, "ad": self.ad, "updated": self.updated,
                "expires": self.expires, "source": self.source, "absent": self.absent,
                "weight": self.weight, "kind": self.kind, "machine": self.machine,
                "slot_id": self.slot_id}

    @classmethod
    def from_obj(cls, obj: Mapping[str, Any]) -> AdRecord:
        return cls(**{k: obj[k] for k in ("ad_type", "name", "ad", "updated", "expires", "source",
                                         "absent", "weight", "kind", "machine", "slot_id")})


@dataclass(frozen=True, slots=True)
class UpdateStats:
    """condor_updates_stats' numbers for one source: Total = received + lost."""

    total: int
    received: int
    lost: int
    last_seq: int

    @property
    def lost_pct(self) -> float:
        return 100.0 * self.lost / self.total if self.total else 0.0


@dataclass
class PoolState:
    """Current ads by (MyType, Name), per-source update statistics, knob overrides."""

    ads: dict[str, AdRecord] = field(default_factory=dict)
    stats: dict[str, dict[str, int]] = field(default_factory=dict)
    overrides: dict[str, str] = field(default_factory=dict)
    now: float | None = None
    size: float = 0.0
    # caches, rebuilt on demand, never serialized
    _heap: list[tuple[float, str]] | None = field(default=None, repr=False, compare=False)
    _index: _SizeIndex | None = field(default=None, repr=False, compare=False)
    _cfg: Effective[PoolConfig] = field(default_factory=Effective, repr=False, compare=False)

    def to_json(self) -> str:
        """Canonical JSON (sorted keys) — runners compare it for equality."""
        obj = {"ads": {k: r.to_obj() for k, r in self.ads.items()}, "stats": self.stats,
               "overrides": self.overrides, "now": self.now, "size": self.size}
        return orjson.dumps(obj, option=orjson.OPT_SORT_KEYS).decode()

    @classmethod
    def from_json(cls, text: str | bytes) -> PoolState:
        obj = orjson.loads(text)
        return cls(ads={k: AdRecord.from_obj(v) for k, v in obj["ads"].items()},
                   stats={k: dict(v) for k, v in obj["stats"].items()},
                   overrides=dict(obj["overrides"]), now=obj["now"], size=obj["size"])

    def effective(self, cfg: PoolConfig) -> PoolConfig:
        """`cfg` with this log's `config.changed` overrides (cached)."""
        return self._cfg.get(cfg, self.overrides)


def _key(ad_type: str, name: str) -> str:
    """MyType is case-insensitive in HTCondor; Name is kept as given."""
    return f"{ad_type.lower()}/{name}"


# --- evaluation helpers ------------------------------------------------------------------

def _lookup(ad: Mapping[str, Any], attr: str) -> Any:
    """Case-insensitive attribute lookup in a JSON-form ad (ClassAd names ignore case)."""
    if attr in ad:
        return ad[attr]
    low = attr.lower()
    for k, v in ad.items():
        if k.lower() == low:
            return v
    return None



def _eval_in(expr: str | ExprTree, ad: Mapping[str, Any] | ClassAd, now: float) -> Any:
    """`expr` evaluated in `ad` with classad2, `time()` read as the event time `now`; an ad
    that does not convert gives ERROR."""
    try:
        return evaluate(expr, ad, now=now)
    except ClassAdError:
        return Value.Error


# --- fast evaluation ----------------------------------------------------------------------
#
# Converting a JSON ad to a classad2 ClassAd costs far more than the rest of an update, and
# SLOT_WEIGHT (default `Cpus`) usually reads one attribute. `_plain(ad)` checks in one pass
# that `ad_from_json(ad)` would succeed (identifier keys, JSON values, every `/Expr(...)/`
# compiles, ints within int64) and that no two keys differ only in case, and returns the
# lower-case key index. With it, a bare attribute reference is answered from the dict, and
# any other expression from a memo keyed by the values of the attributes it can reach
# (its identifiers, followed through `/Expr(...)/` values). Anything else — duplicates by
# case, nested values, quoted names, eval()/time()/random() — takes the classad2 path, so the
# results are the ones `_eval_in` gives.

_MEMO_MAX: Final = 1 << 16
_INT64: Final = 1 << 63
_MISS: Final = object()
_EXPR_TEXT: dict[str, str | bool | None] = {}  # value -> inner text / False (bad) / None (plain)
_REFS: dict[str, frozenset[str] | None] = {}
_EVAL_MEMO: dict[tuple[Any, ...], Any] = {}
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_IDENT_FULL = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_EXPR_JSON_RE = re.compile(r"/Expr\((.*)\)/\Z", re.S)
_KEYWORDS = frozenset({"true", "false", "undefined", "error", "is", "isnt", "parent", "my",
                       "target", "root", "self", "super"})
_IMPURE = frozenset({"eval", "time", "random"})


def _bounded(memo: dict[Any, Any]) -> dict[Any, Any]:
    if len(memo) >= _MEMO_MAX:
        memo.clear()
    return memo


def _expr_text(value: str) -> str | bool | None:
    """For a string value: None if it is plain text, its expression text if it is a valid
    `/Expr(...)/`, False if it is one that does not compile (the ad would not convert)."""
    found = _EXPR_TEXT.get(value, _MISS)
    if found is not _MISS:
        return found  # type: ignore[return-value]
    out: str | bool | None = None
    m = _EXPR_JSON_RE.match(value)
    if m is not None:
        try:
            compile_expr(m.group(1))
            out = m.group(1)
        except ClassAdError:
            out = False
    _bounded(_EXPR_TEXT)[value] = out
    return out


def _value_ok(v: Any) -> bool:
    """Whether a JSON value converts (the rules of schemas.classads._from_json_value)."""
    t = type(v)
    if t is str:
        return not v.startswith("/Expr(") or _expr_text(v) is not False
    if t is int:
        return -_INT64 <= v < _INT64
    if t is float or t is bool or v is None:
        return True
    if t is list:
        return all(_value_ok(x) for x in v)
    if t is dict:
        return _plain(v) is not None
    return False


_KEY_INDEX: dict[tuple[Any, ...], dict[str, str] | None] = {}


def _key_index(keys: tuple[Any, ...]) -> dict[str, str] | None:
    """Lower-case key -> key, or None if a key is not an identifier or two differ by case."""
    idx: dict[str, str] = {}
    for k in keys:
        if type(k) is not str or _IDENT_FULL.match(k) is None:
            return None
        low = k.lower()
        if low in idx:
            return None
        idx[low] = k
    return idx


def _plain(ad: Mapping[str, Any]) -> dict[str, str] | None:
    """Lower-case key -> key when the ad surely converts and has no keys equal but for case.

    The index depends on the keys only and is shared by ads with the same keys (callers
    must not change it); the values are checked on every call."""
    if type(ad) is not dict:
        return None
    keys = tuple(ad)
    try:
        idx = _KEY_INDEX[keys]
    except KeyError:
        if len(_KEY_INDEX) >= 4096:
            _KEY_INDEX.clear()
        idx = _KEY_INDEX[keys] = _key_index(keys)
    if idx is None:
        return None
    expr_text = _EXPR_TEXT
    for v in ad.values():
        t = type(v)
        if t is str:
            text: str = v  # typed: the compiled core's startswith, not a method call by name
            if text.startswith("/Expr("):
                r = expr_text.get(text, _MISS)
                if r is False or (r is _MISS and _expr_text(text) is False):
                    return None
        elif t is int:
            if not -_INT64 <= v < _INT64:
                return None
        elif t is not float and t is not bool and v is not None and not _value_ok(v):
            return None
    return idx


def _get(ad: Mapping[str, Any], idx: dict[str, str] | None, attr: str) -> Any:
    """`_lookup` with the index when there is one (then there are no case duplicates)."""
    if idx is None:
        return _lookup(ad, attr)
    k = idx.get(attr.lower())
    return None if k is None else ad[k]


def _refs(text: str) -> frozenset[str] | None:
    """Lower-cased identifiers of an expression (a superset of the attributes it reads);
    None when its reads cannot be known from the text (quoted names, eval, time, random)."""
    if text in _REFS:
        return _REFS[text]
    words = frozenset(w.lower() for w in _WORD.findall(text))
    out = None if ("'" in text or words & _IMPURE) else words
    _bounded(_REFS)[text] = out
    return out


def _bare_ref(expr: str) -> str | None:
    """The lower-cased attribute name when `expr` is just an attribute reference."""
    text = expr.strip()
    if _IDENT_FULL.match(text) is None:
        return None
    low = text.lower()
    return None if low in _KEYWORDS else low


def _eval_fast(expr: str | ExprTree, ad: Mapping[str, Any], idx: dict[str, str] | None,
               now: float) -> Any:
    """`_eval_in(expr, ad, now)`, answered without classad2 when the index allows it (an
    expression reaching time() always takes classad2, so the memo never holds a time)."""
    if idx is None or type(expr) is not str:
        return _eval_in(expr, ad, now)
    ref = _bare_ref(expr)
    if ref is not None:
        k = idx.get(ref)
        if k is None:
            return Value.Undefined
        v = ad[k]
        t = type(v)
        if t is int or t is float or t is bool:
            return v
        if v is None:
            return Value.Undefined
        if t is str and (not v.startswith("/Expr(") or _expr_text(v) is None):
            return v
    refs = _refs(expr)
    if refs is None:
        return _eval_in(expr, ad, now)
    seen = set(refs)
    pending = list(refs)
    while pending:
        k = idx.get(pending.pop())
        if k is None:
            continue
        v = ad[k]
        if type(v) is str:
            inner = _expr_text(v) if v.startswith("/Expr(") else None
            if inner:
                more = _refs(inner)  # type: ignore[arg-type]
                if more is None:
                    return _eval_in(expr, ad, now)
                for w in more - seen:
                    seen.add(w)
                    pending.append(w)
        elif type(v) is list or type(v) is dict:
            return _eval_in(expr, ad, now)
    parts: list[Any] = [expr]
    for name in sorted(seen):
        k = idx.get(name)
        if k is not None:
            v = ad[k]
            t = type(v)
            parts.append((k, t, v.hex() if t is float else v))
    key = tuple(parts)
    try:
        return _EVAL_MEMO[key]
    except KeyError:
        pass
    value = _eval_in(expr, ad, now)
    _bounded(_EVAL_MEMO)[key] = value
    return value


def _attr_value(ad: Mapping[str, Any], idx: dict[str, str] | None, attr: str,
                now: float) -> Any:
    value = _get(ad, idx, attr)
    if isinstance(value, str) and value.startswith("/Expr("):
        return _eval_fast(attr, ad, idx, now)
    return value


def attr_value(ad: Mapping[str, Any], attr: str, now: float) -> Any:
    """A literal attribute as is; an expression evaluated in the ad with classad2 at event
    time `now`."""
    value = _lookup(ad, attr)
    if isinstance(value, str) and value.startswith("/Expr("):
        return _eval_fast(attr, ad, _plain(ad), now)
    return value


def slot_weight(ad: Mapping[str, Any], cfg: PoolConfig, now: float) -> float:
    """A slot's SlotWeight for the pie: 1.0 per slot when slot weights are off.

    A partitionable slot that advertises TotalSlot<Res> is weighed on its full resources
    with SLOT_WEIGHT (its own SlotWeight covers only what is still unclaimed); any other
    slot uses its advertised SlotWeight, else SLOT_WEIGHT evaluated in the ad. A missing,
    non-numeric or negative weight counts 1.0, as the accountant does.
    """
    if not cfg.use_slot_weights:
        return 1.0
    return _slot_weight(ad, cfg, _plain(ad), now)


def _slot_weight(ad: Mapping[str, Any], cfg: PoolConfig, idx: dict[str, str] | None,
                 now: float) -> float:
    if not cfg.use_slot_weights:
        return 1.0
    value: Any = None
    if _get(ad, idx, "PartitionableSlot") is True and any(
            _get(ad, idx, f"TotalSlot{r}") is not None for r in _RESOURCES):
        full = dict(ad)
        full_idx = None if idx is None else dict(idx)
        for res in _RESOURCES:
            total = _get(ad, idx, f"TotalSlot{res}")
            if total is not None:
                for k in [k for k in full if k.lower() == res.lower()]:
                    del full[k]
                full[res] = total
                if full_idx is not None:
                    full_idx[res.lower()] = res
        value = _eval_fast(cfg.slot_weight, full, full_idx, now)
    elif _get(ad, idx, "SlotWeight") is not None:
        value = _attr_value(ad, idx, "SlotWeight", now)
    else:
        value = _eval_fast(cfg.slot_weight, ad, idx, now)
    if not is_number(value) or value < 0 or math.isnan(value) or math.isinf(value):
        return 1.0
    return float(value)


def _ad_lifetime(ad: Mapping[str, Any], cfg: PoolConfig, idx: dict[str, str] | None,
                 now: float) -> float:
    """The ad's own ClassAdLifetime when positive, else CLASSAD_LIFETIME."""
    value = _attr_value(ad, idx if idx is not None else _plain(ad), "ClassAdLifetime", now)
    if is_number(value) and value > 0:
        return float(value)
    return cfg.classad_lifetime


def _is_machine(ad_type: str) -> bool:
    return ad_type.lower() == "machine"


def _describe(rec: AdRecord, cfg: PoolConfig, idx: dict[str, str] | None, now: float) -> None:
    """Derive the slot facts the pool size needs (done once per update, not per event), with
    `time()` read as the event time `now`."""
    ad = rec.ad
    if not _is_machine(rec.ad_type):
        rec.kind, rec.weight, rec.machine, rec.slot_id = "s", 0.0, None, None
        return
    if idx is None:
        idx = _plain(ad)
    if _get(ad, idx, "PartitionableSlot") is True:
        rec.kind = "p"
    elif _get(ad, idx, "DynamicSlot") is True:
        rec.kind = "d"
    else:
        rec.kind = "s"
    machine = _get(ad, idx, "Machine")
    rec.machine = machine if isinstance(machine, str) else None
    slot_id = _get(ad, idx, "SlotID")
    rec.slot_id = int(slot_id) if is_number(slot_id) else None
    rec.weight = _slot_weight(ad, cfg, idx, now)


Unit = tuple[str, ...]


def _unit(key: str, rec: AdRecord) -> Unit | None:
    """What a slot ad's weight is counted with: a partitionable slot and the dynamic slots
    carved from it (same Machine and SlotID) form one unit; any other slot is its own."""
    if not _is_machine(rec.ad_type):
        return None
    if rec.kind in ("p", "d"):
        return ("pd", rec.machine or "", str(rec.slot_id))
    return ("s", key)


class _SizeIndex:
    """Pool size kept incrementally and exactly: each unit's contribution is a Fraction of
    its float weights, so the total never drifts and does not depend on the order ads came
    in (equal to math.fsum over the current slots)."""

    __slots__ = ("members", "contrib", "total", "counted", "_size")

    def __init__(self, ads: Mapping[str, AdRecord]) -> None:
        self.members: dict[Unit, set[str]] = {}
        self.contrib: dict[Unit, Fraction] = {}
        # the weights each unit's contribution was summed from: an update that leaves them
        # as they were (most refreshes) skips the Fraction arithmetic
        self.counted: dict[Unit, tuple[float, ...]] = {}
        self.total = Fraction(0)
        self._size: float | None = None
        for key, rec in ads.items():
            unit = _unit(key, rec)
            if unit is not None:
                self.members.setdefault(unit, set()).add(key)
        for unit in list(self.members):  # _touch drops units left without live slots
            self._touch(unit, ads)

    def _touch(self, unit: Unit, ads: Mapping[str, AdRecord]) -> None:
        live = [ads[k] for k in self.members.get(unit, ()) if k in ads and not ads[k].absent]
        parents = [r for r in live if r.kind == "p"]
        counted = parents if parents else live
        if len(counted) == 1:
            weights: tuple[float, ...] = (counted[0].weight,)
        else:
            weights = tuple(sorted(r.weight for r in counted))
        if self.counted.get(unit) == weights and unit in self.contrib:
            return  # same weights, same contribution (counted is non-empty iff live is)
        if len(weights) == 1:  # the sum below, of one weight (Fractions are normalized)
            new = Fraction(weights[0])
        else:
            new = sum((Fraction(w) for w in weights), Fraction(0))
        before = self.contrib.get(unit)
        self.total += new if before is None else new - before
        self._size = None
        if new or live:
            self.contrib[unit] = new
            self.counted[unit] = weights
        else:
            self.contrib.pop(unit, None)
            self.members.pop(unit, None)
            self.counted.pop(unit, None)

    def changed(self, key: str, old: AdRecord | None, new: AdRecord | None,
                ads: Mapping[str, AdRecord]) -> None:
        """Re-count the units of `key` before (`old`) and after (`new`, already in `ads`)."""
        units = []
        if old is not None and (u := _unit(key, old)) is not None:
            self.members.get(u, set()).discard(key)
            units.append(u)
        if new is not None and (u := _unit(key, new)) is not None:
            self.members.setdefault(u, set()).add(key)
            units.append(u)
        for u in dict.fromkeys(units):
            self._touch(u, ads)

    @property
    def size(self) -> float:
        if self._size is None:
            self._size = float(self.total)
        return self._size


def _index(state: PoolState) -> _SizeIndex:
    if state._index is None:
        state._index = _SizeIndex(state.ads)
    return state._index


def _replace(state: PoolState, key: str, new: AdRecord | None) -> None:
    """Put (or with None remove) the ad at `key`, keeping the size index in step."""
    old = state.ads.get(key)  # records are replaced, never edited, so `old` stays as it was
    if new is None:
        state.ads.pop(key, None)
    else:
        state.ads[key] = new
    _index(state).changed(key, old, new, state.ads)
    state.size = _index(state).size


# --- expiry --------------------------------------------------------------------------------

def _heap(state: PoolState) -> list[tuple[float, str]]:
    if state._heap is None:
        state._heap = [(r.expires, k) for k, r in state.ads.items() if r.expires is not None]
        heapq.heapify(state._heap)
    return state._heap


def _schedule(state: PoolState, key: str, rec: AdRecord) -> None:
    if rec.expires is not None and state._heap is not None:
        heapq.heappush(state._heap, (rec.expires, key))


def _absent_ok(rec: AdRecord, cfg: PoolConfig, at: float) -> bool:
    """ABSENT_REQUIREMENTS, evaluated against the ad expiring at `at`."""
    if not cfg.absent_requirements or not _is_machine(rec.ad_type):
        return False
    return _eval_fast(cfg.absent_requirements, rec.ad, _plain(rec.ad), at) is True


def _retire(state: PoolState, key: str, at: float, cfg: PoolConfig) -> None:
    """An ad's lifetime ended at `at`: keep it as absent or forget it."""
    rec = state.ads[key]
    if not rec.absent and _absent_ok(rec, cfg, at):
        after = cfg.absent_expire_ads_after
        absent = replace(rec, ad={**rec.ad, "Absent": True}, absent=True,
                         expires=at + after if after > 0 else None)
        _replace(state, key, absent)
        _schedule(state, key, absent)
    else:
        _replace(state, key, None)


def _expire(state: PoolState, now: float, cfg: PoolConfig) -> bool:
    """Retire every ad whose deadline `now` has passed, earliest first (deterministic)."""
    heap = _heap(state)
    changed = False
    while heap and heap[0][0] < now:
        deadline, key = heapq.heappop(heap)
        rec = state.ads.get(key)
        if rec is None or rec.expires != deadline:
            continue  # stale entry: the ad was refreshed, invalidated or already retired
        _retire(state, key, deadline, cfg)
        changed = True
    return changed


# --- the fold ------------------------------------------------------------------------------

def _count_update(state: PoolState, env: Envelope) -> None:
    """Per-source sequence bookkeeping: a gap is lost updates, a lower seq is a restart."""
    st = state.stats.get(env.source)
    if st is None:
        state.stats[env.source] = {"seq": env.seq, "received": 1, "lost": 0}
        return
    if env.seq == st["seq"]:
        return  # the same update again
    if env.seq > st["seq"]:
        st["lost"] += env.seq - st["seq"] - 1
    st["received"] += 1
    st["seq"] = env.seq


def _count_refresh(state: PoolState, r: AdRefresh) -> None:
    """A refresh's updates in its ad's stream: `received` of `first`..`last` arrived, the
    others and any skipped before `first` were lost (condor_updates_stats' numbers)."""
    st = state.stats.get(r.source)
    if st is None:
        state.stats[r.source] = {"seq": r.last, "received": r.received,
                                 "lost": r.last - r.first + 1 - r.received}
        return
    if r.last <= st["seq"]:
        return  # counted already
    st["lost"] += max(0, r.first - st["seq"] - 1) + (r.last - r.first + 1 - r.received)
    st["received"] += r.received
    st["seq"] = r.last


def _refresh(state: PoolState, r: AdRefresh, cfg: PoolConfig) -> bool:
    """An ad still heard from at `r.heard`: its volatile attributes as heard then, its
    lifetime counted from then. Only the stream that wrote the ad refreshes it, and never
    back in time; an ad the fold no longer holds (or holds as absent) stays as it is."""
    key = _key(r.ad_type, r.name)
    rec = state.ads.get(key)
    if rec is None or rec.absent or rec.source != r.source or r.heard < rec.updated:
        return False
    ad = {**rec.ad, **r.ad} if r.ad else rec.ad
    idx = _plain(ad)
    new = AdRecord(ad_type=rec.ad_type, name=rec.name, ad=ad, updated=r.heard,
                   expires=r.heard + _ad_lifetime(ad, cfg, idx, r.heard), source=rec.source)
    _describe(new, cfg, idx, r.heard)
    _replace(state, key, new)
    _schedule(state, key, new)
    return True


def _recompute_weights(state: PoolState, cfg: PoolConfig, now: float) -> None:
    for rec in state.ads.values():
        _describe(rec, cfg, None, now)
    state._index = None
    state.size = _index(state).size


def stale(state: PoolState, data: Payload, ts: float) -> str | None:
    """Why an `ad.updated`/`ad.invalidated` at `ts` is older than the ad the collector holds
    (None: it is not): a late update never replaces a newer ad, nor a late invalidation
    withdraw one. Of one daemon's run (same DaemonStartTime) the UpdateSequenceNumber orders
    its ads, as the daemon numbers them; otherwise the event time does."""
    if not isinstance(data, (AdUpdated, AdInvalidated)):
        return None
    held = state.ads.get(_key(data.ad_type, data.name))
    if held is None:
        return None
    what = f"{data.ad_type} ad {data.name!r}"
    if isinstance(data, AdUpdated):
        new_seq: Any = data.ad.get("UpdateSequenceNumber")
        old_seq: Any = held.ad.get("UpdateSequenceNumber")
        start = data.ad.get("DaemonStartTime")
        if (is_number(new_seq) and is_number(old_seq) and is_number(start)
                and start == held.ad.get("DaemonStartTime")):
            if new_seq < old_seq:
                return (f"{what}: UpdateSequenceNumber {new_seq} is older than the held ad's "
                        f"{old_seq} (same DaemonStartTime {start}); a late update does not "
                        "replace a newer ad")
            return None
    if ts < held.updated:
        return (f"{what}: event time {ts:.0f} is older than the held ad's update at "
                f"{held.updated:.0f}; a late {'update does not replace' if isinstance(data, AdUpdated) else 'invalidation does not withdraw'} a newer ad")
    return None


def step(state: PoolState, env: Envelope, cfg: PoolConfig, *, checked: bool = False) -> bool:
    """Apply one event; True when the set of current ads (and so maybe pool size) changed. An
    ad update or invalidation older than the ad held (`stale`; `checked`: the caller asked
    already, and it is not) changes no ad; an `ad.refreshed` keeps ads alive and counts their
    updates (`_refresh`)."""
    eff = state.effective(cfg)
    state.now = env.ts if state.now is None else max(state.now, env.ts)
    _count_update(state, env)
    changed = _expire(state, state.now, eff)
    data = env.data
    if not checked and isinstance(data, (AdUpdated, AdInvalidated)) \
            and stale(state, data, env.ts) is not None:
        return changed
    if isinstance(data, AdUpdated):
        key = _key(data.ad_type, data.name)
        ad = dict(data.ad)
        idx = _plain(ad)
        rec = AdRecord(ad_type=data.ad_type, name=data.name, ad=ad, updated=env.ts,
                       expires=env.ts + _ad_lifetime(ad, eff, idx, env.ts), source=env.source)
        _describe(rec, eff, idx, env.ts)
        before = state.ads.get(key)
        index = state._index
        if (before is not None and index is not None and not before.absent
                and before.kind == rec.kind and before.weight == rec.weight
                and before.machine == rec.machine and before.slot_id == rec.slot_id
                and before.ad_type == rec.ad_type):
            # same unit, same live weight: `_replace`'s index update would change nothing
            state.ads[key] = rec
            state.size = index.size
        else:
            _replace(state, key, rec)
        _schedule(state, key, rec)
        changed = True
    elif isinstance(data, AdsRefreshed):
        for r in data.refreshes:
            _count_refresh(state, r)
            changed = _refresh(state, r, eff) or changed
    elif isinstance(data, AdInvalidated):
        key = _key(data.ad_type, data.name)
        if key in state.ads:
            if eff.expire_invalidated_ads:
                _retire(state, key, env.ts, eff)
            else:
                _replace(state, key, None)
            changed = True
    elif isinstance(data, ConfigChanged):
        knob = data.knob.upper()
        state.overrides[knob] = data.value
        if knob in _POOL_KNOBS:
            new = state.effective(cfg)
            if knob in ("SLOT_WEIGHT", "NEGOTIATOR_USE_SLOT_WEIGHTS"):
                _recompute_weights(state, new, env.ts)
                changed = True
    return changed


def tick(state: PoolState, ts: float, source: str, seq: int, cfg: PoolConfig) -> None:
    """`step` for an event (from `source`, numbered `seq`, at `ts`) that is not an ad
    update, invalidation or knob change (the ledger's hot path): the clock, the source's
    sequence bookkeeping, and expiry when a deadline passed."""
    now = state.now
    if now is None or ts > now:
        state.now = now = ts
    st = state.stats.get(source)
    if st is None:
        state.stats[source] = {"seq": seq, "received": 1, "lost": 0}
    else:
        last = st["seq"]
        if seq != last:
            if seq > last + 1:  # a gap (the next seq, the usual case, loses none)
                st["lost"] += seq - last - 1
            st["received"] += 1
            st["seq"] = seq
    heap = state._heap
    if heap is None or (heap and heap[0][0] < now):
        _expire(state, now, state.effective(cfg))


def apply(state: PoolState, env: Envelope, cfg: PoolConfig) -> list[Payload]:
    """The collector fold. It derives no events: quotas read pool size via `pool_size`."""
    step(state, env, cfg)
    return []


# --- queries -------------------------------------------------------------------------------

def pool_size(state: PoolState) -> float:
    """Σ SlotWeight of current non-absent slot ads (the negotiator's pie size)."""
    return state.size


def current_ads(state: PoolState, ad_type: str | None = None, *, absent: bool | None = False
                ) -> list[AdRecord]:
    """Ads of `ad_type` (any when None), sorted by key. absent=False hides absent ads (as
    condor_status does), True gives only absent ads (condor_status -absent), None gives all."""
    out = []
    for key in sorted(state.ads):
        rec = state.ads[key]
        if ad_type is not None and rec.ad_type.lower() != ad_type.lower():
            continue
        if absent is not None and rec.absent != absent:
            continue
        out.append(rec)
    return out


def keyed_ads(state: PoolState, ad_type: str | None = None) -> list[tuple[str, AdRecord]]:
    """(key, ad) of every ad of `ad_type` (any when None), absent ones included, in no
    particular order (a collector answering a query of 200,000 ads does not sort them)."""
    if ad_type is None:
        return list(state.ads.items())
    prefix = _key(ad_type, "")
    return [(k, r) for k, r in state.ads.items() if k.startswith(prefix)]


def get_ad(state: PoolState, ad_type: str, name: str) -> AdRecord | None:
    """One ad by (MyType, Name), absent or not."""
    return state.ads.get(_key(ad_type, name))


def update_stats(state: PoolState, sources: Iterable[str] | None = None) -> dict[str, UpdateStats]:
    """condor_updates_stats per source: total (received + lost), lost, lost %."""
    names = sorted(state.stats) if sources is None else [s for s in sources if s in state.stats]
    out = {}
    for name in names:
        st = state.stats[name]
        out[name] = UpdateStats(total=st["received"] + st["lost"], received=st["received"],
                                lost=st["lost"], last_seq=st["seq"])
    return out
