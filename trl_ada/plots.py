"""Training plots from a Trainer's `log_history`: reward, samples drawn per prompt, zero-variance share."""

from __future__ import annotations

import csv
import json
import logging
import math
import numbers
from collections.abc import Sequence
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

PLOTS_DIR = "plots"

# (file stem, title, y label, [(log key, legend label), ...])
PLOT_SPECS: tuple[tuple[str, str, str, tuple[tuple[str, str], ...]], ...] = (
    (
        "reward",
        "Reward against step",
        "mean reward",
        (("reward", "kept update groups (TRL's reward)"), ("ada/pool_reward/mean", "all completions drawn (pool)")),
    ),
    (
        "samples_per_prompt",
        "Completions drawn per prompt",
        "completions",
        (("ada/samples_per_prompt/mean", "mean"), ("ada/samples_per_prompt/max", "max")),
    ),
    (
        "zero_variance_share",
        "Zero-variance groups before and after adaptive sampling",
        "share of prompts",
        (
            ("ada/zero_variance_share/first_n", "first num_generations draws (plain GRPO)"),
            ("ada/zero_variance_share/kept", "kept update groups (Reinforce-Ada)"),
        ),
    ),
    (
        "pass_rate_predictor",
        "Pass-rate estimates made at each step's start, scored on its draws",
        "per-draw loss (lower is better)",
        (
            ("ada/pass_rate_predictor/log_loss", "log-loss of the estimates used"),
            ("ada/pass_rate_predictor/brier", "Brier score of the estimates used"),
            ("ada/pass_rate_predictor/model_log_loss", "log-loss of the learned model alone"),
        ),
    ),
)


def training_entries(log_history: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The per-step entries of a `log_history` (those with a loss), in order."""
    return [entry for entry in log_history if "loss" in entry and "step" in entry]


def logged_number(entry: dict[str, Any], key: str) -> float | None:
    """The number logged under `key` in one `log_history` entry, or `None` when there is none to show.

    A metric can be missing, `None` or NaN (e.g. at a step where every reward abstained), or infinite; every reader
    of `log_history` (plots, card, run summary) skips these the same way rather than crash or average them in.
    """
    value = entry.get(key)
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        return None
    return float(value)


def logged_series(entries: Sequence[dict[str, Any]], key: str) -> list[tuple[int, float]]:
    """`(step, value)` of every entry that logged a number under `key` (see [`logged_number`])."""
    points = []
    for entry in entries:
        value = logged_number(entry, key)
        if value is not None:
            points.append((entry["step"], value))
    return points


def write_metrics(log_history: Sequence[dict[str, Any]], output_dir: str | Path) -> list[Path]:
    """Write the logged metrics as `metrics.json` (all entries) and `metrics.csv` (one row per training step)."""
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    json_path = output_dir / "metrics.json"
    json_path.write_text(json.dumps(list(log_history), indent=1))
    entries = training_entries(log_history)
    columns = sorted({key for entry in entries for key in entry}, key=lambda k: (k != "step", k))
    csv_path = output_dir / "metrics.csv"
    with csv_path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows(entries)
    return [json_path, csv_path]


def write_training_plots(log_history: Sequence[dict[str, Any]], output_dir: str | Path) -> list[tuple[str, Path]]:
    """Write one PNG per plot into `output_dir/plots`; returns `(title, path)` of those with data to show."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    entries = training_entries(log_history)
    plots_dir = Path(output_dir) / PLOTS_DIR
    written = []
    for stem, title, ylabel, series in PLOT_SPECS:
        lines = []
        for key, label in series:
            points = logged_series(entries, key)
            if points:
                lines.append((label, points))
        if not lines:
            continue
        plots_dir.mkdir(parents=True, exist_ok=True)
        fig, ax = plt.subplots(figsize=(6, 3.6), dpi=100)
        for label, points in lines:
            steps, values = zip(*points, strict=True)
            ax.plot(steps, values, marker="o" if len(points) < 30 else None, markersize=3, label=label)
        ax.set_title(title)
        ax.set_xlabel("optimizer step")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        path = plots_dir / f"{stem}.png"
        fig.savefig(path)
        plt.close(fig)
        written.append((title, path))
    return written
