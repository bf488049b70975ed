"""The DuckDB history target: a sink target that appends a batch of events AND the log position
after it in one transaction, so a crash anywhere leaves either both or neither (exactly-once
effect without ids to deduplicate on).

Rows go in through Arrow (one `INSERT ... SELECT` per table per batch; never row at a time).
It runs on the shared sink runner (streams/sink.py, `catch_up`) as a `StagedTarget`: the
runner's thread builds a batch's Arrow tables (`stage`), the overlap worker only runs DuckDB
(`deliver_staged`), which leaves the GIL to the reading thread. Job history events are read
lean (`HistoryTarget.LEAN`): the runner validates them and hands over their stored bytes,
never a decoded ad; msgspec slices the ad's JSON text out of them (`_stored_ad`) and DuckDB
takes the typed columns out of it (`json_transform`). Measured (bench/history.py, CPU per
job): building ad dicts, keeping them for a batch and re-encoding them (orjson) cost ~25 us
on the runner's thread, more than DuckDB's whole insert; read lean it was ~12; DuckDB's
`json_extract` of the ad cost ~4 us of the worker's ~12 and its guard against duplicate keys
~3.4 us of the runner's, the msgspec slice ~1.2 us in all.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from itertools import accumulate
from pathlib import Path
from typing import Any, Final, Mapping, Sequence

import duckdb
import msgspec
import orjson
import pyarrow as pa

from adstash.history.db import open_db, publish, read_copy, remove_db, writer_lock
from adstash.history.errors import HistoryError
from adstash.history.schema import BATCH, JOB_COLUMNS
from schemas.events import (AdInvalidated, AdminCommanded, AdUpdated, ConfigChanged,
                            JobHistory, JobStarted, JobStopped, JobSubmitted, LimitChanged,
                            Matched,
                            NegotiationCycled, PriorityChanged, QuotaComputed)
from streams.log.port import Log
from streams.log.topics import DERIVED, EVENTS, ensure_topics
from streams.sink import (Anchors, Positions, Rejection, SinkItem, SinkReport, SinkRunner,
                          anchors, anchors_hold)

NAME = "history"
_JOB_HISTORY: Final = JobHistory.TYPE


_JOB_STRUCT = "{" + ", ".join(f'"{n}": "{t}"' for n, t in JOB_COLUMNS) + "}"


def _job_value(name: str, typ: str) -> str:
    # a string attribute holding an expression ("/Expr(...)/") is not a string value
    if typ == "VARCHAR":
        return f"CASE WHEN starts_with(s.\"{name}\", '/Expr(') THEN NULL ELSE s.\"{name}\" END"
    return f's."{name}"'


_JOBS_INSERT = (
    "INSERT INTO jobs SELECT b.event_id, b.ts, b.source, "
    "split_part(s.GlobalJobId, '#', 1) AS ScheddName, "
    "CASE WHEN s.AccountingGroup IS NOT NULL AND NOT starts_with(s.AccountingGroup, '/Expr(') "
    "THEN s.AccountingGroup || '@' || split_part(s.\"User\", '@', 2) ELSE s.\"User\" END, "
    "CASE WHEN s.AcctGroup IS NOT NULL AND NOT starts_with(s.AcctGroup, '/Expr(') THEN s.AcctGroup "
    "WHEN contains(s.AccountingGroup, '.') "
    "THEN regexp_extract(s.AccountingGroup, '^(.*)\\.[^.]*$', 1) ELSE '<none>' END, "
    "to_timestamp(s.CompletionDate // 86400 * 86400), "
    + ", ".join(_job_value(n, t) for n, t in JOB_COLUMNS)
    + ", b.ad, b.log_partition, b.log_offset, ? "
    f"FROM (SELECT *, json_transform(ad, '{_JOB_STRUCT}') AS s FROM _jobs_batch) b")

# One row per event id: a job's history ad logged twice (an import repeated on Kafka, a schedd
# re-sending it) keeps its first row, as the ledger ignores a duplicate id. The check is a
# semi-join that hashes the batch and scans the table's ids (an anti-join would hash the whole
# table per batch; a PRIMARY KEY's index cost ~2.4 us more per inserted job, measured at 1M
# rows), plus a count of the batch's repeated ids; only a batch that holds a known or
# repeated id takes the filtering insert.
_KNOWN_IDS = ("SELECT (SELECT count(*) FROM jobs WHERE event_id IN "
              "(SELECT event_id FROM _jobs_batch)) + "
              "(SELECT count(*) - count(DISTINCT event_id) FROM _jobs_batch)")
_JOBS_INSERT_NEW = (
    _JOBS_INSERT + " WHERE NOT EXISTS (SELECT 1 FROM jobs j WHERE j.event_id = b.event_id) "
    "QUALIFY row_number() OVER (PARTITION BY b.event_id ORDER BY b.log_partition, "
    "b.log_offset) = 1")

_JOBS_SCHEMA: Final = pa.schema([
    ("event_id", pa.string()), ("ts", pa.float64()), ("source", pa.string()),
    ("ad", pa.json_(pa.large_string())), ("log_partition", pa.int32()),
    ("log_offset", pa.int64())])
#: rows per Arrow record batch of a sink batch (see `_job_table`)
_ARROW_ROWS: Final = 8192


def _ad_array(ads: list[bytes | msgspec.Raw]) -> pa.ExtensionArray:
    """The ads' JSON texts as one Arrow `arrow.json` column, built from one joined buffer and
    their offsets (no Python string per ad: ~1.2 us per job). DuckDB takes the extension
    type as its JSON type without parsing it again; every text is a value msgspec parsed
    (`_stored_ad`), so it is valid JSON."""
    offsets = pa.array([0, *accumulate(map(len, ads))], pa.int64())
    storage = pa.LargeStringArray.from_buffers(len(ads), offsets.buffers()[1],
                                               pa.py_buffer(b"".join(ads)))
    return pa.ExtensionArray.from_storage(_JOBS_SCHEMA.field("ad").type, storage)


def _job_table(jobs: list[SinkItem]) -> pa.Table:
    """A sink batch's job.history items as Arrow record batches of `_ARROW_ROWS` rows, built
    column by column: the ads (~1.6 KB a job) are copied a record batch at a time into
    buffers of ~13 MB, not one of the sink batch's ~200 MB, which would be fresh memory
    faulted in page by page."""
    def batch(chunk: list[SinkItem]) -> pa.RecordBatch:
        return pa.record_batch([
            [it.event.id for it in chunk], [it.event.ts for it in chunk],
            [it.event.source for it in chunk], _ad_array([_stored_ad(it) for it in chunk]),
            [it.partition for it in chunk], [it.offset for it in chunk]], schema=_JOBS_SCHEMA)
    return pa.Table.from_batches(
        [batch(jobs[i:i + _ARROW_ROWS]) for i in range(0, len(jobs), _ARROW_ROWS)], _JOBS_SCHEMA)


# table -> its columns in the order the rows below are built (all but `batch`, set per batch)
_COLUMNS: dict[str, tuple[str, ...]] = {
    "job_runs": ("event_id", "ts", "kind", "job_id", "schedd", "submitter", "slot",
                 "slot_weight", "cpus", "reason"),
    "matches": ("event_id", "ts", "negotiator", "cycle", "job_id", "schedd", "submitter", "grp",
                "slot", "reason", "preempts"),
    "cycles": ("event_id", "ts", "negotiator", "cycle", "now", "duration", "matches",
               "rejections"),
    "cycle_submitters": ("ts", "negotiator", "cycle", "submitter", "grp", "matches", "usage",
                         "idle", "eup", "submitter_limit", "stopped"),
    "priorities": ("event_id", "ts", "name", "priority", "factor", "effective_priority",
                   "resources_used", "weighted_resources_used", "floor", "ceiling",
                   "old_priority", "old_factor", "cause"),
    "quotas": ("event_id", "ts", "grp", "config_quota", "effective_quota", "subtree_quota",
               "allocated", "cause"),
    "limits": ("event_id", "ts", "limit_name", "max", "in_use", "cause"),
    "admin": ("event_id", "ts", "source", "kind", "op", "target", "value", "by_user", "reason",
              "duration"),
    "submitted": ("event_id", "ts", "job_id", "schedd", "submitter", "grp", "QDate",
                  "RequestCpus", "JobPrio", "JobStatus"),
    "slot_updates": ("event_id", "ts", "slot", "machine", "state", "activity", "cpus",
                     "slot_weight", "remote_user", "present"),
}


class _StoredAd(msgspec.Struct, gc=False):
    ad: msgspec.Raw


class _StoredJob(msgspec.Struct, gc=False):
    """A job.history event's ad as its stored JSON text (`_stored_ad`)."""

    data: _StoredAd


_STORED_JOB: Final = msgspec.json.Decoder(_StoredJob)


def _stored_ad(item: SinkItem) -> bytes | msgspec.Raw:
    """The ad of a job.history event as its stored JSON text, sliced out by msgspec: the event
    log validated the same bytes with the same parser, so this is the ad it decodes, the
    accountant's (a duplicate "data" or "ad" key resolves to the last, \\u escapes in keys
    read alike) — no JSON path of DuckDB's (which takes the first) and no scan of the bytes
    for such cases. An item read without its bytes carries its decoded ad."""
    if item.raw:
        return _STORED_JOB.decode(item.raw).data.ad
    return orjson.dumps(item.event.data.ad)


def _num(value: Any) -> float | None:
    """A finite number from an ad value, else None (expressions, strings, booleans)."""
    if type(value) in (int, float) and value == value and abs(value) != float("inf"):
        return float(value)
    return None


def _str(value: Any) -> str | None:
    return value if type(value) is str and not value.startswith("/Expr(") else None


def _submitted_group(ad: Mapping[str, Any]) -> str:
    """The accounting group of a submitted job's ad, as the jobs table derives it."""
    group = _str(ad.get("AcctGroup"))
    if group is not None:
        return group
    acct = _str(ad.get("AccountingGroup"))
    return acct.rsplit(".", 1)[0] if acct is not None and "." in acct else "<none>"


class Rows:
    """Rows of one batch, per table, built from events (pure: no database)."""

    def __init__(self) -> None:
        self.tables: dict[str, list[tuple[Any, ...]]] = defaultdict(list)
        self.jobs: list[SinkItem] = []  # job.history, read lean (see `_job_table`)

    def add(self, item: SinkItem) -> None:
        env = item.event
        if env.type == _JOB_HISTORY:  # read lean: `data` is None, `raw` the stored event
            self.jobs.append(item)
            return
        d = env.data
        add = self.tables
        where = (item.partition, item.offset)
        if isinstance(d, AdUpdated):
            if d.ad_type == "Machine":
                ad = d.ad
                add["slot_updates"].append((
                    env.id, env.ts, d.name, _str(ad.get("Machine")), _str(ad.get("State")),
                    _str(ad.get("Activity")), _num(ad.get("Cpus")),
                    _num(ad.get("SlotWeight", ad.get("Cpus"))), _str(ad.get("RemoteUser")),
                    True, *where))
        elif isinstance(d, AdInvalidated):
            if d.ad_type == "Machine":
                machine = d.name.split("@", 1)[1] if "@" in d.name else d.name
                add["slot_updates"].append((env.id, env.ts, d.name, machine, None, None, None,
                                            None, None, False, *where))
        elif isinstance(d, JobSubmitted):
            ad = d.ad
            qdate, prio, status = _num(ad.get("QDate")), _num(ad.get("JobPrio")), _num(ad.get("JobStatus"))
            add["submitted"].append((
                env.id, env.ts, d.job_id, d.schedd, d.submitter, _submitted_group(ad),
                None if qdate is None else int(qdate), _num(ad.get("RequestCpus")),
                None if prio is None else int(prio), None if status is None else int(status),
                *where))
        elif isinstance(d, JobStarted):
            add["job_runs"].append((env.id, env.ts, "started", d.job_id, d.schedd, d.submitter,
                                    d.slot, d.slot_weight, _num(d.resources.get("Cpus")), None,
                                    *where))
        elif isinstance(d, JobStopped):
            add["job_runs"].append((env.id, env.ts, "stopped", d.job_id, d.schedd, d.submitter,
                                    d.slot, None, None, d.reason, *where))
        elif isinstance(d, Matched):
            add["matches"].append((env.id, env.ts, d.negotiator, d.cycle, d.job_id, d.schedd,
                                   d.submitter, d.group, d.slot, d.reason, d.preempts, *where))
        elif isinstance(d, NegotiationCycled):
            add["cycles"].append((env.id, env.ts, d.negotiator, d.cycle, d.now, d.duration,
                                  d.matches, orjson.dumps(d.rejections).decode(), *where))
            for name, s in d.submitters.items():
                if isinstance(s, Mapping):
                    add["cycle_submitters"].append((
                        env.ts, d.negotiator, d.cycle, name, _str(s.get("group")),
                        _num(s.get("matches")), _num(s.get("usage")), _num(s.get("idle")),
                        _num(s.get("eup")), _num(s.get("limit")), _str(s.get("stopped")),
                        *where))
        elif isinstance(d, PriorityChanged):
            add["priorities"].append((env.id, env.ts, d.name, d.priority, d.factor,
                                      d.effective_priority, d.resources_used,
                                      d.weighted_resources_used, d.floor, d.ceiling,
                                      d.old_priority, d.old_factor, d.cause, *where))
        elif isinstance(d, QuotaComputed):
            add["quotas"].append((env.id, env.ts, d.group, d.config_quota, d.effective_quota,
                                  d.subtree_quota, d.allocated, d.cause, *where))
        elif isinstance(d, LimitChanged):
            add["limits"].append((env.id, env.ts, d.limit, d.max, d.in_use, d.cause, *where))
        elif isinstance(d, AdminCommanded):
            add["admin"].append((env.id, env.ts, env.source, "admin.command", d.op, d.target,
                                 None if d.value is None else str(d.value), d.by, d.reason,
                                 d.duration, *where))
        elif isinstance(d, ConfigChanged):
            add["admin"].append((env.id, env.ts, env.source, "config.changed", "set", d.knob,
                                 d.value, d.by, "", None, *where))

    def __len__(self) -> int:
        return len(self.jobs) + sum(len(v) for v in self.tables.values())


@dataclass(frozen=True, slots=True)
class Staged:
    """A batch as Arrow tables, ready for DuckDB (`HistoryTarget.stage`)."""

    jobs: pa.Table | None  # job.history rows (`_JOBS_SCHEMA`)
    tables: dict[str, pa.Table]  # every other table's rows


class HistoryTarget:
    """The DuckDB history database as a sink target (the transactional kind)."""

    name = NAME
    #: event types the runner hands over as stored bytes (see the module docstring)
    LEAN = frozenset({JobHistory.TYPE})

    def __init__(self, path: Path | str, topics: tuple[str, ...] = (EVENTS, DERIVED)) -> None:
        self.path = Path(path)
        self.topics = topics
        self.con: duckdb.DuckDBPyConnection = open_db(self.path)
        # one DuckDB thread: the runner's decoding has the other core (overlap); a second
        # DuckDB thread only waited on it (measured: more CPU per row, no faster)
        self.con.execute("SET threads = 1")

    def positions(self) -> Positions:
        """Where the next batch starts, as stored with the rows."""
        out: Positions = {}
        for topic, partition, nxt in self.con.execute(
                "SELECT topic, partition, next_offset FROM positions").fetchall():
            out.setdefault(topic, {})[int(partition)] = int(nxt)
        return out

    def made_from_another(self, log: Log) -> bool:
        """Whether the rows came from a log other than `log`: an anchored record (`anchors`)
        differs or is gone, or a position lies past the log's end."""
        stored = {(str(t), int(p)): str(a) for t, p, a in self.con.execute(
            "SELECT topic, partition, anchor FROM log_anchors").fetchall()}
        if not anchors_hold(log, stored):
            return True
        for topic, parts in self.positions().items():
            ends = log.end_offsets(topic) if parts and topic in log.topics() else {}
            if any(nxt > ends.get(p, 0) for p, nxt in parts.items()):
                return True
        return False

    def record_anchors(self, found: Anchors) -> None:
        """Keep the log's records the positions follow (`anchors`), for `made_from_another`."""
        for (topic, partition), anchor in found.items():
            self.con.execute("INSERT OR REPLACE INTO log_anchors VALUES (?, ?, ?)",
                             [topic, partition, anchor])

    def stage(self, items: Sequence[SinkItem]) -> Staged:
        """The batch's Arrow tables (pure Python and Arrow: no database; see StagedTarget)."""
        rows = Rows()
        for item in items:
            rows.add(item)
        tables: dict[str, pa.Table] = {}
        for table, tuples in rows.tables.items():
            names = (*_COLUMNS[table], "log_partition", "log_offset")
            tables[table] = pa.table({n: pa.array(list(a)) if any(v is not None for v in a)
                                      else pa.nulls(len(a)) for n, a in zip(names, zip(*tuples))})
        return Staged(_job_table(rows.jobs) if rows.jobs else None, tables)

    def deliver(self, items: Sequence[SinkItem], upto: Positions) -> list[Rejection]:
        """`deliver_staged` of the staged batch (the runner stages apart in overlap mode)."""
        return self.deliver_staged(self.stage(items), upto)

    def deliver_staged(self, staged: Staged, upto: Positions) -> list[Rejection]:
        """Append the batch's rows and `upto` in one transaction; nothing is rejected (a row
        that does not fit a typed column keeps NULL there, the whole ad stays in `ad`). Only
        DuckDB runs here (it leaves the GIL to the runner's reading thread)."""
        con = self.con
        try:
            con.execute("BEGIN")
            batch = con.execute("SELECT nextval('batch_seq')").fetchall()[0][0]
            if staged.jobs is not None:
                con.register("_jobs_batch", staged.jobs)
                known = con.execute(_KNOWN_IDS).fetchall()[0][0]
                con.execute(_JOBS_INSERT if not known else _JOBS_INSERT_NEW, [batch])
                con.unregister("_jobs_batch")
            for table, src in staged.tables.items():
                con.register("_batch", src)
                con.execute(f"INSERT INTO {table} ({', '.join(src.column_names)}, batch) "
                            f"SELECT *, ? FROM _batch", [batch])
                con.unregister("_batch")
            for topic, parts in upto.items():
                for partition, nxt in parts.items():
                    con.execute("INSERT OR REPLACE INTO positions VALUES (?, ?, ?)",
                                [topic, partition, nxt])
            con.execute("COMMIT")
        except duckdb.Error as exc:
            try:
                con.execute("ROLLBACK")
            except duckdb.Error:  # a failed COMMIT (a full disk) has ended the transaction
                pass
            raise HistoryError(f"{self.path}: {str(exc).splitlines()[0]}") from None
        return []

    def close(self) -> None:
        self.con.execute("CHECKPOINT")  # the file alone holds every row: it is copied next
        self.con.close()


def catch_up(log: Log, path: Path | str, *, batch: int = BATCH,
             topics: tuple[str, ...] | None = None, wait: bool = True) -> SinkReport:
    """Bring the database at `path` up to the log's end on the shared sink runner (its
    positions are the database's own, so the runner commits no consumer-group offsets).
    `topics` default to the table's events and derived topics (a Kafka run names its own).
    A database made from another log (`streams.sink.anchors`, or positions past its end) is
    re-created from this one: the derived store follows the log, never a mix of two. Then
    the database is published to its readers (`db.publish`). Another update running makes
    this one wait, or without `wait` raise HistoryBusyError."""
    if topics is None:
        ensure_topics(log)
        topics = (EVENTS, DERIVED)
    with writer_lock(path, wait=wait):
        target = HistoryTarget(path, topics)
        if target.made_from_another(log):
            target.close()
            remove_db(path)
            target = HistoryTarget(path, topics)
        try:
            report = SinkRunner(log, target, batch=batch, overlap=True,
                                lean=HistoryTarget.LEAN).run_once()
            target.record_anchors(anchors(log, target.positions()))
        finally:
            target.close()
        if report.delivered or not read_copy(path).exists():
            publish(path)  # what readers open (db.py: sharing)
        return report
