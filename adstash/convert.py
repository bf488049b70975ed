"""Job ClassAd -> Elasticsearch document, by condor_adstash's rules (REFERENCE.md).

The ad arrives in HTCondor's JSON form (a `job.history` payload): literals are converted
directly, and only attributes holding an expression are evaluated, with classad2, in the
context of the whole ad — so an ad of plain values costs no ClassAd at all (the sink must keep
up with several thousand ads per second).

One deliberate difference: where adstash falls back to its own launch time for `RecordTime`,
this uses the event's time, so a redelivered or re-imported ad gets the same document id
(DESIGN.md: event time only; exactly-once effect).
"""
from __future__ import annotations

import re
from typing import Any, Mapping

from adstash import fields
from schemas.classads import ClassAd, Value, ad_from_json, eval_tree, is_expr_json
from schemas.errors import ClassAdError

__all__ = ["AdstashError", "ConvertError", "case_normalize", "doc_id", "record_time", "to_doc"]

MAX_STRING = 256  # longer strings are cut to 253 characters plus "..."


class AdstashError(Exception):
    """Root of the adstash package's errors."""


class ConvertError(AdstashError):
    """A job ad that cannot become a document (it names the attribute)."""


_KNOWN_BY_FOLD = {name.casefold(): name for name in fields.KNOWN}
_AUTO_DATE = re.compile(r"^(.*)(Date)$")
_AUTO_PROVISIONED = re.compile(r"^(.*)(Provisioned)$")
_AUTO_REQUEST = re.compile(r"^(Request)([A-Za-df-z].*)$")  # not "Requested..."
_AUTO_BOOL = re.compile(r"^(Want|Has|Is)([A-Z_].*)$", re.IGNORECASE)
_NAME_CACHE: dict[str, str] = {}


def _capitalized(m: re.Match[str]) -> str:
    return "".join(part.capitalize() for part in m.groups())


def case_normalize(attr: str) -> str:
    """adstash's field name for a ClassAd attribute: the known casing, the re-cased
    Date/Provisioned/Request/Want/Has/Is families, or lowercase (ES names are case-sensitive)."""
    cached = _NAME_CACHE.get(attr)
    if cached is not None:
        return cached
    out: str | None = attr if attr in fields.KNOWN else _KNOWN_BY_FOLD.get(attr.casefold())
    if out is None:
        for pattern, test in ((_AUTO_DATE, attr.endswith("Date")),
                              (_AUTO_PROVISIONED, attr.endswith("Provisioned")),
                              (_AUTO_REQUEST, attr.startswith("Request")),
                              (_AUTO_BOOL, attr[:4].lower() == "want" or attr[:3].lower() == "has"
                               or attr[:2].lower() == "is")):
            m = pattern.match(attr) if test else None
            if m:
                out = _capitalized(m)
                break
    if out is None:
        out = attr.casefold()
    if len(_NAME_CACHE) < 100_000:
        _NAME_CACHE[attr] = out
    return out


def _number(value: Any) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0.0


def record_time(ad: Mapping[str, Any], fallback: int) -> int:
    """When the record was written, as condor_adstash dates it: for removed/completed/error jobs
    CompletionDate (when > 0); then, for every status, EpochWriteDate (job-epoch ads), then
    EnteredCurrentStatus (when > 0); otherwise `fallback`."""
    attrs = ("CompletionDate", "EpochWriteDate", "EnteredCurrentStatus") \
        if ad.get("JobStatus") in (3, 4, 6) else ("EpochWriteDate", "EnteredCurrentStatus")
    for attr in attrs:
        t = _number(ad.get(attr, 0))
        if t > 0:
            return int(t)
    return int(fallback)


# how a field's value is cast, decided once per field name (the per-ad loop is the hot path)
_TEXT, _FLOAT, _INT, _BOOL, _DATE, _NESTED, _OTHER, _SKIP = range(8)
_PLAN: dict[str, tuple[str, int]] = {}


def _plan(attr: str) -> tuple[str, int]:
    """(adstash field name, cast) of a ClassAd attribute, cached."""
    got = _PLAN.get(attr)
    if got is not None:
        return got
    key = case_normalize(attr)
    if key in fields.IGNORE:
        kind = _SKIP
    elif key in fields.TEXT or key in fields.INDEXED_KEYWORD or key in fields.NOINDEX_KEYWORD:
        kind = _TEXT
    elif key in fields.FLOAT:
        kind = _FLOAT
    elif key in fields.INT or key.endswith("Provisioned") or key.startswith("Request"):
        kind = _INT
    elif key in fields.BOOL or key[:4] == "Want" or key[:3] == "Has" or key[:2] == "Is":
        kind = _BOOL
    elif key in fields.DATE or key.endswith("Date"):
        kind = _DATE
    elif key in fields.NESTED:
        kind = _NESTED
    else:
        kind = _OTHER
    if len(_PLAN) < 100_000:
        _PLAN[attr] = (key, kind)
    return key, kind


def _typed(key: str, kind: int, value: Any) -> tuple[str, Any] | None:
    """adstash's cast of one evaluated value; None drops it (zero dates)."""
    try:
        if kind == _TEXT or kind == _OTHER:
            return key, _text(value)
        if kind == _FLOAT:
            return key, float(value)
        if kind == _INT:
            return key, _int64(value)
        if kind == _BOOL:
            return key, bool(value)
        if kind == _DATE:
            t = _int64(value)
            return None if t == 0 else (key, t)
        return key, _nested(value)
    except (TypeError, ValueError, OverflowError):
        return f"{key}_STRING", _text(value)


def _int64(value: Any) -> int:
    """int() as adstash casts, refusing what no JSON encoder or long field can hold."""
    v = int(value)
    if not -(1 << 63) <= v < (1 << 63):
        raise OverflowError(f"{value!r} exceeds 64 bits")
    return v


def _text(value: Any) -> str:
    if isinstance(value, ClassAd):
        return str(value)
    return str(value)


def _nested(value: Any) -> dict[str, Any]:
    if isinstance(value, ClassAd):
        return {k: _plain(_value_in(value, k)) for k in value}
    if isinstance(value, Mapping):
        return dict(value)
    raise ValueError(f"not a nested ad: {value!r}")


def _value_in(ad: ClassAd, attr: str) -> Any:
    """`ad`'s attribute evaluated; ERROR when classad2 refuses (too deep, too much work)."""
    try:
        return eval_tree(ad.lookup(attr), ad)
    except ClassAdError:
        return Value.Error


def _plain(value: Any) -> Any:
    if isinstance(value, Value):
        return None
    if isinstance(value, ClassAd):
        return _nested(value)
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _cut(value: Any) -> Any:
    if isinstance(value, str) and len(value) > MAX_STRING:
        return value[:MAX_STRING - 3] + "..."
    return value


def _holds_expr(values: list[Any]) -> bool:
    """True when a JSON-form list holds an unevaluated expression or an ad, at any depth."""
    return any(isinstance(v, dict) or (isinstance(v, str) and is_expr_json(v))
               or (isinstance(v, list) and _holds_expr(v)) for v in values)


_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_REFS: dict[str, frozenset[str]] = {}


def _names_in(value: Any) -> frozenset[str] | None:
    """Every identifier an expression's text names (lowercased, a superset of its attribute
    references), cached by text; None when the value could reach attributes by a computed
    name (eval()) or holds nested expressions, which need the whole ad."""
    if value is None:
        return frozenset()
    if isinstance(value, list):  # rare (a list holding an expression): the whole ad
        return None
    if isinstance(value, dict):
        return frozenset() if not any(v is None or isinstance(v, dict) or is_expr_json(v)
                                      for v in value.values()) else None
    got = _REFS.get(value)
    if got is None:
        names = frozenset(n.lower() for n in _IDENT.findall(value))
        got = frozenset({"\0eval"}) if "eval" in names else names
        if len(_REFS) < 10_000:
            _REFS[value] = got
    return None if "\0eval" in got else got


def _context(ad: Mapping[str, Any], evaluated: list[str]) -> ClassAd:
    """The ClassAd the evaluated attributes are evaluated in: only they and the attributes
    their expressions name (case-insensitively), which evaluates exactly as the whole ad would
    (an attribute reference is by name) at a fraction of the cost of converting ~100
    attributes to ClassAd values per job ad."""
    wanted: set[str] = set()
    for attr in evaluated:
        names = _names_in(ad[attr])
        if names is None:
            wanted = set()
            break
        wanted |= names
    else:
        sub = {k: v for k, v in ad.items() if k in evaluated or k.lower() in wanted}
        ad = sub
    try:
        return ad_from_json(ad)
    except ClassAdError as exc:
        raise ConvertError(f"cannot read the job ad: {exc}") from None


_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1
#: (attribute, expression text, the values of the attributes it names) -> its fields. An
#: expression's value depends on nothing else (`_context` evaluates it in exactly those
#: attributes), and a pool's history repeats the same Requirements over a cluster's jobs, so
#: most ads need no ClassAd at all. Expressions naming a function whose value is not fixed
#: by its arguments (time(), random(), ...) are never memoized.
_MEMO: dict[tuple[Any, ...], tuple[tuple[str, Any], ...]] = {}
_UNSTABLE = frozenset({"time", "random", "splittime", "formattime", "\0eval"})


def _evaluated(ad: Mapping[str, Any], evaluated: list[str]) -> list[tuple[str, Any]]:
    """The document fields of the attributes holding expressions (or nested ads, undefined)."""
    memo_key: tuple[Any, ...] | None = None
    raws = [ad[attr] for attr in evaluated]
    if all(isinstance(raw, str) for raw in raws):
        names: frozenset[str] | None = frozenset()
        for raw in raws:
            found = _names_in(raw)
            names = None if found is None or names is None else names | found
        if names is not None and not names & _UNSTABLE:
            # typed, and reals by their bits: 1, 1.0 and true (equal in Python) or 0.0 and
            # -0.0 evaluate differently
            referenced = sorted((k.lower(), type(v).__name__,
                                 v.hex() if type(v) is float else v)
                                for k, v in ad.items() if k.lower() in names)
            try:
                memo_key = (*evaluated, *raws, *referenced)
                got = _MEMO.get(memo_key)
            except TypeError:  # an unhashable value (a list): evaluate
                memo_key = got = None
            if got is not None:
                return list(got)
    out: list[tuple[str, Any]] = []
    classad = _context(ad, evaluated)
    for attr in evaluated:
        key, kind = _plan(attr)
        try:
            value = eval_tree(classad.lookup(attr), classad)
        except ClassAdError as exc:  # this document's rejection, with the reason
            raise ConvertError(f"{attr}: {exc}") from None
        if value is Value.Error or value is Value.Undefined:
            expr = classad.lookup(attr) if attr in classad else None
            out.append((f"{key}_EXPR", _cut(str(expr) if expr is not None else "undefined")))
            continue
        if isinstance(value, Value):
            continue
        typed = _typed(key, kind, value)
        if typed is not None:
            out.append((typed[0], _cut(typed[1])))
    if memo_key is not None and len(_MEMO) < 10_000:
        _MEMO[memo_key] = tuple(out)
    return out


def to_doc(ad: Mapping[str, Any], *, fallback_time: float,
           metadata: Mapping[str, Any] | None = None) -> dict[str, Any] | None:
    """The document for one job ad (JSON form), or None for a DAGMan ROOT task ad, which
    adstash skips. Raises ConvertError when the ad cannot be read or has no GlobalJobId."""
    if ad.get("TaskType") == "ROOT":
        return None
    gjid = ad.get("GlobalJobId")
    if not isinstance(gjid, str) or not gjid:
        if not isinstance(ad.get("ClusterId"), int) or not isinstance(ad.get("ProcId"), int):
            raise ConvertError("job ad has neither GlobalJobId nor ClusterId and ProcId "
                               "(the document id needs them)")
        gjid = "UNKNOWN"
    host = ad.get("RemoteHost", ad.get("LastRemoteHost", "UNKNOWN@UNKNOWN"))
    host = host if isinstance(host, str) else "UNKNOWN@UNKNOWN"
    doc: dict[str, Any] = {
        "RecordTime": record_time(ad, int(fallback_time)),
        "ScheddName": gjid.split("#")[0],
        "StartdSlot": host.split("@")[0],
        "StartdName": host.split("@")[-1],
        "Status": fields.STATUS.get(ad.get("JobStatus"), "Unknown"),  # type: ignore[arg-type]
        "Universe": fields.UNIVERSE.get(ad.get("JobUniverse"), "Unknown"),  # type: ignore[arg-type]
    }
    evaluated: list[str] = []
    for attr, raw in ad.items():
        key, kind = _PLAN.get(attr) or _plan(attr)
        if kind == _SKIP:
            continue
        # the literal kinds history ads are made of, cast inline: the same values `_typed`
        # gives (tests/test_adstash_convert.py compares them), without a call per attribute
        t = type(raw)
        if t is str:
            if raw[:6] == "/Expr(" and is_expr_json(raw):
                evaluated.append(attr)
                continue
            if kind == _TEXT or kind == _OTHER:
                doc[key] = raw if len(raw) <= MAX_STRING else _cut(raw)
                continue
        elif t is int:
            if (kind == _INT or kind == _DATE) and _INT64_MIN <= raw <= _INT64_MAX:
                if raw != 0 or kind == _INT:
                    doc[key] = raw
                continue
        elif t is float:
            if kind == _FLOAT:
                doc[key] = raw
                continue
        elif t is bool:
            if kind == _BOOL:
                doc[key] = raw
                continue
        elif raw is None or isinstance(raw, dict) or (t is list and _holds_expr(raw)):
            # a list holding an expression: classad2 writes it as HTCondor does
            # (`[1, RequestCpus * 2]`), never in the JSON form's `/Expr(...)/` encoding
            evaluated.append(attr)
            continue
        typed = _typed(key, kind, raw)
        if typed is not None:
            value = typed[1]
            doc[typed[0]] = value if not isinstance(value, str) or len(value) <= MAX_STRING \
                else _cut(value)
    if evaluated:
        doc.update(_evaluated(ad, evaluated))
    if metadata:
        doc["metadata"] = dict(metadata)
    return doc


def doc_id(doc: Mapping[str, Any]) -> str:
    """adstash's document id `<GlobalJobId>#<RecordTime>` (unique per job and record time);
    an ad without GlobalJobId (adstash would fail on it) gets `UNKNOWN#<ClusterId>.<ProcId>`."""
    gjid = doc.get("GlobalJobId") or f"UNKNOWN#{doc['ClusterId']}.{doc['ProcId']}"
    return f"{gjid}#{doc['RecordTime']}"

