"""A run's curve is its list of evaluations, each a dict with the held-out pass rate (`heldout`) and the axes it was
taken at (`step`, `samples` or `completions`, `train_seconds` or `seconds`), in the order they were taken. These
functions average curves over seeds, find where a curve first reaches a level and read one at a value of an axis."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any

from harness.stats import mean_ci

CURVE_KEYS = ("step", "samples", "train_seconds")
"""The axes every learning run's curve records."""


def first_reach(curve: Sequence[dict], key: str, target: float) -> float:
    """The `key` value (step or samples) at which a curve's held-out reward first reaches `target`, interpolated."""
    previous = curve[0]
    for point in curve:
        if point["heldout"] >= target:
            if point is previous or point["heldout"] == previous["heldout"]:
                return point[key]
            fraction = (target - previous["heldout"]) / (point["heldout"] - previous["heldout"])
            return previous[key] + fraction * (point[key] - previous[key])
        previous = point
    return math.inf


def heldout_at(curve: Sequence[dict], key: str, value: float) -> float | None:
    """The held-out where the curve's `key` reaches `value`, linear between the two evaluations around it; None if the
    curve ended short of it (a reading there would be an extrapolation)."""
    previous = curve[0]
    for point in curve:
        if point[key] >= value:
            if point[key] == previous[key]:
                return point["heldout"]
            share = (value - previous[key]) / (point[key] - previous[key])
            return previous["heldout"] + share * (point["heldout"] - previous["heldout"])
        previous = point
    return None


def heldout_at_completions(run: dict, completions: float) -> float | None:
    """The run's held-out at `completions` drawn (`heldout_at` on its `samples`)."""
    return heldout_at(run["curve"], "samples", completions)


def curve_to_budget(curve: Sequence[dict], budget: float) -> list[dict]:
    """A curve's evaluations before `budget` completions and, if it got there, its reading at the budget: a run's last
    evaluation lies up to a step's draws past the budget, completions the other methods did not get."""
    kept = [{"samples": point["samples"], "heldout": point["heldout"]} for point in curve if point["samples"] < budget]
    reading = heldout_at(curve, "samples", budget)
    if reading is not None:
        kept.append({"samples": float(budget), "heldout": reading})
    return kept


def mean_curve(
    runs: Sequence[dict],
    keys: Sequence[str] = CURVE_KEYS,
    *,
    intervals: bool = True,
    bands: Sequence[str] | None = None,
) -> list[dict]:
    """The runs of one method averaged point by point, over the evaluations every run reached (the same evaluation
    points): each of `keys` by its mean, the held-out by its mean and, with `intervals`, its 95% t-interval over seeds
    (`heldout_ci`); with `bands`, the held-out per band of each point's `bands` the same way (`bands`, `bands_ci`)."""
    points = []
    for i in range(min(len(run["curve"]) for run in runs)):
        column = [run["curve"][i] for run in runs]
        point = {key: statistics.fmean(entry[key] for entry in column) for key in keys}
        heldout = mean_ci([entry["heldout"] for entry in column])
        point["heldout"] = heldout["mean"]
        if intervals:
            point["heldout_ci"] = [heldout["ci_low"], heldout["ci_high"]]
        if bands is not None:
            per_band = {band: mean_ci([entry["bands"].get(band, math.nan) for entry in column]) for band in bands}
            point["bands"] = {band: per_band[band]["mean"] for band in bands}
            point["bands_ci"] = {band: [per_band[band]["ci_low"], per_band[band]["ci_high"]] for band in bands}
        points.append(point)
    return points


def curve_on_grid(runs: Sequence[dict], key: str, grid: Sequence[float]) -> list[dict[str, Any]]:
    """Each seed's held-out read at every `key` value of `grid` (`heldout_at`), then mean and t-interval over seeds
    (None where a seed did not reach that value; `reached` counts those that did)."""
    points = []
    for x in grid:
        readings = [heldout_at(run["curve"], key, x) for run in runs]
        reached = [reading for reading in readings if reading is not None]
        stat = mean_ci(reached) if len(reached) == len(readings) else {"mean": None, "ci_low": None, "ci_high": None}
        points.append(
            {key: x, "heldout": stat["mean"], "ci": [stat["ci_low"], stat["ci_high"]], "reached": len(reached)}
        )
    return points
