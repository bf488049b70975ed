"""`poolledger history | stats | sql | report`: the history database, HTCondor's way.

`history` is condor_history (newest first, its default columns, -constraint/-limit/-af/-l/
-since, --json); `history update` brings the database up to the log's end, `history rebuild`
re-creates it from the log (the log is the truth), `history export --parquet DIR` writes
Parquet. `stats` is condor_stats over the pool history; `sql` runs a statement; `report`
writes PNGs and a summary. Each query command first catches the database up with the log.
"""
from __future__ import annotations

import argparse
import csv
import datetime as dt
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from adstash.history.errors import HistoryError, HistoryQueryError
from adstash.history.schema import BATCH, DATA_TABLES, VIEW_NAMES
from services.commands import broker_url, events_topic, home_dir
from streams.log.port import LogError
from streams.log.topics import EVENTS

if TYPE_CHECKING:
    from schemas.config import SettingsLike

# DuckDB, Arrow and the sink load when a command runs, not for `poolledger --help`

#: the views that are table macros, called with their sampling step in seconds
MACROS = ("pool_history", "usage_history")
#: HTCondor's slot states, the columns of `poolledger stats` (condor_stats -pool)
SLOT_STATES = ("Owner", "Unclaimed", "Matched", "Claimed", "Preempting", "Backfill", "Drained")
STATUS = {1: "I", 2: "R", 3: "X", 4: "C", 5: "H", 6: ">", 7: "S"}


def register(sub: Any) -> None:
    h = sub.add_parser("history", help="job history from the history database, like "
                       "condor_history (also: update, rebuild, export --parquet DIR)",
                       description="condor_history over the DuckDB history database. A first "
                       "word 'update', 'rebuild' or 'export' manages the database instead.")
    h.add_argument("restrict", nargs="*", metavar="cluster|cluster.proc|owner",
                   help="condor_history's restriction list (or: update | rebuild | export)")
    h.add_argument("-constraint", metavar="EXPR", help="a ClassAd expression jobs must match")
    h.add_argument("-limit", "-match", dest="limit", type=int, metavar="N",
                   help="show at most N jobs")
    h.add_argument("-since", metavar="JOBID|EXPR",
                   help="stop at this job id, or when this expression becomes true")
    out = h.add_mutually_exclusive_group()
    out.add_argument("-af", "-autoformat", dest="af", nargs="+", metavar="ATTR",
                     help="print these attributes, space separated")
    out.add_argument("-l", "-long", dest="long", action="store_true", help="whole ClassAds")
    out.add_argument("--json", action="store_true", help="the ads as a JSON list")
    h.add_argument("--parquet", type=Path, metavar="DIR", help="with 'export': where to")
    h.add_argument("--batch", type=int, default=BATCH, metavar="N",
                   help=f"events per database transaction when updating (default {BATCH}, "
                        "DuckDB's row group)")
    _common(h)
    h.set_defaults(func=run_history)

    s = sub.add_parser("stats", help="pool and user statistics over time, like condor_stats",
                       description="condor_stats over the pool history (event time).")
    rng = s.add_mutually_exclusive_group()
    rng.add_argument("-lastday", dest="last", action="store_const", const=86400.0,
                     help="the last day of the history (the default span)")
    rng.add_argument("-lastweek", dest="last", action="store_const", const=7 * 86400.0,
                     help="the last week of the history")
    rng.add_argument("-lastmonth", dest="last", action="store_const", const=30 * 86400.0,
                     help="the last 30 days of the history")
    rng.add_argument("-lasthours", dest="lasthours", type=float, metavar="N",
                     help="the last N hours of the history")
    s.add_argument("-from", dest="start", metavar="TIME", help="epoch or ISO 8601 (UTC)")
    s.add_argument("-to", dest="end", metavar="TIME", help="epoch or ISO 8601 (UTC)")
    s.add_argument("-interval", type=int, default=3600, metavar="SECONDS",
                   help="sampling interval (default 3600)")
    q = s.add_mutually_exclusive_group()
    q.add_argument("-userquery", metavar="SUBMITTER", help="weighted usage of one submitter")
    q.add_argument("-userlist", action="store_true", help="the submitters in the history")
    q.add_argument("-resourcequery", metavar="SLOT", help="state changes of one slot")
    q.add_argument("-resourcelist", action="store_true", help="the slots in the history")
    s.add_argument("--json", action="store_true", help="JSON rows")
    _common(s)
    s.set_defaults(func=run_stats)

    q2 = sub.add_parser("sql", help="run SQL on the history database (read-only)",
                        description="Run one SQL statement (DuckDB dialect) on the history "
                        "database, read-only (no files, no extensions; `history export` "
                        f"writes files). Tables: {', '.join(DATA_TABLES)}. Views: "
                        + ", ".join(f"{v}(step)" if v in MACROS else v for v in VIEW_NAMES)
                        + ".")
    q2.add_argument("statement", help="one SQL statement, e.g. \"SELECT * FROM queue\"")
    fmt = q2.add_mutually_exclusive_group()
    fmt.add_argument("--csv", action="store_true", help="CSV with a header row")
    fmt.add_argument("--json", action="store_true", help="a JSON list of rows")
    _common(q2)
    q2.set_defaults(func=run_sql_command)

    r = sub.add_parser("report", help="PNG plots and a text summary of the history",
                       description="Write core-hours, pool, wait-time and quota plots and "
                       "summary.txt from the history database.")
    r.add_argument("--from", dest="start", metavar="TIME",
                   help="first time reported: epoch or ISO 8601 (UTC)")
    r.add_argument("--to", dest="end", metavar="TIME",
                   help="last time reported: epoch or ISO 8601 (UTC)")
    r.add_argument("--out", type=Path, required=True, metavar="DIR",
                   help="where the PNGs and summary.txt go")
    _common(r)
    r.set_defaults(func=run_report)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--db", type=Path, metavar="PATH",
                   help="the history database (default: history.duckdb in the data directory)")
    p.add_argument("--no-update", action="store_true",
                   help="query the database as it is, without catching up with the log")


def db_path(args: argparse.Namespace, settings: SettingsLike) -> Path:
    from adstash.history.db import default_path

    return args.db if args.db is not None else default_path(home_dir(settings))


def update(args: argparse.Namespace, settings: SettingsLike, *, batch: int = BATCH,
           wait: bool = True) -> int:
    """Catch the database up with the configured log; returns the events delivered."""
    from adstash.history.target import catch_up
    from streams.log.events import open_log

    log = open_log(broker_url(settings), home_dir(settings))
    try:
        return catch_up(log, db_path(args, settings), batch=batch, wait=wait,
                        topics=_topics(settings)).delivered
    finally:
        log.close()


def _topics(settings: SettingsLike) -> tuple[str, ...] | None:
    """The topics the database follows: the events topic named by `--topic` (a Kafka run's
    own), else the table's events and derived topics (None)."""
    topic = events_topic(settings)
    return None if topic == EVENTS else (topic,)


def _fail(cmd: str, exc: Exception) -> int:
    print(f"poolledger {cmd}: {exc}", file=sys.stderr)
    return 2 if isinstance(exc, HistoryQueryError) else 1


def _prepare(cmd: str, args: argparse.Namespace, settings: SettingsLike) -> Any:
    """The database's published copy, caught up with the log first unless --no-update (or
    the database is read-only here: an auditor's query answers from it as it is). An update
    another process is running is not waited for: the query reads what that one last
    published, and says so once."""
    from adstash.history.db import HistoryBusyError, open_reader

    path = db_path(args, settings)
    if not args.no_update:
        if os.access(path if path.exists() else path.parent, os.W_OK) \
                and os.access(path.parent, os.W_OK):
            try:
                update(args, settings, wait=False)
            except HistoryBusyError:
                print(f"poolledger {cmd}: note: another process is updating {path}; answering "
                      "from what it last published (--no-update answers so without trying)",
                      file=sys.stderr)
        elif path.exists():  # an auditor's query of another user's, or archived, history
            print(f"poolledger {cmd}: note: {path} is read-only here: answered as it is, "
                  "without catching up with the log", file=sys.stderr)
        else:
            raise HistoryError(f"{path}: no history database, and {path.parent} is read-only "
                               "here (`poolledger history update` by its owner makes one)")
    return open_reader(path, sandboxed=cmd == "sql")


def run_history(args: argparse.Namespace, settings: SettingsLike) -> int:
    from adstash.history.db import remove_db
    from adstash.history.export import export_parquet
    from adstash.history.query import check_constraint, history, job_restriction

    words = list(args.restrict)
    action = words[0] if words and words[0] in ("update", "rebuild", "export") else None
    try:
        if action == "rebuild":
            remove_db(db_path(args, settings))
        if action in ("update", "rebuild"):
            if args.batch <= 0:
                print("poolledger history: --batch must be positive", file=sys.stderr)
                return 2
            n = update(args, settings, batch=args.batch)
            print(f"history: {n} events delivered to {db_path(args, settings)}")
            return 0
        if action == "export":
            if args.parquet is None:
                print("poolledger history export: --parquet DIR is required", file=sys.stderr)
                return 2
            con = _prepare("history", args, settings)
            try:
                written = export_parquet(con, args.parquet)
            finally:
                con.close()
            print("history export: " + ", ".join(f"{t} {n}" for t, n in written.items())
                  + f" rows to {args.parquet}")
            return 0
        if args.limit is not None and args.limit < 0:
            print("poolledger history: -limit must not be negative", file=sys.stderr)
            return 2
        if args.constraint is not None:
            check_constraint(args.constraint)  # a malformed one: one line, before any output
        parts = [p for p in (job_restriction(words), args.constraint) if p]
        constraint = " && ".join(f"({p})" for p in parts) if parts else None
        con = _prepare("history", args, settings)
        try:
            ads = history(con, constraint=constraint, limit=args.limit, since=args.since)
            _print_ads(ads, args)
        finally:
            con.close()
    except (HistoryError, LogError) as exc:
        return _fail("history", exc)
    return 0


def _fmt_date(value: Any) -> str:
    if not isinstance(value, (int, float)) or value <= 0:
        return "    ???    "
    t = dt.datetime.fromtimestamp(value, dt.timezone.utc)
    return f"{t.month:2d}/{t.day:<2d} {t.hour:02d}:{t.minute:02d}"


def _fmt_runtime(value: Any) -> str:
    secs = int(value) if isinstance(value, (int, float)) and value > 0 else 0
    return f"{secs // 86400:3d}+{secs % 86400 // 3600:02d}:{secs % 3600 // 60:02d}:{secs % 60:02d}"


def _af(value: Any) -> str:
    if value is None:
        return "undefined"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str) and value.startswith("/Expr(") and value.endswith(")/"):
        return value[6:-2]
    return str(value)


def _print_ads(ads: Any, args: argparse.Namespace) -> None:
    import orjson

    from schemas.classads import ad_from_json

    out = sys.stdout
    if args.json:
        out.write(orjson.dumps(list(ads), option=orjson.OPT_INDENT_2).decode() + "\n")
        return
    if not args.long and not args.af:
        out.write(" ID     OWNER          SUBMITTED   RUN_TIME     ST COMPLETED   CMD\n")
    for ad in ads:
        if args.long:
            out.write(ad_from_json(ad).printOld() + "\n")
        elif args.af:
            low = {k.lower(): v for k, v in ad.items()}
            out.write(" ".join(_af(low.get(a.lower())) for a in args.af) + "\n")
        else:
            job = f"{ad.get('ClusterId', '?')}.{ad.get('ProcId', '?')}"
            status = STATUS.get(ad.get("JobStatus"), "?") if isinstance(ad.get("JobStatus"), int) else "?"
            cmd = " ".join(str(x) for x in (ad.get("Cmd", ""), ad.get("Args", "")) if x)
            out.write(f"{job:<8} {str(ad.get('Owner', '')):<14} {_fmt_date(ad.get('QDate'))} "
                      f"{_fmt_runtime(ad.get('RemoteWallClockTime'))} {status:<2} "
                      f"{_fmt_date(ad.get('CompletionDate'))} {cmd}\n")


def _time(text: str | None, what: str) -> float | None:
    from streams.replay import ReplayError, parse_time

    if text is None:
        return None
    try:
        return parse_time(text)
    except (ReplayError, ValueError) as exc:
        raise HistoryQueryError(f"{what} {text!r}: {exc}") from None


def run_stats(args: argparse.Namespace, settings: SettingsLike) -> int:
    import duckdb

    try:
        if args.interval <= 0:
            raise HistoryQueryError(f"-interval {args.interval}: must be positive")
        con = _prepare("stats", args, settings)
        try:
            end = _time(args.end, "-to")
            start = _time(args.start, "-from")
            last = args.last or (args.lasthours * 3600 if args.lasthours else None)
            log_end = con.execute("SELECT ts FROM log_end").fetchall()[0][0] or 0.0
            if end is None:
                end = log_end + 1
            if start is None:
                start = end - (last or 86400.0)
            if args.userlist:
                sql = "SELECT DISTINCT submitter FROM runs ORDER BY 1"
                params: list[Any] = []
            elif args.resourcelist:
                sql = "SELECT DISTINCT slot FROM slot_updates ORDER BY 1"
                params = []
            elif args.userquery:
                sql = ("SELECT time, round(weighted_seconds / ?, 3) AS running FROM "
                       f"usage_history({args.interval}) WHERE submitter = ? AND ts >= ? "
                       "AND ts < ? ORDER BY ts")
                params = [args.interval, args.userquery, start, end]
            elif args.resourcequery:
                sql = ("SELECT time, state, activity, remote_user FROM machine_states "
                       "WHERE slot = ? AND ts >= ? AND ts < ? ORDER BY ts")
                params = [args.resourcequery, start, end]
            else:
                states = ", ".join(f"'{s}'" for s in SLOT_STATES)
                sql = (f"PIVOT (SELECT time, state, slots FROM pool_history({args.interval}) "
                       f"WHERE ts >= ? AND ts < ?) ON state IN ({states}) USING coalesce(sum(slots), 0) "
                       "ORDER BY time")
                params = [start, end]
            try:
                rel = con.execute(sql, params)
                names = [d[0] for d in rel.description]
                rows = rel.fetchall()
            except duckdb.Error as exc:
                raise HistoryError(f"stats query failed: {str(exc).splitlines()[0]}") from None
        finally:
            con.close()
    except (HistoryError, LogError) as exc:
        return _fail("stats", exc)
    _print_table(names, rows, as_json=args.json)
    return 0


def _cell(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, dt.datetime):
        return v.astimezone(dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
    if isinstance(v, float):
        # epoch seconds and other large values in full (6 digits would print 1.7638e+09)
        return f"{v:.6g}" if abs(v) < 1e6 else f"{v:.0f}" if v.is_integer() else f"{v:.2f}"
    return str(v)


def _print_table(names: list[str], rows: list[tuple[Any, ...]], *, as_json: bool = False,
                 as_csv: bool = False) -> None:
    if as_json:
        import orjson

        sys.stdout.write(orjson.dumps([dict(zip(names, r)) for r in rows],
                                      option=orjson.OPT_INDENT_2 | orjson.OPT_NAIVE_UTC,
                                      default=str).decode() + "\n")
        return
    if as_csv:
        w = csv.writer(sys.stdout)
        w.writerow(names)
        w.writerows([[_cell(v) for v in r] for r in rows])
        return
    cells = [[_cell(v) for v in r] for r in rows]
    widths = [max([len(n)] + [len(c[i]) for c in cells]) for i, n in enumerate(names)]
    sys.stdout.write("  ".join(n.ljust(w) for n, w in zip(names, widths)).rstrip() + "\n")
    for c in cells:
        sys.stdout.write("  ".join(v.ljust(w) for v, w in zip(c, widths)).rstrip() + "\n")


def run_sql_command(args: argparse.Namespace, settings: SettingsLike) -> int:
    import duckdb

    from adstash.history.query import run_sql, sql_message

    try:
        con = _prepare("sql", args, settings)
        try:
            rel = run_sql(con, args.statement)
            if rel is None:
                return 0
            names = list(rel.columns)
            rows = rel.fetchall()
        except duckdb.Error as exc:  # a failure while fetching is the statement's too
            raise HistoryQueryError(sql_message(args.statement, exc)) from None
        finally:
            con.close()
    except (HistoryError, LogError) as exc:
        return _fail("sql", exc)
    _print_table(names, rows, as_json=args.json, as_csv=args.csv)
    return 0


def run_report(args: argparse.Namespace, settings: SettingsLike) -> int:
    from adstash.history.report import write_report

    try:
        start, end = _time(args.start, "--from"), _time(args.end, "--to")
        con = _prepare("report", args, settings)
        try:
            paths = write_report(con, args.out, start=start, end=end)
        finally:
            con.close()
    except (HistoryError, LogError) as exc:
        return _fail("report", exc)
    print("Report: " + "  ".join(str(p) for p in paths))
    sys.stdout.write((args.out / "summary.txt").read_text())
    return 0
