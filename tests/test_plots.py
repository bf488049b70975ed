"""The run's plots carry what they are for (asserted on the plotted data, not on file
existence): the share plot stacks cores under the pool size, so the groups scenario's outage
(half the pool off for six hours) is on it; the RUP plot is linear up to RUP 10,000, so the
fair-share example's peak near 75 reads off the axis; legends name submitters as
condor_userprio's table does."""
from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import pytest

from services import plots
from services.mainloop import Sample


@pytest.fixture
def captured(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The axes each plot drew, kept before `finish` closes its figure."""
    axes: list[Any] = []
    finish = plots.finish

    def keep(fig: Any, ax: Any, path: Path, *args: Any) -> Path:
        axes.append(ax)
        monkeypatch.setattr(plt, "close", lambda _fig: None)
        return finish(fig, ax, path, *args)

    monkeypatch.setattr(plots, "finish", keep)
    return axes


def _outage_samples() -> list[Sample]:
    out = []
    for i in range(24 * 6):
        hours = i / 6
        size = 15.0 if 12 <= hours < 18 else 30.0
        used = {"group_physics.einstein@example.org": 0.6 * size,
                "group_chemistry.curie@example.org": 0.4 * size}
        out.append(Sample(hours, i, size, {n: 1.0 for n in used}, {n: 1000.0 for n in used},
                          {n: u / size for n, u in used.items()}, demand=600.0 - hours))
    return out


def test_share_plot_shows_the_pool_size_and_the_outage(tmp_path: Path, captured: list[Any]) -> None:
    plots.plot_share(_outage_samples(), tmp_path / "share.png")
    ax = captured[0]
    pool = next(line for line in ax.get_lines() if line.get_label() == "pool size")
    ys = list(pool.get_ydata())
    assert max(ys) == 30.0 and min(ys) == 15.0  # the outage is on the plot
    assert ax.get_ylabel() == "cores in use (weighted slots)"
    stacked_top = max(max(path.vertices[:, 1]) for c in ax.collections for path in c.get_paths())
    assert stacked_top == pytest.approx(30.0)  # cores, stacked, not shares of what still runs
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == ["curie@example.org (group_chemistry)",
                      "einstein@example.org (group_physics)", "pool size"]


def test_share_plot_sets_the_demand_against_the_pool_above_the_bands(
        tmp_path: Path, captured: list[Any]) -> None:
    plots.plot_share(_outage_samples(), tmp_path / "share.png")
    ax = captured[0]
    top = ax.figure.axes[0]
    assert top is not ax and top.get_shared_x_axes().joined(top, ax)
    lines = {line.get_label(): list(line.get_ydata()) for line in top.get_lines()}
    assert set(lines) == {"demand (running + idle)", "pool size"}
    assert lines["demand (running + idle)"][0] == 600.0 and min(lines["pool size"]) == 15.0
    assert top.get_ylim()[1] > 600.0  # on its own scale: the bands' axis stays at the pool's
    assert ax.get_ylim()[1] == pytest.approx(33.0)
    assert ["pool down to 15 of 30 cores"] == [t.get_text() for t in ax.texts]


def test_rup_plot_is_linear_so_a_peak_near_75_reads_off_the_axis(
        tmp_path: Path, captured: list[Any]) -> None:
    samples = [Sample(h, h, 100.0, {"a@example.org": min(75.0, 0.5 + 1.5 * h),
                                    "b@example.org": 0.5}, {}, {}) for h in range(72)]
    plots.plot_rup(samples, tmp_path / "rup.png")
    ax = captured[0]
    assert ax.get_yscale() == "linear"
    low, high = ax.get_ylim()
    assert low == 0 and 75 < high < 90
    ticks = [t for t in ax.get_yticks() if low <= t <= high]
    assert len(ticks) >= 5  # a readable scale, not two decades


def test_rup_plot_turns_log_with_1_2_5_ticks_only_for_huge_priorities(
        tmp_path: Path, captured: list[Any]) -> None:
    samples = [Sample(h, h, 1.0, {"nice-user.c@example.org": 0.5 * 10 ** h}, {}, {})
               for h in range(8)]
    plots.plot_rup(samples, tmp_path / "rup.png")
    ax = captured[0]
    assert ax.get_yscale() == "log" and "log scale" in ax.get_ylabel()
    ticks = {t for t in ax.get_yticks() if 1 <= t <= 1e6}
    assert {1, 2, 5, 10, 20, 50} <= ticks


def _row(t: float, kind: str, prio: float, cause: str = "job started") -> Any:
    from services.commands.audit import AuditRow

    return AuditRow(t, f"e{t}", kind, cause, None, None, prio, 1000.0, prio * 1000, 1.0, 0.0, -1.0)


def _hours(ax: Any, t0: float, x: float) -> float:
    """An x of a date axis (matplotlib's days since its epoch) as hours since epoch second t0."""
    from matplotlib.dates import date2num

    return float((x - date2num(datetime.fromtimestamp(t0, timezone.utc))) * 24)


def test_audit_plot_keeps_the_run_readable_after_a_much_later_edit() -> None:
    """A 4 h run, then a live -setfactor 200 days later: the axis spans the run (the edit is
    named at the edge), and an edit within the run is marked where it happened."""
    from services.commands.audit import CurvePoint, draw

    t0 = 1_763_800_000.0
    rows = [_row(t0 + h * 3600, "job.started", 0.5 + 0.1 * h) for h in range(5)]
    rows.insert(2, _row(t0 + 1.5 * 3600, "admin.command", 0.65, "setfactor 2000.0 by root"))
    late = t0 + 200 * 86400
    rows.append(_row(late, "admin.command", 0.5, "setfactor 3000.0 by root"))
    curve = [CurvePoint(t0 + m * 60, 0.5 + m / 600, 500 + m, 1000.0) for m in range(0, 241, 10)]
    curve.append(CurvePoint(late, 0.5, 1500.0, 3000.0))
    fig = draw("alice@example.org", rows, curve)
    rup_ax, eup_ax, factor_ax = fig.axes
    left, right = rup_ax.get_xlim()
    assert _hours(rup_ax, t0, right) < 5  # the run fills the plot, not one pixel of 4,800 hours
    rup = next(line for line in rup_ax.get_lines() if line.get_label() == "RUP")
    assert _hours(rup_ax, t0, max(rup.get_xydata()[:, 0])) == pytest.approx(4.0)
    for ax in fig.axes:  # the edit within the run crosses every panel, where it happened
        marks = [line for line in ax.get_lines() if line.get_linestyle() == "--"]
        assert [_hours(ax, t0, list(m.get_xydata()[:, 0])[0]) for m in marks] == \
            [pytest.approx(1.5)]
    notes = [t.get_text() for t in factor_ax.texts]
    assert any("setfactor 3000.0" in n and "200 days later" in n for n in notes)
    assert [t.get_text() for t in rup_ax.texts] == ["setfactor 2000.0 by root"]
    _nothing_clipped(fig)
    plt.close(fig)


def _audited(with_edit: bool) -> tuple[Any, float]:
    """bob on 2 slots of weight 2 for 12 h, then (with_edit) root's -setfactor 500 at 13 h:
    `audit`'s rows and curve drawn."""
    from schemas.events import AdminCommanded, JobStarted, JobStopped, make_event
    from schemas.settings import load_settings
    from services.commands.audit import audit, draw

    t0 = 1_763_800_000.0
    evs = [make_event(JobStarted(f"2.{i}", "schedd@ap1", "bob@example.org", f"slot{i}@ep2", 2.0),
                      ts=t0, source="schedd@ap1", seq=1 + i) for i in range(2)]
    evs += [make_event(JobStopped(f"2.{i}", f"slot{i}@ep2", "completed", "schedd@ap1",
                                  "bob@example.org"), ts=t0 + 12 * 3600, source="schedd@ap1",
                       seq=3 + i) for i in range(2)]
    if with_edit:
        evs.append(make_event(AdminCommanded("setfactor", "bob@example.org", 500.0, "root",
                                             "VIP"), ts=t0 + 13 * 3600, source="cm", seq=1))
    evs.append(make_event(JobStarted("3.0", "schedd@ap1", "alice@example.org", "slot9@ep2", 1.0),
                          ts=t0 + 24 * 3600, source="schedd@ap1", seq=9))
    # one schedd speaks for this pool: its word (and the edit an hour after it) sets the clock
    settings = load_settings(config_path=[], env={"POOLLEDGER_CLOCK_QUORUM": "1"})
    rows, curve = audit(evs, settings, "bob@example.org")
    return draw("bob@example.org", rows, curve), t0


def test_audit_plot_shows_a_setfactor_on_eup_and_factor_named_with_who() -> None:
    """A -setfactor leaves RUP alone and moves EUP and the factor: all three are drawn on one
    UTC time axis, the edit is a dashed line through them, named with who issued it, and the
    legend lists exactly what is drawn."""
    fig, t0 = _audited(with_edit=True)
    rup_ax, eup_ax, factor_ax = fig.axes
    assert rup_ax.get_shared_x_axes().joined(rup_ax, factor_ax)
    factor = next(line for line in factor_ax.get_lines() if line.get_label() == "priority factor")
    xs, ys = factor.get_xydata()[:, 0], list(factor.get_ydata())
    assert ys[0] == 1000.0 and ys[-1] == 500.0  # the edit is on the plot
    first = next(i for i, y in enumerate(ys) if y == 500.0)
    assert _hours(factor_ax, t0, xs[first]) == pytest.approx(13.0)  # a step at its time
    eup = next(line for line in eup_ax.get_lines() if line.get_label() == "EUP")
    at = {round(_hours(eup_ax, t0, x), 6): y for x, y in eup.get_xydata()}
    rup = next(line for line in rup_ax.get_lines() if line.get_label() == "RUP")
    rup_at = dict(zip((round(_hours(rup_ax, t0, x), 6) for x in rup.get_xydata()[:, 0]),
                      rup.get_ydata()))
    assert at[13.0] == pytest.approx(rup_at[13.0] * 500.0)  # EUP after the edit: RUP x 500
    eup_ys = [y for x, y in eup.get_xydata() if round(_hours(eup_ax, t0, x), 6) == 13.0]
    assert eup_ys[0] == pytest.approx(rup_at[13.0] * 1000.0)  # ... and before it, x 1000
    assert [t.get_text() for t in rup_ax.texts] == ["setfactor 500.0 by root"]
    for ax in fig.axes:
        assert [_hours(ax, t0, line.get_xydata()[0, 0]) for line in ax.get_lines()
                if line.get_linestyle() == "--"] == [pytest.approx(13.0)]
    assert factor_ax.get_xlabel() == "time (UTC)"
    assert _hours(factor_ax, t0, factor.get_xydata()[:, 0].min()) == pytest.approx(0.0)
    _nothing_clipped(fig)
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert labels == ["RUP", "EUP", "priority factor", "admin command (condor_userprio)"]
    plt.close(fig)


def test_audit_plot_has_no_edit_in_its_legend_when_there_is_none_and_nothing_clipped(
        tmp_path: Path) -> None:
    fig, _ = _audited(with_edit=False)
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["RUP", "EUP", "priority factor"]
    assert not any(ax.texts for ax in fig.axes)
    _nothing_clipped(fig)
    plt.close(fig)


def _nothing_clipped(fig: Any) -> None:
    """Every panel with what it draws (axis and tick labels, notes) and the legend lies
    inside the figure, and an edit's name inside its panel."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    box = fig.bbox
    for ext in [ax.get_tightbbox(renderer) for ax in fig.axes] + \
            [legend.get_window_extent() for legend in fig.legends]:
        assert box.x0 <= ext.x0 and ext.x1 <= box.x1 and box.y0 <= ext.y0 and ext.y1 <= box.y1
    for ax in fig.axes:
        frame = ax.get_window_extent()
        for text in ax.texts:
            ext = text.get_window_extent()
            assert frame.y0 <= ext.y0 and ext.y1 <= frame.y1, text.get_text()


def test_audit_plot_names_edits_at_one_time_once() -> None:
    """Two identical edits at one time (a script run twice) and a third, different one: one
    mark, one name saying how many, the other named beside it."""
    from services.commands.audit import CurvePoint, draw

    t0 = 1_763_800_000.0
    rows = [_row(t0, "job.started", 0.5),
            _row(t0 + 3600, "admin.command", 0.6, "setfactor 2000.0 by root because 'a'"),
            _row(t0 + 3600, "admin.command", 0.6, "setfactor 2000.0 by root because 'a'"),
            _row(t0 + 3600, "admin.command", 0.6, "setceil 4.0 by ops"),
            _row(t0 + 7200, "job.started", 0.7)]
    curve = [CurvePoint(t0 + m * 60, 0.5 + m / 1200, 500.0, 1000.0) for m in range(121)]
    fig = draw("alice@example.org", rows, curve)
    rup_ax = fig.axes[0]
    assert [t.get_text() for t in rup_ax.texts] == \
        ["setfactor 2000.0 by root (\u00d72); setceil 4.0 by ops"]
    assert len([line for line in rup_ax.get_lines() if line.get_linestyle() == "--"]) == 1
    plt.close(fig)
