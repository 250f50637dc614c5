"""
Learning comparison on CPU: the shipped tiny arithmetic model trained with GRPO n=4/8/16, DAPO, Seq-pos, Seq-balance,
Est and Seq-balance with the log objective, several seeds each, same learning rate and steps.

Every run is a separate process (one thread each, `--jobs` at a time). Each run logs, every `--eval_every` steps,
the held-out pass rate at temperature 1 on the same fixed problems (the "reward" compared across methods: the
training reward of an adaptive sampler is measured on its balanced or re-weighted groups, so it is not comparable),
the completions generated so far and the wall time of its training steps. The report gives two ratios:

- steps for `seq_balance` to reach GRPO-n4's final held-out reward (< 1: fewer steps);
- generated completions for `seq_balance` to reach GRPO-n16's final held-out reward (< 1: fewer completions);

plus `objective=log` against `linear`, and the final held-out accuracy (mean and spread over seeds).

    python scripts/benchmark_learning.py --out benchmarks/results/learning [--steps 300 --seeds 0 1 2 --jobs 2]

Finite mode (`--train_data`): the runs train for `--epochs` passes over a fixed prompt set (every prompt
once per epoch, DAPO's refills drawn from the same set) and are evaluated on a held-out set with a `band` column
(both built by `recipes/finite-arithmetic/build_data.sh`), overall and per band. The report gives, per method, the
final held-out pass rate with a 95% t-interval over seeds, the paired (same-seed) differences against DAPO and
GRPO-n4 with their intervals, and the completions the best adaptive method needs to reach GRPO-n16's final, as
`table.md` and `summary.json`, with plots:

    python scripts/benchmark_learning.py --out benchmarks/results/finite/mix \\
        --train_data benchmarks/results/finite/data/train_mix.jsonl \\
        --heldout_data benchmarks/results/finite/data/heldout_mix.jsonl \\
        --epochs 8 --prompts_per_step 20 --eval_every 25 --eval_samples 2 --learning_rate 1e-4 \\
        --seeds 0 1 2 3 4 --jobs 2

`--task trace` runs the finite mode on the trace-arithmetic testbed instead (`trl_ada.tasks.trace_arithmetic`: the
shipped trace model, its final-answer reward and completion length; sets built by `recipes/trace-arithmetic/`).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))  # the shared harness, benchmarks/harness

from harness.arithmetic import (
    PROMPTS_PER_STEP,
    TASKS,
    epoch_visits,
    heldout_by_band,
    heldout_pass_rates,
    indexed_dataset,
    load_rows,
    steps_per_epoch,
    task_parts,
    testbed_settings,
)
from harness.curves import first_reach, heldout_at_completions, mean_curve  # noqa: F401 (BENCHMARKS.md reads it here)
from harness.methods import (
    DAPO,
    DAPO_GATED,
    DAPO_REPLAY,
    KNAPSACK,
    REMEMBERED_BASELINE,
    SEQ_BALANCE,
    SPO,
    add_method_arguments,
    check_method_arguments,
    method_settings,
    refuse_removed,
    removed_reason,
    update_group_rows,
)
from harness.report import LEARNING_PANELS, Panel, fmt, markdown_table, plot_curves
from harness.runs import Child, group_by_method, matching_runs, missing_runs, reusable, run_path, run_processes
from harness.stats import mean_ci, paired_difference
from harness.tournament import write_tournament
from harness.training import (
    BUDGET_EVAL_POINTS,
    EvaluationPlan,
    budget_steps,
    draw_accounting,
    evaluation_callback,
    gate_passes,
    step_shapes,
    train_seconds,
    training_args,
)

logger = logging.getLogger("benchmark_learning")

SEQ_POS = {**SEQ_BALANCE, "sampler": "seq_pos"}
EST = {"sampler": "est", "num_generations": 8}
TRACKED_ROUNDS = {**SEQ_BALANCE, "round_policy": "tracked", "round_confidence": 0.7}

# name -> (label, AdaGRPOConfig overrides). Update group n=4 for every adaptive method, as in the paper.
METHODS: dict[str, tuple[str, dict]] = {
    "grpo_n4": ("GRPO n=4", {"sampler": "uniform", "num_generations": 4}),
    "grpo_n8": ("GRPO n=8", {"sampler": "uniform", "num_generations": 8}),
    "grpo_n16": ("GRPO n=16", {"sampler": "uniform", "num_generations": 16}),
    "dapo": ("DAPO n=4", DAPO),
    "seq_pos": ("Seq-pos", SEQ_POS),
    "seq_balance": ("Seq-balance", SEQ_BALANCE),
    "seq_balance_log": ("Seq-balance, log objective", {**SEQ_BALANCE, "objective": "log"}),
    # The paper's Est spends 8 completions per prompt on average and trains on all of them.
    "est": ("Est (budget 8)", EST),
    # The authors' later single-round variant (their recipe: one draw each, the rest by 1/p̂, every draw trained).
    "est_ema": ("Est-EMA (budget 8), the authors' later variant", {"sampler": "est_ema", "num_generations": 8}),
    # The best round policy of BENCHMARKS.md ("Round policies"): request sizes from a tracker that remembers prompts
    # across epochs, which a finite set gives it.
    "seq_balance_tracked": ("Seq-balance, tracked rounds", TRACKED_ROUNDS),
    "seq_balance_predictive": ("Seq-balance, predictive rounds", {**TRACKED_ROUNDS, "round_policy": "predictive"}),
    # The learned pass-rate predictor (a prompt's first visit is predicted from its text), as Est's budgets
    # and as Seq-balance's first-round prior (tracked rounds: the prediction combined with the prompt's counts).
    "est_learned": ("Est (budget 8), learned predictor", {**EST, "pass_rate_predictor": "learned"}),
    "seq_balance_learned": (
        "Seq-balance, tracked rounds, learned prior",
        {**TRACKED_ROUNDS, "pass_rate_predictor": "learned"},
    ),
    # What the authors' released code does: no std scaling of the advantages, weight 1.
    "seq_balance_authors": (
        "Seq-balance, authors' setting",
        {**SEQ_BALANCE, "scale_rewards": "none", "objective": "linear"},
    ),
    # Whole-pool updates: every draw of a Seq-* pool trained on, each advantage scaled by the share of its outcome's
    # draws that the balanced group kept, so that a prompt weighs what its group would (`train_on="pool"`).
    "seq_balance_pool": ("Seq-balance, whole pool", {**SEQ_BALANCE, "train_on": "pool"}),
    "seq_pos_pool": ("Seq-pos, whole pool", {**SEQ_POS, "train_on": "pool"}),
    # The tournament's entries (harness/methods.py).
    "knapsack": ("Knapsack-RL", KNAPSACK),
    "dapo_gated": ("DAPO, gated refill", DAPO_GATED),
    "dapo_gated_fitted": ("DAPO, gated refill, fitted prior", {**DAPO_GATED, "sampler_kwargs": {"prior": "fitted"}}),
    # Remembered baselines: DAPO scored against each prompt's pass rate from its earlier steps (tracked) or the
    # learned predictor's estimate (predicted).
    "dapo_tracked": ("DAPO, tracked baseline", {**DAPO, **REMEMBERED_BASELINE}),
    "dapo_predicted": (
        "DAPO, predicted baseline",
        {**DAPO, **REMEMBERED_BASELINE, "baseline": "predicted", "pass_rate_predictor": "learned"},
    ),
    # SPO (Xu et al., arXiv 2509.13232): the smallest group TRL allows, the tracked baseline, and each generation
    # batch's prompts drawn by sqrt(p(1-p)) + 0.05 from the tracker.
    "spo": ("SPO n=2", SPO),
    # Replayed successes (AR3PO, arXiv 2509.25808; ExGRPO, arXiv 2510.02245): a prompt whose draws all came back wrong
    # trained on its latest stored correct completion, so DAPO kept it instead of refilling, and Seq-balance's
    # all-wrong pools got a positive. Removed from trl-ada (harness/methods.py, REMOVED_KNOBS): kept so that the
    # reports of their runs in benchmarks/results rebuild; running them is refused.
    "dapo_replay": ("DAPO, replayed successes", DAPO_REPLAY),
    "seq_balance_replay": ("Seq-balance, replayed successes", {**SEQ_BALANCE, "replay": "successes"}),
    # SPO with a weak Beta(0.1, 0.1) prior: a prompt never solved reads close to 0, as SPO's tracker initialised from
    # offline draws does, instead of 1 / (N + 2) under Beta(1, 1); both its baseline and its priority follow.
    "spo_weak_prior": (
        "SPO n=2, Beta(0.1, 0.1) prior",
        {**SPO, "pass_rate_prior_alpha": 0.1, "pass_rate_prior_beta": 0.1},
    ),
    # SPO's ablation: the same group and baseline in TRL's shuffled order, so the difference is the priority draw.
    "spo_shuffled": ("SPO n=2, shuffled order", {**SPO, "sampler": "uniform"}),
}
BUILT_IN_METHODS = dict(METHODS)
RECOMMENDED = "dapo"
"""The method README's "Which sampler should I use" recommends for a finite prompt set; `recommended` runs it."""
METHODS["recommended"] = (f"Recommended ({METHODS[RECOMMENDED][0]})", METHODS[RECOMMENDED][1])
TOURNAMENT_METHODS = ["grpo_n4", "grpo_n16", "dapo", "seq_balance", "knapsack", "dapo_gated", "dapo_gated_fitted"]
"""The tournament, read at equal completions (`--completions_budget`)."""

# The stream comparison's default methods (its published table); the finite comparison adds the round policy and the
# authors' setting.
STREAM_METHODS = ["grpo_n4", "grpo_n8", "grpo_n16", "dapo", "seq_pos", "seq_balance", "seq_balance_log", "est"]
FINITE_METHODS = ["grpo_n4", "grpo_n8", "grpo_n16", "dapo", "seq_pos", "seq_balance", "seq_balance_tracked", "est",
                  "seq_balance_log", "seq_balance_authors"]  # fmt: skip
# Reinforce-Ada's own methods: the candidates for "best adaptive method" (DAPO is the peer baseline, not one of them).
ADAPTIVE_METHODS = ("seq_pos", "seq_balance", "seq_balance_tracked", "seq_balance_predictive", "est",
                    "seq_balance_log", "seq_balance_authors", "est_learned", "seq_balance_learned")  # fmt: skip
# Paired differences are taken against these, when they ran.
PAIRED_REFERENCES = ("dapo", "grpo_n4")


def make_config(
    method: str, seed: int, steps: int, lr: float, out: Path, prompts_per_step: int, max_completion_length: int = 8
) -> Any:
    """The `AdaGRPOConfig` of one run: the method's overrides on the settings every method shares."""
    from trl_ada import AdaGRPOConfig

    overrides = METHODS[method][1]
    refuse_removed(method, overrides, recorded=method in BUILT_IN_METHODS)
    rows_per_step = prompts_per_step * overrides["num_generations"]
    arguments = training_args(str(out / f"{method}-seed{seed}"), seed, steps, lr, rows_per_step, max_completion_length)
    return AdaGRPOConfig(**arguments, **overrides)


def run_settings(settings: dict[str, Any], method: str) -> dict[str, Any]:
    """What one run of `method` depends on: the shared settings, and its overrides when they are not the built-in
    method's (`harness.methods.method_settings`)."""
    return method_settings(settings, METHODS[method][1], BUILT_IN_METHODS.get(method))


def run_one(
    method: str,
    seed: int,
    steps: int,
    eval_every: int,
    heldout_size: int,
    lr: float,
    out: Path,
    completions_budget: int | None = None,
) -> dict:
    """One training run (called in a child process); returns its curve and final numbers."""
    import torch

    from trl_ada import AdaGRPOTrainer
    from trl_ada.tasks.arithmetic import accuracy_by_level, exact_match_reward, held_out_problems, make_dataset
    from trl_ada.tiny import load_tiny_arith_model

    torch.set_num_threads(1)
    label, overrides = METHODS[method]
    model, tokenizer = load_tiny_arith_model()
    heldout = held_out_problems(heldout_size, seed=1234)
    steps = budget_steps(completions_budget, steps, PROMPTS_PER_STEP)
    config = make_config(method, seed, steps, lr, out, PROMPTS_PER_STEP)
    curve: list[dict] = []
    plan = EvaluationPlan(steps, eval_every, completions_budget)
    scored = [0]  # completions scored so far (the budget's count)

    def evaluate(trainer_model) -> float:
        return accuracy_by_level(
            trainer_model, tokenizer, heldout, temperature=1.0, num_samples=1, max_new_tokens=8, seed=seed
        )["overall"]

    def exact_match(completions: list[Any], answer: list[str], **kwargs: Any) -> list[float]:
        scored[0] += len(completions)
        return exact_match_reward(completions, answer)

    def heldout_point(step: int, trainer_model: Any) -> dict:
        # samples and train_seconds are filled in after training: on_step_end runs before the step's own log entry is
        # written, so the history here would miss the step the point is taken at.
        return {"step": step, "heldout": evaluate(trainer_model)}

    dataset = make_dataset(max(steps * PROMPTS_PER_STEP * 2, 4000), seed=seed)
    trainer = AdaGRPOTrainer(
        model,
        [exact_match],
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[evaluation_callback(plan, lambda step: scored[0], heldout_point, curve)],
    )
    start_accuracy = evaluate(trainer.model)
    trainer.train()
    entries = [e for e in trainer.state.log_history if "step_time" in e]
    for point in curve:
        done = [e for e in entries if e["step"] <= point["step"]]
        point["samples"] = draw_accounting(done)["total"]
        point["train_seconds"] = train_seconds(done)
    return {
        "method": method,
        "label": label,
        "seed": seed,
        "prompts_per_step": PROMPTS_PER_STEP,
        "start_heldout": start_accuracy,
        "curve": [{"step": 0, "heldout": start_accuracy, "samples": 0.0, "train_seconds": 0.0}, *curve],
        "median_step_seconds": statistics.median(e["step_time"] for e in entries),
        "train_pass_rate": [e.get("ada/pass_rate/mean") for e in entries],
        "draws": draw_accounting(entries),
        "gate_passed_over": gate_passes(entries),
        "step_shapes": step_shapes(entries, update_group_rows(METHODS[method][1], PROMPTS_PER_STEP)),
        "completions": scored[0],
        "steps_run": trainer.state.global_step,
    }


def summarize(results: list[dict]) -> dict:
    """The stream's summary: per method the final held-out (mean and sd over seeds), completions, step time and mean
    curve; the steps and completions Seq-balance needs to reach GRPO's finals, and the log objective against linear."""
    table = {}
    for method, runs in group_by_method(results).items():
        finals = [run["curve"][-1]["heldout"] for run in runs]
        table[method] = {
            "label": runs[0]["label"],
            "seeds": len(runs),
            "final_heldout_mean": statistics.fmean(finals),
            "final_heldout_sd": statistics.stdev(finals) if len(finals) > 1 else 0.0,
            "start_heldout_mean": statistics.fmean(run["start_heldout"] for run in runs),
            "samples_total_mean": statistics.fmean(run["curve"][-1]["samples"] for run in runs),
            "median_step_seconds": statistics.fmean(run["median_step_seconds"] for run in runs),
            "curve": mean_curve(runs, intervals=False),
        }
    ratios = {}
    if {"seq_balance", "grpo_n4"} <= table.keys():
        target = table["grpo_n4"]["final_heldout_mean"]
        ratios["steps_seq_balance_to_grpo_n4_final"] = first_reach(
            table["seq_balance"]["curve"], "step", target
        ) / max(first_reach(table["grpo_n4"]["curve"], "step", target), 1e-9)
    if {"seq_balance", "grpo_n16"} <= table.keys():
        target = table["grpo_n16"]["final_heldout_mean"]
        ratios["samples_seq_balance_to_grpo_n16_final"] = first_reach(
            table["seq_balance"]["curve"], "samples", target
        ) / max(first_reach(table["grpo_n16"]["curve"], "samples", target), 1e-9)
    if {"seq_balance", "seq_balance_log"} <= table.keys():
        ratios["final_heldout_log_minus_linear"] = (
            table["seq_balance_log"]["final_heldout_mean"] - table["seq_balance"]["final_heldout_mean"]
        )
    return {"methods": table, "ratios": ratios}


# ---- Finite mode: epochs over a fixed prompt set, held-out pass rate per band, intervals over seeds -----------------


def band_sort_key(band: str) -> tuple[float, int, float]:
    """Orders band labels such as ``"[0, 0]"``, ``"(0, 0.2]"`` by their lower end (closed before open), then upper."""
    try:
        low, high = (float(part) for part in band.strip("[]()").split(","))
    except ValueError:  # not an interval: after the intervals, by name
        return (math.inf, 0, math.inf)
    return (low, 0 if band.startswith("[") else 1, high)


def run_finite(
    method: str,
    seed: int,
    steps: int,
    eval_every: int,
    lr: float,
    out: Path,
    *,
    train_data: Path,
    heldout_data: Path,
    eval_samples: int,
    prompts_per_step: int,
    completions_budget: int | None = None,
    task: str = "arithmetic",
    model_dir: Path | None = None,
) -> dict:
    """One training run over a finite prompt set (called in a child process); returns its curve and final numbers.

    Every curve point holds the held-out pass rate overall and per ``band`` of the held-out set, the completions
    generated so far (counted where they are scored, so rounds, Est's budgets and DAPO's refills are all in) and the
    training wall time (the trainer's ``step_time``, evaluation excluded).
    """
    import torch

    from trl_ada import AdaGRPOTrainer

    torch.set_num_threads(1)
    label, _ = METHODS[method]
    load_model, task_reward, max_completion_length = task_parts(task)
    if model_dir is not None:
        from trl_ada.tiny import load_tiny

        model, tokenizer = load_tiny(model_dir)
    else:
        model, tokenizer = load_model()
    rows = load_rows(train_data)
    heldout_rows = load_rows(heldout_data)
    for path, table, needed in ((train_data, rows, ()), (heldout_data, heldout_rows, ("band",))):
        missing = sorted({key for row in table for key in ("prompt", "answer", *needed) if key not in row})
        if missing or not table:
            raise ValueError(
                f"{path} must be a non-empty JSON-lines set with {('prompt', 'answer', *needed)}: {missing}"
            )
    heldout = heldout_by_band(heldout_rows)
    per_epoch = steps_per_epoch(len(rows), prompts_per_step)
    if per_epoch < 1:
        raise ValueError(f"The training set ({len(rows)} prompts) is smaller than one step ({prompts_per_step}).")
    skipped = len(rows) % prompts_per_step
    if skipped:
        message = "%d prompts, %d per step: each epoch skips %d prompts (a different few each time)."
        logger.warning(message, len(rows), prompts_per_step, skipped)
    steps = budget_steps(completions_budget, steps, prompts_per_step)
    plan = EvaluationPlan(steps, eval_every, completions_budget)
    config = make_config(method, seed, steps, lr, out, prompts_per_step, max_completion_length)
    dataset = indexed_dataset(rows)

    visits: list[set[int]] = []  # rows scored during each optimizer step
    scored: list[int] = []  # completions scored during each optimizer step
    trainer: Any = None

    def exact_match(completions: list[Any], answer: list[str], row_index: list[int], **kwargs: Any) -> list[float]:
        """The task's reward; also records which rows the step scored and how many completions it generated."""
        step = trainer.state.global_step  # steps finished so far: the one being computed is index `step`
        while len(visits) <= step:
            visits.append(set())
            scored.append(0)
        visits[step].update(row_index)
        scored[step] += len(completions)
        return task_reward(completions, answer)

    def evaluate(trainer_model: Any) -> tuple[float, dict[str, float]]:
        result = heldout_pass_rates(task, trainer_model, tokenizer, heldout, num_samples=eval_samples, seed=seed)
        return result["overall"], dict(result["per_level"])

    curve: list[dict] = []

    def point(step: int, trainer_model: Any) -> dict:
        overall, bands = evaluate(trainer_model)
        # train_seconds is filled in after training: on_step_end runs before the step's own log entry is written.
        return {
            "step": step,
            "epoch": step / per_epoch,
            "heldout": overall,
            "bands": bands,
            "samples": float(sum(scored[:step])),
            "train_seconds": 0.0,
        }

    held_out = evaluation_callback(plan, lambda step: sum(scored[:step]), point, curve)
    trainer = AdaGRPOTrainer(
        model, [exact_match], args=config, train_dataset=dataset, processing_class=tokenizer, callbacks=[held_out]
    )
    started = time.perf_counter()
    start = point(0, trainer.model)
    trainer.train()
    entries = [e for e in trainer.state.log_history if "step_time" in e]
    for entry in [start, *curve]:
        entry["train_seconds"] = train_seconds([e for e in entries if e["step"] <= entry["step"]])
    return {
        "method": method,
        "label": label,
        "seed": seed,
        "train_size": len(rows),
        "heldout_size": len(heldout),
        "prompts_per_step": prompts_per_step,
        "steps_per_epoch": per_epoch,
        "start_heldout": start["heldout"],
        "curve": [start, *curve],
        "median_step_seconds": statistics.median(e["step_time"] for e in entries),
        "step_seconds": [e["step_time"] for e in entries],
        "run_seconds": time.perf_counter() - started,
        "epoch_visits": epoch_visits([sorted(v) for v in visits], per_epoch),
        "visits": [sorted(v) for v in visits],
        "completions_per_step": scored,
        "draws": draw_accounting(entries),
        "gate_passed_over": gate_passes(entries),
        "step_shapes": step_shapes(entries, update_group_rows(METHODS[method][1], prompts_per_step)),
    }


def _final(run: dict) -> float:
    return run["curve"][-1]["heldout"]


def _final_band(band: str) -> Any:
    return lambda run: run["curve"][-1]["bands"].get(band, math.nan)


def summarize_finite(results: list[dict]) -> dict:
    """Per method: final held-out pass rate overall and per band with 95% t-intervals over seeds, completions and
    time; paired differences against DAPO and GRPO-n4; completions for the best adaptive method to reach GRPO-n16's
    final held-out."""
    by_method = group_by_method(results)
    bands = sorted({band for run in results for band in run["curve"][-1]["bands"]}, key=band_sort_key)
    table: dict[str, Any] = {}
    for method, runs in by_method.items():
        runs.sort(key=lambda run: run["seed"])
        table[method] = {
            "label": runs[0]["label"],
            "seeds": [run["seed"] for run in runs],
            "epochs": runs[0]["curve"][-1]["epoch"],
            "steps": runs[0]["curve"][-1]["step"],
            "start_heldout": mean_ci([run["start_heldout"] for run in runs]),
            "final_heldout": mean_ci([_final(run) for run in runs]),
            "final_bands": {band: mean_ci([_final_band(band)(run) for run in runs]) for band in bands},
            "samples_total": mean_ci([run["curve"][-1]["samples"] for run in runs]),
            "train_seconds": mean_ci([run["curve"][-1]["train_seconds"] for run in runs]),
            "median_step_seconds": statistics.fmean(run["median_step_seconds"] for run in runs),
            "epoch_visits": [run["epoch_visits"] for run in runs],
            "curve": mean_curve(runs, ("step", "epoch", "samples", "train_seconds"), bands=bands),
        }
    paired: dict[str, dict[str, Any]] = {}
    for reference in PAIRED_REFERENCES:
        if reference not in by_method:
            continue
        paired[reference] = {
            method: {
                "overall": paired_difference(runs, by_method[reference], _final),
                "bands": {band: paired_difference(runs, by_method[reference], _final_band(band)) for band in bands},
            }
            for method, runs in by_method.items()
            if method != reference
        }
    return {
        "bands": bands,
        "methods": table,
        "paired": paired,
        "completions_to_grpo_n16_final": completions_to_target(by_method, table),
    }


def completions_to_target(by_method: dict[str, list[dict]], table: dict[str, Any]) -> dict[str, Any] | None:
    """Completions the best adaptive method (highest mean final held-out) generates to first reach GRPO-n16's final
    held-out pass rate, over the completions GRPO-n16 generates to reach it (< 1: fewer).

    ``ratio`` compares the mean curves against the mean final; ``per_seed`` pairs each seed's curves against that
    seed's GRPO-n16 final (``inf``: never reached within the run).
    """
    adaptive = [method for method in ADAPTIVE_METHODS if method in table]
    if "grpo_n16" not in table or not adaptive:
        return None
    best = max(adaptive, key=lambda method: table[method]["final_heldout"]["mean"])
    target = table["grpo_n16"]["final_heldout"]["mean"]
    best_samples = first_reach(table[best]["curve"], "samples", target)
    reference_samples = first_reach(table["grpo_n16"]["curve"], "samples", target)
    per_seed = {}
    references = {run["seed"]: run for run in by_method["grpo_n16"]}
    for run in by_method[best]:
        if run["seed"] in references:
            reference = references[run["seed"]]
            goal = _final(reference)
            per_seed[run["seed"]] = first_reach(run["curve"], "samples", goal) / max(
                first_reach(reference["curve"], "samples", goal), 1e-9
            )
    finite = [value for value in per_seed.values() if math.isfinite(value)]
    return {
        "best_adaptive": best,
        "target_heldout": target,
        "samples_best": best_samples,
        "samples_grpo_n16": reference_samples,
        "ratio": best_samples / max(reference_samples, 1e-9),
        "per_seed": per_seed,
        "per_seed_reached": len(finite),
        "per_seed_ratio": mean_ci(finite) if len(finite) == len(per_seed) else None,
    }


def finite_table(summary: dict) -> str:
    """The markdown tables of a finite run: final held-out per band, paired differences, the completions ratio."""
    bands = summary["bands"]
    methods = summary["methods"]
    seeds = max((len(method["seeds"]) for method in methods.values()), default=0)
    finals = [
        [method["label"], str(len(method["seeds"])), f"{method['epochs']:.2f}", fmt(method["final_heldout"]),
         *(fmt(method["final_bands"][band]) for band in bands), f"{method['samples_total']['mean']:,.0f}",
         f"{method['train_seconds']['mean']:.1f}", f"{method['median_step_seconds']:.3f}"]
        for method in methods.values()
    ]  # fmt: skip
    header = f"method | seeds | epochs | overall | {' | '.join(bands)} | completions | train s | s/step"
    lines = [
        f"Final held-out pass rate (T=1): mean [95% t-interval over {seeds} seeds]",
        "",
        *markdown_table(header, finals),
    ]
    for reference, rows in summary["paired"].items():
        differences = [
            [methods[method]["label"], str(len(row["overall"]["seeds"])), fmt(row["overall"], signed=True),
             *(fmt(row["bands"][band], signed=True) for band in bands)]
            for method, row in rows.items()
        ]  # fmt: skip
        lines += [
            "",
            f"Paired difference against {methods[reference]['label']} (same seed), final held-out: "
            "mean [95% t-interval]",
            "",
            *markdown_table(f"method | seeds | overall | {' | '.join(bands)}", differences),
        ]
    ratio = summary["completions_to_grpo_n16_final"]
    if ratio is not None:
        per_seed = f"reached in {ratio['per_seed_reached']} of {len(ratio['per_seed'])} seeds"
        if ratio["per_seed_ratio"] is not None:
            per_seed = fmt(ratio["per_seed_ratio"])
        lines += [
            "",
            f"Completions for the best adaptive method ({methods[ratio['best_adaptive']]['label']}) to reach "
            f"GRPO-n16's final held-out ({ratio['target_heldout']:.3f}): {ratio['samples_best']:,.0f} against "
            f"{ratio['samples_grpo_n16']:,.0f}, ratio **{ratio['ratio']:.3f}** (mean curves); per seed "
            f"{per_seed}.",
        ]
    return "\n".join(lines) + "\n"


def plot_finite(summary: dict, out: Path) -> list[Path]:
    """``learning_curves.png`` (overall held-out against steps, completions and wall time, 95% bands over seeds) and
    ``band_curves.png`` (held-out per band against steps)."""
    rows = list(summary["methods"].values())
    title = "Finite prompt set: held-out pass rate against steps, completions and wall time (mean, 95% CI)"
    paths = [plot_curves(out / "learning_curves.png", rows, LEARNING_PANELS, title)]
    band_panels = [
        Panel(
            "step",
            "optimizer steps",
            title=f"held-out band {band}",
            y=lambda point, band=band: point["bands"][band],
            ci=lambda point, band=band: point["bands_ci"][band],
        )
        for band in summary["bands"]
    ]
    if band_panels:
        paths.append(plot_curves(out / "band_curves.png", rows, band_panels))
    return paths


# ---- Main -----------------------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    """The command line (`--run METHOD SEED`, hidden, is a child process's: one run, written as JSON)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="results folder (default: benchmarks/results/learning; finite mode: "
        "benchmarks/results/finite/<train set>)",
    )
    defaults = f"{' '.join(STREAM_METHODS)}; finite mode: {' '.join(FINITE_METHODS)}"
    budget_help = (
        f"measuring the held-out at each 1/{BUDGET_EVAL_POINTS} of it; --steps/--epochs then only cap the steps"
    )
    add_method_arguments(
        parser, METHODS, defaults=defaults, tournament_methods=TOURNAMENT_METHODS, budget_help=budget_help
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--eval_every", type=int, default=25)
    parser.add_argument("--heldout_size", type=int, default=600)
    parser.add_argument("--learning_rate", type=float, default=3e-5)
    parser.add_argument("--jobs", type=int, default=2, help="runs at a time (one CPU thread each)")
    parser.add_argument(
        "--task",
        choices=TASKS,
        default="arithmetic",
        help="arithmetic: the one-shot tiny model; trace: the trace-arithmetic testbed (its model, final-answer "
        "reward and completion length; needs --train_data, e.g. from recipes/trace-arithmetic/build_data.sh)",
    )
    finite = parser.add_argument_group("finite mode (a fixed training set, visited for several epochs)")
    finite.add_argument("--train_data", type=Path, default=None, help="JSON-lines training set (prompt, answer, ...)")
    finite.add_argument("--heldout_data", type=Path, default=None, help="JSON-lines held-out set with a 'band' column")
    finite.add_argument("--epochs", type=int, default=None, help="passes over --train_data (instead of --steps)")
    finite.add_argument("--prompts_per_step", type=int, default=None, help=f"default {PROMPTS_PER_STEP}")
    finite.add_argument("--eval_samples", type=int, default=None, help="held-out completions per prompt (default 1)")
    finite.add_argument(
        "--model", type=Path, help="a tiny-model directory to start from instead of the task's shipped one"
    )
    parser.add_argument(
        "--reuse_runs",
        action="store_true",
        help="keep the runs already in OUT/runs whose recorded settings match these (e.g. to add seeds to a table)",
    )
    parser.add_argument(
        "--report_only",
        action="store_true",
        help="start no run: rebuild the tables from the runs in OUT/runs whose recorded settings match these (e.g. "
        "a method run at fewer seeds than the others)",
    )
    parser.add_argument("--run", nargs=2, metavar=("METHOD", "SEED"), help=argparse.SUPPRESS)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    check_method_arguments(parser, args, METHODS, tournament_methods=TOURNAMENT_METHODS, budget_example="DAPO's")
    is_finite = args.train_data is not None
    if is_finite:
        if args.heldout_data is None:
            parser.error("--train_data needs --heldout_data (a held-out set with a 'band' column).")
    elif any(
        v is not None for v in (args.heldout_data, args.epochs, args.prompts_per_step, args.eval_samples, args.model)
    ):
        parser.error("--heldout_data, --epochs, --prompts_per_step, --eval_samples and --model need --train_data.")
    elif args.task != "arithmetic":
        parser.error(
            f"--task {args.task} runs on a fixed prompt set: give --train_data and --heldout_data (e.g. built by "
            "recipes/trace-arithmetic/build_data.sh)."
        )
    if args.out is None:
        args.out = (
            Path("benchmarks/results/finite") / args.train_data.stem
            if is_finite
            else Path("benchmarks/results/learning")
        )
    if args.methods is None:
        args.methods = list(FINITE_METHODS if is_finite else STREAM_METHODS)
    prompts_per_step = args.prompts_per_step or PROMPTS_PER_STEP
    eval_samples = args.eval_samples or 1
    args.out.mkdir(parents=True, exist_ok=True)
    steps = args.steps
    if is_finite and args.epochs is not None:
        steps = args.epochs * steps_per_epoch(len(load_rows(args.train_data)), prompts_per_step)
        if steps < 1:
            parser.error(f"{args.train_data} holds fewer prompts than one step ({prompts_per_step}).")
    # What a run's result depends on besides its method and seed: --reuse_runs keeps a run only when these match.
    settings = testbed_settings(args, steps, prompts_per_step, eval_samples)
    if args.model is not None:  # absent for the shipped model, for the same reason
        if not args.report_only and not (args.model / "config.json").is_file():
            parser.error(
                f"--model {args.model} holds no model (config.json); build one with scripts/build_trace_model.py."
            )
        settings["model"] = str(args.model)

    runs_dir = args.out / "runs"
    if args.run:  # child process: one run, written as JSON
        method, seed = args.run[0], int(args.run[1])
        result = run_child(args, method, seed, eval_samples, prompts_per_step)
        result["settings"] = run_settings(settings, method)
        run_path(runs_dir, method, seed).write_text(json.dumps(result))
        return 0

    runs_dir.mkdir(exist_ok=True)
    pending = [(m, s) for s in args.seeds for m in args.methods]
    if args.report_only:
        pending = []
    elif args.reuse_runs:
        pending = [(m, s) for m, s in pending if not reusable(run_path(runs_dir, m, s), run_settings(settings, m))]
        logger.info("Reusing %d finished runs.", len(args.seeds) * len(args.methods) - len(pending))
    for method in dict.fromkeys(m for m, _ in pending):  # before any run starts
        reason = removed_reason(method, METHODS[method][1], recorded=method in BUILT_IN_METHODS)
        if reason is not None:
            parser.error(reason)
    common = child_arguments(args, steps, prompts_per_step, eval_samples)
    argv = [sys.executable, __file__, *common, "--run"]
    children = [Child(m, s, [*argv, m, str(s)], runs_dir / f"{m}-seed{s}.log") for m, s in pending]
    failed = run_processes(children, jobs=args.jobs)
    # Only runs made with this invocation's settings: an older run in the folder does not slip into a table.
    results = matching_runs(runs_dir, args.methods, args.seeds, lambda method: run_settings(settings, method))
    if args.report_only:
        missing = missing_runs(results, args.methods, args.seeds)
        if missing and args.tournament:  # a tournament paired by seed, built from part of its runs, misleads
            parser.error(
                f"--report_only --tournament: no run with these settings in {runs_dir} for "
                f"{', '.join(missing)}. Run them (recipes/finite-arithmetic/run_tournament.sh, or these arguments "
                "without --report_only and with --reuse_runs), or give --methods/--seeds that ran."
            )
        if missing:
            logger.warning("--report_only: no run with these settings for %s; the tables leave them out.", missing)
    if args.tournament:
        write_tournament(
            args.out,
            results,
            args.completions_budget,
            lambda method, prompts: update_group_rows(METHODS[method][1], prompts),
            prompts_per_step=prompts_per_step,
        )
    if is_finite:
        return report_finite(args, results, steps, prompts_per_step, eval_samples, failed)
    report_stream(args.out, results)
    return 0


def run_child(args: argparse.Namespace, method: str, seed: int, eval_samples: int, prompts_per_step: int) -> dict:
    """The child process's run: the finite mode's or the stream's."""
    with tempfile.TemporaryDirectory() as scratch:  # the trainers' output dirs are not results
        if args.train_data is not None:
            return run_finite(
                method, seed, args.steps, args.eval_every, args.learning_rate, Path(scratch),
                train_data=args.train_data, heldout_data=args.heldout_data, eval_samples=eval_samples,
                prompts_per_step=prompts_per_step, completions_budget=args.completions_budget, task=args.task,
                model_dir=args.model,
            )  # fmt: skip
        return run_one(
            method, seed, args.steps, args.eval_every, args.heldout_size, args.learning_rate, Path(scratch),
            completions_budget=args.completions_budget,
        )  # fmt: skip


def child_arguments(args: argparse.Namespace, steps: int, prompts_per_step: int, eval_samples: int) -> list[str]:
    """The arguments every child process of this invocation gets (the step count, not the epochs)."""
    common = [
        "--out", str(args.out), "--steps", str(steps), "--eval_every", str(args.eval_every),
        "--heldout_size", str(args.heldout_size), "--learning_rate", str(args.learning_rate), "--task", args.task,
    ]  # fmt: skip
    for spec in args.method_config:
        common += ["--method_config", spec]
    if args.completions_budget is not None:
        common += ["--completions_budget", str(args.completions_budget)]
    if args.train_data is not None:
        common += ["--train_data", str(args.train_data), "--heldout_data", str(args.heldout_data)]
        if args.model is not None:
            common += ["--model", str(args.model)]
        common += ["--prompts_per_step", str(prompts_per_step), "--eval_samples", str(eval_samples)]
    return common


def report_stream(out: Path, results: list[dict]) -> None:
    """Writes the stream's ``summary.json`` and plot, and prints its table."""
    summary = summarize(results)
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    title = "Tiny arithmetic model: held-out reward against steps, samples and wall time (mean over seeds)"
    plot_curves(out / "learning_curves.png", summary["methods"].values(), LEARNING_PANELS, title)
    print(f"{'method':<28}{'seeds':>6}{'start':>8}{'final':>8}{'sd':>7}{'samples':>10}{'s/step':>8}")
    for method in summary["methods"].values():
        print(
            f"{method['label']:<28}{method['seeds']:>6}{method['start_heldout_mean']:>8.3f}"
            f"{method['final_heldout_mean']:>8.3f}{method['final_heldout_sd']:>7.3f}"
            f"{method['samples_total_mean']:>10.0f}{method['median_step_seconds']:>8.3f}"
        )
    for name, value in summary["ratios"].items():
        print(f"{name}: {value:.3f}")


def report_finite(
    args: argparse.Namespace,
    results: list[dict],
    steps: int,
    prompts_per_step: int,
    eval_samples: int,
    failed: list[str],
) -> int:
    """Writes a finite run's ``summary.json``, ``table.md`` and plots, prints the table; 1 when a run failed."""
    if not results:
        logger.error("No run finished; see %s/runs/*.log.", args.out)
        return 1
    summary = summarize_finite(results)
    summary["settings"] = {
        "train_data": str(args.train_data), "heldout_data": str(args.heldout_data), "epochs": args.epochs,
        "steps": steps, "prompts_per_step": prompts_per_step, "eval_every": args.eval_every,
        "eval_samples": eval_samples, "learning_rate": args.learning_rate, "seeds": args.seeds,
        "methods": args.methods,
    }  # fmt: skip
    if args.task != "arithmetic":
        summary["settings"]["task"] = args.task
    if args.model is not None:
        summary["settings"]["model"] = str(args.model)
    summary["failed_runs"] = failed
    # Not strict JSON for never-reached targets (inf), like the stream summary: Python's json reads it back.
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
    table = finite_table(summary)
    (args.out / "table.md").write_text(table)
    plot_finite(summary, args.out)
    print(table)
    if failed:
        logger.error("Failed runs: %s (see %s/runs/*.log).", ", ".join(failed), args.out)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
