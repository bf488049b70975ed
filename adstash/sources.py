"""History from real pools into the log: HTCondor's history formats -> `job.history` events.

Everything enters through the log (DESIGN.md "Sinks"). A schedd `history` file and a startd's
`startd_history` (ads ended by `*** ` banners), `condor_history -l` output (blank-line
separated ads) and `condor_history -json` output are read with schemas.classads (classad2
underneath). Event ids come from the ad — `history:<GlobalJobId>#<RecordTime>` — and ids
already in the log are skipped, so importing a file twice changes nothing. A malformed ad goes
to the events topic's DLQ with `file:line`; the rest is imported.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from adstash.convert import record_time
from schemas.classads import ClassAd, ad_to_json, parse_history, parse_json_ads, \
    parse_status_dump
from schemas.errors import ClassAdError
from schemas.events import Envelope, JobHistory, make_event
from streams.log.events import DeadLetter, EventLog
from streams.log.topics import EVENTS

__all__ = ["ImportReport", "history_format", "import_history"]


@dataclass(slots=True)
class ImportReport:
    """What an import did: events appended, ads already in the log, ads dead-lettered."""

    imported: int = 0
    already: int = 0
    rejected: int = 0


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


def _history_event(ad: dict[str, Any], path: Path, ordinal: int) -> Envelope:
    """The `job.history` event of one ad, its id and time derived from the ad alone."""
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


def _known_ids(elog: EventLog) -> set[str]:
    return {env.id for _, env in elog.read(EVENTS) if env.type == JobHistory.TYPE
            and env.id.startswith("history:")}


def import_history(elog: EventLog, paths: list[Path]) -> ImportReport:
    """Append the job ads of HTCondor history files as `job.history` events (see module doc).
    Raises OSError for a file that cannot be read."""
    report = ImportReport()
    known = _known_ids(elog)
    dead = {(d.path, d.line, d.reason) for d in elog.dead_letters(EVENTS)}
    for path in paths:
        text = path.read_text(errors="replace")
        bad: list[DeadLetter] = []
        fresh: list[Envelope] = []
        for ordinal, ad in _ads(path, text, bad):
            env = _history_event(ad_to_json(ad), path, ordinal)
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
