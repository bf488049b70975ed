"""History database: ingest of job.history events from the log, against a plain Arrow insert
of the same rows in the same run; then queries on a large jobs table.

    python bench/history.py [--events 1000000] [--rows 10000000] [--batch 122880]

Ingest = `catch_up` as `poolledger history update` runs it: the sink runner reading the
embedded log (CRC check, decode and validation of every event included), the target's Arrow
batches (staged on the reading thread) and its one-transaction insert with the positions,
each batch written by DuckDB on the overlap worker while the next is read, decoded and
staged; `--batch` defaults to the target's (a DuckDB row group). CPU per row is printed beside
each rate: on a shared machine the rates move with the load, the CPU cost much less. Baseline = the same
ads, already decoded, turned into an Arrow table (`pa.Table.from_pylist` over the typed
columns plus the ad's JSON) and inserted with one `INSERT ... SELECT` into a table of the same
typed columns and the same ad column definition (schema.AD_COLUMN). Then the jobs table is
grown to `--rows` rows in SQL (copies of the ingested rows with new ids and times) and two
queries are timed: core-hours per submitter per day (the `core_hours` view) and
`history -constraint 'Owner == "u17"' -limit 100`. Targets (issue 13): ratio >= 0.5,
>= 50,000 rows/s, each query < 1 s. The last line is key=value pairs.
"""
from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import duckdb
import orjson
import pyarrow as pa

ROOT = Path(__file__).resolve().parents[1]
# run as a script, bench/ comes first on the path and bench/adstash.py shadows the package
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
sys.path.insert(0, str(ROOT))

from adstash.history.db import open_db  # noqa: E402
from adstash.history.query import history  # noqa: E402
from adstash.history.schema import AD_COLUMN, JOB_COLUMNS  # noqa: E402
from adstash.history.target import BATCH, catch_up  # noqa: E402
from schemas.events import JobHistory, encode, make_event  # noqa: E402
from streams.log.embedded import EmbeddedLog  # noqa: E402
from streams.log.topics import EVENTS, ensure_topics  # noqa: E402

T0 = 1_763_800_000.0


def progress(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def job_ad(i: int) -> dict[str, Any]:
    """A completed job's history ad, about the size of the simulator's (80 attributes)."""
    user = f"u{i % 100}"
    group = f"group_{i % 7}"
    q = T0 + i * 0.5
    start = q + 60 + i % 600
    wall = 300.0 + (i * 37) % 7200
    ad: dict[str, Any] = {
        "MyType": "Job", "TargetType": "Machine", "ClusterId": i // 100, "ProcId": i % 100,
        "GlobalJobId": f"ap{i % 4}.example.org#{i // 100}.{i % 100}#{int(T0)}",
        "Owner": user, "User": f"{user}@example.org", "AcctGroup": group,
        "AcctGroupUser": user, "AccountingGroup": f"{group}.{user}", "JobUniverse": 5,
        "JobStatus": 4, "LastJobStatus": 2, "QDate": int(q), "JobStartDate": int(start),
        "JobCurrentStartDate": int(start), "CompletionDate": int(start + wall),
        "EnteredCurrentStatus": int(start + wall), "RemoteWallClockTime": wall,
        "RemoteUserCpu": wall * 0.9, "RemoteSysCpu": wall * 0.02, "CumulativeSlotTime": wall,
        "CommittedTime": wall, "RequestCpus": 1 + i % 4, "RequestMemory": 2048,
        "RequestDisk": 1024, "CpusProvisioned": 1 + i % 4, "MemoryProvisioned": 2048,
        "DiskProvisioned": 4096, "MachineAttrSlotWeight0": float(1 + i % 4),
        "NumJobStarts": 1, "ExitCode": 0, "ExitBySignal": False,
        "LastRemoteHost": f"slot1@node{i % 500:03d}.example.org", "Cmd": "/bin/sleep",
        "Args": "600", "JobPrio": 0, "Iwd": f"/home/{user}", "Out": "job.out",
        "Err": "job.err", "In": "/dev/null", "ImageSize": 1000, "DiskUsage": 1000,
        "Requirements": '/Expr((TARGET.Arch == "X86_64") && (TARGET.OpSys == "LINUX"))/',
        "Rank": 0.0, "KillSig": "SIGTERM", "NiceUser": False, "JobRunCount": 1,
        "NumShadowStarts": 1, "NumJobMatches": 1, "NumRestarts": 0, "NumSystemHolds": 0,
        "NumHolds": 0, "ShouldTransferFiles": "IF_NEEDED", "WhenToTransferOutput": "ON_EXIT",
        "OnExitRemove": True, "OnExitHold": False, "LeaveJobInQueue": False,
        "MyJobSubmitHost": "<ap1.example.org:9618>", "JobLeaseDuration": 2400,
        "LastMatchTime": int(start), "RemoteHost": f"slot1@node{i % 500:03d}.example.org",
        "ExitStatus": 0, "JobDuration": wall,
    }
    return ad


def plain_rows(ads: list[dict[str, Any]]) -> pa.Table:
    rows = [{**{n: ad.get(n) for n, _t in JOB_COLUMNS}, "ad": orjson.dumps(ad).decode()}
            for ad in ads]
    return pa.Table.from_pylist(rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--batch", type=int, default=BATCH)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-history-"))
    try:
        log = EmbeddedLog(tmp / "log")
        ensure_topics(log)
        progress(f"appending {args.events} job.history events to an embedded log")
        sample: list[dict[str, Any]] = []
        chunk = []
        for i in range(args.events):
            ad = job_ad(i)
            if i < 200_000:
                sample.append(ad)
            env = make_event(JobHistory(ad), ts=float(ad["CompletionDate"]),
                             source=f"schedd@ap{i % 4}.example.org", seq=i + 1)
            chunk.append((None, encode(env), env.ts))
            if len(chunk) >= 50_000:
                log.append(EVENTS, chunk)
                chunk = []
        if chunk:
            log.append(EVENTS, chunk)

        progress("ingest through the sink runner")
        db = tmp / "history.duckdb"
        t, cpu = time.perf_counter(), time.process_time()
        report = catch_up(log, db, batch=args.batch)
        ingest_s = time.perf_counter() - t
        ingest_cpu = time.process_time() - cpu
        assert report.delivered == args.events, report
        ingest_rate = args.events / ingest_s

        # baseline: the same rows (a sample, decoded ads in memory) as one plain Arrow insert
        progress(f"plain Arrow insert of {len(sample)} of the same rows")
        plain = duckdb.connect(str(tmp / "plain.duckdb"))
        columns = ", ".join(f'"{n}" {t}' for n, t in JOB_COLUMNS)
        plain.execute(f"CREATE TABLE jobs ({columns}, {AD_COLUMN})")
        t, cpu = time.perf_counter(), time.process_time()
        table = plain_rows(sample)
        plain.register("src", table)
        plain.execute("INSERT INTO jobs SELECT * FROM src")
        plain_s = time.perf_counter() - t
        plain_cpu = time.process_time() - cpu
        plain.close()
        plain_rate = len(sample) / plain_s
        ratio = ingest_rate / plain_rate
        print(f"ingest: {args.events} rows in {ingest_s:.2f} s = {ingest_rate:,.0f} rows/s "
              f"(decode, Arrow, insert, positions); CPU {ingest_cpu / args.events * 1e6:.1f} us/row")
        print(f"plain Arrow insert: {len(sample)} rows in {plain_s:.2f} s = "
              f"{plain_rate:,.0f} rows/s; CPU {plain_cpu / len(sample) * 1e6:.1f} us/row; "
              f"ratio {ratio:.2f}")

        con = open_db(db)
        n = con.execute("SELECT count(*) FROM jobs").fetchall()[0][0]
        progress(f"growing jobs from {n} to {args.rows} rows in SQL")
        copy = 1
        while n < args.rows:
            take = min(n, args.rows - n)
            con.execute(
                f"INSERT INTO jobs SELECT * REPLACE (event_id || '/{copy}' AS event_id, "
                f"ts + {copy} * 604800 AS ts, ClusterId + {copy} * 100000 AS ClusterId, "
                f"QDate + {copy} * 604800 AS QDate, JobStartDate + {copy} * 604800 AS "
                f"JobStartDate, JobCurrentStartDate + {copy} * 604800 AS JobCurrentStartDate, "
                f"CompletionDate + {copy} * 604800 AS "
                f"CompletionDate, to_timestamp((CompletionDate + {copy} * 604800) // 86400 * 86400) "
                f"AS completion_day, "
                f"log_offset + {copy} * {args.events} AS log_offset) "
                f"FROM jobs LIMIT {take}")
            n += take
            copy += 1
        con.execute("CHECKPOINT")
        rows = con.execute("SELECT count(*) FROM jobs").fetchall()[0][0]

        t = time.perf_counter()
        grouped = con.execute("SELECT day, submitter, core_hours FROM core_hours").fetchall()
        groupby_s = time.perf_counter() - t
        t = time.perf_counter()
        found = list(history(con, constraint='Owner == "u17"', limit=100))
        constraint_s = time.perf_counter() - t
        assert len(found) == 100 and all(a["Owner"] == "u17" for a in found)
        con.close()
        print(f"jobs table: {rows:,} rows; core-hours per submitter per day: {len(grouped)} "
              f"groups in {groupby_s:.3f} s; history -constraint 'Owner == \"u17\"' -limit 100: "
              f"{constraint_s:.3f} s")
        print(f"ingest_rows_per_s={ingest_rate:.0f} ratio={ratio:.3f} "
              f"groupby_seconds={groupby_s:.3f} constraint_seconds={constraint_s:.3f} "
              f"events={args.events} rows={rows}")
        return 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
