"""The reports' pieces: a mean and its interval as text, markdown tables, plots of held-out curves."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HELDOUT_LABEL = "held-out pass rate (T=1)"


def fmt(stat: dict[str, Any], *, signed: bool = False, digits: int = 3, half_width: bool = False) -> str:
    """A `mean_ci` result as text: ``0.462 [0.441, 0.483]`` (signed: ``+0.012 [-0.004, +0.028]``), or with `half_width`
    ``1,234 ± 56``; the mean alone when the interval is unknown, ``n/a`` when the mean is."""
    mean = stat.get("mean")
    if mean is None or not math.isfinite(mean):
        return "n/a"
    spec = f"{'+' if signed else ''},.{digits}f"
    if stat.get("ci_low") is None:
        return format(mean, spec)
    if half_width:
        return f"{mean:{spec}} ± {stat['half_width']:{spec}}"
    return f"{mean:{spec}} [{stat['ci_low']:{spec}}, {stat['ci_high']:{spec}}]"


def markdown_table(header: str, rows: Iterable[Sequence[str]], *, left: int = 1) -> list[str]:
    """A markdown table's lines: `header` holds the column names separated by ``" | "``, each row its cells; the
    first `left` columns are aligned left, the others right."""
    columns = header.count(" | ") + 1
    return [
        f"| {header} |",
        "|" + "---|" * left + "---:|" * (columns - left),
        *("| " + " | ".join(row) + " |" for row in rows),
    ]


@dataclass(frozen=True)
class Panel:
    """One plot: each method's held-out (`y`) against `x`, over the points `points` picks from the method's row, with
    the 95% band `ci` gives where every point has one."""

    x: str
    xlabel: str
    title: str | None = None
    points: Callable[[dict], Sequence[dict]] = lambda row: row["curve"]
    y: Callable[[dict], float | None] = lambda point: point["heldout"]
    ci: Callable[[dict], Sequence[float | None] | None] = lambda point: point.get("heldout_ci")


LEARNING_PANELS = (
    Panel("step", "optimizer steps"),
    Panel("samples", "completions generated"),
    Panel("train_seconds", "training wall time (s, one core)"),
)
"""Held-out against steps, completions and training time: the panels of every `learning_curves.png` of a run's
`curve`."""


def plot_curves(path: Path, rows: Iterable[dict], panels: Sequence[Panel], title: str | None = None) -> Path:
    """Writes one figure of `panels` side by side to `path`, a line per row (a method: its `label` and curve)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = list(rows)
    fig, axes = plt.subplots(1, len(panels), figsize=(5.3 * len(panels), 4.5), dpi=100, squeeze=False)
    for panel, ax in zip(panels, axes[0], strict=True):
        for row in rows:
            points = [point for point in panel.points(row) if panel.y(point) is not None]
            xs = [point[panel.x] for point in points]
            ax.plot(xs, [panel.y(point) for point in points], marker="o", markersize=3, label=row["label"])
            intervals = [panel.ci(point) for point in points]
            if points and all(interval is not None and interval[0] is not None for interval in intervals):
                ax.fill_between(xs, [low for low, _ in intervals], [high for _, high in intervals], alpha=0.15)
        if panel.title:
            ax.set_title(panel.title)
        ax.set_xlabel(panel.xlabel)
        ax.set_ylabel(HELDOUT_LABEL)
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
