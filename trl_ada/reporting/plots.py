"""Training plots and metrics files from a Trainer's `log_history`: reward, samples drawn per prompt, zero-variance
share, the pass-rate estimates' scores and their reliability diagram."""

from __future__ import annotations

import csv
import json
import math
import numbers
from collections.abc import Sequence
from pathlib import Path
from typing import Any

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


CALIBRATION_STEM = "pass_rate_calibration"
CALIBRATION_TITLE = "Calibration of the pass-rate estimates (reliability diagram, whole run)"
_BIN_KEY = "ada/pass_rate_predictor/bin_{}/{}"

PLOT_CAPTIONS: dict[str, str] = {
    CALIBRATION_STEM: "How to read it: each point is one bin of predicted pass rate (the estimates made at each "
    "step's start), placed at its mean prediction against the share of its draws that came out positive, over the "
    "whole run; on the diagonal the estimates are calibrated, below it they were too high, above it too low (the "
    "lower panel counts the draws per bin)."
}
"""A line under a plot on the model card, by file stem."""


def calibration_table(entries: Sequence[dict[str, Any]]) -> list[tuple[int, float, float, float]]:
    """The reliability diagram of a run: `(bin, mean prediction, observed pass rate, draws)` for every bin of the
    `ada/pass_rate_predictor/bin_K/*` metrics with a draw, summed over `entries`."""
    table = []
    bins = 0
    while any(_BIN_KEY.format(bins, "draws") in entry for entry in entries):
        bins += 1
    for b in range(bins):
        draws, positives, predicted = (
            math.fsum(v for entry in entries if (v := logged_number(entry, _BIN_KEY.format(b, name))) is not None)
            for name in ("draws", "positives", "predicted")
        )
        if draws > 0:
            table.append((b, predicted / draws, positives / draws, draws))
    return table


def _write_calibration_plot(plt: Any, entries: Sequence[dict[str, Any]], plots_dir: Path) -> Path | None:
    table = calibration_table(entries)
    if not table:
        return None
    fig, (ax, counts) = plt.subplots(
        2, 1, figsize=(5, 5.4), dpi=100, sharex=True, gridspec_kw={"height_ratios": (3, 1)}
    )
    _, predicted, observed, draws = zip(*table, strict=True)
    ax.plot([0, 1], [0, 1], color="grey", linestyle="--", linewidth=1, label="calibrated (diagonal)")
    ax.plot(predicted, observed, marker="o", label="estimates, per bin")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_title(CALIBRATION_TITLE, fontsize=9)
    ax.set_ylabel("observed pass rate of the draws")
    counts.bar(predicted, draws, width=0.04)
    counts.set_xlabel("predicted pass rate (mean of the bin)")
    counts.set_ylabel("draws")
    counts.grid(alpha=0.3)
    return _save(plt, fig, ax, plots_dir / f"{CALIBRATION_STEM}.png")


def _save(plt: Any, fig: Any, ax: Any, path: Path) -> Path:
    """Gives `ax` the plots' grid and legend, then writes `fig` to `path` (making its folder) and closes it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def training_entries(log_history: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The per-step entries of a `log_history` (those with a loss), in order."""
    return [entry for entry in log_history if "loss" in entry and "step" in entry]


def logged_number(entry: dict[str, Any], key: str) -> float | None:
    """The number logged under `key` in one `log_history` entry, or `None` when it is missing, `None`, NaN (a step
    where every reward abstained) or infinite: every reader of `log_history` skips these the same way."""
    value = entry.get(key)
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        return None
    return float(value)


def logged_series(entries: Sequence[dict[str, Any]], key: str) -> list[tuple[int, float]]:
    """`(step, value)` of every entry that logged a number under `key` (see [`logged_number`])."""
    return [(entry["step"], value) for entry in entries if (value := logged_number(entry, key)) is not None]


def logged_mean(entries: Sequence[dict[str, Any]], key: str) -> float | None:
    """The mean of [`logged_series`]'s values, or `None` when there is none."""
    values = [value for _, value in logged_series(entries, key)]
    return math.fsum(values) / len(values) if values else None


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
        lines = [(label, points) for key, label in series if (points := logged_series(entries, key))]
        if not lines:
            continue
        fig, ax = plt.subplots(figsize=(6, 3.6), dpi=100)
        for label, points in lines:
            steps, values = zip(*points, strict=True)
            ax.plot(steps, values, marker="o" if len(points) < 30 else None, markersize=3, label=label)
        ax.set_title(title)
        ax.set_xlabel("optimizer step")
        ax.set_ylabel(ylabel)
        written.append((title, _save(plt, fig, ax, plots_dir / f"{stem}.png")))
    calibration = _write_calibration_plot(plt, entries, plots_dir)
    if calibration is not None:
        written.append((CALIBRATION_TITLE, calibration))
    return written
