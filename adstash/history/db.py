"""Opening the history database: create it on first use, refuse another schema version.

DuckDB's own errors are translated here (one adapter), so commands print one line naming the
file and never a traceback.
"""
from __future__ import annotations

from pathlib import Path

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


def open_db(path: Path | str, *, read_only: bool = False) -> duckdb.DuckDBPyConnection:
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
        con = duckdb.connect(str(path), read_only=read_only)
    except (duckdb.Error, OSError) as exc:
        raise HistoryError(f"{path}: cannot open the history database: "
                           f"{str(exc).splitlines()[0]}") from None
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
    for p in (path, path.with_name(path.name + ".wal")):
        p.unlink(missing_ok=True)
