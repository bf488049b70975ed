"""Parquet export of the history database, hive-partitioned by day (`TABLE/day=YYYY-MM-DD/`),
incremental: the directory remembers the last sink batch it holds per table
(`_poolledger_export.json`), so a second export writes only newer batches as new files, and
DuckDB, pandas (pyarrow) and Spark read the directory unchanged.
"""
from __future__ import annotations

import json
from pathlib import Path

import duckdb

from adstash.history.errors import HistoryError
from adstash.history.schema import DATA_TABLES
from streams.log.files import atomic_file, check_parents

STATE = "_poolledger_export.json"


def export_parquet(con: duckdb.DuckDBPyConnection, directory: Path | str) -> dict[str, int]:
    """Write each table's rows newer than the directory's watermark; rows written per table."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    state_path = out / STATE
    check_parents(state_path)  # DuckDB writes the Parquet files under `out` as it finds it
    try:
        state: dict[str, int] = json.loads(state_path.read_text()) if state_path.exists() else {}
    except (OSError, ValueError) as exc:
        raise HistoryError(f"{state_path}: unreadable export state ({exc}); "
                           "export to an empty directory") from None
    written: dict[str, int] = {}
    try:
        for table in DATA_TABLES:
            done = int(state.get(table, 0))
            top = con.execute(f"SELECT max(batch), count(*) FILTER (WHERE batch > ?) FROM {table}",
                              [done]).fetchall()[0]
            if top[0] is None or top[1] == 0:
                written[table] = 0
                continue
            con.execute(
                f"COPY (SELECT *, strftime(to_timestamp(ts), '%Y-%m-%d') AS day FROM {table} "
                f"WHERE batch > {done} AND batch <= {int(top[0])}) "
                f"TO '{(out / table).as_posix()}' (FORMAT parquet, PARTITION_BY (day), "
                f"OVERWRITE_OR_IGNORE, FILENAME_PATTERN 'b{done + 1}-{int(top[0])}_{{i}}')")
            written[table] = int(top[1])
            state[table] = int(top[0])
    except duckdb.Error as exc:
        raise HistoryError(f"export to {out}: {str(exc).splitlines()[0]}") from None
    finally:
        with atomic_file(state_path) as f:
            f.write(json.dumps(state, indent=1, sort_keys=True).encode())
    return written
