"""The tournament: methods read at equal completions (every run stopped once it has drawn the same budget) and at equal
training time, each as paired (same-seed) differences against a reference (DAPO), with where their draws went."""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from harness.curves import curve_on_grid, curve_to_budget, first_reach, heldout_at, heldout_at_completions
from harness.gpu_time import add_projected_seconds
from harness.report import fmt, markdown_table
from harness.runs import group_by_method
from harness.stats import mean_ci, paired_difference
from harness.training import BUDGET_EVAL_POINTS


def mean_curve_to_budget(runs: Sequence[dict], budget: float) -> list[dict]:
    """The runs' curves read at each `1 / BUDGET_EVAL_POINTS` of the budget and averaged, up to the last point every
    run reached (a run that ended short is not extrapolated)."""
    grid = [budget * k / BUDGET_EVAL_POINTS for k in range(BUDGET_EVAL_POINTS + 1)]
    points = []
    for point in curve_on_grid(runs, "samples", grid):
        if point["heldout"] is None:
            break
        points.append({"samples": point["samples"], "heldout": point["heldout"]})
    return points


def tournament_summary(results: list[dict], budget: int, reference: str = "dapo") -> dict[str, Any]:
    """The tournament: per method, the held-out at the completions budget (`final`: each curve read at the budget,
    linear between the evaluations around it; a run that ended short of it is listed in `short_of_budget` and left out)
    and at the reference's mean training time, each as a mean with its 95% interval and as a paired (same-seed)
    difference against the reference; the completions a method's mean curve needs to reach the reference's level at the
    budget, over the reference's own mean curve's (`to_reference_final`; the reference's row reads 1 by construction);
    the completions, training seconds and draw accounting (useful and trained shares, per band) summed over seeds."""
    by_method = group_by_method(results)

    def at_budget(run: dict) -> float | None:
        return heldout_at_completions(run, budget)

    ref_runs = by_method.get(reference, [])
    ref_reached = [run for run in ref_runs if at_budget(run) is not None]
    ref_seconds = statistics.fmean(run["curve"][-1]["train_seconds"] for run in ref_runs) if ref_runs else None
    ref_by_seed = {run["seed"]: run for run in ref_runs}
    # The level to reach: the reference's mean held-out at the budget. Its own mean curve's first crossing of it is
    # the yardstick, read as every method's is (its mean final completions would credit it with overshoot).
    target = statistics.fmean(at_budget(run) for run in ref_reached) if ref_reached else None
    ref_start = statistics.fmean(run["curve"][0]["heldout"] for run in ref_runs) if ref_runs else None
    ref_crossing = (
        first_reach(mean_curve_to_budget(ref_runs, budget), "samples", target) if target is not None else math.inf
    )
    methods = {}
    for method, runs in by_method.items():
        reached = [run for run in runs if at_budget(run) is not None]
        short = [run for run in sorted(runs, key=lambda run: run["seed"]) if at_budget(run) is None]
        drawn = sum(run["draws"]["total"] for run in runs)
        bands: dict[str, dict[str, float]] = {}
        for run in runs:
            for band, counts in run["draws"]["bands"].items():
                entry = bands.setdefault(band, {"drawn": 0.0, "useful": 0.0})
                entry["drawn"] += counts["drawn"]
                entry["useful"] += counts["useful"]
        row: dict[str, Any] = {
            "label": runs[0]["label"],
            "seeds": sorted(run["seed"] for run in runs),
            "final": mean_ci([at_budget(run) for run in reached]),
            "short_of_budget": [{"seed": run["seed"], "completions": run["curve"][-1]["samples"]} for run in short],
            "completions": statistics.fmean(run["curve"][-1]["samples"] for run in runs),
            "train_seconds": statistics.fmean(run["curve"][-1]["train_seconds"] for run in runs),
            "useful_share": sum(run["draws"]["useful"] for run in runs) / drawn if drawn else math.nan,
            "trained_share": sum(run["draws"]["trained"] for run in runs) / drawn if drawn else math.nan,
            "bands": {
                band: {"share": counts["drawn"] / drawn, "useful_share": counts["useful"] / counts["drawn"]}
                for band, counts in bands.items()
                if counts["drawn"]
            },
        }
        if all("gpu_seconds" in run["curve"][-1] for run in runs):  # step shapes known (`harness.gpu_time`)
            row["gpu_seconds"] = statistics.fmean(run["curve"][-1]["gpu_seconds"] for run in runs)
        gated = [run["gate_passed_over"] for run in runs if run.get("gate_passed_over") is not None]
        if gated:  # runs written before it was recorded lack it
            row["gate_passed_over"] = {"per_run": statistics.fmean(gated), "runs": len(gated)}
        if target is not None:
            # The completions a method needs to reach the reference's level, read on its mean curve (the seeds'
            # curves read on a common grid of completions and averaged: a per-seed reading would keep only the lucky
            # seeds), as a share of the reference's own; and the seeds whose own curve reached it within the budget.
            crossing = first_reach(mean_curve_to_budget(runs, budget), "samples", target)
            per_seed = [first_reach(curve_to_budget(run["curve"], budget), "samples", target) for run in runs]
            # A reference that ended at or below its start sets no target to reach: every curve "reaches" it at
            # 0 completions, a 0.00x that says nothing.
            ratio = math.nan
            if target > ref_start and math.isfinite(ref_crossing):
                ratio = crossing / ref_crossing
            row["to_reference_final"] = {
                "target": target,
                "completions": crossing,
                "reference_completions": ref_crossing,
                "seeds_reached": sum(math.isfinite(value) for value in per_seed),
                "completions_ratio": ratio,
            }
        if ref_runs and method != reference:
            row["minus_reference"] = paired_difference(reached, ref_reached, at_budget)
            # A rule can draw exactly what the reference draws, seed for seed: said, not hidden in a difference of 0.
            paired = [(run, ref_by_seed[run["seed"]]) for run in runs if run["seed"] in ref_by_seed]
            row["identical_to_reference"] = bool(paired) and all(same_run(run, ref) for run, ref in paired)
            row["minus_reference_at_equal_time"] = paired_at_equal(runs, ref_by_seed, "train_seconds")
            if "gpu_seconds" in row:
                row["minus_reference_at_equal_gpu_time"] = paired_at_equal(runs, ref_by_seed, "gpu_seconds")
        methods[method] = row
    return {"budget": budget, "reference": reference, "reference_seconds": ref_seconds, "methods": methods}


def paired_at_equal(runs: Sequence[dict], ref_by_seed: dict[int, dict], key: str) -> dict[str, Any]:
    """Per seed, the run's held-out minus the reference's, both read at the `key` value (training or projected GPU
    seconds) both reached: the shorter run's total, since every run stops at the budget and the cheaper method cannot
    be read later. Mean and 95% interval over the seeds both ran (and hold `key`)."""
    differences, seeds = [], []
    for run in runs:
        ref = ref_by_seed.get(run["seed"])
        if ref is None or key not in run["curve"][-1] or key not in ref["curve"][-1]:
            continue
        common = min(run["curve"][-1][key], ref["curve"][-1][key])
        differences.append(heldout_at(run["curve"], key, common) - heldout_at(ref["curve"], key, common))
        seeds.append(run["seed"])
    return {**mean_ci(differences), "seeds": seeds}


def same_run(run: dict, other: dict) -> bool:
    """Whether two runs drew the same completions and measured the same held-out at every evaluation (their seconds
    may differ: they are timings)."""

    def trace(entry: dict) -> list[tuple]:
        return [(point["step"], point["samples"], point["heldout"]) for point in entry["curve"]]

    return trace(run) == trace(other) and run["draws"] == other["draws"]


def tournament_table(summary: dict[str, Any]) -> str:
    """`tournament.md`: the held-out table against the reference, then where each method's draws went."""
    from trl_ada.samplers.accounting import BANDS

    reference = summary["reference"]
    rows = list(summary["methods"].values())
    projected = any("gpu_seconds" in row for row in rows)
    header = (
        f"method | seeds | held-out at equal completions | - {reference} | - {reference} at equal time | "
        + (f"- {reference} at equal projected GPU time | projected GPU h | " if projected else "")
        + f"completions | training s | useful draws | trained draws | completions to {reference}'s final (seeds)"
    )
    lines = [
        f"Every run stops once it has drawn {summary['budget']:,} completions, and each curve is read at exactly that "
        "many (equal completions; linear between the evaluations around it, since a run's last step overshoots by up "
        f"to a step's draws); 'at equal time' reads a method's curve and {reference}'s of the same seed at the "
        "training time both reached (the shorter run's). Differences are paired by seed, with 95% t-intervals. "
        f"'Completions to {reference}'s final': the completions at which the method's mean curve first reaches "
        f"{reference}'s mean held-out at the budget, over those {reference}'s own mean curve needs ({reference}: "
        "1.00x by construction); in brackets, the seeds whose own curve reached it within the budget.",
        "",
        *markdown_table(header, [_held_out_cells(row, reference, projected) for row in rows]),
    ]
    if projected:
        lines += [
            "",
            "'Projected GPU': each run's steps priced at the paper's setting (8 x H100, Qwen2.5-Math-1.5B, 512 prompts "
            "a step) by benchmarks/generation_cost.py's model: its generate calls, completions and update rows scaled "
            "to 512 prompts (benchmarks/harness/gpu_time.py); '-' where a run recorded neither its step shapes nor a "
            "log to read them from.",
        ]
    short = [(row["label"], row["short_of_budget"]) for row in rows if row.get("short_of_budget")]
    if short:
        lines += [
            "",
            "Runs that ended short of the budget (left out of the equal-completions readings, not extrapolated):",
            "",
        ]
        lines += [
            f"- {label}: " + ", ".join(f"seed {entry['seed']} at {entry['completions']:,.0f}" for entry in entries)
            for label, entries in short
        ]
    lines += [
        "",
        "Where the draws went: per band of the pool's measured pass rate, the share of the method's draws spent there "
        "(and, in brackets, the share of those that served an update group with a signal).",
        "",
        *markdown_table(" | ".join(["method", *BANDS]), [[row["label"], *_band_cells(row, BANDS)] for row in rows]),
    ]
    gates = [(row["label"], row["gate_passed_over"]) for row in rows if "gate_passed_over" in row]
    if gates:
        lines += [
            "",
            "Rows the refill walk stepped past as predicted unmixed (`ada/dapo/passed_over_total`), per run:",
            "",
        ]
        lines += [
            f"- {label}: {gate['per_run']:,.1f} (mean of {gate['runs']} run{'s' * (gate['runs'] > 1)} that record it)"
            for label, gate in gates
        ]
    return "\n".join(lines) + "\n"


def _held_out_cells(row: dict[str, Any], reference: str, projected: bool = False) -> list[str]:
    """A method's cells in the held-out table."""
    label = row["label"]
    if row.get("identical_to_reference"):
        seeds = ", ".join(str(seed) for seed in row["seeds"])
        label += f" (= {reference} run for run: same draws and held-out, seed{'s' * (len(row['seeds']) > 1)} {seeds})"
    seeds_cell = str(len(row["seeds"]))
    if row.get("short_of_budget"):  # runs written before the reading at the budget lack it
        seeds_cell += f" ({len(row['short_of_budget'])} short)"
    at_time = row.get("minus_reference_at_equal_time")
    at_gpu_time = row.get("minus_reference_at_equal_gpu_time")
    gpu_cells = [
        "-" if at_gpu_time is None else fmt(at_gpu_time, signed=True),
        f"{row['gpu_seconds'] / 3600:.1f}" if "gpu_seconds" in row else "-",
    ]
    return [
        label, seeds_cell, fmt(row["final"]),
        fmt(row["minus_reference"], signed=True) if "minus_reference" in row else "-",
        "-" if at_time is None else fmt(at_time, signed=True),
        *(gpu_cells if projected else []),
        f"{row['completions']:,.0f}", f"{row['train_seconds']:.1f}", f"{row['useful_share']:.3f}",
        f"{row['trained_share']:.3f}", _reach(row.get("to_reference_final")),
    ]  # fmt: skip


def _band_cells(row: dict[str, Any], bands: Sequence[str]) -> list[str]:
    """A method's share of draws per band, with the useful share of those in brackets."""
    entries = [row["bands"].get(band) for band in bands]
    return ["-" if entry is None else f"{entry['share']:.3f} ({entry['useful_share']:.2f})" for entry in entries]


def _reach(reading: dict[str, Any] | None) -> str:
    """`0.82x (4)`: the mean curve's completions to the target over the reference's, and the seeds that reached it."""
    if reading is None:
        return "-"
    ratio = reading["completions_ratio"]
    if math.isnan(ratio):
        if not math.isfinite(reading.get("reference_completions", 0.0)):
            return "- (the reference's mean curve did not reach its level within the budget)"
        return "- (the reference ended at or below its start)"
    return f"{'never' if not math.isfinite(ratio) else f'{ratio:.2f}x'} ({reading['seeds_reached']})"


def write_tournament(
    out: Path,
    results: list[dict],
    budget: int,
    group_rows: Callable[[str, int], int | None] | None = None,
    prompts_per_step: int | None = None,
) -> None:
    """Writes `tournament.json` and `tournament.md` under `out` and prints the table; with `group_rows` (a step's
    update rows per method, `harness.gpu_time.add_projected_seconds`, and the testbed's `prompts_per_step` for runs
    that do not record it), the readings at equal projected GPU time too."""
    if not results:
        return
    if group_rows is not None:
        add_projected_seconds(results, out / "runs", group_rows, prompts_per_step=prompts_per_step)
    summary = tournament_summary(results, budget)
    (out / "tournament.json").write_text(json.dumps(summary, indent=1))
    table = tournament_table(summary)
    (out / "tournament.md").write_text(table)
    print(table)
