"""A reader for HTCondor's condor_config syntax, keeping where every value came from.

Why our own reader: the htcondor wheel's config functions read the machine's HTCondor
installation and its global state; PoolLedger needs a pure reader whose values remember
`file:line` so a bad knob can be named with its source, and whose layers (defaults, files,
environment, command line) can be stacked and replayed.

Supported: `NAME = value`; `NAME @=tag` ... `@tag` multi-line values; lines ending in `\\`
continue on the next (comment lines inside are dropped); `#` comment lines; names are
case-insensitive; later assignments override earlier ones; `$(NAME)` and `$(NAME:default)`
expand at lookup (recursively; undefined expands to ''); a self-reference such as
`START = ($(START)) && X` takes the previous value at read time, as HTCondor does;
`$ENV(VAR[:default])`; `$$(...)` is left for match time; `include [ifexist] : path`;
`if`/`elif`/`else`/`endif` on `true`/`false`/numbers/`defined NAME`. A directory is read
as a config.d: its files in lexical order, skipping names HTCondor's
LOCAL_CONFIG_DIR_EXCLUDE_REGEXP skips (dot-files, `~` backups, `.rpmsave`, `.rpmnew`).
Not supported (a ConfigError says so): `use` metaknobs and `$INT()`-style functions.
"""
from __future__ import annotations

import os
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from schemas.classads import Value, evaluate
from schemas.errors import ClassAdError, ConfigError
from schemas.events import MAX_QUANTITY

__all__ = ["ConfigEntry", "ConfigValues", "read_config", "resolve_env", "DEFAULT_SOURCE", "PathArg",
           "TRUE_WORDS", "FALSE_WORDS", "boolean_word", "to_int", "to_float", "to_bool", "SettingsLike",
           "negotiator_interval",
           "Knobs", "knob_raw", "knob_str", "knob_float", "knob_bool"]

DEFAULT_SOURCE = "<Default>"
PathArg = str | os.PathLike[str]
#: The one vocabulary of boolean words (case-insensitive) every reader of a knob accepts: a
#: settings value, an `if` condition, a `config.changed` the folds read, a daemon's knob.
#: HTCondor's param_boolean takes true/false/1/0 and evaluates anything else as a ClassAd
#: expression; its `if` takes yes/no too. Accepting the union in every place means a value
#: valid in one place is never refused (or read differently) in another.
TRUE_WORDS = frozenset({"true", "yes", "t", "y", "1", "on"})
FALSE_WORDS = frozenset({"false", "no", "f", "n", "0", "off"})


def boolean_word(text: str) -> bool | None:
    """True or False for a boolean word, None for anything else (an expression, a typo)."""
    low = text.strip().lower()
    if low in TRUE_WORDS:
        return True
    if low in FALSE_WORDS:
        return False
    return None

_NAME = r"[A-Za-z_][A-Za-z0-9_.]*"
_ASSIGN = re.compile(rf"({_NAME})\s*=(.*)\Z", re.S)
_MULTI = re.compile(rf"({_NAME})\s*@=\s*(\S*)\s*\Z")
_INCLUDE = re.compile(r"include\s*(ifexist)?\s*:\s*(.*)\Z", re.I)
_USE = re.compile(r"use\s+\w+\s*:", re.I)
_COND = re.compile(r"(if|elif|else|endif)\b\s*(.*)\Z", re.I)
_EXCLUDE = re.compile(r"^((\..*)|(.*~)|(#.*)|(.*\.rpmsave)|(.*\.rpmnew))$")
_INT = re.compile(r"[+-]?\d+\Z")
_FUNC = re.compile(r"\$([A-Za-z_]+)\(")
_MAX_INCLUDE_DEPTH = 20
_MAX_MACRO_DEPTH = 200  # nested $(NAME) expansions: deeper is a runaway chain, named, not a RecursionError


@dataclass(frozen=True, slots=True)
class ConfigEntry:
    """One assignment: the name as written, its unexpanded value and where it was made."""

    name: str
    raw: str
    source: str


def _find_close(text: str, start: int) -> int:
    """Index of the ')' closing the '(' just before `start`, or -1."""
    depth = 1
    for i in range(start, len(text)):
        if text[i] == "(":
            depth += 1
        elif text[i] == ")":
            depth -= 1
            if depth == 0:
                return i
    return -1


def _macros(text: str) -> Iterator[tuple[int, int, str, str, str | None]]:
    """Each macro reference: (start, end, kind, name, default or None); kind 'ENV' or ''.

    `$$(...)` is skipped (the startd substitutes it at match time).
    """
    i = 0
    while True:
        i = text.find("$", i)
        if i < 0 or i + 1 >= len(text):
            return
        if text[i + 1] == "$":
            i += 2
            continue
        kind = ""
        open_at = i + 1
        if text[open_at] != "(":
            m = _FUNC.match(text, i)
            if not m:
                i += 1
                continue
            kind, open_at = m.group(1).upper(), m.end() - 1
        close = _find_close(text, open_at + 1)
        if close < 0:
            i += 1
            continue
        body = text[open_at + 1:close]
        name, colon, default = body.partition(":")
        yield i, close + 1, kind, name.strip(), (default if colon else None)
        i = close + 1


def resolve_env(text: str, env: Mapping[str, str]) -> str:
    """`text` with every `$ENV(VAR[:default])` replaced by its value in `env` (other macros
    kept): what an issuer does to a `config.changed` value before appending it, so no fold
    ever reads its own process's environment."""
    out: list[str] = []
    pos = 0
    for start, end, kind, name, default in _macros(text):
        if kind != "ENV":
            continue
        out.append(text[pos:start])
        value = env.get(name)
        out.append(value if value is not None else resolve_env(default or "", env))
        pos = end
    out.append(text[pos:])
    return "".join(out)


# ---------------------------------------------------------------------------------------
# typed values: the one conversion of condor_config text every reader uses


def _eval_text(text: str) -> Any:
    """condor_config numbers may be ClassAd expressions (`10 * $(MINUTE)`), as in HTCondor."""
    try:
        return evaluate(text)
    except ClassAdError:
        return Value.Error


#: HTCondor reads integer knobs as a C `int` (param_integer refuses what does not fit)
INT_KNOB_MIN, INT_KNOB_MAX = -2**31, 2**31 - 1
#: a number knob: finite and of a magnitude whose products (priority x factor, quota x
#: share) stay finite; the contract's bound on quantities in events
FLOAT_KNOB_MAX = MAX_QUANTITY


def to_int(text: str) -> int:
    """An integer knob's text: digits, or a ClassAd expression with an integral value, within
    HTCondor's integer range."""
    if _INT.match(text):
        return _int_in_range(int(text))
    value = _eval_text(text)
    if isinstance(value, bool) or isinstance(value, Value):
        raise ValueError("expected an integer")
    if isinstance(value, int):
        return _int_in_range(value)
    if isinstance(value, float) and value.is_integer():
        return _int_in_range(int(value))
    raise ValueError("expected an integer")


def _int_in_range(value: int) -> int:
    if not INT_KNOB_MIN <= value <= INT_KNOB_MAX:
        raise ValueError(f"expected an integer between {INT_KNOB_MIN} and {INT_KNOB_MAX}")
    return value


def to_float(text: str) -> float:
    """A number knob's text: a literal, or a ClassAd expression with a numeric value; finite
    and within +-FLOAT_KNOB_MAX (1e308 would make every product it enters infinite)."""
    try:
        value: Any = float(text)
    except ValueError:
        value = _eval_text(text)
        if isinstance(value, bool) or isinstance(value, Value) or not isinstance(value, (int, float)):
            raise ValueError("expected a number") from None
    number = float(value)
    if not (-FLOAT_KNOB_MAX <= number <= FLOAT_KNOB_MAX):  # NaN fails both comparisons
        raise ValueError(f"expected a finite number between {-FLOAT_KNOB_MAX:g} and {FLOAT_KNOB_MAX:g}")
    return number


def to_bool(text: str) -> bool:
    """A boolean knob's text: a word of the one vocabulary, or a ClassAd boolean expression."""
    word = boolean_word(text)
    if word is not None:
        return word
    value = _eval_text(text)
    if isinstance(value, bool):
        return value
    raise ValueError("expected a boolean (True/False)")


# --- the folds' view: typed reads over settings plus `config.changed` text ---------------

class SettingsLike(Protocol):
    """The settings every reader takes (folds, the ledger, runners, commands): a knob name
    answered with its typed value or None, and the same settings with `config.changed`
    overrides on top. `schemas.settings.Settings` is the real one; `Knobs` serves tests and
    layering. It lives here, not in the core, so the pure core and the services name it alike."""

    def get(self, name: str) -> Any: ...

    def with_overrides(self, overrides: Mapping[str, str]) -> SettingsLike: ...


class Knobs:
    """Settings backed by a mapping, case-insensitive, optionally layered over other settings.

    Used for `config.changed` overrides (which beat the config files from their event time
    on) and in tests. A knob set to the empty string reads as unset, as in condor_config.
    """

    __slots__ = ("_values", "_parent")

    def __init__(self, values: Mapping[str, Any] | None = None,
                 parent: SettingsLike | None = None) -> None:
        self._values = {k.upper(): v for k, v in (values or {}).items()}
        self._parent = parent

    def get(self, name: str) -> Any:
        key = name.upper()
        if key in self._values:
            value = self._values[key]
            return None if value == "" else value
        return self._parent.get(name) if self._parent is not None else None

    def with_overrides(self, overrides: Mapping[str, str]) -> Knobs:
        """These knobs with `overrides` on top (unvalidated, as every Knobs value)."""
        return Knobs(overrides, parent=self)


def knob_raw(settings: SettingsLike | None, name: str) -> Any:
    """The knob's value or None; settings that fail or answer '' count as unset."""
    if settings is None:
        return None
    try:
        value = settings.get(name)
    except (KeyError, LookupError):
        return None
    return None if value == "" else value


def knob_str(settings: SettingsLike | None, name: str, default: str | None = None) -> str | None:
    """A string or expression knob as text (an ExprTree is printed back to ClassAd text)."""
    value = knob_raw(settings, name)
    if value is None:
        return default
    if isinstance(value, (list, tuple)):
        return ", ".join(str(v) for v in value)
    return str(value)


def negotiator_interval(settings: SettingsLike) -> float:
    """NEGOTIATOR_INTERVAL in force on the log (config.changed included), in seconds: the one
    reader of the knob, for the simulation loop, the negotiator service and the ledger's
    clock report alike. The settings typed and validated it (> 0), and the ledger refuses a
    `config.changed` that would not."""
    return float(settings.get("NEGOTIATOR_INTERVAL"))


def knob_float(settings: SettingsLike | None, name: str, default: float | None) -> float | None:
    """A numeric knob: typed by Settings, or text (a `config.changed`) converted as Settings
    converts it; `default` when unset or not a number (the fold never stops on a knob)."""
    value = knob_raw(settings, name)
    if value is None:
        return default
    if isinstance(value, (bool, int, float)):
        return float(value)
    try:
        return to_float(str(value).strip())
    except ValueError:
        return default


def knob_bool(settings: SettingsLike | None, name: str, default: bool) -> bool:
    """A boolean knob: typed by Settings, or text converted as Settings converts it (the one
    boolean vocabulary, else a ClassAd expression); `default` when unset or not a boolean."""
    value = knob_raw(settings, name)
    if value is None:
        return default
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)):
        return value != 0
    try:
        return to_bool(str(value).strip())
    except ValueError:
        return default



class ConfigValues:
    """Assignments by case-insensitive name, expanded on lookup.

    Immutable to callers: `layered` returns a new object, so defaults, files, environment
    and overrides stack without copies leaking between Settings instances.
    """

    __slots__ = ("_entries", "_env")

    def __init__(self, entries: Mapping[str, ConfigEntry] | None = None,
                 env: Mapping[str, str] | None = None) -> None:
        self._entries: dict[str, ConfigEntry] = dict(entries or {})
        self._env: Mapping[str, str] = env if env is not None else os.environ

    # -- reading

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name.upper() in self._entries

    def __iter__(self) -> Iterator[str]:
        return (e.name for e in self._entries.values())

    def __len__(self) -> int:
        return len(self._entries)

    def entry(self, name: str) -> ConfigEntry | None:
        return self._entries.get(name.upper())

    def entries(self) -> Iterator[ConfigEntry]:
        return iter(self._entries.values())

    def raw(self, name: str) -> str | None:
        """The value as written (self-references already replaced), or None if unset."""
        e = self._entries.get(name.upper())
        return e.raw if e else None

    def source(self, name: str) -> str | None:
        """Where the value was set: `file:line`, `env VAR`, `command line` or `<Default>`."""
        e = self._entries.get(name.upper())
        return e.source if e else None

    def get(self, name: str, default: str | None = None) -> str | None:
        """The value with every macro expanded, or `default` if unset."""
        e = self._entries.get(name.upper())
        if e is None:
            return default
        return self._expand(e.raw, [e.name.upper()], e.name, e.source)

    def origins(self, name: str) -> list[tuple[str, str]]:
        """(name, source) of the assignment of `name` and of every assignment and `$ENV()`
        variable its expansion reads, recursively (`("$ENV(VAR)", "env VAR")` for the
        latter): who decides a value, as a security check needs to know."""
        out: list[tuple[str, str]] = []
        seen: set[str] = set()
        todo = [name.upper()]
        while todo:
            upper = todo.pop()
            e = self._entries.get(upper)
            if upper in seen or e is None:
                continue
            seen.add(upper)
            out.append((e.name, e.source))
            stack = [e.raw]
            while stack:
                for _start, _end, kind, ref, default in _macros(stack.pop()):
                    if kind == "ENV":
                        out.append((f"$ENV({ref})", f"env {ref}"))
                    elif not kind:
                        todo.append(ref.upper())
                    if default:
                        stack.append(default)
        return out

    def expand(self, text: str, *, knob: str | None = None, source: str | None = None) -> str:
        """Expand the macros in any text against these values."""
        return self._expand(text, [knob.upper()] if knob else [], knob, source)

    def _expand(self, text: str, chain: list[str], knob: str | None, source: str | None) -> str:
        if "$" not in text:
            return text
        out: list[str] = []
        pos = 0
        for start, end, kind, name, default in _macros(text):
            out.append(text[pos:start])
            pos = end
            if kind == "ENV":
                value = self._env.get(name)
                out.append(value if value is not None else
                           self._expand(default or "", chain, knob, source))
                continue
            if kind.startswith("RANDOM_"):
                raise ConfigError(f"${kind}() is nondeterministic: the log's folds must give the "
                                  "same value on every replay", knob=knob, source=source)
            if kind:
                raise ConfigError(f"unsupported macro function ${kind}()", knob=knob, source=source)
            upper = name.upper()
            if upper in chain:
                cycle = " -> ".join(self._display(n) for n in chain[chain.index(upper):] + [upper])
                raise ConfigError(f"macro expansion cycle: {cycle}", knob=knob, source=source)
            if len(chain) >= _MAX_MACRO_DEPTH:
                raise ConfigError(f"macros nested deeper than {_MAX_MACRO_DEPTH}: "
                                  f"{self._display(chain[0])} -> ... -> {self._display(upper)}",
                                  knob=knob, source=source)
            e = self._entries.get(upper)
            if e is None:
                out.append(self._expand(default, chain, knob, source) if default is not None else "")
            else:
                out.append(self._expand(e.raw, chain + [upper], knob, source))
        out.append(text[pos:])
        return "".join(out)

    def _display(self, upper: str) -> str:
        e = self._entries.get(upper)
        return e.name if e else upper

    # -- building

    def layered(self, entries: Iterable[ConfigEntry]) -> ConfigValues:
        """A new ConfigValues with `entries` assigned in order on top of these.

        A self-reference in an entry takes the value below it, as in a config file.
        """
        new = ConfigValues(self._entries, self._env)
        for e in entries:
            new._assign(e.name, e.raw, e.source)
        return new

    def _assign(self, name: str, raw: str, source: str) -> None:
        upper = name.upper()
        if "$" in raw:
            raw = self._substitute_self(upper, raw)
        self._entries.pop(upper, None)  # re-assignment moves the name to the end
        self._entries[upper] = ConfigEntry(name, raw, source)

    def _substitute_self(self, upper: str, raw: str) -> str:
        prev = self._entries.get(upper)
        out: list[str] = []
        pos = 0
        for start, end, kind, name, default in _macros(raw):
            if kind or name.upper() != upper:
                continue
            out.append(raw[pos:start])
            out.append(prev.raw if prev else (default or ""))
            pos = end
        out.append(raw[pos:])
        return "".join(out)


# ---------------------------------------------------------------------------------------
# the file reader


class _Reader:
    """Reads files into a ConfigValues; keeps the include depth and the if/else stack."""

    def __init__(self, values: ConfigValues) -> None:
        self.values = values

    def read_path(self, path: Path, depth: int, where: str | None, ifexist: bool = False) -> None:
        if depth > _MAX_INCLUDE_DEPTH:
            raise ConfigError(f"includes nested deeper than {_MAX_INCLUDE_DEPTH} (a cycle?)", source=where)
        if path.is_dir():
            for child in sorted(path.iterdir(), key=lambda p: p.name):
                if child.is_file() and not _EXCLUDE.match(child.name):
                    self.read_file(child, depth)
        elif path.is_file():
            self.read_file(path, depth)
        elif not ifexist:
            raise ConfigError(f"configuration file {str(path)!r} does not exist", source=where)

    def read_file(self, path: Path, depth: int) -> None:
        try:
            text = path.read_text(encoding="utf-8", errors="surrogateescape")
        except OSError as exc:
            raise ConfigError(f"cannot read {str(path)!r}: {exc.strerror}", source=str(path)) from None
        self.read_text(text, str(path), depth)

    def read_text(self, text: str, fname: str, depth: int = 0) -> None:
        lines = text.splitlines()
        # stack of (taking_this_branch, some_branch_taken, line of the if)
        conds: list[tuple[bool, bool, int]] = []
        i = 0
        while i < len(lines):
            lineno = i + 1
            line = lines[i]
            i += 1
            stripped = line.strip()
            if not stripped or stripped.startswith("#"):
                continue
            # continuation lines: join while the line ends in a backslash
            while stripped.endswith("\\") and i < len(lines):
                nxt = lines[i]
                i += 1
                if nxt.strip().startswith("#"):
                    continue
                line = line.rstrip()[:-1] + nxt
                stripped = line.strip()
            if stripped.endswith("\\"):
                stripped = stripped[:-1].rstrip()
            where = f"{fname}:{lineno}"
            active = all(c[0] for c in conds)

            m = _COND.match(stripped)
            if m and not _ASSIGN.match(stripped) and not _MULTI.match(stripped):
                word, arg = m.group(1).lower(), m.group(2).strip()
                if word == "if":
                    truth = active and self._condition(arg, where)
                    conds.append((truth, truth, lineno))
                elif not conds:
                    raise ConfigError(f"'{word}' without 'if'", source=where)
                elif word == "elif":
                    _, taken, at = conds[-1]
                    outer = all(c[0] for c in conds[:-1])
                    truth = outer and not taken and self._condition(arg, where)
                    conds[-1] = (truth, taken or truth, at)
                elif word == "else":
                    _, taken, at = conds[-1]
                    conds[-1] = (not taken, True, at)
                else:
                    conds.pop()
                continue

            m = _MULTI.match(stripped)
            if m:
                name, tag = m.group(1), m.group(2)
                body: list[str] = []
                while True:
                    if i >= len(lines):
                        raise ConfigError(f"'@={tag}' is never closed by '@{tag}'", knob=name, source=where)
                    nxt = lines[i]
                    i += 1
                    if nxt.strip() == "@" + tag:
                        break
                    body.append(nxt)
                if active:
                    self.values._assign(name, "\n".join(body), where)
                continue

            if not active:
                continue
            m = _ASSIGN.match(stripped)
            if m:
                self.values._assign(m.group(1), m.group(2).strip(), where)
                continue
            m = _INCLUDE.match(stripped)
            if m:
                target = self.values.expand(m.group(2).strip(), source=where)
                path = Path(target).expanduser()
                if not path.is_absolute():
                    path = Path(fname).parent / path
                self.read_path(path, depth + 1, where, ifexist=bool(m.group(1)))
                continue
            if _USE.match(stripped):
                raise ConfigError(f"'use' metaknobs are not supported: {stripped!r}", source=where)
            raise ConfigError(f"expected 'NAME = value', got {stripped[:60]!r}", source=where)
        if conds:
            raise ConfigError("'if' without 'endif'", source=f"{fname}:{conds[-1][2]}")

    def _condition(self, arg: str, where: str) -> bool:
        words = arg.split()
        if len(words) == 2 and words[0].lower() == "defined":
            return words[1] in self.values and bool(self.values.raw(words[1]))
        text = self.values.expand(arg, source=where).strip()
        word = boolean_word(text) if text else False
        if word is not None:
            return word
        try:
            return float(text) != 0
        except ValueError:
            raise ConfigError(f"cannot evaluate condition {arg!r}", source=where) from None


def read_config(paths: PathArg | Sequence[PathArg], *, base: ConfigValues | None = None,
                env: Mapping[str, str] | None = None) -> ConfigValues:
    """Read condor_config files (or config.d directories) in order; later values win.

    `base` holds values below the files (e.g. the defaults table): macros may refer to
    them and self-references start from them; the result includes them. A missing file
    or a malformed line raises ConfigError naming `file:line`.
    """
    values = ConfigValues(env=env) if base is None else base.layered(())
    if env is not None:
        values._env = env
    reader = _Reader(values)
    items = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    for p in items:
        reader.read_path(Path(p).expanduser(), 0, None)
    return values


def parse_config_text(text: str, name: str = "<string>", *, base: ConfigValues | None = None) -> ConfigValues:
    """Read condor_config text (as read_config does a file); sources are `name:line`."""
    values = ConfigValues() if base is None else base.layered(())
    _Reader(values).read_text(text, name)
    return values
