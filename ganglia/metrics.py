"""condor_gangliad's metric language: metric ClassAds read from GANGLIAD_METRICS_CONFIG_DIR,
evaluated with classad2 against every daemon ad of the collector view.

The semantics follow HTCondor's gangliad (seed 000, REFERENCE.md): every attribute of a
metric is an expression evaluated in the scope of the daemon ad; TargetType picks the ads
(`Machine_slot1`: slot 1 of each machine, not a dynamic slot; `Any`: every ad); Verbosity above
GANGLIAD_VERBOSITY is skipped; Regex (anchored at the start) makes one metric per matching
attribute, with `Regex` in the ad referring to it and `\\N` in string results replaced by the
N-th group; Aggregate (sum/avg/min/max) folds the values by AggregateGroup (default the Name)
into one pool metric under the collector's host; Type defaults by the value (bool int8, int
int32, real float, string); Scale multiplies numbers; Lifetime sets DMAX.

PoolLedger adds attributes for Prometheus, which wants one family per quantity with the daemon,
submitter or limit in labels (ganglia/families.py): PrometheusName (a string literal: the family,
snake_case, `htcondor_` prepended, the base unit of Units and `_total` of a counter appended
when missing; default: the Name made snake_case), PrometheusType ("gauge", or "counter" — the
default when Derivative is true), PrometheusHelp (the family's HELP; default: Desc or Title when
they are literals, as they then name no instance) and PrometheusLabel_<label> (an expression
giving that label per ad; it survives an Aggregate). Every series carries `machine`, the host
(of the daemon, or the collector's for an aggregate), whatever gangliad's Ganglia machine is.

Why the fast path: a pool of 20,000 slots times a hundred metrics is millions of evaluations
per interval. An attribute that is a literal is evaluated once at load; a bare attribute
reference is read from the ad's dict; any other expression is evaluated with classad2 in a
small ad holding only the attributes it references (classad2's externalRefs), memoised on
their values. Expressions whose reads cannot be known (eval(), time(), random(), scoped MY./
TARGET. names, an attribute that is itself an expression) take the full classad2 path over the
whole ad. `Evaluator(..., fast=False)` evaluates everything the full way: the baseline the
bench compares against and the tests cross-check with.
"""
from __future__ import annotations

import math
import os
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Final

from ganglia.errors import MetricConfigError
from ganglia.families import KINDS, SNAKE_CASE, Family, derived_body, make_family
from schemas.classads import ClassAd, ExprTree, Value, ad_from_json, compile_expr, eval_tree, \
    parse_ad
from schemas.config import SettingsLike
from schemas.errors import ClassAdError
from streams.core.collector import attr_value

__all__ = ["MetricDef", "Metric", "Evaluation", "Evaluator", "GangliadConfig", "load_metrics",
           "parse_metrics", "default_metrics_dir", "GANGLIA_TYPES"]

GANGLIA_TYPES: Final = ("double", "float", "int32", "uint32", "int16", "uint16", "int8", "uint8",
                        "string")
_TYPES: Final = frozenset(GANGLIA_TYPES) | {"boolean"}
_INTEGER_TYPES: Final = frozenset({"int32", "uint32", "int16", "uint16", "int8", "uint8"})
_AGGREGATES: Final = frozenset({"sum", "avg", "min", "max"})
_IMPURE = re.compile(r"\b(eval|time|random|formatTime|splitTime)\s*\(", re.I)
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_KEYWORDS: Final = frozenset({"true", "false", "undefined", "error", "is", "isnt", "parent", "my",
                              "target", "root", "self", "super"})
_NAME_IN_BLOCK = re.compile(r"\bName\s*=\s*\"((?:[^\"\\]|\\.)*)\"", re.S)
_GROUP_MACRO = re.compile(r"\\(\d+)")
_MISSING: Final = object()
#: ads per submitter and group: the negotiator's Accounting ads, and the Reconciliation ads
#: (streams.core.reconcile.drift_ad) gangliad --reconcile evaluates beside them
_ACCOUNTING_TYPES: Final = frozenset({"accounting", "reconciliation"})


def default_metrics_dir() -> Path:
    """The metric files shipped with PoolLedger (used when GANGLIAD_METRICS_CONFIG_DIR is empty)."""
    return Path(__file__).with_name("metrics.d")


# --- definitions -------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class _Attr:
    """One metric attribute, classified once at load: a constant, a bare attribute reference,
    an expression with known references, or one that needs the whole ad."""

    tree: ExprTree
    kind: str  # "const" | "ref" | "expr" | "full"
    const: Any = None
    ref: str = ""
    refs: tuple[str, ...] = ()


def _evaluated(tree: ExprTree, scope: ClassAd | None = None) -> Any:
    """The value, or ERROR when classad2 refuses the evaluation (too deep, too much work):
    the metric then "failed to evaluate" for that ad, as gangliad says, and the rest go on."""
    try:
        return eval_tree(tree, scope)
    except ClassAdError:
        return Value.Error


def _classify(tree: ExprTree, text: str) -> _Attr:
    stripped = text.strip()
    if _IDENT.match(stripped) and stripped.lower() not in _KEYWORDS:
        return _Attr(tree, "ref", ref=stripped)
    if _IMPURE.search(text):
        return _Attr(tree, "full")
    refs = tuple(r for r in ClassAd().externalRefs(tree) if r)
    if any("." in r for r in refs):
        return _Attr(tree, "full")
    if not refs:
        return _Attr(tree, "const", const=_evaluated(tree))
    return _Attr(tree, "expr", refs=refs)


@dataclass(frozen=True)
class MetricDef:
    """One metric ad as read from a file: where it was, and its attributes classified."""

    where: str
    label: str
    attrs: Mapping[str, _Attr]
    verbosity: int
    target_types: frozenset[str]
    #: the Prometheus family when it is the same for every ad (PrometheusName or a literal Name)
    family: Family | None = None
    prom_kind: str = "gauge"
    prom_help: str = ""
    prom_labels: tuple[tuple[str, _Attr], ...] = ()

    @property
    def any_type(self) -> bool:
        return "any" in self.target_types

    @property
    def slot1(self) -> bool:
        return "machine_slot1" in self.target_types

    def has(self, name: str) -> bool:
        return name.lower() in self.attrs


def _split_ads(text: str) -> Iterable[tuple[int, str]]:
    """Top-level `[ ... ]` blocks of a metrics file with their first line (strings, comments
    and nesting respected); text outside the blocks other than whitespace, commas and
    comments is its own block, so the parser reports it with its line."""
    i, n, line = 0, len(text), 1
    start = -1
    depth = 0
    stray = -1
    while i < n:
        ch = text[i]
        if ch == "\n":
            line += 1
        if depth == 0 and ch not in "[ \t\r\n," and not text.startswith(("//", "/*"), i):
            if stray < 0:
                stray = i
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
            continue
        if text.startswith("/*", i):
            j = text.find("*/", i + 2)
            end = n if j < 0 else j + 2
            line += text.count("\n", i, end)
            i = end
            continue
        if ch == '"' and depth > 0:
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            line += text.count("\n", i, j)
            i = j + 1
            continue
        if ch == "[":
            if depth == 0:
                if stray >= 0:
                    yield _line_of(text, stray), text[stray:i]
                    stray = -1
                start = i
            depth += 1
        elif ch == "]" and depth > 0:
            depth -= 1
            if depth == 0:
                yield _line_of(text, start), text[start:i + 1]
                start = -1
        i += 1
    if depth > 0 and start >= 0:
        yield _line_of(text, start), text[start:]
    elif stray >= 0:
        yield _line_of(text, stray), text[stray:]


def _line_of(text: str, index: int) -> int:
    return 1 + text.count("\n", 0, index)


def _literal_string(attr: _Attr | None) -> str | None:
    if attr is None or attr.kind != "const":
        return None
    return attr.const if isinstance(attr.const, str) else None


def _metric_def(block: str, path: str, line: int) -> MetricDef:
    found = _NAME_IN_BLOCK.search(block)
    label = found.group(1) if found else "(unnamed)"
    where = f"{path}:{line}"
    try:
        ad = parse_ad(block, path, first_line=line)
    except ClassAdError as exc:
        raise MetricConfigError(f"{exc}; metric {label!r} skipped") from None
    attrs: dict[str, _Attr] = {}
    for key in ad.keys():
        tree = ad.lookup(key)
        attrs[key.lower()] = _classify(tree, str(tree))
    name = _literal_string(attrs.get("name"))
    if name is not None:
        label = name
    elif "regex" in attrs:
        label = f"Regex {_literal_string(attrs['regex']) or '(expression)'}"
    elif "name" in attrs:
        label = str(attrs["name"].tree)

    def bad(reason: str) -> MetricConfigError:
        return MetricConfigError(f"{where}: metric {label!r}: {reason}")

    target = attrs.get("targettype")
    if target is None:
        raise bad("no TargetType")
    target_text = _literal_string(target)
    if target_text is None or not target_text.strip():
        raise bad("TargetType must be a non-empty string literal")
    verbosity = 0
    if "verbosity" in attrs:
        v = attrs["verbosity"]
        if v.kind != "const" or isinstance(v.const, bool) or not isinstance(v.const, int):
            raise bad("Verbosity must be an integer literal")
        verbosity = v.const
    for key, allowed in (("aggregate", _AGGREGATES), ("type", _TYPES)):
        text = _literal_string(attrs.get(key))
        if key in attrs and attrs[key].kind == "const" and (text is None or text.lower() not in allowed):
            raise bad(f"{key.capitalize()} {attrs[key].const!r} is not one of {', '.join(sorted(allowed))}")
    regex = _literal_string(attrs.get("regex"))
    if regex is not None:
        try:
            re.compile(regex)
        except re.error as exc:
            raise bad(f"Regex {regex!r}: {exc}") from None
    for key in ("scale", "lifetime"):
        a = attrs.get(key)
        if a is not None and a.kind == "const" and (isinstance(a.const, bool) or not isinstance(a.const, (int, float))
                                                   or not math.isfinite(a.const)):
            raise bad(f"{key.capitalize()} must be a finite number")
    if "lifetime" in attrs and attrs["lifetime"].kind == "const" and attrs["lifetime"].const <= 0:
        raise bad("Lifetime must be positive")
    types = frozenset(t.strip().lower() for t in target_text.split(",") if t.strip())
    kind, help_text, family = _prometheus(attrs, label, bad)
    labels = []
    for key, attr in sorted(attrs.items()):
        if key.startswith("prometheuslabel_"):
            label_name = key[len("prometheuslabel_"):]
            if not SNAKE_CASE.match(label_name) or label_name.startswith("__") or label_name == "machine":
                raise bad(f"PrometheusLabel_{label_name}: a label name is snake_case, not reserved "
                          "and not machine (always the host)")
            labels.append((label_name, attr))
    return MetricDef(where=where, label=label, attrs=attrs, verbosity=verbosity, target_types=types,
                     family=family, prom_kind=kind, prom_help=help_text, prom_labels=tuple(labels))


def _fixed_text(attr: _Attr | None, regex: bool) -> str | None:
    """A literal string that is the same for every ad (no Regex group reference in it)."""
    text = _literal_string(attr)
    if text is None or (regex and _GROUP_MACRO.search(text)):
        return None
    return text


def _prometheus(attrs: Mapping[str, _Attr], label: str, bad: Any) -> tuple[str, str, Family | None]:
    """A metric's Prometheus type, HELP and (when fixed at load) family."""
    kind = "gauge"
    if "prometheustype" in attrs:
        text = _literal_string(attrs["prometheustype"])
        if text is None or text.lower() not in KINDS:
            raise bad(f"PrometheusType must be one of {', '.join(KINDS)}")
        kind = text.lower()
    elif attrs.get("derivative") is not None and attrs["derivative"].const is True:
        kind = "counter"  # gangliad graphs its slope: a cumulative count
    regex = "regex" in attrs
    if "prometheushelp" in attrs and _literal_string(attrs["prometheushelp"]) is None:
        raise bad("PrometheusHelp must be a string literal (one HELP for the whole family)")
    help_text = (_literal_string(attrs.get("prometheushelp")) or _fixed_text(attrs.get("desc"), regex)
                 or _fixed_text(attrs.get("title"), regex) or "")
    units = _literal_string(attrs.get("units")) or ""
    if "prometheusname" in attrs:
        body = _literal_string(attrs["prometheusname"])
        if body is None:
            raise bad("PrometheusName must be a string literal (one family for every daemon)")
        try:
            return kind, help_text, make_family(body, kind, help_text or f"condor_gangliad metric {body}", units)
        except ValueError as exc:
            raise bad(f"PrometheusName {body!r}: {exc}") from None
    name = _literal_string(attrs.get("name"))
    if name is not None and not regex:
        return kind, help_text, make_family(derived_body(name, kind), kind, help_text or name, units)
    return kind, help_text, None


def parse_metrics(text: str, path: str) -> tuple[list[MetricDef], list[MetricConfigError]]:
    """Every metric ad of one file's text; a malformed one is reported and the rest kept."""
    defs: list[MetricDef] = []
    problems: list[MetricConfigError] = []
    for line, block in _split_ads(text):
        if not block.lstrip().startswith("["):
            problems.append(MetricConfigError(
                f"{path}:{line}: expected '[' to open a metric ClassAd, got {block.strip()[:40]!r}"))
            continue
        try:
            defs.append(_metric_def(block, path, line))
        except MetricConfigError as exc:
            problems.append(exc)
    return defs, problems


def _config_files(directory: Path) -> list[Path]:
    """The files of a config directory in name order, skipping hidden files and editor
    backups, as HTCondor's config-directory reader does."""
    return sorted(p for p in directory.iterdir()
                  if p.is_file() and not p.name.startswith(".")
                  and not p.name.endswith(("~", ".rpmsave", ".rpmnew", ".swp", ".bak")))


def load_metrics(directory: str | os.PathLike[str] | None
                 ) -> tuple[list[MetricDef], list[MetricConfigError]]:
    """Every metric of every file in `directory` (None or '': the shipped defaults)."""
    where = Path(directory) if directory else default_metrics_dir()
    if not where.is_dir():
        raise MetricConfigError(f"GANGLIAD_METRICS_CONFIG_DIR {str(where)!r}: not a directory")
    defs: list[MetricDef] = []
    problems: list[MetricConfigError] = []
    for path in _config_files(where):
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError as exc:
            problems.append(MetricConfigError(f"{path}: cannot read: {exc.strerror}"))
            continue
        d, p = parse_metrics(text, str(path))
        defs += d
        problems += p
    return _one_help_per_family(defs, problems), problems


def _one_help_per_family(defs: list[MetricDef], problems: list[MetricConfigError]
                         ) -> list[MetricDef]:
    """Metrics sharing a Prometheus family must agree on its type, HELP and unit (Prometheus
    has one of each per family): a later metric that disagrees with the first is skipped,
    with a problem naming both places."""
    first: dict[str, MetricDef] = {}
    kept: list[MetricDef] = []
    for d in defs:
        fam = d.family
        if fam is None:
            kept.append(d)
            continue
        seen = first.setdefault(fam.name, d)
        other = seen.family
        if seen is not d and other is not None and (other.kind, other.help, other.unit) != (
                fam.kind, fam.help, fam.unit):
            problems.append(MetricConfigError(
                f"{d.where}: metric {d.label!r}: family {fam.name} is already a {other.kind} "
                f"with HELP {other.help!r} at {seen.where} (one type, HELP and unit per "
                "family); metric skipped"))
            continue
        kept.append(d)
    return kept


# --- configuration -----------------------------------------------------------------------

@dataclass(frozen=True)
class GangliadConfig:
    """The gangliad knobs the evaluation reads (see schemas/knobs.py)."""

    interval: float = 60.0
    verbosity: int = 0
    min_metric_lifetime: int = 86400
    requirements: str | None = None
    per_execute_node_metrics: bool = True
    default_cluster: str | None = None
    default_machine: str | None = None
    default_ip: str | None = None

    @classmethod
    def from_settings(cls, settings: SettingsLike) -> GangliadConfig:
        def text(name: str) -> str | None:
            value = settings.get(name)
            return str(value) if value not in (None, "") else None

        return cls(interval=float(settings.get("GANGLIAD_INTERVAL")),
                   verbosity=int(settings.get("GANGLIAD_VERBOSITY")),
                   min_metric_lifetime=int(settings.get("GANGLIAD_MIN_METRIC_LIFETIME")),
                   requirements=text("GANGLIAD_REQUIREMENTS"),
                   per_execute_node_metrics=bool(settings.get("GANGLIAD_PER_EXECUTE_NODE_METRICS")),
                   default_cluster=text("GANGLIAD_DEFAULT_CLUSTER"),
                   default_machine=text("GANGLIAD_DEFAULT_MACHINE"),
                   default_ip=text("GANGLIAD_DEFAULT_IP"))

    @property
    def tmax(self) -> int:
        """The longest gmond should wait between two values: twice the interval."""
        return int(self.interval * 2)

    @property
    def dmax(self) -> int:
        """How long gmond keeps a metric no longer sent: 3 x TMAX, at least the minimum."""
        return max(self.min_metric_lifetime, 3 * self.tmax)


# --- results -------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Metric:
    """One value to publish, with everything gmetric, Prometheus and Graphite need."""

    name: str
    value: int | float | str
    type: str  # a Ganglia type
    group: str
    title: str
    desc: str
    units: str
    derivative: bool
    machine: str
    ip: str
    cluster: str
    tmax: int
    dmax: int
    family: Family  # the Prometheus family
    labels: tuple[tuple[str, str], ...] = ()  # its Prometheus labels
    aggregate: bool = False

    @property
    def text(self) -> str:
        """The value as gangliad formats it (%g for reals, %d for integers and booleans)."""
        if self.type in ("float", "double"):
            return f"{float(self.value):g}"
        if self.type == "string":
            return str(self.value)
        return str(int(self.value))


@dataclass
class Evaluation:
    """One evaluation of the metric set over the collector view at event time `at`."""

    at: float
    metrics: list[Metric] = field(default_factory=list)
    warnings: Counter[str] = field(default_factory=Counter)

    def by_name(self, name: str, machine: str | None = None) -> list[Metric]:
        return [m for m in self.metrics if m.name == name and (machine is None or m.machine == machine)]


# --- evaluation ----------------------------------------------------------------------------

class _AdScope:
    """One daemon ad during an evaluation: its JSON form and, when needed, its classad2 ad."""

    __slots__ = ("ad", "my_type", "now", "low", "_classad", "regex_attr", "regex_value")

    def __init__(self, ad: Mapping[str, Any], my_type: str, now: float) -> None:
        self.ad = ad
        self.now = now  # the evaluation's event time: what time() in the ad means
        self.my_type = my_type
        self.low = my_type.lower()
        self._classad: ClassAd | None = None
        self.regex_attr: str | None = None
        self.regex_value: Any = None

    def classad(self) -> ClassAd:
        if self.regex_attr is not None:
            # `Regex` refers to the matched attribute, as gangliad inserts it into a copy
            return ad_from_json({**self.ad, "Regex": f"/Expr({self.regex_attr})/"})
        if self._classad is None:
            self._classad = ad_from_json(self.ad)
        return self._classad

    def get(self, attr: str) -> Any:
        """An attribute's value (an expression evaluated), or UNDEFINED."""
        if self.regex_attr is not None and attr.lower() == "regex":
            return self.regex_value
        value = attr_value(self.ad, attr, self.now)
        return Value.Undefined if value is None else value


_PLAIN = (bool, int, float, str)


class Evaluator:
    """Evaluates a metric set over daemon ads; `fast=False` is the all-classad2 baseline."""

    def __init__(self, defs: Sequence[MetricDef], cfg: GangliadConfig, *, fast: bool = True) -> None:
        self.cfg = cfg
        self.fast = fast
        self.defs = [d for d in defs if d.verbosity <= cfg.verbosity]
        self._by_type: dict[str, list[MetricDef]] = {}
        self._memo: dict[tuple[Any, ...], Any] = {}
        self._families: dict[tuple[str, str, str], Family] = {}
        self._requirements = compile_expr(cfg.requirements) if cfg.requirements else None
        self._tmax, self._dmax = cfg.tmax, cfg.dmax
        defaults = {"cluster": cfg.default_cluster, "machine": cfg.default_machine,
                    "ip": cfg.default_ip}
        self._defaults = {k: _classify(compile_expr(v), v) for k, v in defaults.items() if v}

    def _defs_for(self, my_type: str, slot1: bool) -> list[MetricDef]:
        key = f"{my_type.lower()}#{slot1}"
        found = self._by_type.get(key)
        if found is None:
            low = my_type.lower()
            found = [d for d in self.defs
                     if d.any_type or low in d.target_types or (slot1 and d.slot1)]
            self._by_type[key] = found
        return found

    # -- one attribute ------------------------------------------------------------------

    def _eval(self, attr: _Attr, scope: _AdScope) -> Any:
        if not self.fast:
            return _evaluated(attr.tree, scope.classad())
        kind = attr.kind
        if kind == "const":
            return attr.const
        if kind == "ref":
            return scope.get(attr.ref)
        if kind == "expr":
            values = []
            for r in attr.refs:
                v = scope.get(r)
                if v is not Value.Undefined and type(v) not in _PLAIN:
                    return _evaluated(attr.tree, scope.classad())
                values.append(v)
            key = (id(attr), *values)
            hit = self._memo.get(key, _MISSING)
            if hit is _MISSING:
                small = ClassAd({r: v for r, v in zip(attr.refs, values) if v is not Value.Undefined})
                hit = _evaluated(attr.tree, small)
                if len(self._memo) >= 1 << 16:
                    self._memo.clear()
                self._memo[key] = hit
            return hit
        return _evaluated(attr.tree, scope.classad())

    def _value(self, d: MetricDef, scope: _AdScope, attr: str) -> Any:
        """The metric's Value, else the daemon's attribute of that name (UNDEFINED if none)."""
        value: Any = Value.Undefined
        if "value" in d.attrs:
            value = self._eval(d.attrs["value"], scope)
        if value is Value.Undefined:
            value = scope.get(attr)
        return value

    def _string(self, d: MetricDef, name: str, scope: _AdScope, groups: Sequence[str] | None,
                default: str | None = None) -> str | None:
        """An optional string attribute (None: it failed to evaluate to a string)."""
        attr = d.attrs.get(name)
        if attr is None:
            attr = self._defaults.get(name)
            if attr is None:
                return default
        value = self._eval(attr, scope)
        if value is Value.Undefined:
            return default
        if not isinstance(value, str):
            return None
        return _substituted(value, groups)

    def _label_values(self, d: MetricDef, scope: _AdScope, groups: Sequence[str] | None) -> dict[str, str]:
        """The metric's PrometheusLabel_<label> values for this ad (numbers as text, '' when
        undefined: the label set of a family never changes)."""
        out = {}
        for label, attr in d.prom_labels:
            value = self._eval(attr, scope)
            if isinstance(value, str):
                out[label] = _substituted(value, groups)
            elif isinstance(value, (int, float)) and not isinstance(value, bool):
                out[label] = f"{value:g}" if isinstance(value, float) else str(value)
            elif isinstance(value, bool):
                out[label] = "true" if value else "false"
            else:
                out[label] = ""
        return out

    def _family(self, d: MetricDef, name: str, units: str) -> Family:
        """The family of a metric whose Name differs per ad and that has no PrometheusName."""
        key = (d.where, name, units)
        found = self._families.get(key)
        if found is None:
            found = self._families[key] = make_family(derived_body(name, d.prom_kind), d.prom_kind,
                                                      d.prom_help or name, units)
        return found

    # -- one ad -----------------------------------------------------------------------------

    def evaluate(self, ads: Iterable[tuple[str, Mapping[str, Any]]], at: float,
                 collector_host: str | None = None) -> Evaluation:
        """Every metric over `ads` ((MyType, ad) pairs, in a stable order) at event time `at`."""
        out = Evaluation(at)
        aggregates: dict[str, _Aggregate] = {}
        ips: dict[str, str] = {}
        scopes: list[_AdScope] = []
        execute_only: set[str] = set()
        others: set[str] = set()
        for ad_type, ad in ads:
            my_type = ad.get("MyType") if isinstance(ad.get("MyType"), str) else ad_type
            scope = _AdScope(ad, str(my_type), at)
            if self._requirements is not None:
                ok = _evaluated(self._requirements, scope.classad())
                if ok is not True:
                    continue
            scopes.append(scope)
            machine = ad.get("Machine")
            address = ad.get("MyAddress")
            if isinstance(machine, str):
                if isinstance(address, str) and address.startswith("<"):
                    ips.setdefault(machine, address[1:].split(":", 1)[0].split(">", 1)[0])
                (execute_only if scope.low == "machine" else others).add(machine)
        execute_only -= others
        host = collector_host or "localhost"
        for scope in scopes:
            ad = scope.ad
            slot1 = (scope.low == "machine" and attr_value(ad, "SlotID", at) in (1, None)
                     and attr_value(ad, "DynamicSlot", at) is not True)
            for d in self._defs_for(scope.my_type, slot1):
                self._one(d, scope, out, aggregates, ips, host, execute_only)
        for agg in aggregates.values():
            metric = agg.result()
            if metric is not None:
                out.metrics.append(metric)
        return out

    def _one(self, d: MetricDef, scope: _AdScope, out: Evaluation, aggregates: dict[str, _Aggregate],
             ips: Mapping[str, str], host: str, execute_only: set[str]) -> None:
        req = d.attrs.get("requirements")
        if req is not None:
            if self._eval(req, scope) is not True:
                return
        regex = d.attrs.get("regex")
        if regex is None:
            self._emit(d, scope, None, None, out, aggregates, ips, host, execute_only)
            return
        pattern = self._eval(regex, scope)
        if not isinstance(pattern, str) or not pattern:
            out.warnings[f"{d.where}: metric {d.label!r}: Regex is not a string"] += 1
            return
        try:
            compiled = re.compile(pattern)
        except re.error:
            out.warnings[f"{d.where}: metric {d.label!r}: Regex {pattern!r} does not compile"] += 1
            return
        for attr in list(scope.ad):
            m = compiled.match(attr)
            if m is None:
                continue
            groups = [m.group(0), *(g or "" for g in m.groups())]
            scope.regex_attr, scope.regex_value = attr, scope.get(attr)
            try:
                self._emit(d, scope, attr, groups, out, aggregates, ips, host, execute_only)
            finally:
                scope.regex_attr = scope.regex_value = None

    def _emit(self, d: MetricDef, scope: _AdScope, regex_attr: str | None, groups: list[str] | None,
              out: Evaluation, aggregates: dict[str, _Aggregate], ips: Mapping[str, str], host: str,
              execute_only: set[str]) -> None:
        ad = scope.ad
        my_type = scope.low

        def warn(reason: str) -> None:
            out.warnings[f"{d.where}: metric {d.label!r}: {reason}"] += 1

        name = self._string(d, "name", scope, groups, regex_attr)
        if name is None:
            warn("Name is not a string")
            return
        if not name:
            return
        aggregate = (self._string(d, "aggregate", scope, groups, "") or "").lower()
        if aggregate and aggregate not in _AGGREGATES:
            warn(f"Aggregate {aggregate!r} is not sum, avg, min or max")
            return
        if aggregate:
            group = "HTCondor Pool"
        elif my_type == "scheduler":
            group = "HTCondor Schedd"
        elif my_type == "machine":
            group = "HTCondor Startd"
            if not self.cfg.per_execute_node_metrics:
                return
        elif my_type == "daemonmaster":
            group = "HTCondor Master"
            machine_name = ad.get("Machine")
            if not self.cfg.per_execute_node_metrics and machine_name in execute_only:
                return
        else:
            group = f"HTCondor {scope.my_type}"
        aggregate_group = name
        if aggregate:
            aggregate_group = self._string(d, "aggregategroup", scope, groups, name) or name
            known = aggregates.get(aggregate_group) if self.fast else None
            if known is not None:
                # a further datapoint of a group: only its value counts (gangliad folds the
                # raw values and publishes with the first datapoint's attributes)
                raw = self._value(d, scope, regex_attr or name)
                if raw is Value.Undefined:
                    return
                raw = _checked(raw, known.type_name)
                if raw is None:
                    warn(f"Value failed to evaluate for {scope.my_type} {ad.get('Name')!r}")
                    return
                known.add_raw(raw)
                return
        group = self._string(d, "group", scope, groups, group) or group
        title = self._string(d, "title", scope, groups, name) or name
        desc = self._string(d, "desc", scope, groups, "") or ""
        units = self._string(d, "units", scope, groups, "") or ""
        cluster = self._string(d, "cluster", scope, groups, "") or ""
        derivative = False
        if "derivative" in d.attrs:
            derivative = self._eval(d.attrs["derivative"], scope) is True
        scale: float = 1.0
        if "scale" in d.attrs:
            s = self._eval(d.attrs["scale"], scope)
            if isinstance(s, (int, float)) and not isinstance(s, bool) and math.isfinite(s):
                scale = float(s)
        type_name = (self._string(d, "type", scope, groups, "") or "").lower()
        if type_name and type_name not in _TYPES:
            warn(f"Type {type_name!r} is not a Ganglia type")
            return
        value = self._value(d, scope, regex_attr or name)
        if value is Value.Undefined:
            return  # the daemon does not publish it: nothing to report, as in gangliad
        value = _checked(value, type_name)
        if value is None:
            warn(f"Value failed to evaluate for {scope.my_type} {ad.get('Name')!r}")
            return
        declared = type_name
        raw = value
        if not type_name:
            if isinstance(value, bool):
                type_name = "boolean"
            elif isinstance(value, int):
                type_name = "int32"
            elif isinstance(value, float):
                type_name = "float"
            else:
                type_name = "string"
        if type_name == "boolean":
            value, type_name = int(value), "int8"
        elif type_name in ("float", "double"):
            value = float(value) * scale
        elif type_name in _INTEGER_TYPES:
            value = int(int(value) * scale)
        if isinstance(value, float) and not math.isfinite(value):
            warn(f"Value is not finite for {scope.my_type} {ad.get('Name')!r}")
            return
        if aggregate:
            machine = host
        elif (my_type == "machine" and d.slot1) or my_type == "collector":
            machine = _str(ad.get("Machine"))
        elif my_type == "submitter":
            machine = _str(ad.get("ScheddName"))
        elif my_type in _ACCOUNTING_TYPES:
            machine = _str(ad.get("NegotiatorName"))
        else:
            machine = _str(ad.get("Name"))
        explicit = self._string(d, "machine", scope, groups, None)
        machine = explicit or machine
        ip = machine if "@" in machine else ips.get(machine, "")
        ip = self._string(d, "ip", scope, groups, ip) or ip
        lifetime = self._dmax
        if "lifetime" in d.attrs:
            lt = self._eval(d.attrs["lifetime"], scope)
            if isinstance(lt, (int, float)) and not isinstance(lt, bool) and math.isfinite(lt) and lt > 0:
                lifetime = int(lt)
        family = d.family or self._family(d, name, units)
        own = self._label_values(d, scope, groups)
        if aggregate:
            labels = {"machine": machine, **own}
        else:
            labels = {**_labels(scope.my_type, ad, machine, bool(explicit), d.slot1, regex_attr, groups), **own}
        metric = Metric(name=name, value=value, type=type_name, group=group, title=title, desc=desc,
                        units=units, derivative=derivative, machine=machine, ip=ip, cluster=cluster,
                        tmax=self._tmax, dmax=lifetime, family=family,
                        labels=tuple(sorted(labels.items())), aggregate=bool(aggregate))
        if aggregate:
            agg = aggregates.get(aggregate_group)
            if agg is None:
                agg = aggregates[aggregate_group] = _Aggregate(metric, aggregate, declared, scale)
            agg.add_raw(raw)
        else:
            out.metrics.append(metric)


def _str(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _checked(value: Any, type_name: str) -> Any:
    """The value if it suits the metric's Type (gangliad's checks), else None."""
    if value is Value.Error or isinstance(value, Value):
        return None
    if type_name == "string":
        return value if isinstance(value, str) else None
    if type_name in ("float", "double"):
        return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None
    if type_name in _INTEGER_TYPES:
        return value if isinstance(value, int) and not isinstance(value, bool) else None
    if type_name == "boolean":
        return value if isinstance(value, bool) else None
    return value if isinstance(value, _PLAIN) else None


def _group_of(submitter: str) -> str:
    """A submitter's accounting group: the part of its user name before the last '.'."""
    user = submitter.rsplit("@", 1)[0]
    return user.rsplit(".", 1)[0] if "." in user else "<none>"


def _substituted(value: str, groups: Sequence[str] | None) -> str:
    """`\\N` in a Regex metric's string replaced by the N-th group."""
    if not groups or "\\" not in value:
        return value
    return _GROUP_MACRO.sub(lambda m: groups[int(m.group(1))] if int(m.group(1)) < len(groups) else "", value)


def _labels(my_type: str, ad: Mapping[str, Any], machine: str, explicit: bool, slot1: bool,
            regex_attr: str | None, groups: Sequence[str] | None) -> dict[str, str]:
    """Prometheus labels for a daemon's metric. `machine` is always the host: the ad's Machine
    (the host part of gangliad's machine when the metric sets Machine, or the ad has none),
    never a daemon's name; the daemon is in its own label (schedd, negotiator, collector, slot,
    name), the submitter and accounting group where the ad has them, and for a Regex metric
    what it matched (the first group, else the attribute). Each ad type has a fixed label set,
    so a family's series never split."""
    low = my_type.lower()
    host = _str(ad.get("Machine")) if not explicit else ""
    out = {"machine": host or machine.rsplit("@", 1)[-1], "daemon": low}
    if regex_attr is not None:
        out["match"] = groups[1] if groups and len(groups) > 1 and groups[1] else regex_attr
    name = _str(ad.get("Name"))
    if low == "scheduler":
        out["schedd"] = name
    elif low == "negotiator":
        out["negotiator"] = name
    elif low == "collector":
        out["collector"] = name
    elif low == "machine":
        if not slot1:
            out["slot"] = name
    elif low == "submitter":
        out["submitter"] = name
        out["schedd"] = _str(ad.get("ScheddName"))
        out["group"] = _group_of(name)
    elif low in _ACCOUNTING_TYPES:
        out["negotiator"] = _str(ad.get("NegotiatorName"))
        if ad.get("IsAccountingGroup") is True:
            out["group"] = name
        else:
            out["submitter"] = name
            out["group"] = _str(ad.get("AccountingGroup")) or _group_of(name)
    else:
        out["name"] = name
    return out


class _Aggregate:
    """sum/avg/min/max of one AggregateGroup over the datapoints' raw values, published with
    the first datapoint's attributes and Scale. Its Prometheus labels are the collector's host
    and the metric's own PrometheusLabel_<label>s, nothing else: a label that happens to be
    common today (the one schedd of a small pool) would split the series when a second appears."""

    def __init__(self, first: Metric, func: str, type_name: str, scale: float) -> None:
        self.first = first
        self.func = func
        self.type_name = type_name  # the declared Type ('' when inferred), checked per datapoint
        self.scale = scale
        self.total = 0.0
        self.count = 0

    def add_raw(self, value: Any) -> None:
        if isinstance(value, (int, float)):
            n = float(value)
            if self.func in ("sum", "avg"):
                self.total += n
            elif self.count == 0 or (n < self.total if self.func == "min" else n > self.total):
                self.total = n
            self.count += 1

    def result(self) -> Metric | None:
        m = self.first
        if m.type == "string":
            return None
        if self.func == "avg":
            if self.count == 0:
                return None
            total = self.total / self.count
        else:
            total = self.total
        total *= self.scale
        value: int | float = total if m.type in ("float", "double") else int(total)
        return replace(m, value=value)
