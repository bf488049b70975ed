"""The run's graphs: the "User Priority" and "Fair Share" figures from per-cycle samples.

Why these two: they are how HTCondor's manual explains fair share — each submitter's real user
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

from streams.log.files import atomic_file  # noqa: E402

if TYPE_CHECKING:
    from services.mainloop import Sample

__all__ = ["figure", "finish", "legend_name", "plot_rup", "plot_share", "plt", "save",
           "write_plots"]


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
    return save(fig, path)


def save(fig: Any, path: Path) -> Path:
    """Write `fig` to `path` (its format from the suffix; atomically) and free it."""
    with atomic_file(path) as f:
        fig.savefig(f, dpi=100, format=path.suffix.lstrip(".") or "png")
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


#: Above this RUP a linear axis flattens the other submitters into its floor: log, 1-2-5 ticks.
LOG_RUP_ABOVE = 10_000.0


def legend_name(name: str) -> str:
    """A submitter as condor_userprio's default (hierarchical) table shows it: the user
    under its group, so `group_physics.bohr@example.org` reads `bohr@example.org (group_physics)`."""
    group, dot, user = name.partition(".")
    if dot and group.startswith("group_") and "@" in user:
        return f"{user} ({group})"
    return name


def plot_rup(samples: Sequence[Sample], path: Path, title: str = "User Priority") -> Path:
    """Each submitter's real user priority over time, on a linear axis so a peak can be read
    off it; a log axis with 1-2-5 ticks, labelled as such, only past `LOG_RUP_ABOVE`."""
    from matplotlib.ticker import LogLocator, ScalarFormatter

    fig, ax = figure()
    top = 0.5
    for name in _names(samples, "rup"):
        xs, ys = _series(samples, "rup", name)
        ax.plot(xs, ys, label=legend_name(name), linewidth=1.5)
        top = max([top, *ys])
    ylabel = "real user priority (RUP)"
    if top > LOG_RUP_ABOVE:
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(ScalarFormatter())
        ylabel += ", log scale"
    else:
        ax.set_ylim(0, top * 1.05)
    return finish(fig, ax, path, title, "time (hours)", ylabel)


def plot_share(samples: Sequence[Sample], path: Path, title: str = "Fair Share") -> Path:
    """The cores each submitter uses, stacked, under the pool's size: an outage shows as the
    pool line dropping, and each band's height is what that submitter held of what ran. A
    panel above sets the pool's size against the demand (weighted running + idle), which is
    often many times the pool and would flatten the bands on one axis."""
    fig, (top, ax) = plt.subplots(2, 1, figsize=(9, 6.5), sharex=True,
                                  gridspec_kw={"height_ratios": [1, 3]})
    names = _names(samples, "share")
    xs = [s.hours for s in samples]
    sizes = [s.pool_size for s in samples]
    if names:
        bands = [[s.share.get(name, 0.0) * s.pool_size for s in samples] for name in names]
        ax.stackplot(xs, *bands, labels=[legend_name(n) for n in names], alpha=0.8, step="post")
    ax.step(xs, sizes, where="post", color="black", linewidth=1.5, label="pool size")
    most = max([1.0, *sizes])
    ax.set_ylim(0, most * 1.1)
    if sizes and min(sizes) < 0.9 * most:
        low = min(range(len(sizes)), key=sizes.__getitem__)
        ax.annotate(f"pool down to {sizes[low]:g} of {most:g} cores", xy=(xs[low], sizes[low]),
                    xytext=(4, 6), textcoords="offset points", ha="left", fontsize="small")
    top.step(xs, [s.demand for s in samples], where="post", color="tab:red", linewidth=1.2,
             label="demand (running + idle)")
    top.step(xs, sizes, where="post", color="black", linewidth=1.5, label="pool size")
    top.set_ylim(0, max([most, *(s.demand for s in samples)]) * 1.1)
    top.set_ylabel("cores")
    top.set_title(title)
    top.grid(True, alpha=0.3)
    top.legend(loc="upper right", fontsize="small")
    return finish(fig, ax, path, "", "time (hours)", "cores in use (weighted slots)")


def write_plots(samples: Sequence[Sample], out: Path, name: str = "") -> list[Path]:
    """`rup.png` and `share.png` in `out` (created); returns their paths."""
    out.mkdir(parents=True, exist_ok=True)
    suffix = f" — {name}" if name else ""
    return [plot_rup(samples, out / "rup.png", f"User Priority{suffix}"),
            plot_share(samples, out / "share.png", f"Fair Share{suffix}")]
