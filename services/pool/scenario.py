"""Scenario files: a pool (machines, schedds, config) and its workload, in JSON or TOML.

A scenario says what a real pool would have been given: execute machines with their
condor_config (slot types, START/RANK and the rest of the policy), access points, submitters
with accounting groups and job streams (arrivals, run times, requests, requirements, ranks,
priorities, concurrency limits), and admin actions at given times (condor_userprio edits,
config changes, owner activity, condor_vacate/drain/off, schedd outages, condor_rm/hold/prio).
Every problem is a ScenarioError naming the file and the key path, e.g.
`fairshare.toml: submitters[1].jobs[0].duration.kind: unknown distribution 'normal'`.

Times and durations are seconds or strings such as "90s", "15m", "48h", "2d", "1h30m";
`at` times are relative to the scenario's `start`.
"""
from __future__ import annotations

import json
import math
import random
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from schemas.events import ADMIN_OPS
from services.pool.errors import ScenarioError
from streams.core.userprio_ops import AdminCommandError, check_issued

DEFAULT_START = 1763800000.0
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*([smhdw]?)")
_HOST = re.compile(r"[A-Za-z0-9][A-Za-z0-9.\-]*\Z")
_USER = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]*\Z")
_GROUP = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]*\Z")

ACTION_KINDS = ("userprio", "config", "machine_attrs", "owner_active", "vacate", "drain",
                "cancel_drain", "startd_off", "startd_on", "schedd_down", "schedd_up",
                "remove", "hold", "release", "prio")


@dataclass(frozen=True, slots=True)
class Distribution:
    """A run-time distribution: fixed, exponential (mean) or uniform (low, high); seconds."""

    kind: str
    a: float
    b: float = 0.0
    minimum: float = 1.0

    def sample(self, rng: random.Random) -> float:
        """One draw (never below `minimum`), from the stream's own seeded generator."""
        if self.kind == "fixed":
            value = self.a
        elif self.kind == "exponential":
            value = rng.expovariate(1.0 / self.a)
        else:
            value = rng.uniform(self.a, self.b)
        return max(self.minimum, round(value, 3))


@dataclass(frozen=True, slots=True)
class Arrival:
    """When jobs arrive: one batch at `at`; a Poisson stream (`rate` per hour); or every
    `every` seconds. Each arrival is one cluster of `size` jobs; `count` caps arrivals."""

    kind: str
    at: float = 0.0
    size: int = 1
    rate: float = 0.0
    every: float = 0.0
    start: float = 0.0
    stop: float | None = None
    count: int | None = None


@dataclass(frozen=True, slots=True)
class JobSpec:
    """A stream of identical submit descriptions."""

    arrival: Arrival
    duration: Distribution
    request_cpus: int = 1
    request_memory: int = 128
    request_disk: int = 1024
    request: dict[str, int] = field(default_factory=dict)
    requirements: str | None = None
    rank: str | None = None
    priority: int = 0
    concurrency_limits: str | None = None
    max_retirement_time: float | None = None
    job_max_vacate_time: float | None = None
    job_lease_duration: float | None = 2400.0
    vacate_time: float = 0.0
    kill_sig: str = "SIGTERM"
    exit_code: int = 0
    cmd: str = "/bin/sleep"
    args: str = ""
    attrs: dict[str, Any] = field(default_factory=dict)
    on_exit_remove: bool = True
    cron: dict[str, str] = field(default_factory=dict)
    deferral_time: str | None = None
    deferral_window: float | None = None
    deferral_prep_time: float | None = None
    cpu_efficiency: float | None = None  # CPU time per core-second running; None: not reported


@dataclass(frozen=True, slots=True)
class SubmitterSpec:
    """A user submitting at a schedd, possibly in an accounting group or as a nice user."""

    user: str
    schedd: str
    group: str | None
    group_user: str | None
    nice_user: bool
    jobs: tuple[JobSpec, ...]


@dataclass(frozen=True, slots=True)
class MachineSpec:
    """`count` identical execute machines named by `name` (with `{n}` for 1..count)."""

    name: str
    count: int
    first: int
    cpus: int
    memory: int
    disk: int
    swap: int | None
    gpus: int
    config: dict[str, Any]
    attrs: dict[str, Any]

    def hosts(self) -> list[str]:
        """The machines' host names."""
        return [self.name.format(n=i) for i in range(self.first, self.first + self.count)]


@dataclass(frozen=True, slots=True)
class Action:
    """An admin or environment action at `at` seconds after the start."""

    at: float
    kind: str
    params: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Scenario:
    """A whole scenario, validated."""

    path: str
    name: str
    start: float
    duration: float
    uid_domain: str
    central_manager: str
    config: dict[str, Any]
    machines: tuple[MachineSpec, ...]
    schedds: tuple[str, ...]
    submitters: tuple[SubmitterSpec, ...]
    actions: tuple[Action, ...]
    claim_delay: float = 0.0
    periodic_slot_updates: bool = False
    emit_config: bool = True

    @property
    def end(self) -> float:
        """Epoch second the simulation runs to."""
        return self.start + self.duration


class _Reader:
    """Typed access to a parsed document; every failure names the file and key path."""

    def __init__(self, path: str) -> None:
        self.path = path

    def fail(self, key: str, reason: str) -> ScenarioError:
        return ScenarioError(reason, path=self.path, key=key)

    def table(self, obj: Any, key: str, allowed: tuple[str, ...]) -> dict[str, Any]:
        if not isinstance(obj, dict):
            raise self.fail(key, f"expected a table, got {type(obj).__name__}")
        for k in obj:
            if k not in allowed:
                raise self.fail(f"{key}.{k}" if key else k,
                                f"unknown key (expected one of: {', '.join(allowed)})")
        return obj

    def array(self, obj: Any, key: str) -> list[Any]:
        if not isinstance(obj, list):
            raise self.fail(key, f"expected an array, got {type(obj).__name__}")
        return obj

    def string(self, obj: Mapping[str, Any], name: str, key: str, default: str | None = None,
               pattern: re.Pattern[str] | None = None) -> str:
        value = obj.get(name, default)
        if not isinstance(value, str) or not value:
            if value is None:
                raise self.fail(f"{key}.{name}", "required")
            raise self.fail(f"{key}.{name}", f"expected a non-empty string, got {value!r}")
        if pattern is not None and not pattern.match(value):
            raise self.fail(f"{key}.{name}", f"invalid name {value!r}")
        return value

    def opt_string(self, obj: Mapping[str, Any], name: str, key: str,
                   pattern: re.Pattern[str] | None = None) -> str | None:
        if obj.get(name) is None:
            return None
        return self.string(obj, name, key, pattern=pattern)

    def number(self, obj: Mapping[str, Any], name: str, key: str, default: float | None = None,
               minimum: float | None = None, integer: bool = False) -> float:
        value = obj.get(name, default)
        if value is None:
            raise self.fail(f"{key}.{name}", "required")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise self.fail(f"{key}.{name}", f"expected a number, got {value!r}")
        if integer and float(value) != int(value):
            raise self.fail(f"{key}.{name}", f"expected a whole number, got {value!r}")
        if minimum is not None and value < minimum:
            raise self.fail(f"{key}.{name}", f"must be at least {minimum:g}, got {value!r}")
        return float(value)

    def boolean(self, obj: Mapping[str, Any], name: str, key: str, default: bool) -> bool:
        value = obj.get(name, default)
        if not isinstance(value, bool):
            raise self.fail(f"{key}.{name}", f"expected true or false, got {value!r}")
        return value

    def seconds(self, obj: Mapping[str, Any], name: str, key: str, default: float | None = None,
                minimum: float = 0.0) -> float:
        value = obj.get(name, default)
        if value is None:
            raise self.fail(f"{key}.{name}", "required")
        secs = parse_duration(value)
        if secs is None:
            raise self.fail(f"{key}.{name}", f"expected seconds or a duration like '15m', got {value!r}")
        if secs < minimum:
            raise self.fail(f"{key}.{name}", f"must be at least {minimum:g} s, got {value!r}")
        return secs

    def knobs(self, obj: Any, key: str) -> dict[str, Any]:
        if obj is None:
            return {}
        if not isinstance(obj, dict):
            raise self.fail(key, "expected a table of knob = value")
        for k, v in obj.items():
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.]*", k):
                raise self.fail(f"{key}.{k}", "not a valid knob name")
            if isinstance(v, (dict, list)) or v is None:
                raise self.fail(f"{key}.{k}", "a knob value must be a string, number or boolean")
        return dict(obj)

    def attrs(self, obj: Any, key: str) -> dict[str, Any]:
        if obj is None:
            return {}
        if not isinstance(obj, dict):
            raise self.fail(key, "expected a table of Attribute = value")
        for k, v in obj.items():
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k):
                raise self.fail(f"{key}.{k}", "not a valid ClassAd attribute name")
            if isinstance(v, (dict, list)) or v is None:
                raise self.fail(f"{key}.{k}", "an attribute value must be a string, number or boolean")
        return dict(obj)


def parse_duration(value: Any) -> float | None:
    """Seconds from a number or a string like '90', '15m', '48h', '1h30m'; None when invalid."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value) if math.isfinite(value) else None
    if not isinstance(value, str):
        return None
    text = value.strip().lower().replace(" ", "")
    if not text or _DURATION.sub("", text):
        return None
    return float(sum(float(n) * _UNIT[u or "s"] for n, u in _DURATION.findall(text)))


def _expression(r: _Reader, obj: Mapping[str, Any], name: str, key: str) -> str | None:
    text = r.opt_string(obj, name, key)
    if text is None:
        return None
    import classad2

    from schemas.classads import nondeterministic

    try:
        probe = classad2.ClassAd(f"[__x = ({text}\n)]")
        ok = "__x" in probe
    except Exception:
        ok = False
    if not ok:
        raise r.fail(f"{key}.{name}", f"not a ClassAd expression: {text!r}")
    found = nondeterministic(text)
    if found:
        raise r.fail(f"{key}.{name}", f"calls {found}, which is nondeterministic: two runs of "
                                      "one seed would differ")
    return text


def _distribution(r: _Reader, value: Any, key: str) -> Distribution:
    if not isinstance(value, dict):
        secs = parse_duration(value)
        if secs is None or secs <= 0:
            raise r.fail(key, f"expected a duration or a table with kind, got {value!r}")
        return Distribution("fixed", secs)
    t = r.table(value, key, ("kind", "seconds", "mean", "low", "high", "min"))
    kind = r.string(t, "kind", key)
    minimum = r.seconds(t, "min", key, 1.0)
    if kind == "fixed":
        return Distribution("fixed", r.seconds(t, "seconds", key, minimum=0.001), minimum=minimum)
    if kind == "exponential":
        return Distribution("exponential", r.seconds(t, "mean", key, minimum=0.001), minimum=minimum)
    if kind == "uniform":
        low = r.seconds(t, "low", key)
        high = r.seconds(t, "high", key)
        if high < low:
            raise r.fail(f"{key}.high", "must not be below low")
        return Distribution("uniform", low, high, minimum=minimum)
    raise r.fail(f"{key}.kind", f"unknown distribution {kind!r} (fixed, exponential, uniform)")


def _arrival(r: _Reader, value: Any, key: str) -> Arrival:
    t = r.table(value, key, ("kind", "at", "count", "size", "rate", "every", "start", "stop"))
    kind = r.string(t, "kind", key)
    size = int(r.number(t, "size", key, 1, minimum=1, integer=True))
    count = int(r.number(t, "count", key, minimum=1, integer=True)) if "count" in t else None
    stop = r.seconds(t, "stop", key) if "stop" in t else None
    if kind == "batch":
        for bad in ("rate", "every", "start", "stop"):
            if bad in t:
                raise r.fail(f"{key}.{bad}", "not used by a batch arrival")
        n = int(r.number(t, "count", key, 1, minimum=1, integer=True))
        return Arrival("batch", at=r.seconds(t, "at", key, 0.0), size=n * size)
    if kind == "poisson":
        return Arrival("poisson", size=size, rate=r.number(t, "rate", key, minimum=1e-9),
                       start=r.seconds(t, "start", key, 0.0), stop=stop, count=count)
    if kind == "periodic":
        return Arrival("periodic", size=size, every=r.seconds(t, "every", key, minimum=1.0),
                       start=r.seconds(t, "start", key, 0.0), stop=stop, count=count)
    raise r.fail(f"{key}.kind", f"unknown arrival {kind!r} (batch, poisson, periodic)")


_JOB_KEYS = ("arrival", "duration", "request_cpus", "request_memory", "request_disk", "request",
             "requirements", "rank", "priority", "concurrency_limits", "max_retirement_time",
             "job_max_vacate_time", "job_lease_duration", "vacate_time", "kill_sig", "exit_code",
             "cmd", "args", "attrs", "on_exit_remove", "cron_minute", "cron_hour",
             "cron_day_of_month", "cron_month", "cron_day_of_week", "cron_window", "cron_prep_time",
             "deferral_time", "deferral_window", "deferral_prep_time", "cpu_efficiency")


def _deferral(r: _Reader, t: Mapping[str, Any], key: str) -> dict[str, Any]:
    """condor_submit's deferral and CronTab commands (seed 003); cron_window and
    cron_prep_time are the deferral window and prep time of a CronTab job."""
    from services.pool.crontab import CronTab, CronTabError

    cron: dict[str, str] = {}
    for name in ("minute", "hour", "day_of_month", "month", "day_of_week"):
        value = t.get(f"cron_{name}")
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (str, int)):
            raise r.fail(f"{key}.cron_{name}", f"expected a crontab value like '*/10', got {value!r}")
        cron[name] = str(value)
    try:
        CronTab.parse(cron)
    except CronTabError as exc:
        raise r.fail(f"{key}.cron_{exc.field}", str(exc)) from None
    deferral = t.get("deferral_time")
    if deferral is not None:
        if cron:
            raise r.fail(f"{key}.deferral_time", "give either deferral_time or cron_* commands, not both")
        if isinstance(deferral, (int, float)) and not isinstance(deferral, bool):
            deferral = str(int(r.number(t, "deferral_time", key, minimum=0)))
        deferral = _expression(r, {"deferral_time": deferral}, "deferral_time", key)
    out: dict[str, Any] = {"cron": cron, "deferral_time": deferral}
    for name, alias in (("deferral_window", "cron_window"), ("deferral_prep_time", "cron_prep_time")):
        given = [n for n in (name, alias) if n in t]
        if len(given) == 2:
            raise r.fail(f"{key}.{alias}", f"give either {name} or {alias}, not both")
        out[name] = r.seconds(t, given[0], key) if given else None
    return out


def _job(r: _Reader, value: Any, key: str) -> JobSpec:
    t = r.table(value, key, _JOB_KEYS)
    if "arrival" not in t:
        raise r.fail(f"{key}.arrival", "required")
    if "duration" not in t:
        raise r.fail(f"{key}.duration", "required")
    request: dict[str, int] = {}
    if "request" in t:
        req = t["request"]
        if not isinstance(req, dict):
            raise r.fail(f"{key}.request", "expected a table of resource = amount")
        for name in req:
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
                raise r.fail(f"{key}.request.{name}", "not a resource name")
            attr = "GPUs" if name.lower() == "gpus" else name[:1].upper() + name[1:]
            request[attr] = int(r.number(req, name, f"{key}.request", minimum=0,
                                                                 integer=True))
    limits = r.opt_string(t, "concurrency_limits", key)
    if limits is not None:
        for token in (x.strip() for x in limits.split(",")):
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)?(:\d+(\.\d+)?)?", token):
                raise r.fail(f"{key}.concurrency_limits", f"bad limit {token!r} (name[.sub][:increment])")
    return JobSpec(
        arrival=_arrival(r, t["arrival"], f"{key}.arrival"),
        duration=_distribution(r, t["duration"], f"{key}.duration"),
        request_cpus=int(r.number(t, "request_cpus", key, 1, minimum=1, integer=True)),
        request_memory=int(r.number(t, "request_memory", key, 128, minimum=0, integer=True)),
        request_disk=int(r.number(t, "request_disk", key, 1024, minimum=0, integer=True)),
        request=request,
        requirements=_expression(r, t, "requirements", key),
        rank=_expression(r, t, "rank", key),
        priority=int(r.number(t, "priority", key, 0, integer=True)),
        concurrency_limits=limits,
        max_retirement_time=r.seconds(t, "max_retirement_time", key) if "max_retirement_time" in t else None,
        job_max_vacate_time=r.seconds(t, "job_max_vacate_time", key) if "job_max_vacate_time" in t else None,
        job_lease_duration=r.seconds(t, "job_lease_duration", key, 2400.0) or None,
        vacate_time=(math.inf if t.get("vacate_time") == "never" else
                     r.seconds(t, "vacate_time", key, 0.0)),
        kill_sig=r.string(t, "kill_sig", key, "SIGTERM"),
        exit_code=int(r.number(t, "exit_code", key, 0, integer=True)),
        cmd=r.string(t, "cmd", key, "/bin/sleep"),
        args=str(t.get("args", "")),
        attrs=r.attrs(t.get("attrs"), f"{key}.attrs"),
        on_exit_remove=r.boolean(t, "on_exit_remove", key, True),
        cpu_efficiency=(r.number(t, "cpu_efficiency", key, minimum=0.0)
                        if "cpu_efficiency" in t else None),
        **_deferral(r, t, key),
    )


def _machine(r: _Reader, value: Any, key: str) -> MachineSpec:
    t = r.table(value, key, ("name", "count", "first", "cpus", "memory", "disk", "swap", "gpus",
                             "config", "attrs"))
    name = r.string(t, "name", key)
    probe = name.replace("{n}", "1")
    if not _HOST.match(re.sub(r"\{n:[^}]*\}", "1", probe)):
        raise r.fail(f"{key}.name", f"not a host name pattern: {name!r}")
    count = int(r.number(t, "count", key, 1, minimum=1, integer=True))
    try:
        name.format(n=1)
    except (KeyError, IndexError, ValueError):
        raise r.fail(f"{key}.name", f"bad pattern {name!r} (use {{n}} or {{n:02d}})") from None
    if count > 1 and name.format(n=1) == name.format(n=2):
        raise r.fail(f"{key}.name", f"{count} machines need a {{n}} in the name pattern")
    return MachineSpec(
        name=name, count=count, first=int(r.number(t, "first", key, 1, minimum=0, integer=True)),
        cpus=int(r.number(t, "cpus", key, 1, minimum=1, integer=True)),
        memory=int(r.number(t, "memory", key, 1024, minimum=1, integer=True)),
        disk=int(r.number(t, "disk", key, 10_000_000, minimum=1, integer=True)),
        swap=int(r.number(t, "swap", key, minimum=0, integer=True)) if "swap" in t else None,
        gpus=int(r.number(t, "gpus", key, 0, minimum=0, integer=True)),
        config=r.knobs(t.get("config"), f"{key}.config"),
        attrs=r.attrs(t.get("attrs"), f"{key}.attrs"),
    )


#: Knobs holding ClassAd expressions a startd evaluates; a typo fails at load time.
_EXPR_KNOBS = ("START", "IS_OWNER", "RANK", "WANT_SUSPEND", "WANT_VACATE", "SUSPEND", "CONTINUE",
               "PREEMPT", "KILL", "MAXJOBRETIREMENTTIME", "MachineMaxVacateTime", "SLOT_WEIGHT",
               "START_BACKFILL", "EVICT_BACKFILL")


def _check_machine(r: _Reader, m: MachineSpec, pool: dict[str, Any], key: str) -> None:
    """Build the machine's slots and compile its policy as its startd would, so a bad layout
    or expression is a ScenarioError at load time naming the knob's key."""
    from schemas.classads import expr
    from schemas.errors import ClassAdError, ConfigError
    from schemas.settings import DaemonConfig
    from services.pool.errors import PoolConfigError
    from services.pool.slots import detect, layout
    from services.pool.startd import startd_attr_knobs

    config = DaemonConfig(pool, m.config)

    def where(knob: str | None) -> str:
        for name in m.config:
            if knob and name.upper() == knob.upper():
                return f"{key}.config.{name}"
        for name in pool:
            if knob and name.upper() == knob.upper():
                return f"config.{name}"
        return f"{key}.config" + (f".{knob}" if knob else "")

    try:
        specs = layout(config, detect(config, cpus=m.cpus, memory=m.memory, disk=m.disk,
                                      swap=m.swap, gpus=m.gpus))
    except (PoolConfigError, ConfigError) as exc:
        raise r.fail(where(exc.knob), exc.reason) from None
    for spec in specs:
        weight = f"SLOT_TYPE_{spec.slot_type}_SLOT_WEIGHT"
        if spec.slot_type > 0 and (config.get(weight) or "").strip():
            try:
                expr(config.get(weight) or "")
            except PoolConfigError as exc:
                raise r.fail(where(weight), exc.reason) from None
        for knob in startd_attr_knobs(config, spec.slot_id, spec.slot_type).values():
            try:
                expr(config.get(knob) or "")
            except ClassAdError as exc:
                raise r.fail(where(knob), exc.reason) from None
    for knob in _EXPR_KNOBS:
        for name in (knob, f"{knob}_VANILLA"):
            try:
                text = config.get(name)
                if text is not None and text.strip():
                    expr(text)
            except (ClassAdError, ConfigError) as exc:
                raise r.fail(where(name), exc.reason) from None


def _check_schedd_policy(r: _Reader, pool: dict[str, Any]) -> None:
    """Compile the job transforms and submit requirements as the schedd would (and read
    the userMap files), so a mistake is a ScenarioError at load time naming the knob."""
    from schemas.settings import DaemonConfig
    from services.pool.errors import PoolConfigError
    from services.pool.submit_policy import job_transforms, submit_requirements

    try:
        submit_requirements(DaemonConfig(pool))
        job_transforms(DaemonConfig(pool))
    except PoolConfigError as exc:
        knob = next((k for k in pool if exc.knob and k.upper() == exc.knob.upper()), exc.knob)
        raise r.fail(f"config.{knob}", exc.reason) from None


def _check_defrag(r: _Reader, pool: dict[str, Any]) -> None:
    """condor_defrag's knobs, checked as the daemon would at startup (a ScenarioError naming
    the knob)."""
    from services.pool.clock import VirtualClock
    from schemas.settings import DaemonConfig
    from services.pool.defrag import Defrag, enabled
    from services.pool.errors import PoolConfigError

    config = DaemonConfig(pool)
    if not enabled(config):
        return
    try:
        Defrag("check", config, VirtualClock(0.0), [], _NoPool())
    except PoolConfigError as exc:
        knob = next((k for k in pool if exc.knob and k.upper() == exc.knob.upper()), exc.knob)
        raise r.fail(f"config.{knob}", exc.reason) from None


class _NoPool:
    """An empty pool for checking condor_defrag's configuration."""

    def slot_ads(self) -> list[dict[str, Any]]:
        return []

    def startd_for(self, slot: str) -> None:
        return None


def _submitter(r: _Reader, value: Any, key: str, schedds: tuple[str, ...]) -> SubmitterSpec:
    t = r.table(value, key, ("user", "schedd", "group", "group_user", "nice_user", "jobs"))
    user = r.string(t, "user", key, pattern=_USER)
    schedd = r.string(t, "schedd", key, schedds[0])
    if schedd not in schedds:
        raise r.fail(f"{key}.schedd", f"no schedd {schedd!r} (have {', '.join(schedds)})")
    jobs = r.array(t.get("jobs", []), f"{key}.jobs")
    return SubmitterSpec(
        user=user, schedd=schedd,
        group=r.opt_string(t, "group", key, pattern=_GROUP),
        group_user=r.opt_string(t, "group_user", key, pattern=_USER),
        nice_user=r.boolean(t, "nice_user", key, False),
        jobs=tuple(_job(r, j, f"{key}.jobs[{i}]") for i, j in enumerate(jobs)),
    )


_ACTION_KEYS: dict[str, tuple[str, ...]] = {
    "userprio": ("op", "target", "value", "by", "reason", "duration", "negotiator"),
    "config": ("knob", "value", "by"),
    "machine_attrs": ("machines", "attrs"),
    "owner_active": ("machines", "for"),
    "vacate": ("machines",),
    "drain": ("machines", "graceful", "schedule", "resume_on_completion", "reason"),
    "cancel_drain": ("machines",),
    "startd_off": ("machines", "fast"),
    "startd_on": ("machines",),
    "schedd_down": ("schedd",),
    "schedd_up": ("schedd",),
    "remove": ("user", "schedd", "count", "by"),
    "hold": ("user", "schedd", "count", "by"),
    "release": ("user", "schedd", "count", "by"),
    "prio": ("user", "schedd", "count", "value"),
}


def _action(r: _Reader, value: Any, key: str, schedds: tuple[str, ...]) -> Action:
    if not isinstance(value, dict):
        raise r.fail(key, "expected a table")
    kind = r.string(value, "kind", key)
    if kind not in _ACTION_KEYS:
        raise r.fail(f"{key}.kind", f"unknown action {kind!r} ({', '.join(ACTION_KINDS)})")
    t = r.table(value, key, ("at", "kind") + _ACTION_KEYS[kind])
    at = r.seconds(t, "at", key)
    params: dict[str, Any] = {k: v for k, v in t.items() if k not in ("at", "kind")}
    if kind == "userprio":
        op = r.string(t, "op", key)
        if op not in ADMIN_OPS:
            raise r.fail(f"{key}.op", f"unknown condor_userprio op {op!r} ({', '.join(ADMIN_OPS)})")
        target = r.string(t, "target", key)
        if op != "resetall" and "@" not in target:
            raise r.fail(f"{key}.target", f"a submitter name needs '@' (e.g. {target}@example.org)")
        if "value" in t and (isinstance(t["value"], bool) or not isinstance(t["value"], (int, float, str))):
            raise r.fail(f"{key}.value", "expected a number or string")
        if op in ("setfactor", "setprio", "setaccum", "setceil", "setfloor") and "value" not in t:
            raise r.fail(f"{key}.value", f"required for {op}")
        if op == "setfactor" and r.number(t, "value", key) < 1:
            raise r.fail(f"{key}.value", "a priority factor must be at least 1")
        try:
            check_issued(op, t.get("value"))
        except AdminCommandError as exc:
            raise r.fail(f"{key}.value", str(exc)) from None
        if "duration" in t:
            params["duration"] = r.seconds(t, "duration", key, minimum=1)
        r.string(t, "by", key, "admin")
        r.opt_string(t, "negotiator", key, pattern=re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z"))
    elif kind == "config":
        knob = r.string(t, "knob", key)
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.]*", knob):
            raise r.fail(f"{key}.knob", "not a valid knob name")
        if "value" not in t or isinstance(t["value"], (dict, list)):
            raise r.fail(f"{key}.value", "required: a string, number or boolean")
    elif kind in ("machine_attrs", "owner_active", "vacate", "drain", "cancel_drain", "startd_off",
                  "startd_on"):
        params["machines"] = r.string(t, "machines", key, "*")
        if kind == "machine_attrs":
            if "attrs" not in t:
                raise r.fail(f"{key}.attrs", "required")
            params["attrs"] = r.attrs(t["attrs"], f"{key}.attrs")
        if kind == "owner_active":
            params["for"] = r.seconds(t, "for", key, minimum=0)
        if kind == "drain":
            params["graceful"] = r.boolean(t, "graceful", key, True)
            schedule = r.opt_string(t, "schedule", key)
            if schedule is not None and schedule not in ("graceful", "quick", "fast"):
                raise r.fail(f"{key}.schedule", f"unknown draining schedule {schedule!r} (graceful, quick, fast)")
            params["resume_on_completion"] = r.boolean(t, "resume_on_completion", key, False)
            r.opt_string(t, "reason", key)
        if kind == "startd_off":
            params["fast"] = r.boolean(t, "fast", key, False)
    elif kind in ("schedd_down", "schedd_up"):
        params["schedd"] = r.string(t, "schedd", key, schedds[0])
        if params["schedd"] not in schedds:
            raise r.fail(f"{key}.schedd", f"no schedd {params['schedd']!r}")
    else:
        params["user"] = r.string(t, "user", key, pattern=_USER)
        params["schedd"] = r.string(t, "schedd", key, schedds[0])
        if params["schedd"] not in schedds:
            raise r.fail(f"{key}.schedd", f"no schedd {params['schedd']!r}")
        if "count" in t:
            params["count"] = int(r.number(t, "count", key, minimum=1, integer=True))
        if kind == "prio":
            params["value"] = int(r.number(t, "value", key, integer=True))
    return Action(at, kind, params)


def _negotiators(r: _Reader, value: Any, config: dict[str, Any]) -> dict[str, Any]:
    """`[[negotiators]]` (name, slot_constraint): named negotiators with separate accounting,
    expanded into the knobs that define them (NEGOTIATOR_NAMES and
    NEGOTIATOR_SLOT_CONSTRAINT_<NAME>, see services.negotiator.shard), so the pool records
    them on the log like any other configuration. Without the section: `config` unchanged."""
    from services.negotiator.shard import NAMES_KNOB, Shard, constraint_knob, shards_from_config

    if value is None:
        try:
            shards_from_config(config)
        except ValueError as exc:
            raise r.fail(f"config.{NAMES_KNOB}", str(exc)) from None
        return config
    if any(k.upper() == NAMES_KNOB for k in config):
        raise r.fail("negotiators", f"give either [[negotiators]] or config.{NAMES_KNOB}, not both")
    shards: list[Shard] = []
    for i, item in enumerate(r.array(value, "negotiators")):
        key = f"negotiators[{i}]"
        t = r.table(item, key, ("name", "slot_constraint"))
        name = r.string(t, "name", key)
        if any(s.name.lower() == name.lower() for s in shards):
            raise r.fail(f"{key}.name", f"duplicate negotiator {name!r}")
        try:
            shards.append(Shard(name, r.opt_string(t, "slot_constraint", key)))
        except ValueError as exc:
            raise r.fail(key, str(exc)) from None
    if not shards:
        raise r.fail("negotiators", "at least one negotiator is needed")
    out = dict(config)
    out[NAMES_KNOB] = ", ".join(s.name for s in shards)
    for s in shards:
        if s.slot_constraint is not None:
            out[constraint_knob(s.name)] = s.slot_constraint
    return out


def parse_scenario(doc: Any, path: str = "<scenario>") -> Scenario:
    """Validate a parsed scenario document (from JSON or TOML)."""
    r = _Reader(path)
    top = r.table(doc, "", ("pool", "config", "machines", "schedds", "submitters", "actions", "sim",
                            "negotiators"))
    pool = r.table(top.get("pool", {}), "pool", ("name", "start", "duration", "uid_domain",
                                                 "central_manager"))
    sim = r.table(top.get("sim", {}), "sim", ("claim_delay", "periodic_slot_updates", "emit_config"))
    schedd_list = r.array(top.get("schedds", [{"name": "ap1.example.org"}]), "schedds")
    schedds: list[str] = []
    for i, s in enumerate(schedd_list):
        st = r.table(s, f"schedds[{i}]", ("name",))
        name = r.string(st, "name", f"schedds[{i}]", pattern=_HOST)
        if name in schedds:
            raise r.fail(f"schedds[{i}].name", f"duplicate schedd {name!r}")
        schedds.append(name)
    if not schedds:
        raise r.fail("schedds", "at least one schedd is needed")
    machines_raw = r.array(top.get("machines"), "machines") if "machines" in top else None
    if not machines_raw:
        raise r.fail("machines", "at least one machine is needed")
    config = _negotiators(r, top.get("negotiators"), r.knobs(top.get("config"), "config"))
    _check_schedd_policy(r, config)
    _check_defrag(r, config)
    machines = tuple(_machine(r, m, f"machines[{i}]") for i, m in enumerate(machines_raw))
    for i, m in enumerate(machines):
        _check_machine(r, m, config, f"machines[{i}]")
    seen: dict[str, str] = {}
    for i, m in enumerate(machines):
        for host in m.hosts():
            if host in seen:
                raise r.fail(f"machines[{i}].name", f"host {host!r} also defined by {seen[host]}")
            seen[host] = f"machines[{i}]"
    sched_t = tuple(schedds)
    subs = tuple(_submitter(r, s, f"submitters[{i}]", sched_t)
                 for i, s in enumerate(r.array(top.get("submitters", []), "submitters")))
    actions = tuple(sorted((_action(r, a, f"actions[{i}]", sched_t)
                            for i, a in enumerate(r.array(top.get("actions", []), "actions"))),
                           key=lambda a: a.at))
    duration = r.seconds(pool, "duration", "pool", minimum=1) if "duration" in pool else None
    if duration is None:
        raise r.fail("pool.duration", "required (how long to simulate, e.g. '6h')")
    return Scenario(
        path=path,
        name=r.string(pool, "name", "pool", Path(path).stem),
        start=r.number(pool, "start", "pool", DEFAULT_START, minimum=0),
        duration=duration,
        uid_domain=r.string(pool, "uid_domain", "pool", "example.org", pattern=_HOST),
        central_manager=r.string(pool, "central_manager", "pool", "cm.example.org", pattern=_HOST),
        config=config,
        machines=machines,
        schedds=sched_t,
        submitters=subs,
        actions=actions,
        claim_delay=r.seconds(sim, "claim_delay", "sim", 0.0),
        periodic_slot_updates=r.boolean(sim, "periodic_slot_updates", "sim", False),
        emit_config=r.boolean(sim, "emit_config", "sim", True),
    )


def load_scenario(path: str | Path) -> Scenario:
    """Read a scenario file (`.toml` or `.json`); ScenarioError names the file and the key."""
    p = Path(path)
    try:
        raw = p.read_bytes()
    except OSError as exc:
        raise ScenarioError(f"cannot read: {exc.strerror}", path=str(p)) from None
    if p.suffix.lower() == ".toml":
        try:
            doc = tomllib.loads(raw.decode("utf-8"))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise ScenarioError(f"not valid TOML: {exc}", path=str(p)) from None
    elif p.suffix.lower() == ".json":
        try:
            doc = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ScenarioError(f"not valid JSON: {exc}", path=str(p)) from None
    else:
        raise ScenarioError("a scenario is a .toml or .json file", path=str(p))
    return parse_scenario(doc, str(p))
