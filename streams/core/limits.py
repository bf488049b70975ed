"""Concurrency limits: pool-wide counters of jobs using a named resource (licences, servers).

Why a fold: usage is the sum over running jobs of what their ConcurrencyLimits declare, so
it is a fold of `job.started` / `job.stopped` / `job.history`, and `limit.changed` says
which event moved a counter. The maxima come from knobs (`config.changed` included).

HTCondor's rules, kept exactly:
- a limits string is tokens `name[:increment]`, separated by commas and/or spaces; an
  increment that is missing, not a number, or <= 0 counts 1;
- a name is `[A-Za-z_][A-Za-z0-9_]*`, optionally `set.member` with both parts of that form
  (so at most one '.'); names are case-insensitive and kept lowercased;
- the maximum is `<NAME>_LIMIT`, else `CONCURRENCY_LIMIT_DEFAULT_<SET>` for `set.member`,
  else CONCURRENCY_LIMIT_DEFAULT (2308032: effectively unlimited);
- a job may start only if for every limit `in_use + increment <= max`.
"""
from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import orjson

from schemas.classads import ClassAd, Value, ad_from_json, evaluate
from schemas.config import Knobs, SettingsLike, knob_float
from schemas.errors import ClassAdError
from schemas.events import (ConfigChanged, Envelope, JobHistory, JobStarted, JobStopped,
                            LimitChanged, Payload)
from streams.core.errors import ConcurrencyLimitError
from streams.core.jobs import history_job, job_key
from streams.core.overrides import Effective

__all__ = [
    "CONCURRENCY_LIMIT_DEFAULT", "ConcurrencyLimitError", "LimitToken", "LimitsConfig",
    "LimitsState", "parse_limits", "limit_increments", "limits_for_slot", "can_start",
    "limit_max", "apply", "LimitState", "LimitConfig",
]

CONCURRENCY_LIMIT_DEFAULT: Final = 2308032.0
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_NUMBER = re.compile(r"\s*[-+]?(\d+\.?\d*([eE][-+]?\d+)?|\.\d+([eE][-+]?\d+)?)")
_SPLIT = re.compile(r"[,\s]+")
_ZERO: Final = 1e-9


@dataclass(frozen=True, slots=True)
class LimitToken:
    """One parsed token: the lowercased limit name and the units the job uses."""

    name: str
    increment: float


def _increment(text: str) -> float:
    """Leading number of `text` (like strtod); missing or <= 0 counts 1, as HTCondor does."""
    m = _NUMBER.match(text)
    if m is None:
        return 1.0
    value = float(m.group(0))
    return value if value > 0 else 1.0


def _parse_token(token: str) -> LimitToken:
    name, colon, inc = token.partition(":")
    if not name:
        raise ConcurrencyLimitError(token, "the limit name is empty")
    parts = name.split(".")
    if len(parts) > 2:
        raise ConcurrencyLimitError(token, "a name may contain at most one '.'")
    for part in parts:
        if not _NAME.match(part):
            raise ConcurrencyLimitError(
                token, "names are letters, digits and '_', not starting with a digit"
                       + (" (on each side of the '.')" if len(parts) == 2 else ""))
    return LimitToken(name.lower(), _increment(inc) if colon else 1.0)


def parse_limits(text: str | None) -> tuple[LimitToken, ...]:
    """Parse a ConcurrencyLimits string; raises ConcurrencyLimitError naming a bad token."""
    if not text:
        return ()
    return tuple(_parse_token(t) for t in _SPLIT.split(text.strip()) if t)


def _parse_lenient(text: str | None) -> tuple[LimitToken, ...]:
    """Tokens that parse; a running job's bad tokens count for nothing (never stop the fold)."""
    out = []
    for t in _SPLIT.split((text or "").strip()):
        if t:
            try:
                out.append(_parse_token(t))
            except ConcurrencyLimitError:
                continue
    return tuple(out)


_HOLDS: Final[dict[str, tuple[tuple[str, float], ...]]] = {}


def _holds(text: str | None) -> tuple[tuple[str, float], ...]:
    """`limit_increments(_parse_lenient(text))` as items, remembered per limits string."""
    key = text or ""
    found = _HOLDS.get(key)
    if found is None:
        found = tuple(limit_increments(_parse_lenient(text)).items())
        if len(_HOLDS) >= 1 << 16:
            _HOLDS.clear()
        _HOLDS[key] = found
    return found


def limit_increments(tokens: tuple[LimitToken, ...]) -> dict[str, float]:
    """Units per limit name; a name listed twice uses both amounts."""
    out: dict[str, float] = {}
    for t in tokens:
        out[t.name] = out.get(t.name, 0.0) + t.increment
    return out


# --- config ------------------------------------------------------------------------------

@dataclass(frozen=True)
class LimitsConfig:
    """CONCURRENCY_LIMIT_DEFAULT, and the settings that answer `<NAME>_LIMIT` and
    `CONCURRENCY_LIMIT_DEFAULT_<SET>` (families, looked up per name)."""

    default: float = CONCURRENCY_LIMIT_DEFAULT
    source: SettingsLike | None = field(default=None, compare=False, repr=False)
    #: maxima looked up so far, by name (the config is immutable)
    _max_memo: dict[str, float] = field(default_factory=dict, init=False, compare=False,
                                        repr=False)

    @classmethod
    def from_settings(cls, settings: SettingsLike | None) -> LimitsConfig:
        value = knob_float(settings, "CONCURRENCY_LIMIT_DEFAULT", CONCURRENCY_LIMIT_DEFAULT)
        return cls(default=value if value is not None and value >= 0 else CONCURRENCY_LIMIT_DEFAULT,
                   source=settings)

    def with_overrides(self, overrides: Mapping[str, str]) -> LimitsConfig:
        if not overrides:
            return self
        return LimitsConfig.from_settings(Knobs(overrides, self.source))

    def max_for(self, name: str) -> float:
        """The maximum of limit `name` (lowercased): named, set default, then pool default."""
        memo = self._max_memo
        found = memo.get(name)
        if found is None:
            found = self._max_for(name)
            if len(memo) >= 1 << 16:
                memo.clear()
            memo[name] = found
        return found

    def _max_for(self, name: str) -> float:
        value = knob_float(self.source, f"{name}_LIMIT", None)
        if value is not None and value >= 0:
            return value
        head, dot, _ = name.partition(".")
        if dot:
            value = knob_float(self.source, f"CONCURRENCY_LIMIT_DEFAULT_{head}", None)
            if value is not None and value >= 0:
                return value
        return self.default


# --- state -------------------------------------------------------------------------------

@dataclass
class LimitsState:
    """Units in use per limit, what each running job holds, and the last announced values."""

    in_use: dict[str, float] = field(default_factory=dict)
    running: dict[str, dict[str, Any]] = field(default_factory=dict)
    announced: dict[str, list[float]] = field(default_factory=dict)
    overrides: dict[str, str] = field(default_factory=dict)
    _cfg: Effective[LimitsConfig] = field(default_factory=Effective, repr=False, compare=False)
    # running keys by job id (a cache beside `running`, never serialized)
    _by_id: dict[str, set[str]] | None = field(default=None, repr=False, compare=False)

    def to_json(self) -> str:
        """Canonical JSON (sorted keys) — runners compare it for equality."""
        obj = {"in_use": self.in_use, "running": self.running, "announced": self.announced,
               "overrides": self.overrides}
        return orjson.dumps(obj, option=orjson.OPT_SORT_KEYS).decode()

    @classmethod
    def from_json(cls, text: str | bytes) -> LimitsState:
        obj = orjson.loads(text)
        return cls(in_use=obj["in_use"], running=obj["running"], announced=obj["announced"],
                   overrides=obj["overrides"])

    def totals_json(self) -> bytes:
        """`to_json` without the running jobs' entries (`running_json`): a snapshot's limits
        section, all `userprio -l`'s limits read."""
        obj = {"in_use": self.in_use, "announced": self.announced, "overrides": self.overrides}
        return orjson.dumps(obj, option=orjson.OPT_SORT_KEYS)

    def running_json(self) -> bytes:
        """What each running job holds (`running` of `to_json`), a section of its own."""
        return orjson.dumps(self.running, option=orjson.OPT_SORT_KEYS)

    @classmethod
    def from_totals_json(cls, raw: bytes) -> LimitsState:
        """The state of `totals_json` with no running entries yet (`load_running`)."""
        obj = orjson.loads(raw)
        return cls(in_use=obj["in_use"], announced=obj["announced"], overrides=obj["overrides"])

    def load_running(self, raw: bytes) -> None:
        """Install the running entries of `running_json` (as `from_json` restores them)."""
        self.running = orjson.loads(raw)
        self._by_id = None

    def effective(self, cfg: LimitsConfig) -> LimitsConfig:
        """`cfg` with this log's `config.changed` overrides (cached)."""
        return self._cfg.get(cfg, self.overrides)

    def keys_of(self, job_id: str) -> list[str]:
        """The keys in `running` of the jobs with this job id, sorted."""
        if self._by_id is None:
            by_id: dict[str, set[str]] = {}
            for k, r in self.running.items():
                by_id.setdefault(r["job_id"], set()).add(k)
            self._by_id = by_id
        return sorted(self._by_id.get(job_id, ()))

    def hold(self, key: str, entry: dict[str, Any]) -> None:
        self.running[key] = entry
        if self._by_id is not None:
            self._by_id.setdefault(entry["job_id"], set()).add(key)

    def drop(self, key: str) -> dict[str, Any]:
        entry = self.running.pop(key)
        if self._by_id is not None:
            keys = self._by_id[entry["job_id"]]
            keys.discard(key)
            if not keys:
                del self._by_id[entry["job_id"]]
        return entry


def limit_max(state: LimitsState, name: str, cfg: LimitsConfig) -> float:
    """The maximum of `name` under `cfg` and the log's overrides."""
    return state.effective(cfg).max_for(name.lower())


def can_start(state: LimitsState, text: str | None, cfg: LimitsConfig | None = None
              ) -> tuple[bool, str]:
    """Whether a job declaring `text` fits every limit now: (True, "") or
    (False, "concurrency limit X reached"). Raises ConcurrencyLimitError for a bad token."""
    eff = state.effective(cfg if cfg is not None else _DEFAULT_CFG)
    for name, inc in limit_increments(parse_limits(text)).items():
        if state.in_use.get(name, 0.0) + inc > eff.max_for(name):
            return False, f"concurrency limit {name} reached"
    return True, ""


_DEFAULT_CFG = LimitsConfig()

#: Singular spellings, for callers that use them.
LimitState = LimitsState
LimitConfig = LimitsConfig


def limits_for_slot(job_ad: Mapping[str, Any] | ClassAd, slot_ad: Mapping[str, Any] | ClassAd) -> str:
    """The job's limits against a candidate slot: ConcurrencyLimitsExpr (submit command
    concurrency_limits_expr) evaluated with the slot as TARGET, else ConcurrencyLimits.
    A result that is not a string (e.g. TARGET.NETWORK undefined) means no limits."""
    job = ad_from_json(job_ad)
    slot = ad_from_json(slot_ad)
    for attr in ("ConcurrencyLimitsExpr", "ConcurrencyLimits"):
        try:
            job.lookup(attr)
        except KeyError:
            continue
        try:
            value = evaluate(job.lookup(attr), job, slot)
        except ClassAdError:
            return ""
        return value if isinstance(value, str) and not isinstance(value, Value) else ""
    return ""


# --- the fold ------------------------------------------------------------------------------

def _find_running(state: LimitsState, job_id: str, schedd: str, slot: str) -> str | None:
    if schedd:
        key = job_key(schedd, job_id)
        return key if key in state.running else None
    found = state.keys_of(job_id)
    on_slot = [k for k in found if state.running[k]["slot"] == slot]
    if on_slot:
        return on_slot[0]
    return found[0] if len(found) == 1 else None


def _history_running(state: LimitsState, named: tuple[str, str]) -> str | None:
    """The running key a history ad naming (job id, schedd) `named` (`history_job`)
    closes, if exactly one matches."""
    job_id, host = named
    if not job_id:
        return None
    if state._by_id is not None and job_id not in state._by_id:
        return None  # not running (the usual case: its limits were released at its stop)
    found = [k for k in state.keys_of(job_id)
             if not host or state.running[k]["schedd"].split("@")[-1] == host.split("@")[-1]]
    return found[0] if len(found) == 1 else None


def _add(state: LimitsState, holds: dict[str, float], sign: float) -> set[str]:
    for name, inc in holds.items():
        value = state.in_use.get(name, 0.0) + sign * inc
        if value > _ZERO:
            state.in_use[name] = value
        else:
            state.in_use.pop(name, None)
    return set(holds)


def _release(state: LimitsState, key: str | None) -> set[str]:
    if key is None or key not in state.running:
        return set()
    held = state.drop(key)
    return _add(state, dict(held["limits"]), -1.0)


_limit_changed: Final = LimitChanged


def _announce(state: LimitsState, cfg: LimitsConfig, touched: Iterable[str],
              cause: str) -> list[Payload]:
    """`limit.changed` for each touched limit whose announced (max, in use) moved, by name."""
    eff = state.effective(cfg)
    memo = eff._max_memo
    in_use = state.in_use
    announced = state.announced
    out: list[Payload] = []
    for name in sorted(touched):
        limit = memo.get(name)
        if limit is None:
            limit = eff.max_for(name)
        now = [limit, in_use.get(name, 0.0)]
        if announced.get(name) != now:
            announced[name] = now
            out.append(_limit_changed(name, limit, now[1], cause))
    return out


def on_started(state: LimitsState, data: JobStarted, cfg: LimitsConfig,
               cause: str, key: str) -> list[Payload]:
    """`apply` for a `job.started` whose job key is `key` (the ledger's hot path)."""
    running = state.running
    limits = data.concurrency_limits
    if not running and not limits:
        return []
    schedd, job_id = data.schedd, data.job_id  # each read once: attributes of an interpreted class
    if key in running:  # a restart on another slot replaces the old claim: as `apply` does
        touched = _release(state, key)
        items = _holds(limits)
        if items:
            holds = dict(items)
            state.hold(key, {"job_id": job_id, "schedd": schedd, "slot": data.slot,
                             "limits": sorted([n, v] for n, v in items)})
            touched |= _add(state, holds, 1.0)
        return _announce(state, cfg, touched, cause) if touched else []
    if not limits:
        return []
    items = _holds(limits)
    if not items:
        return []
    state.hold(key, {"job_id": job_id, "schedd": schedd, "slot": data.slot,
                     "limits": sorted([n, v] for n, v in items)})
    in_use = state.in_use
    for name, inc in items:  # _add(state, dict(items), 1.0): the names are distinct
        value = in_use.get(name, 0.0) + inc  # 1.0 * inc is inc
        if value > _ZERO:
            in_use[name] = value
        else:
            in_use.pop(name, None)
    if len(items) == 1:
        return _announce(state, cfg, (items[0][0],), cause)
    return _announce(state, cfg, [n for n, _ in items], cause)


def on_stopped(state: LimitsState, data: JobStopped, cfg: LimitsConfig,
               cause: str, key: str) -> list[Payload]:
    """`apply` for a `job.stopped` whose job key, if it names a schedd, is `key` (the
    ledger's hot path)."""
    running = state.running
    if not running:
        return []
    schedd = data.schedd
    if schedd:
        if key not in running:  # _find_running with a schedd
            return []
    else:
        found = _find_running(state, data.job_id, schedd, data.slot)
        if found is None:
            return []
        key = found
    touched = _release(state, key)
    if not touched:
        return []
    return _announce(state, cfg, touched, cause)


def on_history(state: LimitsState, named: tuple[str, str], cfg: LimitsConfig,
               cause: str) -> list[Payload]:
    """`apply` for a `job.history` ad naming (job id, schedd) `named` (`history_job`; the
    ledger's hot path)."""
    if not state.running:
        return []
    found = _history_running(state, named)
    if found is None:
        return []
    touched = _release(state, found)
    if not touched:
        return []
    return _announce(state, cfg, touched, cause)


def apply(state: LimitsState, env: Envelope, cfg: LimitsConfig) -> list[Payload]:
    """Fold one event; emit `limit.changed` for each limit whose usage or maximum moved."""
    data = env.data
    if isinstance(data, JobStarted):
        return on_started(state, data, cfg, env.id, job_key(data.schedd, data.job_id))
    if isinstance(data, JobStopped):
        return on_stopped(state, data, cfg, env.id, job_key(data.schedd, data.job_id))
    if isinstance(data, JobHistory):
        return on_history(state, history_job(data.ad), cfg, env.id)
    touched: set[str] = set()
    if isinstance(data, ConfigChanged):
        knob = data.knob.upper()
        state.overrides[knob] = data.value
        if knob.startswith("CONCURRENCY_LIMIT_DEFAULT") or knob.endswith("_LIMIT"):
            touched |= set(state.announced)
            if knob.endswith("_LIMIT") and not knob.startswith("CONCURRENCY_LIMIT_DEFAULT"):
                name = knob[: -len("_LIMIT")].lower()
                try:
                    touched.add(_parse_token(name).name)
                except ConcurrencyLimitError:
                    pass
    return _announce(state, cfg, touched, env.id) if touched else []
