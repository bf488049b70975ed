"""The run's plots carry what they are for (asserted on the plotted data, not on file
existence): the share plot stacks cores under the pool size, so the groups scenario's outage
(half the pool off for six hours) is on it; the RUP plot is linear up to RUP 10,000, so the
fair-share example's peak near 75 reads off the axis; legends name submitters as
condor_userprio's table does."""
from __future__ import annotations

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


def test_audit_plot_keeps_the_run_readable_after_a_much_later_edit(
        tmp_path: Path, captured: list[Any]) -> None:
    """A 4 h run, then a live -setfactor 200 days later: the axis spans the run (the edit is
    named at the edge), and an edit within the run is marked where it happened."""
    from services.commands.audit import plot

    t0 = 1_763_800_000.0
    rows = [_row(t0 + h * 3600, "job.started", 0.5 + 0.1 * h) for h in range(5)]
    rows.insert(2, _row(t0 + 1.5 * 3600, "admin.command", 0.65, "setfactor 2000.0"))
    late = t0 + 200 * 86400
    rows.append(_row(late, "admin.command", 0.5, "setfactor 3000.0"))
    curve = [(t0 + m * 60, 0.5 + m / 600) for m in range(0, 241, 10)] + [(late, 0.5)]
    plot(tmp_path / "audit.png", "alice@example.org", rows, curve)
    ax = captured[0]
    left, right = ax.get_xlim()
    assert right < 5  # hours: the run fills the plot, not one pixel of 4,800 hours
    rup = next(line for line in ax.get_lines() if line.get_label() == "RUP")
    assert max(rup.get_xdata()) == pytest.approx(4.0)
    marks = [line for line in ax.get_lines() if line.get_linestyle() == "--"]
    assert [list(m.get_xdata())[0] for m in marks] == [pytest.approx(1.5)]
    notes = [t.get_text() for t in ax.texts]
    assert any("setfactor 3000.0" in n and "200 days later" in n for n in notes)
    assert "setfactor 2000.0" in notes  # the edit within the run, named at its mark
