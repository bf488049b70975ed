"""A real negotiator's Accountantnew.log followed into its Accounting ads.

`log import-accountant` turns the file into condor_userprio edits that SEED PoolLedger's own
accounting. Following it live is different: what the real negotiator writes are observations
of its accounting, not edits of ours, so each Customer record becomes an `ad.updated` of
ad_type "Accounting" — the ad the negotiator would publish — which the reconciliation fold
compares with PoolLedger's numbers. An ad is appended only when its record changed since the
last one appended; a record deleted (condor_userprio -delete) becomes `ad.invalidated`.

The ad, per Customer record (Name = the submitter or group): Priority (the real priority, as
the record keeps it; no LastUpdate, so readers know it is not the EUP), PriorityFactor (the
record's, else DEFAULT_PRIO_FACTOR), ResourcesUsed, WeightedResourcesUsed, AccumulatedUsage,
WeightedAccumulatedUsage, BeginUsageTime, LastUsageTime (0 when the record has none),
IsAccountingGroup (a name without '@'), AccountingGroup (a group's own name; a submitter's
deepest group in GROUP_NAMES, `<none>` without one) and NegotiatorName (the real negotiator's
name, from the follower's option). Its event time is the accountant's LastUpdateTime (the
`Accountant.` record: when the negotiator last updated priorities), else the file's creation
timestamp (op 107).

The file is a ClassAd transaction log (adstash.sources.AccountantReplay): only complete lines
and closed transactions are consumed; the negotiator rewrites it on compaction (a new file
renamed over the old), which the follower sees as a rotation: the new file is replayed from
its start and only the records that differ from the last ads appended are appended again.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Final

from adstash.sources import AccountantReplay
from schemas.events import AdInvalidated, AdUpdated, Envelope
from services.follow.base import Chunk, Follower, Position

__all__ = ["AccountantFollower", "accounting_ad"]

ACCOUNTING: Final = "Accounting"
_CUSTOMER: Final = "Customer."
#: attributes of the ad taken from the record, 0 when the record has none
_ZERO: Final = ("ResourcesUsed", "WeightedResourcesUsed", "AccumulatedUsage",
                "WeightedAccumulatedUsage", "BeginUsageTime", "LastUsageTime")


def _number(value: Any) -> float | int | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return value


def accounting_ad(name: str, record: dict[str, Any], *, negotiator: str, default_factor: float,
                  group_of: Callable[[str], str]) -> dict[str, Any]:
    """The Accounting ad of one Customer record (see the module doc)."""
    is_group = "@" not in name
    prio = _number(record.get("Priority"))
    factor = _number(record.get("PriorityFactor"))
    ad: dict[str, Any] = {
        "MyType": ACCOUNTING, "Name": name, "NegotiatorName": negotiator,
        "Priority": prio if prio is not None else 0.5,
        "PriorityFactor": factor if factor is not None and factor > 0 else default_factor,
        "IsAccountingGroup": is_group,
        "AccountingGroup": name if is_group else group_of(name),
    }
    for attr in _ZERO:
        value = _number(record.get(attr))
        ad[attr] = value if value is not None else 0
    return ad


class AccountantFollower(Follower):
    """Follows Accountantnew.log (see the module doc)."""

    kind = "accountant"

    def __init__(self, *args: Any, negotiator: str, default_factor: float,
                 group_of: Callable[[str], str], **kw: Any) -> None:
        self.negotiator = negotiator
        self.default_factor = default_factor
        self.group_of = group_of
        super().__init__(*args, **kw)

    def new_file(self, carry: dict[str, Any]) -> None:
        carry["records"] = {}
        carry["created"] = None
        carry["line"] = 0

    def read(self, path: Path, pos: Position, final: bool) -> Chunk:
        with open(path, "rb") as f:
            f.seek(pos.offset)
            data = f.read()
        end = len(data) if final else data.rfind(b"\n") + 1
        if end <= 0:
            return Chunk([], [], pos.offset)
        lines = data[:end].decode("utf-8", errors="surrogateescape").splitlines(keepends=True)
        carry = pos.carry
        replay = AccountantReplay(
            records={k: {a.casefold(): (a, v, 0) for a, v in attrs.items()}
                     for k, attrs in carry.get("records", {}).items()},
            created=carry.get("created"))
        bad: list[Any] = []
        first = int(carry.get("line", 0)) + 1
        settled = replay.feed(path, lines, bad, first_line=first)
        offsets = [pos.offset]
        for line in lines:
            offsets.append(offsets[-1] + len(line.encode("utf-8", errors="surrogateescape")))
        # lines of a transaction still open are read again next time: named then, not now
        dead = [self.dead_letter(path, offsets[(d.line or first) - first],
                                 d.reason.split(": ", 1)[-1], d.raw, d.line)
                for d in bad if (d.line or first) - first < settled]
        carry["records"] = {k: {a: v for a, v in attrs.items()
                                if v is None or isinstance(v, (bool, int, float, str))}
                            for k, attrs in replay.state().items()}
        carry["created"] = replay.created
        carry["line"] = first - 1 + settled
        return Chunk(self._changes(pos), dead, offsets[settled])

    def _changes(self, pos: Position) -> list[Envelope]:
        """ad.updated for each record that differs from the last ad appended, ad.invalidated
        for each record gone, at the accountant's LastUpdateTime."""
        carry = pos.carry
        records: dict[str, dict[str, Any]] = carry["records"]
        published: dict[str, dict[str, Any]] = carry.setdefault("published", {})
        stamp = _number(records.get("Accountant.", {}).get("LastUpdateTime"))
        ts = stamp if stamp is not None and stamp > 0 else carry.get("created")
        if not isinstance(ts, (int, float)) or ts <= 0:
            return []  # nothing dates the records yet; they are compared again next time
        out = []
        current = {}
        for key in sorted(records):
            if key.startswith(_CUSTOMER):
                name = key[len(_CUSTOMER):]
                current[name] = accounting_ad(name, records[key], negotiator=self.negotiator,
                                              default_factor=self.default_factor,
                                              group_of=self.group_of)
        for name, ad in current.items():
            if published.get(name) != ad:
                published[name] = ad
                out.append(self.event(AdUpdated(ACCOUNTING, name, ad), float(ts), pos))
        for name in sorted(set(published) - set(current)):
            del published[name]
            out.append(self.event(AdInvalidated(ACCOUNTING, name), float(ts), pos))
        return out
