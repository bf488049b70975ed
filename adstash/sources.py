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
import re
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Callable, Iterator

import orjson

from adstash.convert import record_time
from schemas.classads import MAX_EXPR_CHARS, ClassAd, ad_from_json, ad_to_json, evaluate, \
    old_syntax, parse_ad
from schemas.errors import ClassAdError, EventValidationError
from schemas.events import (AdminCommanded, AdUpdated, ConfigChanged, Envelope, JobHistory,
                            JobStarted, conflict,
                            content_digest, encode, make_event, validated)
from streams.log.events import DeadLetter, EventLog
from streams.core.groups import ROOT, GroupTree
from streams.log.topics import EVENTS

__all__ = ["ACCOUNTANT_OPS", "AccountantReplay", "ImportReport", "TimeBound", "accountant_state",
           "dump_time", "groups_not_configured", "history_event", "import_accountant",
           "import_files", "import_history", "import_status"]


@dataclass(frozen=True, slots=True)
class TimeBound:
    """How far ahead an imported event's time may lie: `skew` (POOLLEDGER_MAX_EVENT_SKEW)
    past the later of the log's latest event and the wall clock `wall` (the importer's edge)."""

    skew: float
    wall: float


@dataclass(slots=True)
class ImportReport:
    """What an import did: events appended, ads already in the log, ads dead-lettered."""

    imported: int = 0
    already: int = 0
    rejected: int = 0
    #: records whose unweighted AccumulatedUsage an accountant import could not carry (no
    #: condor_userprio edit sets it), said rather than dropped in silence
    accumulated_not_imported: int = 0
    #: `file:line` of the lines that were not UTF-8 and were read as Latin-1
    latin1: list[str] = field(default_factory=list)
    #: why each event the readers' contract (or a conflicting id) refused was not appended
    #: (also in `rejected`, and in the DLQ)
    refused: list[str] = field(default_factory=list)


# --- reading files: streamed, line by line, bounded -------------------------------------------
#
# HTCondor ends every ad it writes: a history file's with a `*** ...` banner, condor_status -l's
# and condor_history -l's with a blank line. The files are read a line at a time (a 100 MB
# attribute is skipped unread, not held), each line decoded as UTF-8, or else as Latin-1 (the
# bytes as the schedd wrote them; the import says which lines), and an ad the file ends inside
# (a copy cut mid-ad) is refused with file:line, never imported as complete.

#: the longest line read whole: one attribute beyond the ClassAd bound is refused anyway
MAX_LINE_BYTES = MAX_EXPR_CHARS + 4096
#: the largest ad (characters) an import reads: far beyond a real job or machine ad
MAX_AD_BYTES = 16 << 20
#: the largest JSON file (condor_history -json) read as one document
MAX_JSON_BYTES = 256 << 20


@dataclass(slots=True)
class _Line:
    number: int
    text: str | None  # None: longer than MAX_LINE_BYTES (skipped unread)
    ended: bool  # by a newline (the file's last line may not be)


def _lines(path: Path, latin1: list[str]) -> Iterator[_Line]:
    """The file's lines, streamed; lines that are not UTF-8 are read as Latin-1 and their
    `file:line` appended to `latin1`."""
    with path.open("rb") as f:
        number = 0
        while True:
            raw = f.readline(MAX_LINE_BYTES + 1)
            if not raw:
                return
            number += 1
            if len(raw) > MAX_LINE_BYTES:
                while raw and not raw.endswith(b"\n"):  # the rest of the line, unread
                    raw = f.readline(1 << 20)
                yield _Line(number, None, bool(raw))
                continue
            ended = raw.endswith(b"\n")
            body = raw.rstrip(b"\n").rstrip(b"\r")
            try:
                text = body.decode("utf-8")
            except UnicodeDecodeError:
                text = body.decode("latin-1")
                latin1.append(f"{path}:{number}")
            yield _Line(number, text, ended)


@dataclass(slots=True)
class _Block:
    """One ad's lines as the file holds them, and why it is refused unread (if it is)."""

    first: int
    lines: list[str] = field(default_factory=list)
    size: int = 0
    problem: str | None = None
    open: bool = False  # the file ended inside it


def _blocks(path: Path, latin1: list[str]) -> Iterator[_Block]:
    """The ads of a history file or an -l dump, each ended by a banner or a blank line; the
    one the file ends inside, if any, marked `open`."""
    block: _Block | None = None
    for line in _lines(path, latin1):
        if line.text is None:
            if block is None:
                block = _Block(line.number)
            block.problem = block.problem or (f"line {line.number} is longer than "
                                              f"{MAX_LINE_BYTES} bytes")
            block.lines = []
            continue
        s = line.text.strip()
        if not s or s.startswith("***"):
            if block is not None:
                yield block
            block = None
            continue
        if block is None:
            if s.startswith("#"):
                continue  # a comment between ads
            block = _Block(line.number)
        if block.problem is None:
            block.size += len(line.text) + 1
            if block.size > MAX_AD_BYTES:
                block.problem, block.lines = f"an ad of more than {MAX_AD_BYTES} bytes", []
            else:
                block.lines.append(line.text)
    if block is not None:
        block.open = True
        yield block


def _json_ads(path: Path, bad: list[DeadLetter]) -> Iterator[tuple[int, ClassAd]]:
    """condor_history -json (one JSON array, or one ad) or JSON Lines (-jsonl: one ad a line)."""
    if path.stat().st_size > MAX_JSON_BYTES:
        bad.append(DeadLetter(f"{path}: a JSON file of more than {MAX_JSON_BYTES} bytes (split "
                              "it, or use condor_history -l or -jsonl, which are streamed)",
                              b"", EVENTS, path=str(path)))
        return
    raw = path.read_bytes()
    try:
        whole = orjson.loads(raw)
    except orjson.JSONDecodeError:
        whole = None
    located: list[tuple[int | None, Any]] = []
    if whole is not None:
        items = whole if isinstance(whole, list) else [whole]
        located = [(None, item) for item in items]
    else:  # JSON Lines, or broken JSON: each line on its own, refused by file:line
        for number, text in enumerate(raw.split(b"\n"), start=1):
            if not text.strip():
                continue
            try:
                located.append((number, orjson.loads(text)))
            except orjson.JSONDecodeError as exc:
                bad.append(DeadLetter(f"{path}:{number}: not JSON: {exc.msg}", text[:65536],
                                      EVENTS, path=str(path), line=number))
    for n, (k, item) in enumerate(located, start=1):
        where = f"{path}:{k}" if k is not None else f"{path}: item {n}"
        try:
            if not isinstance(item, dict):
                raise ClassAdError("not a JSON object")
            ad = ad_from_json(item)
        except ClassAdError as exc:
            bad.append(DeadLetter(f"{where}: {exc}", orjson.dumps(item)[:65536], EVENTS,
                                  path=str(path), line=k))
            continue
        yield (k if k is not None else n), ad


def _is_json(path: Path) -> bool:
    with path.open("rb") as f:
        head = f.read(4096).lstrip()
    return head[:1] in (b"[", b"{")


def _ads(path: Path, bad: list[DeadLetter], latin1: list[str]
         ) -> Iterator[tuple[int, ClassAd]]:
    """(first line, ad) of every readable ad; unreadable ones are appended to `bad`."""
    if _is_json(path):
        yield from _json_ads(path, bad)
        return
    for block in _blocks(path, latin1):
        text = "\n".join(block.lines)
        if block.problem is not None:
            bad.append(DeadLetter(f"{path}:{block.first}: {block.problem}",
                                  text.encode(errors="surrogateescape")[:65536], EVENTS,
                                  path=str(path), line=block.first))
            continue
        try:
            ad = parse_ad(text, str(path), first_line=block.first)
        except ClassAdError as exc:
            bad.append(DeadLetter(str(exc), text.encode(errors="surrogateescape")[:65536],
                                  EVENTS, path=str(path), line=exc.line or block.first))
            continue
        if block.open:  # parsed, yet perhaps only the first half of an ad
            bad.append(DeadLetter(
                f"{path}:{block.first}: the file ends inside this ad (no `***` banner or blank "
                "line after it, which HTCondor writes after every ad): a copy cut mid-ad?",
                text.encode(errors="surrogateescape")[:65536], EVENTS, path=str(path),
                line=block.first))
            continue
        if len(ad):
            yield block.first, ad


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


def _history_events(path: Path, bad: list[DeadLetter], latin1: list[str]
                    ) -> Iterator[tuple[int | None, Envelope]]:
    for ordinal, (line, ad) in enumerate(_ads(path, bad, latin1), start=1):
        yield line, history_event(ad_to_json(ad), ordinal)


#: the events of one file with the line each comes from (None: the whole file's): its bad
#: input appended to the first list (dead letters naming file:line), the `file:line` of lines
#: read as Latin-1 to the second
EventsOf = Callable[[Path, list[DeadLetter], list[str]], Iterator[tuple[int | None, Envelope]]]


def import_files(elog: EventLog, paths: list[Path], events_of: EventsOf,
                 id_prefix: str, bound: TimeBound | None = None) -> ImportReport:
    """Append the events `events_of` makes of each file (its bad input appended to the list
    it is given, as dead letters naming file:line). Ids come from the input, so events whose
    id is already in the log are skipped and a dead letter already in the DLQ is not sent
    again: importing a file twice changes nothing. Each event is checked with the readers'
    contract first (`schemas.events.validated`; an event time more than the skew bound past
    the log's latest and the wall clock, `bound`, where the ledger would dead-letter it,
    too), and an event whose id the log holds with other content
    (another ad with the same GlobalJobId) is refused naming both versions: either goes to
    the DLQ, never to the log. Raises OSError for an unreadable file."""
    report = ImportReport()
    known: dict[str, bytes] = {}
    latest = None if bound is None else bound.wall
    for _, env in elog.read(EVENTS):
        if env.id.startswith(id_prefix):
            known[env.id] = content_digest(env)
        if latest is not None and env.ts > latest:
            latest = env.ts
    horizon = None if bound is None or latest is None else latest + bound.skew
    dead = {(d.path, d.line, d.reason) for d in elog.dead_letters(EVENTS)}
    for path in paths:
        bad: list[DeadLetter] = []
        fresh: list[Envelope] = []
        for line, env in events_of(path, bad, report.latin1):
            refusal, digest = _refusal(elog, env, known.get(env.id), horizon)
            if refusal is not None:  # the readers' contract, at the door
                where = f"{path}:{line}" if line is not None else str(path)
                report.refused.append(f"{where}: {refusal}")
                bad.append(DeadLetter(f"{where}: {refusal}", encode(env), EVENTS, path=str(path),
                                      line=line))
                continue
            if env.id in known:
                report.already += 1
                continue
            known[env.id] = digest
            fresh.append(env)
        if fresh:
            report.imported += len(elog.append(EVENTS, fresh))
        report.rejected += len(bad)
        bad = [d for d in bad if (d.path, d.line, d.reason) not in dead]
        if bad:
            elog.dead_letter(EVENTS, bad)
    return report


def _refusal(elog: EventLog, env: Envelope, held: bytes | None,
             horizon: float | None) -> tuple[str | None, bytes]:
    """Why `env` may not be appended (None: it may), and its digest: the readers' contract
    refuses it, its time lies past `horizon`, or the log holds its id with other content
    (`held`: that event's digest; both versions are named)."""
    try:
        checked = validated(env)
    except EventValidationError as exc:
        return str(exc), b""
    if horizon is not None and checked.ts > horizon:
        return (f"event {env.id}: event time {checked.ts:.0f} lies more than "
                f"POOLLEDGER_MAX_EVENT_SKEW past the log's time and the clock ({horizon:.0f}): "
                "every reader would dead-letter it"), b""
    digest = content_digest(checked)
    if held is not None and held != digest:
        old = next((e for _, e in elog.read(EVENTS) if e.id == env.id), None)
        if old is not None:  # else: one appended by this import (known by digest only)
            return conflict(old, checked), digest
        return f"event {env.id} appears twice in this import with different content", digest
    return None, digest


def import_history(elog: EventLog, paths: list[Path], bound: TimeBound | None = None
                   ) -> ImportReport:
    """Append the job ads of HTCondor history files as `job.history` events (see module doc).
    Raises OSError for a file that cannot be read."""
    return import_files(elog, paths, _history_events, "history:", bound)


# --------------------------------------------------------------------------- condor_status -l

_UPDATE_TIMES = ("LastHeardFrom", "DaemonLastUpdate", "MyCurrentTime")
#: times an ad of a dump may carry, each at or before the moment the dump was taken (the
#: collector's LastHeardFrom, the daemon's clock when it sent the ad, its start, its state's)
_DUMP_TIMES = (*_UPDATE_TIMES, "LastUpdate", "DaemonStartTime", "EnteredCurrentState",
               "EnteredCurrentActivity", "MonitorSelfTime", "LastBenchmark", "JobStart")


def dump_time(path: Path) -> float | None:
    """When a `condor_status -l` dump was taken, from its own ads: the newest of their time
    attributes (`_DUMP_TIMES`); None when no ad carries one. Unreadable ads are left to the
    import, which dead-letters them."""
    times = [float(v) for _, ad in _ads(path, [], []) for v in
             (ad_to_json(ad).get(a) for a in _DUMP_TIMES)
             if isinstance(v, (int, float)) and _positive(v) and math.isfinite(v)]
    return max(times, default=None)


def _status_events(path: Path, bad: list[DeadLetter], latin1: list[str],
                   undated: dict[Path, int]) -> Iterator[tuple[int | None, Envelope]]:
    """`ad.updated` of each ad of a `condor_status -l` dump. The id is MyType/Name and the
    ad's update sequence (UpdateSequenceNumber), else its update time, else a digest of the
    ad; the event time is the ad's update time, else the dump's own time (`dump_time`, read
    only when an ad needs it) — never the wall clock or the file's, which would date a
    pool's past now. Without either the ad is dead-lettered and counted in `undated`."""
    taken: list[float | None] = []  # the dump's time, once read
    for block, (line, ad) in enumerate(_ads(path, bad, latin1), start=1):
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
        if when is None and not taken:
            taken.append(dump_time(path))
        ts = float(when) if when is not None else taken[0]
        if ts is None:
            undated[path] = undated.get(path, 0) + 1
            bad.append(DeadLetter(f"{path}:{line}: {my_type} {name}: no LastHeardFrom, "
                                  "DaemonLastUpdate or MyCurrentTime, and no ad of the dump "
                                  "carries a time to date it by",
                                  orjson.dumps(data), EVENTS, path=str(path), line=line))
            continue
        yield line, make_event(AdUpdated(my_type, name, data), ts=ts,
                               source=f"status@{path.name}", seq=block,
                               id=f"status:{my_type}/{name}@{stamp}")


def _positive(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0


def import_status(elog: EventLog, paths: list[Path], bound: TimeBound | None = None
                  ) -> ImportReport:
    """Append the ads of `condor_status -l` dumps as `ad.updated` events (a snapshot of a
    real pool's collector). The ads of a dump none of whose ads carries a time
    (`_DUMP_TIMES`) and that have no update time of their own are dead-lettered, and the dump
    named in one line of `refused`: nothing dates them. Raises OSError for a file that cannot
    be read."""
    undated: dict[Path, int] = {}
    report = import_files(elog, paths, partial(_status_events, undated=undated), "status:", bound)
    for path, n in undated.items():
        report.refused.append(
            f"{path}: {n} ad(s) without LastHeardFrom, and no ad carries a time "
            f"({', '.join(_DUMP_TIMES[:5])}, ...) to date the dump by: not imported (not "
            "dated at the wall clock); condor_status -l writes LastHeardFrom")
    return report


# --------------------------------------------------------------------------- Accountantnew.log

#: Customer record attribute -> the condor_userprio edit that sets it. AccumulatedUsage (the
#: unweighted total) has no edit: -setaccum sets WeightedAccumulatedUsage only (REFERENCE.md).
ACCOUNTANT_OPS: dict[str, str] = {
    "PriorityFactor": "setfactor", "Priority": "setprio", "WeightedAccumulatedUsage": "setaccum",
    "BeginUsageTime": "setbegin", "LastUsageTime": "setlast", "Floor": "setfloor",
    "Ceiling": "setceil",
}
#: an attribute name (a key holding a space would shift it: `103 Customer.a b Priority 1`)
_ATTR_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*")
_CUSTOMER = "Customer."
_RESOURCE = "Resource."
_ARITY = {"101": (3, 3), "102": (1, 1), "103": (3, 3), "104": (2, 2), "105": (0, 0),
          "106": (0, 0), "107": (1, 3)}


@dataclass(slots=True)
class AccountantReplay:
    """A ClassAd transaction log (Accountantnew.log) replayed so far: its records (key ->
    casefolded attribute -> (attribute, value, line that set it)), its creation timestamp, and
    the operations of a transaction whose 106 has not been read yet."""

    records: dict[str, dict[str, tuple[str, Any, int]]] = field(default_factory=dict)
    created: float | None = None
    pending: list[tuple[str, list[Any]]] | None = None

    def _apply(self, op: str, args: list[Any]) -> None:
        records = self.records
        if op == "101":
            records.setdefault(args[0], {})
        elif op == "102":
            records.pop(args[0], None)
        elif op == "103":
            records.setdefault(args[0], {})[args[1].casefold()] = (args[1], args[2], args[3])
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
            self._line(path, k, raw, line, bad)
            if self.pending is None:
                settled = k - first_line + 1
        return settled

    def _line(self, path: Path, k: int, raw: str, line: str, bad: list[DeadLetter]) -> None:
        def refuse(why: str) -> None:
            bad.append(DeadLetter(f"{path}:{k}: {why}", raw.encode(errors="surrogateescape"),
                                  EVENTS, path=str(path), line=k))

        if "\0" in line:  # no ClassAd holds one: the line is damaged, whatever it names
            refuse("a NUL byte")
            return
        op, _, rest = line.partition(" ")
        args: list[Any] = rest.split(" ", 2) if op == "103" else rest.split()
        if op not in _ARITY or not _ARITY[op][0] <= len(args) <= _ARITY[op][1] or (
                op in ("103", "104") and not _ATTR_NAME.fullmatch(args[1])):
            refuse(f"not a ClassAd log operation: {line[:80]!r}")
        elif op == "103":
            try:
                value = evaluate(old_syntax(args[2]))  # ClassAd logs are old syntax
            except ClassAdError as exc:
                refuse(f"{args[1]}: {exc}")
            else:
                self._op(op, [args[0], args[1], value, k])
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
                refuse(f"107: no timestamp in {line[:80]!r}")
        else:
            self._op(op, args)

    def _op(self, op: str, args: list[Any]) -> None:
        if self.pending is not None:
            self.pending.append((op, args))
        else:
            self._apply(op, args)

    def state(self) -> dict[str, dict[str, Any]]:
        """Every record's attributes (the configured casing of each name)."""
        return {key: {name: v for name, v, _ in attrs.values()}
                for key, attrs in self.records.items()}

    def lines(self) -> dict[tuple[str, str], int]:
        """The line that set each (record, attribute)."""
        return {(key, name): at for key, attrs in self.records.items()
                for name, _, at in attrs.values()}


def accountant_state(path: Path, bad: list[DeadLetter], latin1: list[str]
                     ) -> tuple[dict[str, dict[str, Any]], float | None,
                                dict[tuple[str, str], int]]:
    """The records of a ClassAd transaction log after replaying it (`AccountantReplay`; a
    trailing transaction without its 106 is dropped, as HTCondor does), its creation
    timestamp and the line that set each (record, attribute). The file is streamed: a line
    beyond MAX_LINE_BYTES, or the last line cut before its newline, is refused with file:line."""
    replay = AccountantReplay()
    for read in _lines(path, latin1):
        k, raw = read.number, read.text
        if raw is None:
            bad.append(DeadLetter(f"{path}:{k}: a line longer than {MAX_LINE_BYTES} bytes",
                                  b"", EVENTS, path=str(path), line=k))
        elif raw.strip() and not read.ended:  # the log's last line, cut: HTCondor ends each
            bad.append(DeadLetter(f"{path}:{k}: the file ends inside this operation (a copy "
                                  "cut mid-line?)", raw.encode(errors="surrogateescape"),
                                  EVENTS, path=str(path), line=k))
        else:
            replay.feed(path, [raw], bad, first_line=k)
    return replay.state(), replay.created, replay.lines()


def _accountant_groups(records: dict[str, dict[str, Any]]) -> list[str]:
    """The accounting groups a negotiator's records name: its group Customer records (no '@';
    the accountant keeps one per group a match was charged to), `<none>` left out."""
    return sorted(key[len(_CUSTOMER):] for key in records
                  if key.startswith(_CUSTOMER) and "@" not in key and key != _CUSTOMER + ROOT)


def _resource_slot(key: str) -> str:
    """The slot of a `Resource.` record: HTCondor names it `<Name>@<StartdIpAddr>`
    (Accountant::GetResourceName), the slot's Name then its sinful string."""
    name = key[len(_RESOURCE):]
    head, at, addr = name.rpartition("@")
    return head if at and addr.startswith("<") else name


def _claims(path: Path, records: dict[str, dict[str, Any]], lines: dict[tuple[str, str], int],
            bad: list[DeadLetter]) -> Iterator[tuple[int | None, JobStarted]]:
    """job.started of each claim the accountant holds (a `Resource.` record: RemoteUser,
    SlotWeight), so the submitters' and groups' ResourcesUsed are what condor_userprio showed.
    Dated at the records' time: usage before it is in the records already (AddMatch charges
    from the accountant's last update). The job is named by the record (the accountant keeps
    no job id), under the schedd `accountant@<file>`."""
    for key in sorted(k for k in records if k.startswith(_RESOURCE)):
        rec = records[key]
        user, weight = rec.get("RemoteUser"), rec.get("SlotWeight", 1.0)
        if not isinstance(user, str) or "@" not in user or not _positive(weight) \
                or not math.isfinite(weight):
            at = lines.get((key, "RemoteUser"))
            bad.append(DeadLetter(f"{path}:{at}: {key}: no RemoteUser (user@domain) and positive "
                                  "SlotWeight to charge the claim to", orjson.dumps(
                                      [key, str(user), str(weight)]), EVENTS, path=str(path),
                                  line=at))
            continue
        yield lines.get((key, "RemoteUser")), JobStarted(
            key[len(_RESOURCE):], f"accountant@{path.name}", user, _resource_slot(key),
            float(weight))


def _accountant_events(path: Path, bad: list[DeadLetter], latin1: list[str], by: str,
                       left_out: list[str] | None = None
                       ) -> Iterator[tuple[int | None, Envelope]]:
    """The claims (`_claims`), then admin.command events setting each Customer record's final
    values — a group's too (PoolLedger's extension of the edits to GROUP_NAMES groups) — at
    the accountant's LastUpdateTime (else the log's creation time, else the records' latest
    LastUsageTime). The records (submitters' and groups') with a nonzero AccumulatedUsage,
    which no edit sets, go to `left_out`."""
    records, created, lines = accountant_state(path, bad, latin1)
    if left_out is not None:
        left_out += [key for key, rec in sorted(records.items())
                     if key.startswith(_CUSTOMER) and _positive(rec.get("AccumulatedUsage"))]
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
    for line, claim in _claims(path, records, lines, bad):
        seq += 1
        yield line, make_event(claim, ts=ts, source=f"accountant@{path.name}", seq=seq,
                               id=f"accountant:claim:{claim.slot}:{claim.submitter}@{ts!r}")
    for key in sorted(records):
        if not key.startswith("Customer."):
            continue
        name = key[len("Customer."):]
        for attr, op in ACCOUNTANT_OPS.items():
            value = records[key].get(attr)
            if value is None:
                continue
            if not isinstance(value, (int, float)) or isinstance(value, bool) \
                    or not math.isfinite(value):
                at = lines.get((key, attr))
                bad.append(DeadLetter(f"{path}:{at}: {key} {attr} = {value!r} is not a number",
                                      orjson.dumps([key, attr, str(value)]), EVENTS,
                                      path=str(path), line=at))
                continue
            seq += 1
            yield lines.get((key, attr)), make_event(AdminCommanded(op, name, float(value), by,  # type: ignore[arg-type]
                                            f"import-accountant {path.name}: {key} {attr}"),
                             ts=ts, source=f"accountant@{path.name}", seq=seq,
                             id=f"accountant:{name}:{op}:{float(value)!r}@{ts!r}")


def groups_not_configured(elog: EventLog, paths: list[Path], group_names: Any
                          ) -> dict[Path, list[str]]:
    """Per file, the accounting groups its records name that GROUP_NAMES — `group_names`,
    or the log's last `config.changed` of it — does not define (case-insensitively, as
    HTCondor): their records and their members' group charges need those groups, so the
    import is refused until they are configured. Raises OSError for an unreadable file."""
    for _, env in elog.read(EVENTS):
        if isinstance(env.data, ConfigChanged) and env.data.knob.upper() == "GROUP_NAMES":
            group_names = env.data.value
    tree = GroupTree.from_names(group_names)
    out: dict[Path, list[str]] = {}
    for path in paths:
        records, _, _ = accountant_state(path, [], [])
        missing = [g for g in _accountant_groups(records) if tree.canonical(g) is None]
        if missing:
            out[path] = missing
    return out


def import_accountant(elog: EventLog, paths: list[Path], by: str,
                      bound: TimeBound | None = None) -> ImportReport:
    """Append the final Customer records of negotiator Accountantnew.log files as the
    condor_userprio edits that set them, so a real pool's accounting seeds the ledger;
    `by` is the importer, who holds ADMINISTRATOR (the caller checked). Raises OSError for
    a file that cannot be read."""
    left_out: list[str] = []
    report = import_files(elog, paths, partial(_accountant_events, by=by, left_out=left_out),
                          "accountant:", bound)
    report.accumulated_not_imported = len(left_out)
    return report
