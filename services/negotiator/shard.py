"""Named negotiators with separate accounting (sharding), as pure event routing.

HTCondor can run several negotiators against one collector ("Running Multiple Negotiators in
One Pool"): each owns a non-overlapping partition of the slots, chosen by its own
NEGOTIATOR_SLOT_CONSTRAINT, and each has its own accountant, so usage of the non-GPU machines
never counts against fair share on the GPU machines. `condor_userprio -name NEG` asks one of
them.

PoolLedger keeps one log. A negotiator's accountant is a `Ledger` that folds only the events
that belong to that negotiator; `ShardFilter.route` decides that event by event:

- slot ads (`ad.updated` of a Machine ad) whose ad satisfies the shard's slot constraint
  (evaluated by classad2 with the slot ad as MY, as the matchmaker evaluates
  NEGOTIATOR_SLOT_CONSTRAINT); the filter remembers which slots are in the shard. A dynamic
  slot belongs to the shard of its partitionable slot (that negotiator carved it). A slot
  whose new ad no longer satisfies the constraint leaves the shard: the shard's ledger gets an
  `ad.invalidated` in place of that update (same id, so deduplication is unchanged);
  `ad.invalidated` of a shard slot;
- `job.started` on a slot of the shard, and the `job.stopped` that ends a job started there
  (a stop follows its start even when the slot has left the shard since, so usage never leaks);
- `match` and `negotiation.cycle` events of this negotiator (by name, see `names`);
- `admin.command` events addressed to this negotiator, or to none (see below);
- `config.changed`, `job.submitted`, `job.history` and ads of other types go to every shard;
  derived events go to none (ledgers derive them themselves).

How a command names its negotiator (no schema change): `AdminCommanded.target` stays the
submitter; the negotiator is recorded in the envelope's `source` after a slash,
`<tool>@<host>/<negotiator>` (e.g. `userprio@cm.example.org/gpu`, see `admin_source`). A
command whose source names no negotiator applies to every shard.

How shards are defined (no schema change): two ordinary config knobs, read from wherever
the configuration comes from — the scenario's `[config]` (or its `[[negotiators]]` tables,
which expand into these knobs), PoolLedger's config files, and `config.changed` on the log:

    NEGOTIATOR_NAMES = gpu, cpu
    NEGOTIATOR_SLOT_CONSTRAINT_GPU = TotalGPUs > 0
    NEGOTIATOR_SLOT_CONSTRAINT_CPU = (TotalGPUs ?: 0) == 0

Negotiator `gpu` publishes its events as `gpu@<central manager>`. Because the simulated pool
records its configuration on the log before any slot ad, replaying the log through the same
filter rebuilds exactly the accountant the run's negotiator had (`poolledger userprio -name`).
A constraint changed by `config.changed` takes effect for each slot at its next ad update.
"""
from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from schemas.classads import Value, compile_expr, evaluate
from schemas.config import SettingsLike
from schemas.errors import ClassAdError
from schemas.events import (DERIVED_TYPES, AdInvalidated, AdminCommanded, AdUpdated, ConfigChanged,
                            Envelope, JobStarted, JobStopped, Matched, NegotiationCycled)
from streams.core.ledger import Ledger

__all__ = [
    "Shard", "ShardFilter", "NAMES_KNOB", "constraint_knob", "shards_from_knobs",
    "shards_from_config", "shards_from_settings", "negotiator_name", "names",
    "admin_source", "admin_negotiator", "negotiation_view", "filter_events",
    "select_negotiator", "unknown_negotiator",
]

#: The knob listing the named negotiators, and the prefix of each one's slot constraint.
NAMES_KNOB = "NEGOTIATOR_NAMES"
CONSTRAINT_PREFIX = "NEGOTIATOR_SLOT_CONSTRAINT_"
#: the one negotiator of a pool without NEGOTIATOR_NAMES (services.negotiator.service)
DEFAULT_NAME = "negotiator"
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_DYNAMIC = re.compile(r"(.+)_\d+@(.*)\Z")


@dataclass(frozen=True, slots=True)
class Shard:
    """A named negotiator and the constraint choosing its slots (None: every slot)."""

    name: str
    slot_constraint: str | None = None

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise ValueError(f"negotiator name {self.name!r}: letters, digits and _ only")
        if self.slot_constraint is not None:
            try:
                compile_expr(self.slot_constraint)
            except ClassAdError as exc:
                raise ValueError(f"{constraint_knob(self.name)}: {exc.reason}") from None


def constraint_knob(name: str) -> str:
    """The knob holding negotiator `name`'s slot constraint."""
    return CONSTRAINT_PREFIX + name.upper()


def _text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bool):
        return "True" if value else "False"
    if isinstance(value, (tuple, list)):
        value = ", ".join(str(v) for v in value)
    text = str(value).strip()
    return text or None


def shards_from_knobs(lookup: Callable[[str], Any]) -> list[Shard]:
    """Shards from NEGOTIATOR_NAMES and NEGOTIATOR_SLOT_CONSTRAINT_<NAME> (`lookup` gives a
    knob's value or None); none when NEGOTIATOR_NAMES is unset or empty."""
    listed = _text(lookup(NAMES_KNOB))
    if listed is None:
        return []
    out: list[Shard] = []
    for name in (n for n in re.split(r"[\s,]+", listed) if n):
        if any(s.name.lower() == name.lower() for s in out):
            raise ValueError(f"{NAMES_KNOB}: negotiator {name!r} listed twice")
        out.append(Shard(name, _text(lookup(constraint_knob(name)))))
    return out


def shards_from_config(config: Mapping[str, Any]) -> list[Shard]:
    """Shards from a table of knobs (a scenario's `[config]`), knob names case-insensitive."""
    upper = {k.upper(): v for k, v in config.items()}
    return shards_from_knobs(lambda k: upper.get(k.upper()))


def shards_from_settings(settings: SettingsLike) -> list[Shard]:
    """Shards from PoolLedger's settings; none when the knobs are not set (they are not
    declared knobs, so an unset one is an unknown name to the settings)."""
    def lookup(knob: str) -> Any:
        try:
            return settings.get(knob)
        except Exception:  # noqa: BLE001 - UnknownKnobError: not set anywhere
            return None
    return shards_from_knobs(lookup)


def negotiator_name(shard: str, central_manager: str) -> str:
    """The daemon name a shard's negotiator publishes its events as."""
    return f"{shard}@{central_manager}"


def names(negotiator: str, name: str) -> bool:
    """Whether an event's `negotiator` (a daemon name) is negotiator `name` (a shard name or a
    full daemon name), case-insensitively."""
    neg, want = negotiator.lower(), name.lower()
    return neg == want or ("@" not in want and neg.partition("@")[0] == want)


def admin_source(base: str, negotiator: str | None) -> str:
    """The envelope source of an admin command from `base` (`tool@host`) for `negotiator`."""
    return f"{base}/{negotiator}" if negotiator else base


def admin_negotiator(source: str) -> str | None:
    """The negotiator an admin command's source names, or None (every negotiator)."""
    _, sep, neg = source.rpartition("/")
    return neg if sep and neg else None


def _true(value: Any) -> bool:
    """A definite true, as matchmaking reads a constraint (numbers nonzero)."""
    if isinstance(value, Value):  # UNDEFINED / ERROR are IntEnum members: test them first
        return False
    if isinstance(value, bool):
        return value
    return isinstance(value, (int, float)) and value != 0


@dataclass
class ShardFilter:
    """Which events belong to one negotiator's accounting (see the module docstring).

    Stateful but pure: its state (the shard's slots, the jobs started in it, the constraint
    in force) is a function of the events routed so far, so a replay rebuilds it.
    """

    shard: Shard
    slots: set[str] = field(default_factory=set)
    #: slot -> job id of the jobs started on a shard slot and not stopped yet
    running: dict[str, str] = field(default_factory=dict)
    #: whether this negotiator's definition was seen (given, or in a config.changed)
    defined: bool = False
    #: the negotiators NEGOTIATOR_NAMES lists on the log (for messages)
    listed: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        self.constraint = self.shard.slot_constraint
        self.defined = self.defined or self.constraint is not None

    @property
    def name(self) -> str:
        return self.shard.name

    def in_shard(self, name: str, ad: Mapping[str, Any]) -> bool:
        """Whether the slot `name` with `ad` belongs to this shard now."""
        if ad.get("DynamicSlot") is True:
            m = _DYNAMIC.match(name)
            if m is not None:
                return f"{m.group(1)}@{m.group(2)}" in self.slots
        if self.constraint is None:
            return True
        try:
            return _true(evaluate(self.constraint, my=ad))
        except (ClassAdError, ValueError, TypeError):
            return False

    def _owns_slot(self, slot: str) -> bool:
        if slot in self.slots:
            return True
        m = _DYNAMIC.match(slot)
        return m is not None and f"{m.group(1)}@{m.group(2)}" in self.slots

    def route(self, env: Envelope) -> Envelope | None:
        """The event this shard's ledger folds for `env` (itself, or an `ad.invalidated`
        in place of the update of a slot that left the shard), or None."""
        d = env.data
        if env.type in DERIVED_TYPES:
            return None
        if isinstance(d, AdUpdated):
            if d.ad_type.lower() != "machine":
                return env
            if self.in_shard(d.name, d.ad):
                self.slots.add(d.name)
                return env
            if d.name in self.slots:
                self.slots.discard(d.name)
                gone = AdInvalidated(ad_type=d.ad_type, name=d.name)
                return Envelope(env.id, gone.TYPE, gone.VERSION, env.ts, env.source, env.seq,
                                gone)
            return None
        if isinstance(d, AdInvalidated):
            if d.ad_type.lower() != "machine":
                return env
            if d.name in self.slots:
                self.slots.discard(d.name)
                return env
            return None
        if isinstance(d, JobStarted):
            if self._owns_slot(d.slot):
                self.running[d.slot] = d.job_id
                return env
            self.running.pop(d.slot, None)  # the slot's earlier job (if ours) is gone
            return None
        if isinstance(d, JobStopped):
            job = self.running.get(d.slot)
            if job is not None:
                if not d.job_id or d.job_id == job:
                    del self.running[d.slot]
                return env
            return env if d.slot in self.slots else None
        if isinstance(d, (Matched, NegotiationCycled)):
            return env if names(d.negotiator, self.name) else None
        if isinstance(d, AdminCommanded):
            neg = admin_negotiator(env.source)
            return env if neg is None or names(neg, self.name) else None
        if isinstance(d, ConfigChanged):
            knob = d.knob.upper()
            if knob == constraint_knob(self.name):
                self.constraint = _text(d.value)
                self.defined = True
            elif knob == NAMES_KNOB:
                self.listed = tuple(n for n in re.split(r"[\s,]+", d.value) if n)
                self.defined = self.defined or any(n.lower() == self.name.lower()
                                                   for n in self.listed)
        return env

    def accepts(self, env: Envelope) -> bool:
        """Whether `env` belongs to this negotiator's accounting (updates the filter's state:
        call it once per event, in log order)."""
        return self.route(env) is not None


def filter_events(events: Iterable[Envelope], flt: ShardFilter) -> Iterable[Envelope]:
    """The events a shard's ledger folds, in log order."""
    for env in events:
        routed = flt.route(env)
        if routed is not None:
            yield routed


def select_negotiator(events: Iterable[Envelope], name: str | None, settings: SettingsLike | None = None
                      ) -> tuple[Iterable[Envelope], ShardFilter | None]:
    """The events negotiator `name` (a shard name or its daemon name `name@host`) accounts,
    for `poolledger userprio -name` and friends; `events` unchanged when `name` is None.

    Its slot constraint comes from PoolLedger's settings when they define it, and in any case
    from `config.changed` on the log (a run records its scenario's configuration there). Call
    `unknown_negotiator` once the events were consumed.
    """
    if not name:
        return events, None
    shard = name.partition("@")[0]
    if not _NAME.match(shard):
        raise ValueError(f"not a negotiator name: {name!r}")
    known = {s.name.lower(): s for s in (shards_from_settings(settings) if settings else [])}
    flt = ShardFilter(known.get(shard.lower(), Shard(shard)))
    if shard.lower() in known:
        flt.defined = True
    return filter_events(events, flt), flt


def unknown_negotiator(flt: ShardFilter | None, name: str | None) -> str | None:
    """Why `name` names no negotiator of the replayed log (None when it does): it must be
    listed in NEGOTIATOR_NAMES, or, without named negotiators, be the default one."""
    if flt is None or flt.defined:
        return None
    if not flt.listed and flt.name.lower() == DEFAULT_NAME:
        return None
    have = ", ".join(flt.listed) if flt.listed else f"{DEFAULT_NAME} (no {NAMES_KNOB} on the log)"
    return f"no negotiator {name!r} (negotiators: {have})"


def negotiation_view(shard_ledger: Ledger, demand: Ledger) -> Ledger:
    """What one negotiator's cycle reads: its own slots, accountant, quotas and limits from
    its shard's ledger, and which jobs are idle from the pool-wide ledger (`demand`).

    A job running on another negotiator's slot is not idle (HTCondor's schedd offers only
    idle jobs to every negotiator); the shard's own demand fold cannot know that, since it
    never sees other shards' job starts. A shallow copy: nothing is copied but references.
    """
    return shard_ledger.with_demand_of(demand)
