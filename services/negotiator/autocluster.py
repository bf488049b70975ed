"""Autoclusters and job order: which idle jobs the matchmaker may treat as one request.

A schedd groups its idle jobs into autoclusters by the values of the SIGNIFICANT_ATTRIBUTES,
so the negotiator computes a match list once per autocluster instead of once per job, and
after one job of an autocluster is rejected it skips the rest of them for the cycle. The
grouping is only sound if every attribute any matchmaking expression reads is significant, so
the significant set is an explicit default list plus every job attribute referenced from the
job's own Requirements/Rank/ConcurrencyLimitsExpr, from the slots' Requirements/Rank/START and
from the negotiator's ranking knobs (computed per cycle from the snapshot).
"""
from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from services.negotiator.fastmatch import ExprText

#: The explicit default SIGNIFICANT_ATTRIBUTES: what HTCondor's schedd always treats as
#: significant (resource requests, universe, the match expressions themselves, accounting
#: identity, concurrency limits). Referenced attributes are added to it at run time.
DEFAULT_SIGNIFICANT_ATTRIBUTES: tuple[str, ...] = (
    "Requirements", "Rank", "RequestCpus", "RequestMemory", "RequestDisk", "RequestGPUs",
    "JobUniverse", "Owner", "User", "AccountingGroup", "NiceUser", "ConcurrencyLimits",
    "ConcurrencyLimitsExpr", "DiskUsage", "ImageSize", "ExecutableSize", "MachineAttrs",
    "WantPreempt",
)

#: Job attributes ordering the schedd's queue for one submitter, best first: the expert
#: priorities, JobPrio, then submission time and id (seed 003).
_PRIO_ATTRS = ("prejobprio1", "prejobprio2", "jobprio", "postjobprio1", "postjobprio2")

_IDENT = re.compile(r"(?<![.\w])(?:(my|target)\s*\.\s*)?([A-Za-z_][A-Za-z0-9_]*)(?!\s*\()",
                    re.I)
_KEYWORDS = frozenset({"true", "false", "undefined", "error", "is", "isnt", "my", "target"})


def referenced_names(text: str) -> tuple[set[str], set[str]]:
    """(names read from the expression's own ad, names read from the other ad), lowercased.

    Unscoped names may resolve in either ad (MY first, then TARGET), so they land in both.
    Strings are stripped first. Over-approximating only costs cache granularity.
    """
    stripped = re.sub(r'"(?:[^"\\]|\\.)*"', '""', text)
    mine: set[str] = set()
    other: set[str] = set()
    for m in _IDENT.finditer(stripped):
        scope, name = (m.group(1) or "").lower(), m.group(2).lower()
        if name in _KEYWORDS:
            continue
        if scope != "target":
            mine.add(name)
        if scope != "my":
            other.add(name)
    return mine, other


#: the job attributes `prio_key` reads, in the order of its key
ORDER_ATTRS = (*_PRIO_ATTRS, "qdate", "clusterid", "procid")


def prio_key(values: Mapping[str, Any]) -> tuple[Any, ...]:
    """Sort key putting a submitter's jobs in schedd order (best first)."""
    return order_key(tuple(map(values.get, ORDER_ATTRS)))


def order_key(order: Sequence[Any]) -> tuple[Any, ...]:
    """`prio_key` of the `ORDER_ATTRS` values `order` (anything not a number counts as
    absent): lets a caller that reads those values straight from job ads skip a dict."""
    key: list[Any] = [
        -float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else 0.0
        for v in order[:5]]
    qdate = order[5]
    key.append(float(qdate) if isinstance(qdate, (int, float)) else 0.0)
    key.append(_int(order[6]))
    key.append(_int(order[7]))
    return tuple(key)


def _int(v: Any) -> int:
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else 0


def _canon(v: Any) -> Any:
    if isinstance(v, ExprText):
        return ("expr", v.text)
    if isinstance(v, str):
        return ("str", v)
    if isinstance(v, bool):
        return ("bool", v)
    if isinstance(v, (int, float)):
        return (type(v).__name__, v)
    return ("other", repr(v))


@dataclass(frozen=True, slots=True)
class AutoclusterKey:
    """Identity of an autocluster: the submitter and its significant attribute values."""

    submitter: str
    values: tuple[tuple[str, Any], ...]


class Autoclusters:
    """Assigns stable small integer ids to (submitter, significant values) combinations."""

    def __init__(self, significant: Iterable[str]) -> None:
        self.significant = tuple(sorted({a.lower() for a in significant}))
        self._ids: dict[AutoclusterKey, int] = {}
        self.keys: list[AutoclusterKey] = []

    def assign(self, submitter: str, values: Mapping[str, Any]) -> int:
        """The autocluster id of a job with lowercased attribute `values`."""
        key = AutoclusterKey(submitter, tuple(
            (a, _canon(values[a])) for a in self.significant if a in values))
        ac = self._ids.get(key)
        if ac is None:
            ac = self._ids[key] = len(self.keys)
            self.keys.append(key)
        return ac

    def describe(self, ac: int) -> dict[str, Any]:
        """The significant attributes of autocluster `ac`, for `poolledger why`."""
        return {a: (v[1] if v[0] != "other" else v[1]) for a, v in self.keys[ac].values}
