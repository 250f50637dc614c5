"""
The predictor's learning table: the learned pass-rate predictor against the tracker, Seq-balance, DAPO and GRPO, from the
runs `scripts/benchmark_learning.py` wrote (its `OUT/runs/*.json`; the runs themselves are not committed).

    python benchmarks/predictor_learning.py benchmarks/results/learning-predictor
    python benchmarks/predictor_learning.py benchmarks/results/finite/mix-4-epochs-predictor

Writes `OUT/predictor_table.md` and `OUT/predictor_table.json`: per method, over seeds (mean and 95% t-interval),

- the final held-out pass rate, the completions generated and the training wall time (the trainer's step times,
  evaluation excluded);
- the held-out pass rate at equal completions and at equal wall time: each seed's curve interpolated linearly at a
  common budget (the smallest total any method reached, and further budgets where a method reached them);
- paired differences against DAPO (same seed) for each of those;
- the predictor's goals: the completions `est` with the learned predictor needs to reach GRPO-n16's final held-out
  (mean curves, against GRPO-n16's), and whether it ends at or above DAPO's final with no more completions than DAPO.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the shared harness, benchmarks/harness

from harness.curves import first_reach, heldout_at, mean_curve  # noqa: E402
from harness.report import fmt, markdown_table  # noqa: E402
from harness.runs import group_by_method  # noqa: E402
from harness.stats import mean_ci  # noqa: E402

ORDER = ["grpo_n4", "grpo_n16", "dapo", "seq_balance", "seq_balance_learned", "est", "est_learned"]
REFERENCE = "dapo"


def stat(values: Sequence[float | None]) -> dict[str, Any]:
    """`mean_ci` over seeds when every seed has a value (None: its curve ended short), and how many have one."""
    reached = [value for value in values if value is not None]
    result = mean_ci(reached) if len(reached) == len(values) else {"mean": None, "n": len(reached)}
    result["reached"] = f"{len(reached)}/{len(values)}"
    return result


def paired(runs: list[dict], reference: list[dict], value: Callable[[dict], float | None]) -> dict[str, Any]:
    """`stat` of the same-seed differences ``value(run) - value(reference run)``."""
    by_seed = {run["seed"]: run for run in reference}
    pairs = [(value(run), value(by_seed[run["seed"]])) for run in runs if run["seed"] in by_seed]
    return stat([None if None in pair else pair[0] - pair[1] for pair in pairs])


def cell(value: dict[str, Any], signed: bool = False, digits: int = 3) -> str:
    """A `stat` as text (`fmt`), or how many seeds reached its budget when not all did."""
    return fmt(value, signed=signed, digits=digits) if value["mean"] is not None else f"— (reached {value['reached']})"


def _final(run: dict) -> float:
    return run["curve"][-1]["heldout"]


def analyse(out: Path) -> dict[str, Any]:
    """The table of the runs in `out/runs`: per method its finals and its curves read at each budget, the paired
    differences against DAPO and of each learned predictor against the sampler without it, and the goals."""
    by_method = group_by_method(json.loads(path.read_text()) for path in sorted((out / "runs").glob("*.json")))
    methods = [m for m in ORDER if m in by_method] + sorted(set(by_method) - set(ORDER))
    totals = {m: [run["curve"][-1]["samples"] for run in by_method[m]] for m in methods}
    seconds = {m: [run["curve"][-1]["train_seconds"] for run in by_method[m]] for m in methods}
    # Budgets every method reached on every seed (the smallest totals), then the larger ones some reached; rounded
    # down, so a method whose every seed reached a budget shows a value on every seed.
    completion_budgets = sorted({math.floor(min(v) / 100) * 100 for v in totals.values()})
    second_budgets = sorted(
        {math.floor(min(min(v) for v in seconds.values()) * 10) / 10, math.floor(min(seconds[REFERENCE]) * 10) / 10}
    )
    table: dict[str, Any] = {"completion_budgets": completion_budgets, "second_budgets": second_budgets, "methods": {}}
    for m in methods:
        runs = by_method[m]
        row = {
            "label": runs[0]["label"],
            "seeds": len(runs),
            "final": stat([_final(run) for run in runs]),
            "completions": stat(totals[m]),
            "train_seconds": stat(seconds[m]),
            "at_completions": {
                str(b): stat([heldout_at(r["curve"], "samples", b) for r in runs]) for b in completion_budgets
            },
            "at_seconds": {
                str(b): stat([heldout_at(r["curve"], "train_seconds", b) for r in runs]) for b in second_budgets
            },
        }
        if REFERENCE in by_method and m != REFERENCE:
            ref = by_method[REFERENCE]
            row["vs_dapo"] = {
                "final": paired(runs, ref, _final),
                "at_completions": paired(
                    runs, ref, lambda r: heldout_at(r["curve"], "samples", completion_budgets[0])
                ),
                "at_seconds": paired(runs, ref, lambda r: heldout_at(r["curve"], "train_seconds", second_budgets[0])),
            }
        table["methods"][m] = row
    table["learned_minus_without"] = {
        f"{learned} - {without}": {
            "final": paired(by_method[learned], by_method[without], _final),
            "completions": paired(by_method[learned], by_method[without], lambda r: r["curve"][-1]["samples"]),
        }
        for learned, without in (("est_learned", "est"), ("seq_balance_learned", "seq_balance"))
        if {learned, without} <= by_method.keys()
    }
    table["goals"] = goals(by_method)
    return table


def goals(by_method: dict[str, list[dict]]) -> dict[str, Any]:
    """Goal 1: `est_learned`'s mean curve reaches GRPO-n16's final in at most 0.6x GRPO-n16's completions. Goal 2:
    `est_learned` ends at or above DAPO's final with no more completions."""
    if not {"est_learned", "grpo_n16", "dapo"} <= by_method.keys():
        return {}
    curves = {m: mean_curve(by_method[m]) for m in ("est_learned", "grpo_n16", "dapo")}
    n16_final = curves["grpo_n16"][-1]["heldout"]
    reach = first_reach(curves["est_learned"], "samples", n16_final)
    n16_reach = first_reach(curves["grpo_n16"], "samples", n16_final)
    est_final, est_total = curves["est_learned"][-1]["heldout"], curves["est_learned"][-1]["samples"]
    dapo_final, dapo_total = curves["dapo"][-1]["heldout"], curves["dapo"][-1]["samples"]
    return {
        "grpo_n16_final": n16_final,
        "est_learned_completions_to_grpo_n16_final": reach,
        "ratio_to_grpo_n16": reach / n16_reach if math.isfinite(reach) else math.inf,
        "goal_1_met": math.isfinite(reach) and reach / n16_reach <= 0.6,
        "est_learned_final": est_final,
        "est_learned_completions": est_total,
        "dapo_final": dapo_final,
        "dapo_completions": dapo_total,
        "goal_2_met": est_final >= dapo_final and est_total <= dapo_total,
    }


def markdown(table: dict[str, Any]) -> str:
    """`predictor_table.md`: the held-out at each budget, the paired differences, the goals."""
    methods = table["methods"]
    cb, sb = table["completion_budgets"], table["second_budgets"]
    budgets = [*(f"at {b:,.0f} completions" for b in cb), *(f"at {b:g} s" for b in sb)]
    finals = [
        [row["label"], str(row["seeds"]), cell(row["final"]), f"{row['completions']['mean']:,.0f}",
         f"{row['train_seconds']['mean']:.0f}", *(cell(row["at_completions"][str(b)]) for b in cb),
         *(cell(row["at_seconds"][str(b)]) for b in sb)]
        for row in methods.values()
    ]  # fmt: skip
    differences = [
        [row["label"], *(cell(row["vs_dapo"][key], True) for key in ("final", "at_completions", "at_seconds"))]
        for row in methods.values()
        if "vs_dapo" in row
    ]
    lines = [
        "Held-out pass rate, mean [95% t-interval over seeds]; at a budget, each seed's curve is interpolated "
        "linearly (— where a seed never reached it).",
        "",
        *markdown_table(" | ".join(["method", "seeds", "final", "completions", "train s", *budgets]), finals),
        "",
        f"Paired difference against DAPO (same seed): final, at {cb[0]:,.0f} completions, at {sb[0]:g} s of training",
        "",
        *markdown_table("method | final | equal completions | equal wall time", differences),
    ]
    if table.get("learned_minus_without"):
        pairs = [
            [
                " - ".join(methods[m]["label"] for m in pair.split(" - ")),
                cell(d["final"], True),
                cell(d["completions"], True, 0),
            ]
            for pair, d in table["learned_minus_without"].items()
        ]
        lines += [
            "",
            "The learned predictor against the same sampler without it (same seed)",
            "",
            *markdown_table("pair | final held-out | completions", pairs),
        ]
    g = table.get("goals")
    if g:
        reach = g["est_learned_completions_to_grpo_n16_final"]
        reached = (
            f"with {reach:,.0f} completions, {g['ratio_to_grpo_n16']:.2f}x GRPO-n16's"
            if math.isfinite(reach)
            else "never (mean curve)"
        )
        lines += [
            "",
            f"- Goal 1: `est` with the learned predictor reaches GRPO-n16's final ({g['grpo_n16_final']:.3f}) "
            f"{reached} (target: at most 0.6x): {'met' if g['goal_1_met'] else 'not met'}.",
            f"- Goal 2: its final {g['est_learned_final']:.3f} with {g['est_learned_completions']:,.0f} completions "
            f"against DAPO's {g['dapo_final']:.3f} with {g['dapo_completions']:,.0f}: "
            f"{'met' if g['goal_2_met'] else 'not met'}.",
        ]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="a benchmark_learning.py --out folder with runs/")
    args = parser.parse_args(argv)
    table = analyse(args.out)
    (args.out / "predictor_table.json").write_text(json.dumps(table, indent=1, default=str))
    text = markdown(table)
    (args.out / "predictor_table.md").write_text(text)
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
