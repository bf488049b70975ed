"""The run's graphs: seed 000's "User Priority" and "Fair Share" figures from per-cycle samples.

Why these two: they are how the seed explains fair share — each submitter's real user
priority (RUP) rising while it uses the pool and decaying when idle, and each submitter's
share of the pool converging as the priorities meet. Rendered with matplotlib's Agg backend
(no display needed).
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

if TYPE_CHECKING:
    from services.mainloop import Sample

__all__ = ["figure", "finish", "plot_rup", "plot_share", "write_plots"]


def figure() -> tuple[Any, Any]:
    """A new figure and axes in the project's one size."""
    return plt.subplots(figsize=(9, 5))


def finish(fig: Any, ax: Any, path: Path, title: str, xlabel: str, ylabel: str) -> Path:
    """Title, labels, grid and legend, then write `path` and free the figure."""
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="best", fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _names(samples: Sequence[Sample], attr: str) -> list[str]:
    names: set[str] = set()
    for s in samples:
        names |= set(getattr(s, attr))
    return sorted(names)


def _series(samples: Sequence[Sample], attr: str, name: str) -> tuple[list[float], list[float]]:
    xs, ys = [], []
    for s in samples:
        values = getattr(s, attr)
        if name in values:
            xs.append(s.hours)
            ys.append(values[name])
    return xs, ys


def plot_rup(samples: Sequence[Sample], path: Path, title: str = "User Priority") -> Path:
    """Each submitter's real user priority over time (log scale when it spans decades)."""
    fig, ax = figure()
    top = 0.5
    for name in _names(samples, "rup"):
        xs, ys = _series(samples, "rup", name)
        ax.plot(xs, ys, label=name, linewidth=1.5)
        top = max([top, *ys])
    if top / 0.5 > 50:
        ax.set_yscale("log")
    return finish(fig, ax, path, title, "time (hours)", "real user priority (RUP)")


def plot_share(samples: Sequence[Sample], path: Path, title: str = "Fair Share") -> Path:
    """Each submitter's share of the pool (weighted slots in use / pool size) over time."""
    fig, ax = figure()
    for name in _names(samples, "share"):
        xs, ys = _series(samples, "share", name)
        ax.plot(xs, [100.0 * y for y in ys], label=name, linewidth=1.5)
    ax.set_ylim(0, 105)
    return finish(fig, ax, path, title, "time (hours)", "share of the pool (%)")


def write_plots(samples: Sequence[Sample], out: Path, name: str = "") -> list[Path]:
    """`rup.png` and `share.png` in `out` (created); returns their paths."""
    out.mkdir(parents=True, exist_ok=True)
    suffix = f" — {name}" if name else ""
    return [plot_rup(samples, out / "rup.png", f"User Priority{suffix}"),
            plot_share(samples, out / "share.png", f"Fair Share{suffix}")]
