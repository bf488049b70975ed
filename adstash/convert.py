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
from schemas.classads import ClassAd, Value, ad_from_json, is_expr_json
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
    """When the job left the queue: for removed/completed/error jobs CompletionDate, else
    EpochWriteDate, else EnteredCurrentStatus (when > 0); otherwise `fallback`."""
    if ad.get("JobStatus") in (3, 4, 6):
        for attr in ("CompletionDate", "EpochWriteDate", "EnteredCurrentStatus"):
            t = _number(ad.get(attr, 0))
            if t > 0:
                return int(t)
    return int(fallback)


def _typed(key: str, value: Any) -> tuple[str, Any] | None:
    """adstash's cast of one evaluated value; None drops it (zero dates)."""
    try:
        if key in fields.TEXT or key in fields.INDEXED_KEYWORD or key in fields.NOINDEX_KEYWORD:
            return key, _text(value)
        if key in fields.FLOAT:
            return key, float(value)
        if key in fields.INT or key.endswith("Provisioned") or key.startswith("Request"):
            return key, _int64(value)
        if key in fields.BOOL or key[:4] == "Want" or key[:3] == "Has" or key[:2] == "Is":
            return key, bool(value)
        if key in fields.DATE or key.endswith("Date"):
            t = _int64(value)
            return None if t == 0 else (key, t)
        if key in fields.NESTED:
            return key, _nested(value)
    except (TypeError, ValueError, OverflowError):
        return f"{key}_STRING", _text(value)
    return key, _text(value)


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
        return {k: _plain(value.eval(k)) for k in value}
    if isinstance(value, Mapping):
        return dict(value)
    raise ValueError(f"not a nested ad: {value!r}")


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
    classad: ClassAd | None = None
    for attr, raw in ad.items():
        key = case_normalize(attr)
        if key in fields.IGNORE:
            continue
        value = raw
        if raw is None or is_expr_json(raw) or isinstance(raw, dict):
            if classad is None:
                try:
                    classad = ad_from_json(ad)
                except ClassAdError as exc:
                    raise ConvertError(f"cannot read the job ad: {exc}") from None
            value = classad.eval(attr)
            if value is Value.Error or value is Value.Undefined:
                expr = classad.lookup(attr) if attr in classad else None
                doc[f"{key}_EXPR"] = _cut(str(expr) if expr is not None else "undefined")
                continue
            if isinstance(value, Value):
                continue
        typed = _typed(key, value)
        if typed is not None:
            doc[typed[0]] = _cut(typed[1])
    if metadata:
        doc["metadata"] = dict(metadata)
    return doc


def doc_id(doc: Mapping[str, Any]) -> str:
    """adstash's document id `<GlobalJobId>#<RecordTime>` (unique per job and record time);
    an ad without GlobalJobId (adstash would fail on it) gets `UNKNOWN#<ClusterId>.<ProcId>`."""
    gjid = doc.get("GlobalJobId") or f"UNKNOWN#{doc['ClusterId']}.{doc['ProcId']}"
    return f"{gjid}#{doc['RecordTime']}"

