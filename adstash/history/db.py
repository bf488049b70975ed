"""Opening the history database: create it on first use, refuse another schema version.

DuckDB's own errors are translated here (one adapter), so commands print one line naming the
file and never a traceback.

Sharing it: DuckDB lets one process write a file and, meanwhile, no other open it, not even to
read. So readers never open the sink's file: after each update that delivered rows, the sink
publishes a copy (`history.duckdb.read`, replaced atomically) and every reader (`sql`,
`history`, `stats`, `report`, `connect()`) opens that copy read-only. A reader holding the
previous copy keeps reading it (its file is unlinked, not changed), the sink never waits for a
reader, and sinks wait only for each other (`writer_lock`).
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
from pathlib import Path
from typing import Iterator

import duckdb

from adstash.history.errors import HistoryError, HistoryVersionError
from adstash.history.schema import SCHEMA_VERSION, TABLES, VIEWS
from streams.log.files import UnsafePathError, check_parents

DB_NAME = "history.duckdb"


def default_path(home: Path) -> Path:
    """The database beside the embedded log in the data directory."""
    return Path(home) / DB_NAME


def _create(con: duckdb.DuckDBPyConnection) -> None:
    con.execute("BEGIN")
    for name, columns in TABLES.items():
        con.execute(f"CREATE TABLE {name} ({columns})")
    con.execute("CREATE SEQUENCE batch_seq")  # numbers the sink's batches (Parquet export)
    for view in VIEWS:
        con.execute(view)
    con.execute("INSERT INTO schema_info VALUES (?, 'poolledger')", [SCHEMA_VERSION])
    con.execute("COMMIT")


#: A reader for analysts' statements (`poolledger sql`): no file but the database itself, no
#: extension installed or loaded, and no statement may change that (28.4).
SANDBOX: dict[str, str | bool | int | float | list[str]] = {
    "enable_external_access": False, "lock_configuration": True}


class HistoryBusyError(HistoryError):
    """Another process is updating the database (`writer_lock` is held)."""


def read_copy(path: Path | str) -> Path:
    """The published copy readers open (see the module docstring)."""
    path = Path(path)
    return path.with_name(path.name + ".read")


@contextlib.contextmanager
def writer_lock(path: Path | str, *, wait: bool = True) -> Iterator[None]:
    """Hold the database's writer lock (`<db>.lock`, flock): one sink writes at a time.
    Without `wait`, a held lock raises HistoryBusyError at once."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            raise HistoryBusyError(f"{path}: another process is updating the history "
                                   "database") from None
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def publish(path: Path | str) -> Path:
    """Checkpoint the database (its write-ahead log, a killed sink's committed batches
    included, goes into the file) and copy it to its `read_copy`, replacing the previous
    copy atomically; call with `writer_lock` held."""
    path = Path(path)
    try:
        with contextlib.closing(duckdb.connect(str(path))) as con:
            con.execute("CHECKPOINT")
    except duckdb.Error as exc:
        raise HistoryError(f"{path}: cannot open the history database: "
                           f"{_hinted(str(exc).splitlines()[0])}") from None
    target = read_copy(path)
    tmp = target.with_name(target.name + ".tmp")
    shutil.copyfile(path, tmp)
    os.replace(tmp, target)
    return target


def open_reader(path: Path | str, *, sandboxed: bool = False) -> duckdb.DuckDBPyConnection:
    """A read-only connection to the published copy of the database at `path` (published
    now if there is none, or the database changed since outside a sink, unless a sink is at
    work); `sandboxed` confines it to the database (`SANDBOX`). Never locks the sink's own
    file."""
    path = Path(path)
    copy = read_copy(path)
    config = SANDBOX if sandboxed else None
    if path.exists() and not os.access(path.parent, os.W_OK):  # an auditor's, or archived:
        return open_db(copy if copy.exists() else path, read_only=True, config=config)  # as is
    if path.exists() and (not copy.exists()
                          or path.stat().st_mtime_ns > copy.stat().st_mtime_ns):
        try:  # changed outside a sink (a `connect(read_only=False)` session): publish it
            with writer_lock(path, wait=False):
                publish(path)
        except HistoryError:  # a sink at work publishes when done; a session has it open
            if not copy.exists():
                raise
    if not copy.exists():
        raise HistoryError(f"{path}: no history database (run `poolledger history update`)")
    return open_db(copy, read_only=True, config=config)


def _hinted(first: str) -> str:
    """DuckDB's first line, and for a lock held by another process what to do instead."""
    if "lock" not in first.lower():
        return first
    return (f"{first}; another process holds it open for writing (an analyst's "
            "`connect(read_only=False)`?): query the published copy as it is with --no-update")


def open_db(path: Path | str, *, read_only: bool = False,
            config: dict[str, str | bool | int | float | list[str]] | None = None,
            ) -> duckdb.DuckDBPyConnection:
    """A connection to the history database at `path` (created unless `read_only`).

    Raises HistoryVersionError for a database of another schema version (the message names
    the rebuild command) and HistoryError when the file cannot be opened.
    """
    path = Path(path)
    if read_only and not path.exists():
        raise HistoryError(f"{path}: no history database (run `poolledger history update`)")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if not read_only:
            check_parents(path)
            if path.is_symlink():
                raise UnsafePathError(f"{path}: a symbolic link; refused (PoolLedger never "
                                      "writes through a link)")
        con = duckdb.connect(str(path), read_only=read_only, config=config or {})
    except (duckdb.Error, OSError) as exc:
        raise HistoryError(f"{path}: cannot open the history database: "
                           f"{_hinted(str(exc).splitlines()[0])}") from None
    try:
        found = con.execute("SELECT table_name FROM information_schema.tables "
                            "WHERE table_name = 'schema_info'").fetchall()
        if not found:
            if con.execute("SELECT count(*) FROM information_schema.tables").fetchall() != [(0,)]:
                raise HistoryVersionError(f"{path}: not a PoolLedger history database (no "
                                          "schema_info table); rebuild it with `poolledger "
                                          "history rebuild` or choose another --db")
            if read_only:
                raise HistoryError(f"{path}: empty database")
            _create(con)
        else:
            version = con.execute("SELECT max(version) FROM schema_info").fetchall()[0][0]
            if version != SCHEMA_VERSION:
                raise HistoryVersionError(
                    f"{path}: written by history schema version {version}, this PoolLedger "
                    f"reads version {SCHEMA_VERSION}; rebuild it from the log with "
                    "`poolledger history rebuild`")
    except BaseException:
        con.close()
        raise
    return con


def remove_db(path: Path | str) -> None:
    """Delete the database file and its write-ahead log (a rebuild starts from the log)."""
    path = Path(path)
    for p in (path, path.with_name(path.name + ".wal"), read_copy(path)):
        p.unlink(missing_ok=True)
