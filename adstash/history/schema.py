"""The history database's schema: tables, views, macros and its version.

Why views and macros rather than tables filled by the sink: each question ("core-hours per
submitter per day", "what did the pool look like at 14:00") is a query over rows that are
appended once and never updated, so the sink stays a pure append of one transaction per batch
and every answer is recomputed from the same rows (a restarted or rebuilt database gives the
same answers). Job attributes keep HTCondor's names as columns, so a ClassAd constraint over
them translates to SQL (`query.py`) and `-af` needs no mapping. Times are seconds since the
epoch, as in the ClassAds; the views add `day`/`hour` timestamps (UTC) for grouping, computed
by integer arithmetic on the epoch seconds: `date_trunc` on a TIMESTAMPTZ goes through ICU's
calendar in the session's time zone and was 3/4 of core-hours per day on 10M rows. The jobs'
UTC day of completion is stored at ingest (`completion_day`), the key of the per-day views.
"""
from __future__ import annotations

from typing import Final

#: Bumped whenever a table's columns or a view change (views are stored in the file); a
#: database of another version is refused (`HistoryVersionError`) and `poolledger history
#: rebuild` re-creates it from the log.
SCHEMA_VERSION: Final = 5  # 2: jobs.completion_day; 3: submitted, log_anchors, queue;
# 4: quotas.allocated (effective_quota is HTCondor's EffectiveQuota);
# 5: core_hours split over the days a job ran, cpu_efficiency by HTCondor's attributes

#: The sink's batch: DuckDB's row group (rows). A transaction inserting a whole row group
#: writes it compressed straight to the database file; a smaller one goes to the write-ahead
#: log uncompressed and is written again at the checkpoint (measured: 14 -> 3 us per job for
#: the commit, and a database half the size).
BATCH: Final = 122_880

#: The typed job columns (HTCondor attribute, DuckDB type), extracted from the ad in SQL.
JOB_COLUMNS: Final[tuple[tuple[str, str], ...]] = (
    ("GlobalJobId", "VARCHAR"), ("ClusterId", "BIGINT"), ("ProcId", "BIGINT"),
    ("Owner", "VARCHAR"), ("User", "VARCHAR"), ("AcctGroup", "VARCHAR"),
    ("AcctGroupUser", "VARCHAR"), ("AccountingGroup", "VARCHAR"),
    ("JobStatus", "INTEGER"), ("JobUniverse", "INTEGER"), ("QDate", "BIGINT"),
    ("JobStartDate", "BIGINT"), ("JobCurrentStartDate", "BIGINT"), ("CompletionDate", "BIGINT"),
    ("EnteredCurrentStatus", "BIGINT"), ("RemoteWallClockTime", "DOUBLE"),
    ("RemoteUserCpu", "DOUBLE"), ("RemoteSysCpu", "DOUBLE"), ("CumulativeSlotTime", "DOUBLE"),
    ("CommittedTime", "DOUBLE"), ("RequestCpus", "DOUBLE"), ("RequestMemory", "DOUBLE"),
    ("RequestDisk", "DOUBLE"), ("RequestGpus", "DOUBLE"), ("CpusProvisioned", "DOUBLE"),
    ("MemoryProvisioned", "DOUBLE"), ("DiskProvisioned", "DOUBLE"),
    ("GpusProvisioned", "DOUBLE"), ("MachineAttrSlotWeight0", "DOUBLE"),
    ("NumJobStarts", "INTEGER"), ("ExitCode", "INTEGER"), ("ExitBySignal", "BOOLEAN"),
    ("LastRemoteHost", "VARCHAR"), ("Cmd", "VARCHAR"), ("Args", "VARCHAR"),
    ("JobPrio", "INTEGER"), ("ConcurrencyLimits", "VARCHAR"),
)
JOB_TYPES: Final = {name.lower(): typ for name, typ in JOB_COLUMNS}

#: The whole ad, ZSTD-compressed: ads repeat most of their text, so ZSTD stores them ~14x
#: smaller than DuckDB's default (dictionary/FSST) choice and at half its CPU cost per row,
#: which was most of the ingest's time (measured: bench/history.py).
AD_COLUMN: Final = "ad JSON USING COMPRESSION zstd"

_LOG = "log_partition INTEGER, log_offset BIGINT, batch BIGINT"

TABLES: Final[dict[str, str]] = {
    "schema_info": "version INTEGER NOT NULL, written_by VARCHAR",
    # the sink's checkpoint: stored in the same transaction as the rows of each batch
    "positions": "topic VARCHAR, partition INTEGER, next_offset BIGINT, "
                 "PRIMARY KEY (topic, partition)",
    # the log the rows came from: per partition, the last record read (`streams.sink.anchors`),
    # so a database made from a log since replaced is rebuilt instead of mixed with it
    "log_anchors": "topic VARCHAR, partition INTEGER, anchor VARCHAR, "
                   "PRIMARY KEY (topic, partition)",
    # job.submitted: a job entering (or re-entering, with a new ad) its schedd's queue
    "submitted": ("event_id VARCHAR, ts DOUBLE, job_id VARCHAR, schedd VARCHAR, "
                  "submitter VARCHAR, grp VARCHAR, QDate BIGINT, RequestCpus DOUBLE, "
                  f"JobPrio INTEGER, JobStatus INTEGER, {_LOG}"),
    "jobs": ("event_id VARCHAR, ts DOUBLE, source VARCHAR, ScheddName VARCHAR, "
             "submitter VARCHAR, grp VARCHAR, completion_day TIMESTAMPTZ, "
             + ", ".join(f'"{n}" {t}' for n, t in JOB_COLUMNS) + f", {AD_COLUMN}, {_LOG}"),
    "job_runs": ("event_id VARCHAR, ts DOUBLE, kind VARCHAR, job_id VARCHAR, schedd VARCHAR, "
                 f"submitter VARCHAR, slot VARCHAR, slot_weight DOUBLE, cpus DOUBLE, "
                 f"reason VARCHAR, {_LOG}"),
    "matches": ("event_id VARCHAR, ts DOUBLE, negotiator VARCHAR, cycle BIGINT, job_id VARCHAR, "
                "schedd VARCHAR, submitter VARCHAR, grp VARCHAR, slot VARCHAR, reason VARCHAR, "
                f"preempts VARCHAR, {_LOG}"),
    "cycles": ("event_id VARCHAR, ts DOUBLE, negotiator VARCHAR, cycle BIGINT, now DOUBLE, "
               f"duration DOUBLE, matches BIGINT, rejections JSON, {_LOG}"),
    "cycle_submitters": ("ts DOUBLE, negotiator VARCHAR, cycle BIGINT, submitter VARCHAR, "
                         "grp VARCHAR, matches DOUBLE, usage DOUBLE, idle DOUBLE, eup DOUBLE, "
                         f"submitter_limit DOUBLE, stopped VARCHAR, {_LOG}"),
    "priorities": ("event_id VARCHAR, ts DOUBLE, name VARCHAR, priority DOUBLE, factor DOUBLE, "
                   "effective_priority DOUBLE, resources_used DOUBLE, "
                   "weighted_resources_used DOUBLE, floor DOUBLE, ceiling DOUBLE, "
                   f"old_priority DOUBLE, old_factor DOUBLE, cause VARCHAR, {_LOG}"),
    "quotas": ("event_id VARCHAR, ts DOUBLE, grp VARCHAR, config_quota DOUBLE, "
               f"effective_quota DOUBLE, subtree_quota DOUBLE, allocated DOUBLE, cause VARCHAR, "
               f"{_LOG}"),
    "limits": ("event_id VARCHAR, ts DOUBLE, limit_name VARCHAR, max DOUBLE, in_use DOUBLE, "
               f"cause VARCHAR, {_LOG}"),
    "admin": ("event_id VARCHAR, ts DOUBLE, source VARCHAR, kind VARCHAR, op VARCHAR, "
              "target VARCHAR, value VARCHAR, by_user VARCHAR, reason VARCHAR, duration DOUBLE, "
              f"{_LOG}"),
    "slot_updates": ("event_id VARCHAR, ts DOUBLE, slot VARCHAR, machine VARCHAR, "
                     "state VARCHAR, activity VARCHAR, cpus DOUBLE, slot_weight DOUBLE, "
                     f"remote_user VARCHAR, present BOOLEAN, {_LOG}"),
}

#: Tables holding rows of the log (exported to Parquet; counted by `poolledger history`).
DATA_TABLES: Final = tuple(t for t in TABLES if t not in ("schema_info", "positions",
                                                          "log_anchors"))

VIEWS: Final[tuple[str, ...]] = (
    # each job.started paired with the job.stopped that ended it on that slot (open: NULL)
    """CREATE VIEW runs AS
    WITH e AS (
      SELECT *, lead(kind) OVER w AS next_kind, lead(ts) OVER w AS next_ts,
             lead(reason) OVER w AS next_reason
      FROM job_runs WINDOW w AS (PARTITION BY schedd, job_id, slot
                                 ORDER BY ts, log_partition, log_offset))
    SELECT job_id, schedd, submitter, slot, slot_weight, cpus, ts AS start_ts,
           CASE WHEN next_kind = 'stopped' THEN next_ts END AS stop_ts,
           CASE WHEN next_kind = 'stopped' THEN next_reason END AS stop_reason
    FROM e WHERE kind = 'started'""",
    # the log's latest event time: where open runs are charged up to (as the accountant does)
    """CREATE VIEW log_end AS
    SELECT max(t) AS ts FROM (SELECT max(ts) AS t FROM job_runs UNION ALL
      SELECT max(ts) FROM submitted UNION ALL
      SELECT max(ts) FROM slot_updates UNION ALL SELECT max(ts) FROM cycles UNION ALL
      SELECT max(ts) FROM jobs UNION ALL SELECT max(ts) FROM admin)""",
    # usage per submitter: as the accountant charges it (AccumulatedUsage / weighted)
    """CREATE VIEW submitter_usage AS
    SELECT r.submitter,
           sum(coalesce(r.stop_ts, l.ts) - r.start_ts) AS usage_seconds,
           sum(r.slot_weight * (coalesce(r.stop_ts, l.ts) - r.start_ts)) AS weighted_usage_seconds,
           count(*) AS runs
    FROM runs r, log_end l GROUP BY r.submitter""",
    # core-hours of finished jobs per submitter, group and UTC day, each job's split over the
    # days it ran: its last run (JobCurrentStartDate to CompletionDate) holds the wall time
    # of that run, the wall time of its earlier runs is spread over JobStartDate to the last
    # run's start (their times are not in the ad); each segment shares its seconds among
    # the days in proportion to its overlap with each. `jobs`: the jobs completed that day.
    # Every job is summed on its day of completion (`whole`, the one scan of all rows), then
    # the few that ran before that day (`j`) are moved: taken off it and split (`moved`);
    # filtering or expanding every row instead was 2-3x slower on 10M rows.
    """CREATE VIEW core_hours AS
    WITH whole AS (
      SELECT completion_day AS day, submitter, grp, count(*) AS jobs,
             sum(RemoteWallClockTime * coalesce(CpusProvisioned, RequestCpus, 1)) AS cs,
             sum(RemoteWallClockTime * coalesce(MachineAttrSlotWeight0, CpusProvisioned,
                 RequestCpus, 1)) AS ws
      FROM jobs WHERE CompletionDate > 0 GROUP BY ALL),
    j AS (
      SELECT completion_day, submitter, grp, CAST(CompletionDate AS DOUBLE) AS c,
             JobStartDate, coalesce(CpusProvisioned, RequestCpus, 1) AS cpus,
             coalesce(MachineAttrSlotWeight0, CpusProvisioned, RequestCpus, 1) AS weight,
             RemoteWallClockTime AS wall,
             least(CompletionDate, coalesce(nullif(JobCurrentStartDate, 0),
                                            CompletionDate - RemoteWallClockTime)) AS cur
      FROM jobs WHERE CompletionDate > 0 AND RemoteWallClockTime > 0
        AND (coalesce(JobStartDate, CompletionDate) < CompletionDate // 86400 * 86400
             OR CompletionDate - RemoteWallClockTime < CompletionDate // 86400 * 86400)),
    s AS (
      SELECT submitter, grp, cpus, weight, cur AS lo, c AS hi, least(wall, c - cur) AS secs
      FROM j
      UNION ALL
      SELECT submitter, grp, cpus, weight,
             CASE WHEN JobStartDate > 0 AND JobStartDate < cur THEN JobStartDate
                  ELSE cur - (wall - (c - cur)) END AS lo,
             cur AS hi, wall - (c - cur) AS secs
      FROM j WHERE wall > c - cur),
    d AS (
      SELECT *, unnest(range(CAST(floor(lo / 86400) AS BIGINT) * 86400,
                             CAST(floor(hi / 86400) AS BIGINT) * 86400 + 1, 86400)) AS d0,
             CASE WHEN hi > lo THEN secs * (least(hi, d0 + 86400) - greatest(lo, d0)) / (hi - lo)
                  ELSE secs END AS share
      FROM s),
    moved AS (
      SELECT to_timestamp(d0) AS day, submitter, grp, 0 AS jobs, sum(share * cpus) AS cs,
             sum(share * weight) AS ws
      FROM d GROUP BY ALL
      UNION ALL
      SELECT completion_day, submitter, grp, 0, -sum(wall * cpus), -sum(wall * weight)
      FROM j GROUP BY ALL)
    SELECT day, submitter, grp, CAST(sum(jobs) AS BIGINT) AS jobs, sum(cs) / 3600 AS core_hours,
           sum(ws) / 3600 AS weighted_core_hours
    FROM (FROM whole UNION ALL FROM moved) GROUP BY ALL
    HAVING sum(jobs) > 0 OR abs(sum(cs)) > 1e-6""",
    # CPU efficiency as HTCondor's attributes define it: the CPU time of every run attempt
    # (CumulativeRemoteUserCpu + CumulativeRemoteSysCpu; RemoteUserCpu/RemoteSysCpu leave out
    # evicted attempts, so they are the fallback) over the cores' time running
    # ((RemoteWallClockTime - CumulativeSuspensionTime) x cores), per day of completion; only
    # jobs whose ads report CPU time count, and a day none of whose jobs does is NULL, not 0
    """CREATE VIEW cpu_efficiency AS
    WITH j AS (
      SELECT completion_day, submitter, grp,
             coalesce(TRY_CAST(ad->>'CumulativeRemoteUserCpu' AS DOUBLE), RemoteUserCpu) AS usr,
             coalesce(TRY_CAST(ad->>'CumulativeRemoteSysCpu' AS DOUBLE), RemoteSysCpu) AS sys,
             (RemoteWallClockTime - coalesce(TRY_CAST(ad->>'CumulativeSuspensionTime' AS DOUBLE),
                                             0)) * coalesce(CpusProvisioned, RequestCpus, 1)
               AS core_seconds
      FROM jobs WHERE CompletionDate > 0)
    SELECT completion_day AS day, submitter, grp,
           count(*) FILTER (WHERE usr IS NOT NULL OR sys IS NOT NULL) AS jobs,
           sum(coalesce(usr, 0) + coalesce(sys, 0))
             FILTER (WHERE usr IS NOT NULL OR sys IS NOT NULL) /
             nullif(sum(core_seconds) FILTER (WHERE usr IS NOT NULL OR sys IS NOT NULL), 0)
             AS efficiency
    FROM j GROUP BY ALL""",
    # the jobs still in a queue at the history's end (HTCondor's job queue, not its history):
    # submitted, neither completed nor removed by a job.stopped nor written to the history;
    # wait_seconds is the wait so far for a job that never started (censored at the log's
    # end), else QDate to its first start, so wait_times over finished jobs can be completed
    # with the jobs still waiting
    """CREATE VIEW queue AS
    WITH s AS (
      SELECT *, min(QDate) OVER w AS first_qdate, min(ts) OVER w AS submitted_ts
      FROM submitted WINDOW w AS (PARTITION BY schedd, job_id)
      QUALIFY row_number() OVER (PARTITION BY schedd, job_id
                                 ORDER BY ts DESC, log_partition DESC, log_offset DESC) = 1),
    r AS (
      SELECT schedd, job_id, min(ts) FILTER (WHERE kind = 'started') AS first_start,
             arg_max(CASE WHEN kind = 'started' THEN 'running'
                          WHEN reason = 'held' THEN 'held'
                          WHEN reason IN ('completed', 'removed') THEN 'left'
                          ELSE 'idle' END, (ts, log_partition, log_offset)) AS state
      FROM job_runs GROUP BY ALL),
    h AS (SELECT DISTINCT ScheddName, CAST(ClusterId AS VARCHAR) || '.' ||
                 CAST(ProcId AS VARCHAR) AS job_id FROM jobs)
    SELECT s.job_id, s.schedd, s.submitter, s.grp,
           CAST(coalesce(s.first_qdate, s.submitted_ts) AS BIGINT) AS QDate,
           CASE WHEN r.state IS NOT NULL THEN r.state WHEN s.JobStatus = 5 THEN 'held'
                ELSE 'idle' END AS status,
           s.RequestCpus, s.JobPrio, r.first_start,
           coalesce(r.first_start, l.ts) - coalesce(s.first_qdate, s.submitted_ts) AS wait_seconds,
           r.first_start IS NULL AS still_waiting,
           l.ts - coalesce(s.first_qdate, s.submitted_ts) AS queued_seconds
    FROM s LEFT JOIN r USING (schedd, job_id), log_end l
    WHERE r.state IS DISTINCT FROM 'left'
      AND NOT EXISTS (SELECT 1 FROM h WHERE h.job_id = s.job_id
                      AND (s.schedd = h.ScheddName OR s.schedd = 'schedd@' || h.ScheddName))""",
    """CREATE VIEW wait_times AS
    SELECT GlobalJobId, submitter, grp, QDate, JobStartDate,
           to_timestamp(QDate // 86400 * 86400) AS day, JobStartDate - QDate AS wait_seconds
    FROM jobs WHERE JobStartDate > 0 AND QDate > 0""",
    # badput: slot time of runs that ended without completing (evicted, preempted, vacated)
    """CREATE VIEW badput AS
    SELECT to_timestamp(floor(stop_ts / 86400) * 86400) AS day, submitter,
           count(*) AS runs, sum(slot_weight * (stop_ts - start_ts)) / 3600 AS weighted_hours
    FROM runs WHERE stop_reason IN ('evicted', 'preempted', 'vacated') GROUP BY ALL""",
    # the slot's last state at each event time (the last of several updates at one time)
    """CREATE VIEW slot_states AS
    SELECT * FROM slot_updates
    QUALIFY row_number() OVER (PARTITION BY slot, ts ORDER BY log_partition DESC,
                                log_offset DESC) = 1""",
    # each machine's state changes (HTCondorView's machine history)
    """CREATE VIEW machine_states AS
    SELECT ts, to_timestamp(ts) AS time, slot, machine,
           CASE WHEN present THEN state ELSE 'Gone' END AS state,
           CASE WHEN present THEN activity ELSE 'Gone' END AS activity, remote_user
    FROM (SELECT *, lag(state) OVER w AS prev_state, lag(activity) OVER w AS prev_activity,
                 lag(present) OVER w AS prev_present
          FROM slot_states WINDOW w AS (PARTITION BY slot ORDER BY ts))
    WHERE prev_present IS NULL OR present IS DISTINCT FROM prev_present
       OR state IS DISTINCT FROM prev_state OR activity IS DISTINCT FROM prev_activity""",
    # HTCondorView pool history: slots by state/activity at each `step` seconds of event time
    """CREATE MACRO pool_history(step) AS TABLE
    WITH b AS (SELECT unnest(range(CAST(floor(min(ts) / step) * step AS BIGINT),
                                   CAST(max(ts) AS BIGINT) + 1, CAST(step AS BIGINT))) AS t
               FROM slot_updates),
         g AS (SELECT b.t, s.slot FROM b, (SELECT DISTINCT slot FROM slot_updates) s)
    SELECT g.t AS ts, to_timestamp(g.t) AS time, u.state, u.activity, count(*) AS slots,
           sum(u.cpus) AS cpus, sum(u.slot_weight) AS weight
    FROM g ASOF JOIN slot_states u ON g.slot = u.slot AND g.t >= u.ts
    WHERE u.present GROUP BY ALL ORDER BY 1, 3, 4""",
    # usage by submitter per `step` seconds: the weighted slot-seconds within each interval
    """CREATE MACRO usage_history(step) AS TABLE
    WITH l AS (SELECT ts FROM log_end),
         r AS (SELECT submitter, slot_weight, start_ts, coalesce(stop_ts, (SELECT ts FROM l)) AS end_ts
               FROM runs),
         b AS (SELECT unnest(range(CAST(floor(min(start_ts) / step) * step AS BIGINT),
                                   CAST(max(end_ts) AS BIGINT) + 1, CAST(step AS BIGINT))) AS t
               FROM r)
    SELECT b.t AS ts, to_timestamp(b.t) AS time, r.submitter,
           sum(r.slot_weight * (least(r.end_ts, b.t + step) - greatest(r.start_ts, b.t)))
             AS weighted_seconds
    FROM b JOIN r ON r.start_ts < b.t + step AND r.end_ts > b.t
    GROUP BY ALL ORDER BY 1, 3""",
    # utilization vs demand vs pool size per hour (HTCondorView's pool graph)
    """CREATE VIEW pool_utilization AS
    WITH p AS (SELECT ts, sum(weight) AS pool_size,
                      sum(weight) FILTER (WHERE state IN ('Claimed', 'Preempting')) AS in_use
               FROM pool_history(3600) GROUP BY ts),
         d AS (SELECT CAST(floor(ts / 3600) * 3600 AS BIGINT) AS ts,
                      max(demand) AS demand
               FROM (SELECT ts, sum(usage + idle) AS demand FROM cycle_submitters GROUP BY ts)
               GROUP BY 1)
    SELECT p.ts, to_timestamp(p.ts) AS hour, p.pool_size, coalesce(p.in_use, 0) AS in_use,
           coalesce(d.demand, 0) AS demand
    FROM p LEFT JOIN d USING (ts) ORDER BY p.ts""",
)

#: Every view and macro name, for `poolledger sql` help and the tests.
VIEW_NAMES: Final = ("runs", "log_end", "submitter_usage", "core_hours", "cpu_efficiency",
                     "queue", "wait_times", "badput", "slot_states", "machine_states", "pool_history",
                     "usage_history", "pool_utilization")
