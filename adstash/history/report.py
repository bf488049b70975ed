"""`poolledger report`: PNGs read at a glance and a short text summary, from the views.

Four figures: stacked core-hours per submitter per day; pool size, demand and usage per hour
(an outage shows as the pool-size line dropping); wait-time distribution per group; each
group's usage against its quota.
"""
from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import duckdb
import matplotlib

from streams.log.files import atomic_file

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402


def _window(start: float | None, end: float | None, col: str) -> tuple[str, list[float]]:
    parts, params = [], []
    if start is not None:
        parts.append(f"{col} >= ?")
        params.append(start)
    if end is not None:
        parts.append(f"{col} < ?")
        params.append(end)
    return (" AND ".join(parts) or "TRUE"), params


def write_report(con: duckdb.DuckDBPyConnection, out: Path, *, start: float | None = None,
                 end: float | None = None) -> list[Path]:
    """Write the figures and summary.txt into `out`; returns their paths."""
    out.mkdir(parents=True, exist_ok=True)
    return [_save(core_hours_figure(con, start, end), out / "core_hours.png"),
            _save(pool_figure(con, start, end), out / "pool.png"),
            _save(wait_figure(con, start, end), out / "wait_times.png"),
            _save(quota_figure(con, start, end), out / "group_quota.png"),
            _summary(con, out / "summary.txt", start, end)]


def core_hours_figure(con: duckdb.DuckDBPyConnection, start: float | None,
                      end: float | None) -> Figure:
    """Core-hours per submitter per UTC day, stacked (each job's split over the days it ran)."""
    w, p = _window(start, end, "epoch(day)")
    ch = con.execute(f"SELECT day, submitter, core_hours FROM core_hours WHERE {w} "
                     "ORDER BY day, submitter", p).df()
    fig, ax = plt.subplots(figsize=(10, 5.5), layout="constrained")
    if not ch.empty:
        table = ch.pivot_table(index="day", columns="submitter", values="core_hours",
                               aggfunc="sum", fill_value=0.0)
        labels = [d.strftime("%Y-%m-%d") for d in table.index]
        bottom = [0.0] * len(table)
        for name in table.columns:
            vals = list(table[name])
            ax.bar(labels, vals, bottom=bottom, label=name)
            bottom = [b + v for b, v in zip(bottom, vals)]
        ax.set_ylim(0, max([1.0, *bottom]) * 1.08)  # the tallest bar below the frame
        ax.legend(fontsize=9, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.set_title("Core-hours per submitter per day (finished jobs)")
    ax.set_ylabel("core-hours")
    ax.set_xlabel("day (UTC); a job's core-hours split over the days it ran")
    return fig


def pool_figure(con: duckdb.DuckDBPyConnection, start: float | None,
                end: float | None) -> Figure:
    """Pool size as a line over the slots in use as a filled area, hour by hour: at full use
    the line runs along the area's top edge, both seen (an outage shows as the line dropping).
    The demand, often many times the pool, is set against the pool's size in a panel above
    (on one axis it would flatten the usage; on a twin axis it would cross the pool line
    wherever the two scales happen to meet)."""
    w, p = _window(start, end, "ts")
    pu = con.execute(f"SELECT ts, pool_size, in_use, demand FROM pool_utilization "
                     f"WHERE {w} ORDER BY ts", p).fetchall()
    fig, (top, ax) = plt.subplots(2, 1, figsize=(10, 6.5), sharex=True, layout="constrained",
                                  gridspec_kw={"height_ratios": [1, 3]})
    top.set_title("Pool size, usage and demand per hour")
    if pu:
        # each sample holds for its hour: the last one is drawn to its hour's end too
        xs: list[Any] = [_utc(r[0]) for r in pu] + [_utc(pu[-1][0] + 3600)]
        size, used, demand = ([r[i] for r in pu] + [pu[-1][i]] for i in (1, 2, 3))
        ax.fill_between(xs, used, step="post", color="tab:green", alpha=0.45, linewidth=0,
                        label="in use (claimed)", zorder=1)
        ax.step(xs, size, where="post", color="black", linewidth=1.8,
                label="pool size (slot weight)", zorder=3)
        ax.set_ylim(0, max([1.0, *size]) * 1.15)
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=9)
        top.step(xs, demand, where="post", color="tab:orange", linewidth=1.5,
                 label="demand (running + idle jobs)")
        top.step(xs, size, where="post", color="black", linewidth=1.5,
                 label="pool size (slot weight)")
        top.set_ylim(0, max([1.0, *size, *demand]) * 1.15)
        top.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=9)
        _time_axis(ax)
    top.set_ylabel("slots / jobs")
    ax.set_ylabel("slots (weighted)")
    for a in (top, ax):
        a.grid(True, alpha=0.3)
    return fig


def wait_figure(con: duckdb.DuckDBPyConnection, start: float | None,
                end: float | None) -> Figure:
    """The wait-time distribution (JobStartDate - QDate) per accounting group."""
    w, p = _window(start, end, "QDate")
    wt = con.execute(f"SELECT grp, wait_seconds / 3600.0 AS hours FROM wait_times WHERE {w}",
                     p).df()
    fig, ax = plt.subplots(figsize=(10, 5.5), layout="constrained")
    if not wt.empty:
        groups = sorted(wt["grp"].unique())
        data = [list(wt.loc[wt["grp"] == g, "hours"]) for g in groups]
        ax.boxplot(data, tick_labels=groups, showfliers=True)
    ax.set_title("Wait time (JobStartDate - QDate) per accounting group")
    ax.set_ylabel("hours")
    return fig


#: The usage samples' length: five minutes under two days of history (a 4 h run reads as
#: more than four points), an hour beyond.
def _usage_step(span: float) -> int:
    return 300 if span < 2 * 86400 else 3600


def quota_figure(con: duckdb.DuckDBPyConnection, start: float | None,
                 end: float | None) -> Figure:
    """Each accounting group's usage against its effective quota, one panel per group on a
    shared time axis (groups whose quotas coincide would hide each other on one axis), every
    group from the history's start: usage as a filled step, the quota as a dashed step
    changing where the negotiator recomputed it. A submitter is in the group its name's
    prefix names when that prefix is a group the negotiator computed a quota for, else in
    `<none>` (HTCondor's rule: `nice-user.carol` is not a group)."""
    first, final = con.execute("SELECT min(start_ts), (SELECT ts FROM log_end) FROM runs"
                               ).fetchone() or (None, None)
    step = _usage_step(min(end or final or 0.0, final or 0.0)
                       - max(start or first or 0.0, first or 0.0))
    w, p = _window(start, end, "u.ts")
    usage = con.execute(f"""
        WITH g AS (SELECT DISTINCT lower(grp) AS grp FROM quotas),
             u AS (SELECT ts, CASE WHEN lower(regexp_extract(split_part(submitter, '@', 1),
                                                             '^(.*)\\.[^.]*$', 1))
                                        IN (SELECT grp FROM g)
                                   THEN regexp_extract(split_part(submitter, '@', 1),
                                                       '^(.*)\\.[^.]*$', 1)
                                   ELSE '<none>' END AS grp, weighted_seconds
                   FROM usage_history({step}))
        SELECT u.grp, u.ts, sum(weighted_seconds) / {step} AS used FROM u WHERE {w}
        GROUP BY ALL ORDER BY ALL""", p).fetchall()
    wq, pq = _window(None, end, "ts")
    quotas = con.execute(f"SELECT grp, ts, effective_quota FROM quotas WHERE {wq} "
                         "ORDER BY grp, ts, log_partition, log_offset", pq).fetchall()
    groups = sorted({g for g, _, _ in usage} | {g for g, _, _ in quotas},
                    key=lambda g: (g != "<none>", g.lower()))
    fig, grid = plt.subplots(max(1, len(groups)), 1, figsize=(10, 1.2 + 2.2 * max(1, len(groups))),
                             sharex=True, sharey=True, layout="constrained", squeeze=False)
    axes = [row[0] for row in grid]
    fig.suptitle("Group usage (mean weighted slots) against effective quota")
    last = max([t + step for _, t, _ in usage] + [t for _, t, _ in quotas] + [0.0])
    for i, (ax, grp) in enumerate(zip(axes, groups)):
        color = f"C{i}"
        ts = [(t, u) for g, t, u in usage if g == grp]
        if ts:
            xs = [_utc(t) for t, _ in ts] + [_utc(ts[-1][0] + step)]
            ys = [u for _, u in ts] + [ts[-1][1]]
            ax.fill_between(xs, ys, step="post", color=color, alpha=0.4, linewidth=0,
                            label=f"{grp} usage")
        q = [(t, v) for g, t, v in quotas if g == grp and v is not None]
        if q:
            q = [(max(t, start), v) for t, v in q] if start is not None else q
            ax.step([_utc(t) for t, _ in q] + [_utc(max(last, q[-1][0]))],
                    [v for _, v in q] + [q[-1][1]], where="post", color="black",
                    linestyle="--", linewidth=1.4, label=f"{grp} quota")
        ax.set_ylabel("slots (weighted)")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=9, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    top = max([1.0, *(u for _, _, u in usage), *(v for _, _, v in quotas if v is not None)])
    axes[0].set_ylim(0, top * 1.1)
    if groups:
        _time_axis(axes[-1])
    return fig


def _utc(t: float) -> datetime:
    return datetime.fromtimestamp(t, timezone.utc)


def _time_axis(ax: Any) -> None:
    """Concise UTC dates on `ax`'s x axis."""
    import matplotlib.dates as mdates

    locator = mdates.AutoDateLocator(tz=timezone.utc)
    ax.xaxis.set_major_locator(locator)
    ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator, tz=timezone.utc))
    ax.set_xlabel("time (UTC)")


def _save(fig: Figure, path: Path) -> Path:
    with atomic_file(path) as f:
        fig.savefig(f, dpi=110, format="png")
    plt.close(fig)
    return path


def _summary(con: duckdb.DuckDBPyConnection, path: Path, start: float | None,
             end: float | None) -> Path:
    w, p = _window(start, end, "CompletionDate")
    lines = ["PoolLedger history summary", ""]
    total = con.execute(f"SELECT count(*), sum(RemoteWallClockTime * coalesce(CpusProvisioned, "
                        f"RequestCpus, 1)) / 3600 FROM jobs WHERE {w}", p).fetchall()[0]
    lines.append(f"Jobs finished: {total[0]}   core-hours: {total[1] or 0:.1f}")
    lines.append("")
    lines.append(f"{'Submitter':40} {'jobs':>7} {'core-hours':>11} {'mean wait h':>11}")
    for name, jobs, hours, wait in con.execute(
            f"SELECT submitter, count(*), sum(RemoteWallClockTime * coalesce(CpusProvisioned, "
            f"RequestCpus, 1)) / 3600, avg(JobStartDate - QDate) FILTER (WHERE JobStartDate > 0) "
            f"/ 3600 FROM jobs WHERE {w} GROUP BY 1 ORDER BY 3 DESC NULLS LAST", p).fetchall():
        lines.append(f"{str(name):40} {jobs:7d} {hours or 0:11.1f} {wait or 0:11.2f}")
    w2, p2 = _window(start, end, "ts")
    pool = con.execute(f"SELECT min(pool_size), max(pool_size), avg(in_use / nullif(pool_size, 0)) "
                       f"FROM pool_utilization WHERE {w2}", p2).fetchall()[0]
    lines.append("")
    if pool[0] is not None:
        lines.append(f"Pool size (weighted slots): min {pool[0]:.0f}, max {pool[1]:.0f}; "
                     f"mean utilization {100 * (pool[2] or 0):.1f}%")
        low = con.execute(f"SELECT min(hour), max(hour) FROM pool_utilization WHERE {w2} AND "
                          f"pool_size < (SELECT max(pool_size) FROM pool_utilization)",
                          p2).fetchall()[0]
        if low[0] is not None:
            lines.append(f"Pool below its full size from {low[0]:%Y-%m-%d %H:%M} to "
                         f"{low[1]:%Y-%m-%d %H:%M} UTC (hourly samples)")
    bad = con.execute("SELECT coalesce(sum(weighted_hours), 0) FROM badput").fetchall()[0][0]
    lines.append(f"Badput (runs evicted/preempted/vacated): {bad:.1f} weighted slot-hours")
    with atomic_file(path) as f:
        f.write(("\n".join(lines) + "\n").encode())
    return path
