"""History from real pools into the log: HTCondor's history formats -> `job.history` events.

Everything enters through the log (DESIGN.md "Sinks"). A schedd `history` file and a startd's
`startd_history` (ads ended by `*** ` banners), `condor_history -l` output (blank-line
separated ads) and `condor_history -json` output are read with schemas.classads (classad2
underneath). Event ids come from the ad — `history:<GlobalJobId>#<RecordTime>` — and ids
already in the log are skipped, so importing a file twice changes nothing. A malformed ad goes
to the events topic's DLQ with `file:line`; the rest is imported.
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Callable, Iterator

import orjson

from adstash.convert import record_time
from schemas.classads import ClassAd, ad_to_json, evaluate, old_syntax, parse_history, \
    parse_json_ads, parse_status_dump
from schemas.errors import ClassAdError
from schemas.events import AdminCommanded, AdUpdated, Envelope, JobHistory, make_event
from streams.log.events import DeadLetter, EventLog
from streams.core.userprio_ops import GROUP_OPS
from streams.log.topics import EVENTS

__all__ = ["ACCOUNTANT_OPS", "AccountantReplay", "ImportReport", "accountant_state",
           "history_event", "history_format", "import_accountant", "import_files",
           "import_history", "import_status"]


@dataclass(slots=True)
class ImportReport:
    """What an import did: events appended, ads already in the log, ads dead-lettered."""

    imported: int = 0
    already: int = 0
    rejected: int = 0
    #: submitters whose unweighted AccumulatedUsage an accountant import could not carry (no
    #: condor_userprio edit sets it), said rather than dropped in silence
    accumulated_not_imported: int = 0


def history_format(text: str) -> str:
    """`json` (condor_history -json), `banner` (history / startd_history files) or `long`
    (condor_history -l: ads separated by blank lines)."""
    head = text.lstrip()[:1]
    if head in ("[", "{"):
        return "json"
    if any(line.startswith("*** ") or line.strip() == "***" for line in text.splitlines()):
        return "banner"
    return "long"


def _ads(path: Path, text: str, bad: list[DeadLetter]) -> Iterator[tuple[int, ClassAd]]:
    """(line, ad) of every readable ad; unreadable ones are appended to `bad`."""
    def on_error(exc: ClassAdError, raw: str) -> None:
        bad.append(DeadLetter(str(exc), raw.encode(), EVENTS, path=str(path),
                              line=_line_of(str(exc))))

    fmt = history_format(text)
    if fmt == "json":
        try:
            ads = parse_json_ads(text, path=str(path))
        except ClassAdError as exc:
            bad.append(DeadLetter(str(exc), text.encode()[:65536], EVENTS, path=str(path)))
            return
        for k, ad in enumerate(ads):
            yield k + 1, ad
        return
    parse = parse_history if fmt == "banner" else parse_status_dump
    for k, ad in enumerate(parse(text, path=str(path), on_error=on_error)):
        yield k + 1, ad


def _line_of(message: str) -> int | None:
    """The line number of a ClassAdError's `file:line:` prefix."""
    parts = message.split(":")
    for p in parts[1:3]:
        if p.strip().isdigit():
            return int(p)
    return None


def history_event(ad: dict[str, Any], ordinal: int) -> Envelope:
    """The `job.history` event of one ad, its id and time derived from the ad alone (the same
    whoever reads the ad: `log import-history` or `follow history`)."""
    fallback = max((int(ad[a]) for a in ("EnteredCurrentStatus", "QDate")
                    if isinstance(ad.get(a), (int, float)) and not isinstance(ad.get(a), bool)
                    and ad[a] > 0), default=0)
    rt = record_time(ad, fallback)
    gjid = ad.get("GlobalJobId")
    if not isinstance(gjid, str) or not gjid:
        gjid = f"UNKNOWN#{ad.get('ClusterId')}.{ad.get('ProcId')}"
    schedd = gjid.split("#")[0]
    return make_event(JobHistory(ad), ts=float(rt), source=f"history@{schedd}", seq=ordinal,
                      id=f"history:{gjid}#{rt}")


def _history_events(path: Path, text: str, bad: list[DeadLetter]) -> Iterator[Envelope]:
    for ordinal, ad in _ads(path, text, bad):
        yield history_event(ad_to_json(ad), ordinal)


EventsOf = Callable[[Path, str, list[DeadLetter]], Iterator[Envelope]]


def import_files(elog: EventLog, paths: list[Path], events_of: EventsOf,
                 id_prefix: str) -> ImportReport:
    """Append the events `events_of` makes of each file (its bad input appended to the list
    it is given, as dead letters naming file:line). Ids come from the input, so events whose
    id is already in the log are skipped and a dead letter already in the DLQ is not sent
    again: importing a file twice changes nothing. Raises OSError for an unreadable file."""
    report = ImportReport()
    known = {env.id for _, env in elog.read(EVENTS) if env.id.startswith(id_prefix)}
    dead = {(d.path, d.line, d.reason) for d in elog.dead_letters(EVENTS)}
    for path in paths:
        text = path.read_text(errors="replace")
        bad: list[DeadLetter] = []
        fresh: list[Envelope] = []
        for env in events_of(path, text, bad):
            if env.id in known:
                report.already += 1
                continue
            known.add(env.id)
            fresh.append(env)
        if fresh:
            report.imported += len(elog.append(EVENTS, fresh))
        report.rejected += len(bad)
        bad = [d for d in bad if (d.path, d.line, d.reason) not in dead]
        if bad:
            elog.dead_letter(EVENTS, bad)
    return report


def import_history(elog: EventLog, paths: list[Path]) -> ImportReport:
    """Append the job ads of HTCondor history files as `job.history` events (see module doc).
    Raises OSError for a file that cannot be read."""
    return import_files(elog, paths, _history_events, "history:")


# --------------------------------------------------------------------------- condor_status -l

_UPDATE_TIMES = ("LastHeardFrom", "DaemonLastUpdate", "MyCurrentTime")


def _block_starts(text: str) -> list[int]:
    """The first line of each blank-line separated block (as parse_status_dump splits)."""
    starts: list[int] = []
    inside = False
    for k, raw in enumerate(text.splitlines(), start=1):
        s = raw.strip()
        if not s:
            inside = False
        elif not s.startswith("#") and not inside:
            starts.append(k)
            inside = True
    return starts


def _status_events(path: Path, text: str, bad: list[DeadLetter]) -> Iterator[Envelope]:
    """`ad.updated` of each ad of a `condor_status -l` dump. The id is MyType/Name and the
    ad's update sequence (UpdateSequenceNumber), else its update time, else a digest of the
    ad; the event time is the ad's update time, else the file's modification time."""
    starts = _block_starts(text)
    block = 0

    def on_error(exc: ClassAdError, raw: str) -> None:
        nonlocal block
        block += 1
        bad.append(DeadLetter(str(exc), raw.encode(), EVENTS, path=str(path),
                              line=_line_of(str(exc))))

    mtime = int(path.stat().st_mtime)
    for ad in parse_status_dump(text, path=str(path), on_error=on_error):
        line = starts[block] if block < len(starts) else None
        block += 1
        data = ad_to_json(ad)
        my_type, name = data.get("MyType"), data.get("Name")
        if not isinstance(my_type, str) or not isinstance(name, str) or not my_type or not name:
            bad.append(DeadLetter(f"{path}:{line}: the ad has no MyType and Name (strings)",
                                  orjson.dumps(data), EVENTS, path=str(path), line=line))
            continue
        when = next((int(data[a]) for a in _UPDATE_TIMES if _positive(data.get(a))), None)
        seqno = data.get("UpdateSequenceNumber")
        stamp = (f"seq{seqno}" if _positive(seqno) else f"t{when}" if when is not None
                 else "sha" + hashlib.sha1(orjson.dumps(data, option=orjson.OPT_SORT_KEYS))
                 .hexdigest()[:16])
        yield make_event(AdUpdated(my_type, name, data), ts=float(when or mtime),
                         source=f"status@{path.name}", seq=block,
                         id=f"status:{my_type}/{name}@{stamp}")


def _positive(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0


def import_status(elog: EventLog, paths: list[Path]) -> ImportReport:
    """Append the ads of `condor_status -l` dumps as `ad.updated` events (a snapshot of a
    real pool's collector). Raises OSError for a file that cannot be read."""
    return import_files(elog, paths, _status_events, "status:")


# --------------------------------------------------------------------------- Accountantnew.log

#: Customer record attribute -> the condor_userprio edit that sets it. AccumulatedUsage (the
#: unweighted total) has no edit: -setaccum sets WeightedAccumulatedUsage only (REFERENCE.md).
ACCOUNTANT_OPS: dict[str, str] = {
    "PriorityFactor": "setfactor", "Priority": "setprio", "WeightedAccumulatedUsage": "setaccum",
    "BeginUsageTime": "setbegin", "LastUsageTime": "setlast", "Floor": "setfloor",
    "Ceiling": "setceil",
}
_ARITY = {"101": (3, 3), "102": (1, 1), "103": (3, 3), "104": (2, 2), "105": (0, 0),
          "106": (0, 0), "107": (1, 3)}


@dataclass(slots=True)
class AccountantReplay:
    """A ClassAd transaction log (Accountantnew.log) replayed so far: its records (key ->
    casefolded attribute -> (attribute, value)), its creation timestamp, and the operations
    of a transaction whose 106 has not been read yet."""

    records: dict[str, dict[str, tuple[str, Any]]] = field(default_factory=dict)
    created: float | None = None
    pending: list[tuple[str, list[Any]]] | None = None

    def _apply(self, op: str, args: list[Any]) -> None:
        records = self.records
        if op == "101":
            records.setdefault(args[0], {})
        elif op == "102":
            records.pop(args[0], None)
        elif op == "103":
            records.setdefault(args[0], {})[args[1].casefold()] = (args[1], args[2])
        elif op == "104":
            records.get(args[0], {}).pop(args[1].casefold(), None)

    def feed(self, path: Path, lines: list[str], bad: list[DeadLetter],
             first_line: int = 1) -> int:
        """Apply the operations of `lines` (ops 101-107; a transaction applies at its 106);
        a malformed line is appended to `bad` with file:line and skipped. Values are old
        ClassAd syntax, evaluated with classad2. Returns how many of `lines` lie before the
        start of a transaction still open at their end (a follower reads those again)."""
        settled = 0
        for k, raw in enumerate(lines, start=first_line):
            line = raw.strip()
            if not line:
                if self.pending is None:
                    settled = k - first_line + 1
                continue
            op, _, rest = line.partition(" ")
            args: list[Any] = rest.split(" ", 2) if op == "103" else rest.split()
            if op not in _ARITY or not _ARITY[op][0] <= len(args) <= _ARITY[op][1]:
                bad.append(DeadLetter(f"{path}:{k}: not a ClassAd log operation: {line[:80]!r}",
                                      raw.encode(errors="surrogateescape"), EVENTS,
                                      path=str(path), line=k))
            elif op == "103":
                try:
                    value = evaluate(old_syntax(args[2]))  # ClassAd logs are old syntax
                except ClassAdError as exc:
                    bad.append(DeadLetter(f"{path}:{k}: {args[1]}: {exc}",
                                          raw.encode(errors="surrogateescape"), EVENTS,
                                          path=str(path), line=k))
                else:
                    self._op(op, [args[0], args[1], value])
            elif op == "105":
                self.pending = []
            elif op == "106":
                for o, a in self.pending or ():
                    self._apply(o, a)
                self.pending = None
            elif op == "107":
                try:
                    self.created = float(args[-1])
                except ValueError:
                    bad.append(DeadLetter(f"{path}:{k}: 107: no timestamp in {line!r}",
                                          raw.encode(errors="surrogateescape"), EVENTS,
                                          path=str(path), line=k))
            else:
                self._op(op, args)
            if self.pending is None:
                settled = k - first_line + 1
        return settled

    def _op(self, op: str, args: list[Any]) -> None:
        if self.pending is not None:
            self.pending.append((op, args))
        else:
            self._apply(op, args)

    def state(self) -> dict[str, dict[str, Any]]:
        """Every record's attributes (the configured casing of each name)."""
        return {key: dict(attrs.values()) for key, attrs in self.records.items()}


def accountant_state(path: Path, text: str,
                     bad: list[DeadLetter]) -> tuple[dict[str, dict[str, Any]], float | None]:
    """The records of a ClassAd transaction log after replaying it (`AccountantReplay`; a
    trailing transaction without its 106 is dropped, as HTCondor does) and its creation
    timestamp."""
    replay = AccountantReplay()
    replay.feed(path, text.splitlines(), bad)
    return replay.state(), replay.created


def _accountant_events(path: Path, text: str, bad: list[DeadLetter],
                       left_out: list[str] | None = None) -> Iterator[Envelope]:
    """admin.command events setting each Customer record's final values, at the accountant's
    LastUpdateTime (else the log's creation time, else the records' latest LastUsageTime).
    The submitters with a nonzero AccumulatedUsage, which no edit sets, go to `left_out`."""
    records, created = accountant_state(path, text, bad)
    if left_out is not None:
        left_out += [key for key, rec in sorted(records.items())
                     if key.startswith("Customer.") and "@" in key
                     and _positive(rec.get("AccumulatedUsage"))]
    acct = records.get("Accountant.", {})
    times = [v for r in records.values() for a, v in r.items()
             if a == "LastUsageTime" and _positive(v)]
    candidates: list[Any] = [acct.get("LastUpdateTime"), created, max(times, default=None)]
    ts = next((float(t) for t in candidates if _positive(t)), None)
    if ts is None:
        bad.append(DeadLetter(f"{path}: no LastUpdateTime, creation timestamp or "
                              "LastUsageTime to date the records by", b"", EVENTS,
                              path=str(path)))
        return
    seq = 0
    for key in sorted(records):
        if not key.startswith("Customer."):
            continue
        name = key[len("Customer."):]
        for attr, op in ACCOUNTANT_OPS.items():
            value = records[key].get(attr)
            if value is None:
                continue
            if "@" not in name and op not in GROUP_OPS:
                continue  # a group record: only its factor, floor and ceiling are editable
            if not isinstance(value, (int, float)) or isinstance(value, bool) \
                    or not math.isfinite(value):
                bad.append(DeadLetter(f"{path}: {key} {attr} = {value!r} is not a number",
                                      orjson.dumps([key, attr, str(value)]), EVENTS,
                                      path=str(path)))
                continue
            seq += 1
            yield make_event(AdminCommanded(op, name, float(value), "import-accountant",  # type: ignore[arg-type]
                                            f"{path.name}: {key} {attr}"),
                             ts=ts, source=f"accountant@{path.name}", seq=seq,
                             id=f"accountant:{name}:{op}:{float(value)!r}@{ts!r}")


def import_accountant(elog: EventLog, paths: list[Path]) -> ImportReport:
    """Append the final Customer records of negotiator Accountantnew.log files as the
    condor_userprio edits that set them, so a real pool's accounting seeds the ledger.
    Raises OSError for a file that cannot be read."""
    left_out: list[str] = []
    report = import_files(elog, paths, partial(_accountant_events, left_out=left_out),
                          "accountant:")
    report.accumulated_not_imported = len(left_out)
    return report
