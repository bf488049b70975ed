"""The history database for analysts: the log's events in DuckDB (HTCondorView-style pool
history, condor_history-style job history) and Parquet exports for bigger engines.

For an analyst, one call hands over a DuckDB connection (pandas through `.df()`):

    from adstash.history import connect
    con = connect(home="out/groups")          # or connect("path/to/history.duckdb")
    con.sql("SELECT * FROM core_hours").df()

Tables: jobs (one row per job.history: HTCondor's attribute names as typed columns, the whole
ad as JSON in `ad`), job_runs, matches, cycles, cycle_submitters, priorities, quotas, limits,
admin, slot_updates. Views and macros: see `schema.VIEW_NAMES`.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from adstash.history.errors import HistoryError, HistoryQueryError, HistoryVersionError

if TYPE_CHECKING:  # DuckDB loads with the first connection, not with the package's errors
    import duckdb

__all__ = ["connect", "HistoryError", "HistoryQueryError", "HistoryVersionError"]


def connect(path: Path | str | None = None, *, home: Path | str | None = None,
            read_only: bool = True) -> duckdb.DuckDBPyConnection:
    """A DuckDB connection to the history database at `path`, or the one in data directory
    `home` (`poolledger --home DIR` / POOLLEDGER_HOME). Read-only by default: then it reads
    the copy the sink published after its last update (`db.read_copy`), so a session never
    stops `history update`, `run` or `poolledger sql`, and an update never stops it (reconnect
    to see newer rows). `read_only=False` opens the sink's own file: while it is open, no
    update and no other reader's first publication can run."""
    from adstash.history.db import default_path, open_db, open_reader

    if path is None:
        if home is None:
            raise HistoryError("connect: give the database path or the data directory (home)")
        path = default_path(Path(home))
    return open_reader(path) if read_only else open_db(path)
