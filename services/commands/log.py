"""`poolledger log export|import|snapshot|info|verify|salvage|migrate`: move events between the
log and `.jsonl` files, snapshot the ledger, and check, rescue or convert the embedded log.

`import` and `snapshot` leave a snapshot of the ledger at the events topic's end (as `run`
does; `streams.snapshot`), so the queries after them fold only what is appended later.

`verify`, `salvage` and `migrate` read the embedded log's file directly and change nothing in
it: damage is named (file, topic[partition]@offset) and left for a human to judge, because the
log is the ledger's only truth.
"""
from __future__ import annotations

import argparse
import bisect
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Callable

from schemas.config import SettingsLike
from services.commands import (broker_url, events_topic, home_dir, open_configured_log,
                               open_log_to_read)
from streams.log.embedded import COMMITS_NAME, DB_NAME, Damage, EmbeddedLog, wal_tail_frames
from streams.log.events import EventLog, ensure_topics
from streams.log.port import LogError, Outgoing, Record
from streams.log.segments import SegmentDamage, SegmentLog, is_segment_log
from streams.log.topics import EVENTS, one_partition_message

_BATCH = 5_000


def register(sub: Any) -> None:
    p = sub.add_parser("log", help="export, import, inspect, verify and repair the event log")
    lsub = p.add_subparsers(dest="log_command", metavar="ACTION", required=True)
    e = lsub.add_parser("export", help="write a topic as .jsonl, one envelope per line")
    e.add_argument("--topic", help="topic to export (default: the events topic, `poolledger "
                                   "--topic` / POOLLEDGER_EVENTS_TOPIC, else " + EVENTS + ")")
    e.add_argument("path", type=Path, help="file to write, or - for standard output")
    e.set_defaults(func=export)
    i = lsub.add_parser("import", help="append a .jsonl file's events; bad lines go to the DLQ")
    i.add_argument("--topic", help="topic to append to (default: the events topic, `poolledger "
                                   "--topic` / POOLLEDGER_EVENTS_TOPIC, else " + EVENTS + ")")
    i.add_argument("path", type=Path)
    i.set_defaults(func=import_)
    h = lsub.add_parser("import-history",
                        help="append HTCondor history (history file, startd_history, "
                             "condor_history -l / -json) as job.history events")
    h.add_argument("paths", nargs="+", type=Path, metavar="FILE")
    h.add_argument("--follow", action="store_true",
                   help="keep following the files as they grow and rotate (`follow history`)")
    h.set_defaults(func=import_history, what="history", unit="job ads")
    st = lsub.add_parser("import-status",
                         help="append a condor_status -l dump as ad.updated events")
    st.add_argument("paths", nargs="+", type=Path, metavar="FILE")
    st.set_defaults(func=import_history, what="status", unit="ads")
    ac = lsub.add_parser("import-accountant",
                         help="append a negotiator's Accountantnew.log: its claims as "
                              "job.started, and the condor_userprio edits that set each "
                              "submitter's and group's record (its groups must be in GROUP_NAMES)")
    ac.add_argument("paths", nargs="+", type=Path, metavar="FILE")
    ac.set_defaults(func=import_history, what="accountant", unit="claims and record edits")
    sn = lsub.add_parser("snapshot", help="fold the events topic to its end and store a snapshot "
                         "of the ledger, so queries fold only what comes after it")
    sn.set_defaults(func=snapshot)
    n = lsub.add_parser("info", help="topics, partitions and end offsets (exit 1 if damaged)")
    n.set_defaults(func=info)
    v = lsub.add_parser("verify", help="check every record's checksum and offset of the embedded "
                        "log; exit 1 naming each problem")
    v.set_defaults(func=verify)
    s = lsub.add_parser("salvage", help="copy every readable record of the embedded log to a new "
                        "log in DEST and report exactly which offsets were lost")
    s.add_argument("dest", type=Path, metavar="DEST", help="directory of the new log (new or empty)")
    s.set_defaults(func=salvage)
    b = lsub.add_parser("backup", help="copy the embedded log, WAL contents included, with "
                        "SQLite's backup API (copying log.sqlite alone can lose commits)")
    b.add_argument("dest", type=Path, metavar="DEST", help="directory of the copy (new or empty)")
    b.set_defaults(func=backup)
    m = lsub.add_parser("migrate", help="convert a segment log of an earlier version to SQLite")
    m.add_argument("--from", dest="source", type=Path, metavar="DIR",
                   help="the segment log's directory (default: the embedded log's own)")
    m.set_defaults(func=migrate)


def _open(settings: SettingsLike) -> EventLog:
    log = open_configured_log(settings)
    ensure_topics(log)
    return EventLog(log)


def _embedded_root(settings: SettingsLike, command: str) -> Path | None:
    """The embedded log's directory; None (after saying why) when a broker is configured."""
    url = broker_url(settings)
    if url:
        print(f"poolledger log {command}: works on the embedded log, not on {url}", file=sys.stderr)
        return None
    return home_dir(settings) / "log"


def export(args: argparse.Namespace, settings: SettingsLike) -> int:
    # a reader: a missing or empty log is named (exit 1) and nothing is created on disk
    topic = args.topic or events_topic(settings)
    elog = EventLog(open_log_to_read(settings))
    try:
        if str(args.path) == "-":
            n = elog.write_jsonl(topic, sys.stdout.buffer)
            sys.stdout.buffer.flush()
            print(f"exported {n} events from {topic}", file=sys.stderr)
            return 0
        n = elog.export_jsonl(topic, args.path)
    finally:
        elog.log.close()
    print(f"exported {n} events from {topic} to {args.path}")
    return 0


def import_(args: argparse.Namespace, settings: SettingsLike) -> int:
    if not args.path.is_file():
        print(f"poolledger log import: {args.path}: no such file", file=sys.stderr)
        return 1
    issuer, refusal = _import_authority(settings, "import admin.command and config.changed events")
    topic = args.topic or events_topic(settings)
    elog = _open(settings)
    try:
        imported, rejected = elog.import_jsonl(args.path, topic, issuer=issuer,
                                               refusal=refusal)
        # like `run`: the first query after an import is fast
        folded = _store_snapshot(elog, settings) if topic == EVENTS else None
    finally:
        elog.log.close()
    refused = "" if folded is None or not folded[1] else (
        f"; {folded[1]} refused by the ledger, dead-lettered with the reason")
    print(f"imported {imported} events into {topic}; {rejected} rejected to "
          f"{topic}.dlq{refused}")
    return 1 if rejected else 0


def _import_authority(settings: SettingsLike, what: str) -> tuple[str | None, str]:
    """The importer's identity if it holds ADMINISTRATOR (it is recorded as the `by` of the
    priority edits and knob changes it imports), else None and the refusal."""
    from services.admin import PermissionDeniedError, authorize

    try:
        return str(authorize(settings, home_dir(settings), what)), ""
    except PermissionDeniedError as exc:
        return None, str(exc)


def _store_snapshot(elog: EventLog, settings: SettingsLike) -> tuple[int, int] | None:
    """Fold the events topic from its newest usable snapshot (else its start) to its end and
    store a snapshot there, as `run` leaves one; how many events that folded and how many of
    them the ledger refused (the runner dead-letters those), or None: this log keeps no
    snapshots (Kafka) or its events topic is not one ordered stream. The derived events are
    left to `run`'s runner (a re-fold must not append them a second time)."""
    from streams.runner import EmbeddedRunner
    from streams.snapshot import SnapshotStore

    if not SnapshotStore.supports(elog.log) or elog.log.partitions(EVENTS) != 1:
        return None
    runner = EmbeddedRunner(elog, settings, derived_topic=None)
    before = runner.ledger.rejected
    return runner.run_once(), runner.ledger.rejected - before


def snapshot(args: argparse.Namespace, settings: SettingsLike) -> int:
    from streams.snapshot import SnapshotStore

    # a reader's checks first: a missing or empty log is named (exit 1), nothing created
    elog = EventLog(open_log_to_read(settings))
    try:
        if not SnapshotStore.supports(elog.log):
            print(f"poolledger log snapshot: works on the embedded log, not on "
                  f"{broker_url(settings)} (on Kafka the faust tables hold the state)",
                  file=sys.stderr)
            return 1
        partitions = elog.log.partitions(EVENTS)
        if partitions != 1:
            print(f"poolledger log snapshot: {one_partition_message(EVENTS, partitions)}",
                  file=sys.stderr)
            return 2
        folded = _store_snapshot(elog, settings)
        covered = sum(elog.log.end_offsets(EVENTS).values())
    finally:
        elog.log.close()
    assert folded is not None  # an embedded log's one-partition events topic
    refused = f", {folded[1]} refused by the ledger and dead-lettered" if folded[1] else ""
    print(f"snapshot stored at {EVENTS}@{covered} ({folded[0]} events folded to reach it{refused})")
    return 0


# --------------------------------------------------------------------------- checking

@dataclass
class _Partition:
    """What a scan of one partition found."""

    topic: str
    partition: int
    end: int
    records: int = 0
    damage: list[Damage] = field(default_factory=list)

    @property
    def lost(self) -> int:
        return sum(d.last - d.first + 1 for d in self.damage)


def _scan(log: EmbeddedLog, keep: Any = None) -> list[_Partition]:
    """Scan every partition; `keep(partition, records)` receives the good records in batches."""
    out = []
    for topic in log.topics():
        for p in range(log.partitions(topic)):
            part = _Partition(topic, p, log.end_offsets(topic)[p])
            batch: list[Record] = []
            for item in log.scan(topic, p):
                if isinstance(item, Damage):
                    prev = part.damage[-1] if part.damage else None
                    if prev and prev.last + 1 == item.first and prev.reason == item.reason:
                        item = Damage(topic, p, prev.first, item.last, item.reason)
                        part.damage.pop()
                    part.damage.append(item)
                    continue
                part.records += 1
                if keep is not None:
                    batch.append(item)
                    if len(batch) >= _BATCH:
                        keep(part, batch)
                        batch = []
            if keep is not None and batch:
                keep(part, batch)
            out.append(part)
    return out


def _incomplete_write_note(db: Path) -> str | None:
    frames = wal_tail_frames(db)
    if not frames:
        return None
    return (f"{db}-wal: ends in {frames} page(s) of an append that has not committed (one in "
            "progress, or cut short by a crash: SQLite discards it; it was never acknowledged)")


def _problems(log: EmbeddedLog, parts: list[_Partition]) -> list[str]:
    problems = [f"{log.db}: {d}" for part in parts for d in part.damage]
    problems += [f"{log.db}: {missing}" for missing in log.missing_commits()]
    problems += [f"{log.db}: SQLite quick_check: {line}" for line in log.check_file()]
    ends = {(part.topic, part.partition): part.end for part in parts}
    for group, topic, positions in log.groups():
        for p, off in positions.items():
            if off > ends.get((topic, p), off):
                problems.append(f"{log.db}: group {group!r} is at {topic}[{p}]@{off}, past the "
                                f"end offset {ends[(topic, p)]}")
    for name in log.state_names():
        try:
            log.state(name)
        except LogError as exc:
            problems.append(str(exc))
    return problems


def info(args: argparse.Namespace, settings: SettingsLike) -> int:
    log = open_configured_log(settings)
    try:
        if not isinstance(log, EmbeddedLog):
            ensure_topics(log)
            for topic in sorted(log.topics()):
                ends = log.end_offsets(topic)
                print(f"{topic:32} partitions={len(ends):<3} events={sum(ends.values())}")
            return 0
        note = _incomplete_write_note(log.db)
        parts = _scan(log)
        for topic in log.topics():
            mine = [part for part in parts if part.topic == topic]
            lost = sum(part.lost for part in mine)
            print(f"{topic:32} partitions={len(mine):<3} events={sum(part.end for part in mine)}"
                  + (f" UNREADABLE={lost}" if lost else ""))
        problems = _problems(log, parts)
    finally:
        log.close()
    if note:
        print(f"note: {note}")
    for problem in problems:
        print(f"poolledger log info: {problem}", file=sys.stderr)
    if problems:
        print("poolledger log info: the log is damaged: see `poolledger log verify` and "
              "`poolledger log salvage DEST`", file=sys.stderr)
    return 1 if problems else 0


def verify(args: argparse.Namespace, settings: SettingsLike) -> int:
    root = _embedded_root(settings, "verify")
    if root is None:
        return 2
    db = root / DB_NAME
    if not db.exists():
        print(f"poolledger log verify: no log at {db}"
              + (" (a segment log: run `poolledger log migrate`)" if is_segment_log(root) else ""),
              file=sys.stderr)
        return 1
    note = _incomplete_write_note(db)
    with EmbeddedLog(root) as log:
        parts = _scan(log)
        problems = _problems(log, parts)
        groups = log.groups()
        states = log.state_names()
        unmarked = log.commit_marker() is None and any(part.end for part in parts)
    print(f"verify {db}:")
    for part in parts:
        ok = "ok" if not part.damage else f"{part.lost} offset(s) unreadable"
        print(f"  {part.topic}[{part.partition}]: end offset {part.end}, {part.records} records "
              f"checked (checksum, dense offsets): {ok}")
    print(f"  SQLite quick_check, {sum(len(g[2]) for g in groups)} consumer position(s), "
          f"{len(states)} state entr{'y' if len(states) == 1 else 'ies'}")
    if note:
        print(f"note: {note}")
    if unmarked:
        print(f"note: no {root / COMMITS_NAME} beside the log (a log of an earlier version, or "
              f"{DB_NAME} copied alone): whether a lost {DB_NAME}-wal held commits cannot be "
              "checked")
    for problem in problems:
        print(f"poolledger log verify: {problem}", file=sys.stderr)
    print(f"{len(problems)} problem(s)")
    return 1 if problems else 0


def _empty_dest(dest: Path, verb: str) -> bool:
    """Whether DEST of `log backup`/`log salvage` may be written: missing or an empty
    directory (else one line says why)."""
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        print(f"poolledger log {verb}: {dest} exists and is not an empty directory",
              file=sys.stderr)
        return False
    return True


def backup(args: argparse.Namespace, settings: SettingsLike) -> int:
    root = _embedded_root(settings, "backup")
    if root is None:
        return 2
    dest: Path = args.dest
    if not _empty_dest(dest, "backup"):
        return 2
    if not (root / DB_NAME).exists():
        print(f"poolledger log backup: no log at {root / DB_NAME}", file=sys.stderr)
        return 1
    with EmbeddedLog(root) as log:
        copy = log.backup(dest)
    with EmbeddedLog(dest) as new:
        counts = {t: sum(new.end_offsets(t).values()) for t in new.topics()}
    print(f"backed up {sum(counts.values())} records of {len(counts)} topics to {copy}")
    return 0


def salvage(args: argparse.Namespace, settings: SettingsLike) -> int:
    root = _embedded_root(settings, "salvage")
    if root is None:
        return 2
    dest: Path = args.dest
    if not _empty_dest(dest, "salvage"):
        return 2
    if dest.resolve() == root.resolve():
        print("poolledger log salvage: DEST must not be the damaged log itself", file=sys.stderr)
        return 2
    kept: dict[tuple[str, int], list[int]] = {}  # the old offsets copied, in order
    with EmbeddedLog(root) as log, EmbeddedLog(dest) as new:
        for topic in log.topics():
            new.create_topic(log.spec(topic))

        def keep(part: _Partition, records: list[Record]) -> None:
            rows: list[Outgoing] = [(r.key, r.value, r.timestamp) for r in records]
            new.append_to(part.topic, part.partition, rows)
            kept.setdefault((part.topic, part.partition), []).extend(r.offset for r in records)

        parts = _scan(log, keep)
        for group, topic, positions in log.groups():  # the same place in the renumbered log
            new.commit(group, topic, {p: bisect.bisect_left(kept.get((topic, p), []), off)
                                      for p, off in positions.items()})
        # a snapshot that folded an offset lost here is no fold of the copy: its positions
        # would swallow the renumbered records after the loss (an admin edit among them)
        first_lost = {(p.topic, p.partition): p.damage[0].first for p in parts if p.damage}
        stale = _snapshots_past(log, first_lost)
        for prefix, where in stale:
            print(f"poolledger log salvage: the snapshot at {where} is not copied: it folded "
                  "offsets lost from the copy (readers fold from an older one, or the start)",
                  file=sys.stderr)
        states = 0
        for name in log.state_names():
            if any(name.startswith(prefix) for prefix, _ in stale):
                continue
            try:
                new.put_state(name, log.state(name) or b"")
                states += 1
            except LogError as exc:
                print(f"poolledger log salvage: {exc}: not copied", file=sys.stderr)
    lost = 0
    for part in parts:
        print(f"{part.topic}[{part.partition}]: copied {part.records} of {part.end} offsets")
        for d in part.damage:
            print(f"  LOST {d}")
            lost += d.last - d.first + 1
    print(f"salvaged into {dest}: {sum(p.records for p in parts)} records, {lost} offset(s) lost, "
          f"{states} state entr{'y' if states == 1 else 'ies'}; offsets after a loss are renumbered "
          "(consumer positions moved with them)")
    return 1 if lost else 0


def _snapshots_past(log: EmbeddedLog, first_lost: dict[tuple[str, int], int]
                    ) -> list[tuple[str, str]]:
    """(state name prefix, `topic@positions`) of every stored snapshot whose positions lie
    past an offset lost in the same partition."""
    from streams.snapshot import SnapshotStore

    out = []
    for topic in {t for t, _ in first_lost}:
        for name, head, _ in SnapshotStore(log, topic).headers():
            if head is None or any(pos > first_lost.get((topic, p), pos)
                                   for p, pos in head.positions.items()):
                where = f"{topic}@{head.positions[0] if head and len(head.positions) == 1 else '?'}"
                out.append((f"{name}.", where))
    return out


def migrate(args: argparse.Namespace, settings: SettingsLike) -> int:
    root = _embedded_root(settings, "migrate")
    if root is None:
        return 2
    source: Path = args.source or root
    if not is_segment_log(source):
        print(f"poolledger log migrate: {source} holds no segment log", file=sys.stderr)
        return 1
    if (root / DB_NAME).exists():
        print(f"poolledger log migrate: {root / DB_NAME} already exists; nothing done", file=sys.stderr)
        return 1
    old = SegmentLog(source)
    specs = old.topics()
    damage: list[SegmentDamage] = []
    notes: list[SegmentDamage] = []
    root.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(dir=root, prefix=".migrating-"))
    try:
        with EmbeddedLog(work) as new:
            for spec in specs:
                new.create_topic(spec)
                for p in range(spec.partitions):
                    batch: list[Record] = []
                    for item in old.read(spec, p):
                        if isinstance(item, SegmentDamage):
                            (notes if item.incomplete else damage).append(item)
                        elif not damage:
                            batch.append(item)
                            if len(batch) >= _BATCH:
                                new.restore(spec.name, p, batch)
                                batch = []
                    if not damage:
                        new.restore(spec.name, p, batch, old.ends[(spec.name, p)])
            for group, topic, positions in old.groups():
                if not damage:
                    new.commit(group, topic, positions)
        for d in notes:
            print(f"note: {d} (never acknowledged)")
        if damage:
            for d in damage:
                print(f"poolledger log migrate: {d}", file=sys.stderr)
            print(f"poolledger log migrate: {len(damage)} damaged part(s) in {source}; nothing "
                  "migrated (the segment files are unchanged)", file=sys.stderr)
            return 1
        os.replace(work / DB_NAME, root / DB_NAME)
        if (work / COMMITS_NAME).exists():
            os.replace(work / COMMITS_NAME, root / COMMITS_NAME)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    with EmbeddedLog(root) as log:
        for topic in log.topics():
            ends = log.end_offsets(topic)
            print(f"migrated {topic:32} partitions={len(ends):<3} events={sum(ends.values())}")
    print(f"the log is now {root / DB_NAME}; the segment files in {source} were not changed "
          "(remove its topics/ and groups/ once satisfied)")
    return 0


def import_history(args: argparse.Namespace, settings: SettingsLike) -> int:
    """import-history / import-status / import-accountant: one file/DLQ path for all three."""
    from adstash import sources

    command = f"poolledger log import-{args.what}"
    if getattr(args, "follow", False):
        from services.commands.follow import follow_paths

        # the follower reads each file from its stored position (its start the first time):
        # what is there now, then what is appended, with the importer's ids
        args.once, args.interval, args.name = False, None, None
        return follow_paths("history", args.paths, args, settings)
    for path in args.paths:
        if not path.is_file():
            print(f"{command}: {path}: no such file", file=sys.stderr)
            return 1
    run_import: Callable[..., sources.ImportReport]
    if args.what == "accountant":  # every event it appends is a priority edit
        issuer, refusal = _import_authority(settings, "import-accountant")
        if issuer is None:
            print(f"{command}: {refusal}", file=sys.stderr)
            return 1
        run_import = partial(sources.import_accountant, by=issuer)
    else:
        run_import = {"history": sources.import_history, "status": sources.import_status}[args.what]
    elog = _open(settings)
    if args.what == "accountant":
        try:
            missing = sources.groups_not_configured(elog, args.paths,
                                                    settings.get("GROUP_NAMES"))
        except (LogError, OSError) as exc:
            elog.log.close()
            print(f"{command}: {exc}", file=sys.stderr)
            return 1
        if missing:
            elog.log.close()
            path, groups = next(iter(missing.items()))
            names = sorted({g for gs in missing.values() for g in gs}, key=str.lower)
            print(f"{command}: {path}: accounting group(s) {', '.join(groups)} not in GROUP_NAMES; "
                  f"nothing imported: set GROUP_NAMES = {', '.join(names)} (with each group's "
                  "GROUP_QUOTA_<group>) in condor_config or with --set, then import again",
                  file=sys.stderr)
            return 2
    # the edge may read the wall clock: data from beyond it (and the log's time) by more than
    # the skew bound is what every reader would dead-letter
    bound = sources.TimeBound(float(settings.get("POOLLEDGER_MAX_EVENT_SKEW")), time.time())
    try:
        report = run_import(elog, args.paths, bound=bound)
    except (LogError, OSError) as exc:
        print(f"{command}: {exc}", file=sys.stderr)
        return 1
    finally:
        elog.log.close()
    for reason in report.refused:
        print(f"{command}: refused: {reason}", file=sys.stderr)
    print(f"imported {report.imported} {args.unit} into {EVENTS} ({report.already} already "
          f"there); {report.rejected} malformed or refused to {EVENTS}.dlq")
    if report.latin1:
        print(f"read as Latin-1 (not UTF-8, as the schedd wrote the bytes): "
              f"{', '.join(report.latin1[:5])}"
              + (f" and {len(report.latin1) - 5} more line(s)" if len(report.latin1) > 5 else ""))
    if report.accumulated_not_imported:
        print(f"not imported: the unweighted AccumulatedUsage of "
              f"{report.accumulated_not_imported} record(s) (no condor_userprio edit sets "
              "it; WeightedAccumulatedUsage is imported, as -setaccum)")
    return 1 if report.rejected else 0
