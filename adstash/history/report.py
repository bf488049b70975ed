"""`poolledger report`: PNGs read at a glance and a short text summary, from the views.

Four figures: stacked core-hours per submitter per day; pool size, demand and usage per hour
(an outage shows as the pool-size line dropping); wait-time distribution per group; each
group's usage against its quota.
"""
from __future__ import annotations

from pathlib import Path

import duckdb
import matplotlib

from streams.log.files import atomic_file

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


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
    paths: list[Path] = []

    # 1. core-hours per submitter per day, stacked
    w, p = _window(start, end, "epoch(day)")
    ch = con.execute(f"SELECT day, submitter, core_hours FROM core_hours WHERE {w} "
                     "ORDER BY day, submitter", p).df()
    fig, ax = plt.subplots(figsize=(10, 5.5))
    if not ch.empty:
        table = ch.pivot_table(index="day", columns="submitter", values="core_hours",
                               aggfunc="sum", fill_value=0.0)
        labels = [d.strftime("%Y-%m-%d") for d in table.index]
        bottom = [0.0] * len(table)
        for name in table.columns:
            vals = list(table[name])
            ax.bar(labels, vals, bottom=bottom, label=name)
            bottom = [b + v for b, v in zip(bottom, vals)]
        ax.legend(fontsize=9, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.set_title("Core-hours per submitter per day (finished jobs)")
    ax.set_ylabel("core-hours")
    ax.set_xlabel("day of completion (UTC)")
    fig.tight_layout()
    paths.append(_save(fig, out / "core_hours.png"))

    # 2. pool size, demand and usage per hour
    w, p = _window(start, end, "ts")
    pu = con.execute(f"SELECT hour, pool_size, in_use, demand FROM pool_utilization "
                     f"WHERE {w} ORDER BY ts", p).df()
    fig, ax = plt.subplots(figsize=(10, 5.5))
    if not pu.empty:
        ax.step(pu["hour"], pu["pool_size"], where="post", label="pool size (slot weight)",
                linewidth=2.5, color="black")
        ax.step(pu["hour"], pu["in_use"], where="post", label="in use (claimed)",
                linewidth=2, color="tab:green")
        ax2 = ax.twinx()
        ax2.plot(pu["hour"], pu["demand"], label="demand (running + idle jobs)",
                 color="tab:orange", linestyle="--")
        ax2.set_ylabel("jobs demanded", color="tab:orange")
        ax2.set_ylim(bottom=0)
        lines = ax.get_legend_handles_labels()
        lines2 = ax2.get_legend_handles_labels()
        ax.legend(lines[0] + lines2[0], lines[1] + lines2[1], loc="lower left", fontsize=9)
        fig.autofmt_xdate()
    ax.set_ylim(bottom=0)
    ax.set_title("Pool size, usage and demand per hour (event time, UTC)")
    ax.set_ylabel("slots (weighted)")
    fig.tight_layout()
    paths.append(_save(fig, out / "pool.png"))

    # 3. wait-time distribution per group
    w, p = _window(start, end, "QDate")
    wt = con.execute(f"SELECT grp, wait_seconds / 3600.0 AS hours FROM wait_times WHERE {w}",
                     p).df()
    fig, ax = plt.subplots(figsize=(10, 5.5))
    if not wt.empty:
        groups = sorted(wt["grp"].unique())
        data = [list(wt.loc[wt["grp"] == g, "hours"]) for g in groups]
        ax.boxplot(data, tick_labels=groups, showfliers=True)
    ax.set_title("Wait time (JobStartDate - QDate) per accounting group")
    ax.set_ylabel("hours")
    fig.tight_layout()
    paths.append(_save(fig, out / "wait_times.png"))

    # 4. each group's usage against its quota (hourly)
    uq = con.execute(f"""
        WITH u AS (SELECT ts, CASE WHEN contains(split_part(submitter, '@', 1), '.')
                           THEN regexp_extract(split_part(submitter, '@', 1), '^(.*)\\.[^.]*$', 1)
                           ELSE '<none>' END AS grp,
                          sum(weighted_seconds) / 3600.0 AS used
                   FROM usage_history(3600) GROUP BY ALL),
             q AS (SELECT grp, ts, effective_quota FROM quotas)
        SELECT to_timestamp(u.ts) AS hour, u.grp, u.used, q.effective_quota
        FROM u ASOF LEFT JOIN q ON u.grp = q.grp AND u.ts >= q.ts
        WHERE {_window(start, end, 'u.ts')[0]} ORDER BY u.grp, u.ts""",
                     _window(start, end, "u.ts")[1]).df()
    fig, ax = plt.subplots(figsize=(10, 5.5))
    for i, (grp, rows) in enumerate(uq.groupby("grp")):
        color = f"C{i}"
        ax.plot(rows["hour"], rows["used"], color=color, label=f"{grp} usage", linewidth=2)
        if rows["effective_quota"].notna().any():
            ax.step(rows["hour"], rows["effective_quota"], where="post", color=color,
                    linestyle="--", label=f"{grp} quota")
    if not uq.empty:
        ax.legend(fontsize=9, loc="lower left")
        fig.autofmt_xdate()
    ax.set_ylim(bottom=0)
    ax.set_title("Group usage (mean weighted slots per hour) against effective quota")
    ax.set_ylabel("slots (weighted)")
    fig.tight_layout()
    paths.append(_save(fig, out / "group_quota.png"))

    paths.append(_summary(con, out / "summary.txt", start, end))
    return paths


def _save(fig: "plt.Figure", path: Path) -> Path:  # type: ignore[name-defined]
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
