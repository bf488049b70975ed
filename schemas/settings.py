"""The one typed settings object every PoolLedger component reads its knobs from.

Precedence, lowest first: the defaults table (schemas/knobs.py) < condor_config files
(`config_path`, else env POOLLEDGER_CONFIG; a file or a config.d directory) <
`POOLLEDGER_<KNOB>` environment variables < command-line overrides (`--set KNOB=VALUE`).
Every value is expanded, converted to its knob's type and validated at load, so a bad
value fails at start-up naming the knob and where it was set, never mid-cycle.
Settings are frozen; `with_overrides` derives a new object (what-if replays and
`config.changed` events stack their values on top that way).
"""
from __future__ import annotations

import functools
import os
import pwd
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, TypeVar

from schemas.classads import ExprTree, compile_expr, nondeterministic
from schemas.config import (DEFAULT_SOURCE, ConfigEntry, ConfigValues, PathArg, read_config, to_bool,
                            to_float, to_int)
from schemas.errors import ClassAdError, ConfigError
from schemas.knobs import Knob, declared, family_member, family_name, find_knob

__all__ = ["Settings", "load_settings", "UnknownKnobError", "ENV_PREFIX", "CONFIG_ENV",
           "COMMAND_LINE_SOURCE", "convert_value", "knob_text", "DaemonConfig",
           "check_security_sources"]

ENV_PREFIX = "POOLLEDGER_"
CONFIG_ENV = "POOLLEDGER_CONFIG"
COMMAND_LINE_SOURCE = "command line"

_T = TypeVar("_T")
_LIST_SPLIT = re.compile(r"[,\s]+")
_MACRO_REF = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_.]*)")
_ENV_MACRO = re.compile(r"\$ENV\(", re.IGNORECASE)


class UnknownKnobError(ConfigError, KeyError):
    """A knob name that is neither declared, nor in a declared family, nor set anywhere.

    Also a KeyError, so `settings.get` reads like a mapping lookup to callers.
    """

    def __str__(self) -> str:
        return Exception.__str__(self)


def convert_value(knob: Knob, text: str) -> Any:
    """Convert expanded condor_config text to the knob's type; ValueError/ClassAdError if bad.

    Empty text means "not set" as in HTCondor's param_*(): numbers and booleans fall back
    to the table default (None when that is empty too); an empty expression is None.
    """
    text = text.strip()
    if knob.type in ("int", "float", "bool") and not text:
        if not knob.default.strip():
            return None
        text = knob.default.strip()
    if knob.type == "int":
        return to_int(text)
    if knob.type == "float":
        return to_float(text)
    if knob.type == "bool":
        return to_bool(text)
    if knob.type == "expr":
        return compile_expr(text) if text else None
    if knob.type == "list":
        return tuple(t for t in _LIST_SPLIT.split(text) if t)
    if knob.type == "path":
        return os.path.expanduser(text) if text else ""
    return text


def knob_text(value: Any) -> str:
    """A knob value given as a TOML/JSON value (a scenario's) as condor_config text."""
    if isinstance(value, bool):
        return "True" if value else "False"
    if isinstance(value, (int, float, str)):
        return str(value)
    raise ConfigError(f"a knob value must be a string, number or boolean, not {type(value).__name__}")


def _env_entries(env: Mapping[str, str]) -> list[ConfigEntry]:
    """POOLLEDGER_<KNOB> variables as entries; POOLLEDGER_HOME etc. name the project's own knobs."""
    out = []
    for var in sorted(env):
        if not var.upper().startswith(ENV_PREFIX) or var.upper() == CONFIG_ENV:
            continue
        knob = find_knob(var)
        name = knob.name if knob is not None and not knob.is_pattern else var[len(ENV_PREFIX):]
        if name:
            out.append(ConfigEntry(name, env[var], f"env {var}"))
    return out


def _default_values(env: Mapping[str, str]) -> ConfigValues:
    return ConfigValues({k.name.upper(): ConfigEntry(k.name, k.default, DEFAULT_SOURCE) for k in declared()},
                        env=env)


@dataclass(frozen=True, eq=False)
class Settings:
    """Typed, validated, immutable knob values with their sources; build with load_settings."""

    config: ConfigValues
    _values: Mapping[str, Any] = field(repr=False)
    _texts: Mapping[str, str] = field(repr=False)

    @classmethod
    def from_config(cls, config: ConfigValues) -> Settings:
        """Expand, convert and validate every value; the first bad one raises ConfigError."""
        values: dict[str, Any] = {}
        texts: dict[str, str] = {}
        for entry in config.entries():
            upper = entry.name.upper()
            text = config.get(entry.name) or ""
            texts[upper] = text
            knob = find_knob(entry.name)
            if knob is None:
                values[upper] = text
                continue
            try:
                value = convert_value(knob, text)
            except (ValueError, ClassAdError) as exc:
                reason = exc.reason if isinstance(exc, ClassAdError) else str(exc)
                raise ConfigError(f"{reason}, got {text!r}", knob=entry.name, source=entry.source) from None
            if knob.validate is not None:
                problem = knob.validate(value)
                if problem:
                    raise ConfigError(f"{problem}, got {text!r}", knob=entry.name, source=entry.source)
            values[upper] = value
        return cls(config, MappingProxyType(values), MappingProxyType(texts))

    # -- lookups

    def _entry(self, name: str) -> ConfigEntry:
        e = self.config.entry(name)
        if e is None:
            raise UnknownKnobError("not defined", knob=name)
        return e

    def knob(self, name: str) -> Knob | None:
        """The declared knob (or family) of a name."""
        return find_knob(name)

    def get(self, name: str) -> Any:
        """The typed value (int, float, bool, str, ExprTree, tuple of str, path str) or None.

        A member of a declared family that is not set gives None; a name that is neither
        declared nor set raises UnknownKnobError. An expr knob gives its compiled ExprTree.
        """
        upper = name.upper()
        if upper in self._values:
            return self._values[upper]
        knob = find_knob(name)
        if knob is None:
            raise UnknownKnobError("not defined", knob=name)
        return convert_value(knob, knob.default)

    def text(self, name: str) -> str:
        """The value as text with all macros expanded (what condor_config_val prints)."""
        upper = name.upper()
        if upper in self._texts:
            return self._texts[upper]
        self._entry(name)
        return ""  # pragma: no cover - every entry has a text

    def source(self, name: str) -> str:
        """Where the value was set: `file:line`, `env POOLLEDGER_X`, `command line`, `<Default>`."""
        return self._entry(name).source

    def raw(self, name: str) -> str:
        """The value as written, before macro expansion."""
        return self._entry(name).raw

    def display_name(self, name: str) -> str:
        """The canonical spelling: the table's for declared knobs, else as first written."""
        knob = find_knob(name)
        if knob is not None and not knob.is_pattern:
            return knob.name
        e = self.config.entry(name)
        return e.name if e else name

    def expr(self, name: str) -> ExprTree | None:
        """A knob's value as a compiled ClassAd expression (None when empty).

        For an undeclared or non-expr knob the text is compiled here (ConfigError if bad).
        """
        value = self.get(name)
        if value is None or isinstance(value, ExprTree):
            return value
        text = self.text(name) if name in self else str(value)
        if not text.strip():
            return None
        try:
            return compile_expr(text)
        except ClassAdError as exc:
            raise ConfigError(exc.reason, knob=name, source=self.config.source(name)) from None

    def is_set(self, name: str) -> bool:
        """True when the value comes from somewhere other than the defaults table."""
        e = self.config.entry(name)
        return e is not None and e.source != DEFAULT_SOURCE

    def __contains__(self, name: object) -> bool:
        return name in self.config

    def __iter__(self) -> Iterator[str]:
        """Every name with a value (defaults included), in canonical spelling."""
        return (self.display_name(n) for n in self.config)

    def __len__(self) -> int:
        return len(self.config)

    def items(self) -> Iterator[tuple[str, Any]]:
        return ((n, self.get(n)) for n in self)

    # -- families

    def family(self, pattern: str) -> dict[str, Any]:
        """Set members of a knob family by placeholder value: family('GROUP_QUOTA_<group>')."""
        out: dict[str, Any] = {}
        for name in self.config:
            member = family_member(pattern, name)
            if member is not None:
                out[member] = self.get(name)
        return out

    def member(self, pattern: str, key: str) -> Any:
        """One family member's typed value, or None when unset; None too when the name is
        another declared knob (a group named ROUND_ROBIN_RATE has no GROUP_QUOTA_<group>:
        that name is GROUP_QUOTA_ROUND_ROBIN_RATE)."""
        name = family_name(pattern, key)
        knob = find_knob(name)
        return None if knob is not None and knob.name.upper() != pattern.upper() else self.get(name)

    def group_quota(self, group: str) -> float | None:
        """GROUP_QUOTA_<group> (static quota), None when not configured."""
        value: float | None = self.member("GROUP_QUOTA_<group>", group)
        return value

    def group_quota_dynamic(self, group: str) -> float | None:
        """GROUP_QUOTA_DYNAMIC_<group> (fraction of the parent), None when not configured."""
        value: float | None = self.member("GROUP_QUOTA_DYNAMIC_<group>", group)
        return value

    def group_accept_surplus(self, group: str) -> bool:
        """GROUP_ACCEPT_SURPLUS_<group>, else GROUP_ACCEPT_SURPLUS."""
        value = self.member("GROUP_ACCEPT_SURPLUS_<group>", group)
        return bool(self.get("GROUP_ACCEPT_SURPLUS") if value is None else value)

    def group_autoregroup(self, group: str) -> bool:
        """GROUP_AUTOREGROUP_<group>, else GROUP_AUTOREGROUP."""
        value = self.member("GROUP_AUTOREGROUP_<group>", group)
        return bool(self.get("GROUP_AUTOREGROUP") if value is None else value)

    def group_prio_factor(self, group: str) -> float | None:
        """GROUP_PRIO_FACTOR_<group>, None when unset (the accountant also ignores 0)."""
        value: float | None = self.member("GROUP_PRIO_FACTOR_<group>", group)
        return value

    def concurrency_limit(self, name: str) -> float:
        """Maximum of a concurrency limit: <name>_LIMIT, else CONCURRENCY_LIMIT_DEFAULT_<prefix>
        for `prefix.rest` names, else CONCURRENCY_LIMIT_DEFAULT (as HTCondor's accountant)."""
        value = self.member("<name>_LIMIT", name)
        if value is None and "." in name:
            value = self.member("CONCURRENCY_LIMIT_DEFAULT_<set>", name.split(".", 1)[0])
        if value is None:
            value = self.get("CONCURRENCY_LIMIT_DEFAULT")
        return float(value)

    def unknown_in_files(self) -> list[ConfigEntry]:
        """Assignments in condor_config files to names no knob (or family) declares and no
        other value refers to: most likely typos (`NEGOTIATOR_INTERVL`), which HTCondor would
        accept silently. A macro used as `$(NAME)` elsewhere, or published through
        STARTD_ATTRS, is a user's own definition and is not reported."""
        used: set[str] = {n.upper() for n in (self._values.get("STARTD_ATTRS") or ())}
        for entry in self.config.entries():
            for m in _MACRO_REF.finditer(entry.raw):
                used.add(m.group(1).upper())
        return [e for e in self.config.entries()
                if e.source not in (DEFAULT_SOURCE, COMMAND_LINE_SOURCE)
                and not e.source.startswith("env ") and find_knob(e.name) is None
                and e.name.upper() not in used]

    # -- deriving

    def with_overrides(self, overrides: Mapping[str, str], source: str = COMMAND_LINE_SOURCE) -> Settings:
        """A new Settings with `overrides` on top (validated like everything else).

        Overrides are what `config.changed` events fold (and what-if stacks), so they must
        give the same value in every process and on every replay: a value calling `random()`
        or reading `$ENV()` (which the issuer resolves before appending, `resolve_env`) is
        refused with a ConfigError naming the knob."""
        for knob, value in overrides.items():
            impure = nondeterministic(str(value))
            if impure:
                raise ConfigError(f"{impure} is nondeterministic: a folded knob must give the "
                                  "same value on every replay", knob=knob, source=source)
            if _ENV_MACRO.search(str(value)):
                raise ConfigError("$ENV() would read the folding process's environment: it is "
                                  "resolved when the event is issued", knob=knob, source=source)
        entries = [ConfigEntry(k, str(v), source) for k, v in overrides.items()]
        return Settings.from_config(self.config.layered(entries))


@functools.lru_cache(maxsize=1)
def _daemon_defaults() -> ConfigValues:
    """The table's defaults a daemon starts from; knobs whose default is empty stay undefined,
    so `DaemonConfig.defined` tells a configured NUM_SLOTS from the built-in "detect"."""
    return ConfigValues({k.name.upper(): ConfigEntry(k.name, k.default, DEFAULT_SOURCE)
                         for k in declared() if k.default.strip()})


class DaemonConfig:
    """The condor_config one (simulated) daemon reads: the table's defaults under its pool's
    and its machine's knobs, changed at run time by `config.changed` as condor_reconfig does.

    Why not Settings: a daemon's knobs change while it runs and every machine stacks its own
    layer over the pool's, while Settings converts and validates every knob when built. The
    values, macro expansion (ConfigValues: a self-reference takes the layer below) and
    conversions (to_float, to_bool) are the same; they are applied when a knob is read, and
    a bad value raises ConfigError naming the knob and where it was set.
    """

    __slots__ = ("values",)

    def __init__(self, *layers: Mapping[str, object], base: ConfigValues | None = None,
                 source: str = "scenario") -> None:
        self.values = base if base is not None else _daemon_defaults()
        for layer in layers:
            self.push(layer, source)

    def push(self, layer: Mapping[str, object], source: str = "scenario") -> None:
        """Add a layer of knobs above the existing ones (a later config file)."""
        self.values = self.values.layered(ConfigEntry(k, knob_text(v), source) for k, v in layer.items())

    def set(self, knob: str, value: object, source: str = "config.changed") -> None:
        """A runtime change; `$(KNOB)` in it means the previous value."""
        self.push({knob: value}, source)

    def child(self, *layers: Mapping[str, object], source: str = "scenario") -> DaemonConfig:
        """A config over this one's values and then `layers` (one machine's, one daemon's)."""
        return DaemonConfig(*layers, base=self.values, source=source)

    def raw(self, knob: str) -> str | None:
        """The unexpanded value (self-references already resolved), or None."""
        return self.values.raw(knob)

    def defined(self, knob: str) -> bool:
        """True when a layer defines `knob` (an empty built-in default does not)."""
        return knob in self.values

    def names(self) -> list[str]:
        """Every defined knob name, for prefix scans like SLOT_TYPE_<N>."""
        return sorted(self.values)

    def get(self, knob: str, default: str | None = None) -> str | None:
        """The macro-expanded value of `knob`, or `default` when no layer defines it."""
        return self.values.get(knob, default)

    def number(self, knob: str, default: float = 0.0) -> float:
        """A numeric knob (a literal or a constant ClassAd expression such as `10 * $(MINUTE)`);
        `default` when unset or empty."""
        return self._typed(knob, default, to_float)

    def boolean(self, knob: str, default: bool = False) -> bool:
        """A boolean knob (the one vocabulary, or a ClassAd expression); `default` when unset."""
        return self._typed(knob, default, to_bool)

    def _typed(self, knob: str, default: _T, convert: Callable[[str], _T]) -> _T:
        text = self.get(knob)
        if text is None or not text.strip():
            return default
        try:
            return convert(text.strip())
        except ValueError as exc:
            raise ConfigError(f"{exc}, got {text!r}", knob=knob, source=self.values.source(knob)) from None


def _user(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def _setter(source: str, caller: int) -> tuple[int | None, str]:
    """Who decided a value set at `source` (None: the built-in default) and how to say so:
    the caller for the environment and the command line, a file's owner for a file; a file
    that others may write (group or world) is named as such (uid -1: trusted by nobody)."""
    if source == DEFAULT_SOURCE:
        return None, ""
    if source.startswith("env ") or source.startswith(COMMAND_LINE_SOURCE):
        return caller, f"by {_user(caller)}"
    path = source.rpartition(":")[0] or source
    try:
        st = os.stat(path)
    except OSError:
        return -1, "in a file that cannot be checked"
    if st.st_mode & 0o022:
        return -1, f"in a file others may write (mode {st.st_mode & 0o777:o})"
    return st.st_uid, f"in a file owned by {_user(st.st_uid)}"


def check_security_sources(values: ConfigValues, caller: int | None = None) -> None:
    """Refuse a security knob (`Knob.security`: ALLOW_*/DENY_*, SEC_*, UID_DOMAIN, the time
    bounds, the SASL login) decided by anyone but root or the data directory's owner: HTCondor
    ignores security settings from a user's own config, so neither a user's `--config` file,
    `POOLLEDGER_CONFIG`, `POOLLEDGER_<KNOB>` nor `--set` may grant its author ADMINISTRATOR or
    an identity. A value's macros count too (`UID_DOMAIN = $(FULL_HOSTNAME)` is decided by
    whoever set FULL_HOSTNAME). A data directory not yet made is the caller's own."""
    caller = os.getuid() if caller is None else caller
    home = Path(values.get("POOLLEDGER_HOME") or "out").expanduser()
    try:
        owner = home.stat().st_uid
    except OSError:
        owner = caller
    trusted = {0, owner}
    for entry in values.entries():
        knob = find_knob(entry.name)
        if knob is None or not knob.security:
            continue
        for name, source in values.origins(entry.name):
            uid, who = _setter(source, caller)
            if uid is None or uid in trusted:
                continue
            owners = "root" + ("" if owner == 0 else f" or by {_user(owner)}")
            direct = name.upper() == entry.name.upper()
            via = "" if direct else f"its value comes from {name} ({source}), "
            raise ConfigError(f"refused: a security knob, {via}set {who}; it counts only in "
                              f"configuration owned by {owners} (the owner of {home})",
                              knob=entry.name, source=source if direct else None)


def load_settings(config_path: PathArg | Sequence[PathArg] | None = None,
                  env: Mapping[str, str] | None = None,
                  overrides: Mapping[str, str] | None = None) -> Settings:
    """Build the Settings: defaults < config files < POOLLEDGER_* env < overrides.

    `env` defaults to os.environ; config files come from `config_path`, else the
    POOLLEDGER_CONFIG variable (a file, a directory, or several joined with os.pathsep).
    """
    env = os.environ if env is None else env
    values = _default_values(env)
    paths: list[PathArg] = []
    where = None
    if config_path is not None:
        paths = [config_path] if isinstance(config_path, (str, os.PathLike)) else list(config_path)
        where = f"{COMMAND_LINE_SOURCE} --config"
    elif env.get(CONFIG_ENV):
        paths = [p for p in env[CONFIG_ENV].split(os.pathsep) if p]
        where = f"env {CONFIG_ENV}"
    if paths:
        try:
            values = read_config(paths, base=values, env=env)
        except ConfigError as exc:
            if exc.source is None and where:
                raise ConfigError(exc.reason, knob=exc.knob, source=where) from None
            raise
    values = values.layered(_env_entries(env))
    if overrides:
        values = values.layered(ConfigEntry(k, str(v), COMMAND_LINE_SOURCE) for k, v in overrides.items())
    check_security_sources(values)
    return Settings.from_config(values)
