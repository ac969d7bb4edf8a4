"""PNG plots of a :class:`~specgraft.bench.summary.Summary` (matplotlib, Agg backend).

- ``speedup_vs_mat.png``: speedup against MAT per method and task, the speed/MAT frontier of the
  Graft paper's Figure 1 (peers, which have no MAT, are dashed lines at their overall speedup).
- ``speedup_by_task.png``: speedup vs ``ar`` per task, one bar per method.
- ``tokens_per_step.png``: share of steps that produced k tokens (accepted + bonus), per method;
  every x axis starts at 0, so ``ar``'s single bar at 1 reads as what it is.
- ``time_breakdown.png``: milliseconds per new token, split into the engine's phases.

Legends sit outside the axes (they never cover a bar or a point) and list only series that drew
something: a method with no value on any task has no entry, and a plot with nothing to label has
no legend.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from specgraft.bench.summary import OVERALL, PHASES, Summary  # noqa: E402

MARKERS = "osD^v<>PXh*p"


def _colors(methods: list[str]) -> dict[str, tuple]:
    cmap = plt.get_cmap("tab10")
    return {m: cmap(i % 10) for i, m in enumerate(methods)}


def _legend_outside(ax) -> None:
    """A legend right of the axes with one entry per label that drew something; none if nothing did.

    Matplotlib leaves out artists whose label starts with ``_`` (what an empty series gets here),
    and warns "No artists with labels" when ``legend()`` finds none: that case draws no legend.
    """
    handles, labels = ax.get_legend_handles_labels()
    unique = dict(zip(labels, handles))
    if unique:
        ax.legend(unique.values(), unique.keys(), fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=120, bbox_inches="tight")  # "tight": the outside legend is kept whole
    plt.close(fig)
    return path


def step_axis_limits(ks) -> tuple[float, float]:
    """The x range of a tokens-per-step histogram: from 0 (no step yields fewer than one token, so
    the empty 0 slot shows where the axis begins) to half a bar past the largest ``k``.

    >>> step_axis_limits([1]), step_axis_limits([3, 1, 2])
    ((0.0, 1.5), (0.0, 3.5))
    """
    return 0.0, max(ks, default=1) + 0.5


def plot_speedup_vs_mat(summary: Summary, path: Path) -> Path:
    colors = _colors(summary.methods)
    fig, ax = plt.subplots(figsize=(9.5, 5))
    for m in summary.methods:
        overall = summary.cells[(m, OVERALL)]
        if overall.peer:
            if m != "hf" and overall.speedup is not None:
                ax.axhline(overall.speedup, ls="--", lw=1, color=colors[m], label=f"{m} (HF, no MAT): overall")
            continue
        for i, task in enumerate(summary.tasks):
            c = summary.cell(m, task)
            if c is not None and c.mat is not None and c.speedup is not None:
                ax.scatter(c.mat, c.speedup, color=colors[m], marker=MARKERS[i % len(MARKERS)], s=40, alpha=0.8)
        if overall.mat is not None and overall.speedup is not None:
            ax.scatter(overall.mat, overall.speedup, color=colors[m], marker="*", s=220, edgecolor="black", label=f"{m}: overall")
    for i, task in enumerate(summary.tasks):
        ax.scatter([], [], color="gray", marker=MARKERS[i % len(MARKERS)], label=task)
    ax.axhline(1.0, color="black", lw=0.8)
    ax.set_xlabel("MAT (tokens per step, bonus token included)")
    ax.set_ylabel("speedup vs ar (total ar time / total method time)")
    ax.set_title("Speed against MAT, per method (colour) and task (marker)")
    # outside the axes: with a dozen methods a legend inside hides the points
    _legend_outside(ax)
    ax.grid(alpha=0.3)
    return _save(fig, path)


def plot_speedup_by_task(summary: Summary, path: Path) -> Path:
    colors = _colors(summary.methods)
    methods = [m for m in summary.methods if m != "ar"]
    tasks = [*summary.tasks, OVERALL]
    width = 0.8 / max(len(methods), 1)
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(tasks) + 2), 4.5))
    for j, m in enumerate(methods):
        xs, ys = [], []
        for i, task in enumerate(tasks):
            c = summary.cell(m, task)
            if c is not None and c.speedup is not None:
                xs.append(i + (j - (len(methods) - 1) / 2) * width)
                ys.append(c.speedup)
        if ys:  # a method with no speedup anywhere (e.g. a peer without its baseline) gets no entry
            ax.bar(xs, ys, width=width, color=colors[m], label=m)
    ax.axhline(1.0, color="black", lw=0.8)
    ax.set_xticks(range(len(tasks)), tasks, rotation=20, ha="right")
    ax.set_ylabel("speedup vs ar")
    ax.set_title("Speedup per task")
    _legend_outside(ax)
    ax.grid(axis="y", alpha=0.3)
    return _save(fig, path)


def plot_tokens_per_step(summary: Summary, path: Path) -> Path:
    colors = _colors(summary.methods)
    methods = [m for m in summary.methods if summary.cells[(m, OVERALL)].tokens_per_step]
    n = max(len(methods), 1)
    fig, axes = plt.subplots(1, n, figsize=(3.2 * n, 3.2), squeeze=False, sharey=True)
    for ax, m in zip(axes[0], methods, strict=False):
        hist = summary.cells[(m, OVERALL)].tokens_per_step
        steps = sum(hist.values())
        ks = sorted(hist)
        ax.bar(ks, [hist[k] / steps for k in ks], color=colors[m])
        ax.set_title(f"{m} (MAT {summary.cells[(m, OVERALL)].mat:.2f})", fontsize=9)
        ax.set_xlabel("tokens per step")
        ax.set_xlim(*step_axis_limits(ks))
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(axis="y", alpha=0.3)
    axes[0][0].set_ylabel("share of steps")
    fig.suptitle("Tokens per step (accepted + bonus), all tasks", fontsize=10)
    return _save(fig, path)


def plot_time_breakdown(summary: Summary, path: Path) -> Path:
    cmap = plt.get_cmap("Set2")
    fig, ax = plt.subplots(figsize=(7, 0.5 * len(summary.methods) + 1.5))
    for i, m in enumerate(summary.methods):
        c = summary.cells[(m, OVERALL)]
        if not c.new_tokens:
            continue
        if c.phase_s:
            left = 0.0
            for j, p in enumerate(PHASES):
                w = 1000 * c.phase_s[p] / c.new_tokens
                # a phase no method spent time in draws nothing and gets no legend entry
                ax.barh(i, w, left=left, color=cmap(j), label=p if w > 0 else "_")
                left += w
        else:
            ax.barh(i, 1000 * c.time_s / c.new_tokens, color="lightgray", hatch="//", label="peer total (no breakdown)")
    ax.set_yticks(range(len(summary.methods)), summary.methods)
    ax.invert_yaxis()
    ax.set_xlabel("ms per new token")
    ax.set_title("Where the time goes (all tasks)")
    _legend_outside(ax)
    ax.grid(axis="x", alpha=0.3)
    return _save(fig, path)


def write_plots(summary: Summary, plot_dir: Path) -> list[Path]:
    """Write every plot into ``plot_dir``; returns their paths."""
    plot_dir.mkdir(parents=True, exist_ok=True)
    return [
        plot_speedup_vs_mat(summary, plot_dir / "speedup_vs_mat.png"),
        plot_speedup_by_task(summary, plot_dir / "speedup_by_task.png"),
        plot_tokens_per_step(summary, plot_dir / "tokens_per_step.png"),
        plot_time_breakdown(summary, plot_dir / "time_breakdown.png"),
    ]
