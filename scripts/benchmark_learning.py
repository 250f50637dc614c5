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
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

logger = logging.getLogger("benchmark_learning")

PROMPTS_PER_STEP = 16

# name -> (label, AdaGRPOConfig overrides). Update group n=4 for every adaptive method, as in the paper.
METHODS: dict[str, tuple[str, dict]] = {
    "grpo_n4": ("GRPO n=4", {"sampler": "uniform", "num_generations": 4}),
    "grpo_n8": ("GRPO n=8", {"sampler": "uniform", "num_generations": 8}),
    "grpo_n16": ("GRPO n=16", {"sampler": "uniform", "num_generations": 16}),
    "dapo": ("DAPO n=4", {"sampler": "dapo", "num_generations": 4, "dapo_on_exhausted": "keep_partial"}),
    "seq_pos": ("Seq-pos", {"sampler": "seq_pos", "num_generations": 4, "round_size": 8, "max_rounds": 4}),
    "seq_balance": ("Seq-balance", {"sampler": "seq_balance", "num_generations": 4, "round_size": 8, "max_rounds": 4}),
    "seq_balance_log": (
        "Seq-balance, log objective",
        {"sampler": "seq_balance", "num_generations": 4, "round_size": 8, "max_rounds": 4, "objective": "log"},
    ),
    # The paper's Est spends 8 completions per prompt on average and trains on all of them.
    "est": ("Est (budget 8)", {"sampler": "est", "num_generations": 8}),
    # The best round policy of BENCHMARKS.md ("Round policies"): request sizes from a tracker that remembers prompts
    # across epochs, which a finite set gives it.
    "seq_balance_tracked": (
        "Seq-balance, tracked rounds",
        {
            "sampler": "seq_balance",
            "num_generations": 4,
            "round_size": 8,
            "max_rounds": 4,
            "round_policy": "tracked",
            "round_confidence": 0.7,
        },
    ),
    "seq_balance_predictive": (
        "Seq-balance, predictive rounds",
        {
            "sampler": "seq_balance",
            "num_generations": 4,
            "round_size": 8,
            "max_rounds": 4,
            "round_policy": "predictive",
            "round_confidence": 0.7,
        },
    ),
    # The learned pass-rate predictor (a prompt's first visit is predicted from its text), as Est's budgets
    # and as Seq-balance's first-round prior (tracked rounds: the prediction combined with the prompt's counts).
    "est_learned": (
        "Est (budget 8), learned predictor",
        {"sampler": "est", "num_generations": 8, "pass_rate_predictor": "learned"},
    ),
    "seq_balance_learned": (
        "Seq-balance, tracked rounds, learned prior",
        {
            "sampler": "seq_balance",
            "num_generations": 4,
            "round_size": 8,
            "max_rounds": 4,
            "round_policy": "tracked",
            "round_confidence": 0.7,
            "pass_rate_predictor": "learned",
        },
    ),
    # What the authors' released code does: no std scaling of the advantages, weight 1.
    "seq_balance_authors": (
        "Seq-balance, authors' setting",
        {
            "sampler": "seq_balance",
            "num_generations": 4,
            "round_size": 8,
            "max_rounds": 4,
            "scale_rewards": "none",
            "objective": "linear",
        },
    ),
    # Whole-pool updates: every draw of a Seq-* pool trained on, each advantage scaled by the share of its outcome's
    # draws that the balanced group kept, so that a prompt weighs what its group would (`train_on="pool"`).
    "seq_balance_pool": (
        "Seq-balance, whole pool",
        {"sampler": "seq_balance", "num_generations": 4, "round_size": 8, "max_rounds": 4, "train_on": "pool"},
    ),
    "seq_pos_pool": (
        "Seq-pos, whole pool",
        {"sampler": "seq_pos", "num_generations": 4, "round_size": 8, "max_rounds": 4, "train_on": "pool"},
    ),
    # The tournament: Knapsack-RL (Li et al., arXiv 2509.25849) at GRPO n=4's budget per step, trained on every
    # draw; DAPO whose refill passes over prompts predicted to come back unmixed (trl_ada/samplers/gated.py).
    "knapsack": ("Knapsack-RL", {"sampler": "knapsack", "num_generations": 4}),
    "dapo_gated": (
        "DAPO, gated refill",
        {"sampler": "dapo_gated", "num_generations": 4, "dapo_on_exhausted": "keep_partial"},
    ),
    "dapo_gated_fitted": (
        "DAPO, gated refill, fitted prior",
        {
            "sampler": "dapo_gated",
            "num_generations": 4,
            "dapo_on_exhausted": "keep_partial",
            "sampler_kwargs": {"prior": "fitted"},
        },
    ),
    # Remembered baselines (SPO's, Xu et al. 2025): DAPO scored against each prompt's pass rate from its earlier
    # steps (tracked) or the learned predictor's estimate (predicted), advantages normalised over the update as SPO's.
    "dapo_tracked": (
        "DAPO, tracked baseline",
        {
            "sampler": "dapo",
            "num_generations": 4,
            "dapo_on_exhausted": "keep_partial",
            "baseline": "tracked",
            "scale_rewards": "none",
            "normalize_advantages": True,
        },
    ),
    "dapo_predicted": (
        "DAPO, predicted baseline",
        {
            "sampler": "dapo",
            "num_generations": 4,
            "dapo_on_exhausted": "keep_partial",
            "baseline": "predicted",
            "pass_rate_predictor": "learned",
            "scale_rewards": "none",
            "normalize_advantages": True,
        },
    ),
    # SPO (Xu et al., arXiv 2509.13232): the smallest group TRL allows, the tracked baseline, advantages normalised over
    # the update, and each generation batch's prompts drawn by sqrt(p(1-p)) + 0.05 from the tracker.
    "spo": (
        "SPO n=2",
        {
            "sampler": "spo",
            "num_generations": 2,
            "baseline": "tracked",
            "scale_rewards": "none",
            "normalize_advantages": True,
        },
    ),
    # Replayed successes (AR3PO, arXiv 2509.25808; ExGRPO, arXiv 2510.02245): a prompt whose draws all came back wrong
    # trains on its latest stored correct completion, so DAPO keeps it instead of refilling, and Seq-balance's
    # all-wrong pools get a positive.
    "dapo_replay": (
        "DAPO, replayed successes",
        {"sampler": "dapo", "num_generations": 4, "dapo_on_exhausted": "keep_partial", "replay": "successes"},
    ),
    "seq_balance_replay": (
        "Seq-balance, replayed successes",
        {"sampler": "seq_balance", "num_generations": 4, "round_size": 8, "max_rounds": 4, "replay": "successes"},
    ),
    # SPO with a weak Beta(0.1, 0.1) prior: a prompt never solved reads close to 0, as SPO's tracker initialised from
    # offline draws does, instead of 1 / (N + 2) under Beta(1, 1); both its baseline and its priority follow.
    "spo_weak_prior": (
        "SPO n=2, Beta(0.1, 0.1) prior",
        {
            "sampler": "spo",
            "num_generations": 2,
            "baseline": "tracked",
            "scale_rewards": "none",
            "normalize_advantages": True,
            "pass_rate_prior_alpha": 0.1,
            "pass_rate_prior_beta": 0.1,
        },
    ),
    # SPO's ablation: the same group and baseline in TRL's shuffled order, so the difference is the priority draw.
    "spo_shuffled": (
        "SPO n=2, shuffled order",
        {
            "sampler": "uniform",
            "num_generations": 2,
            "baseline": "tracked",
            "scale_rewards": "none",
            "normalize_advantages": True,
        },
    ),
}
BUILT_IN_METHODS = dict(METHODS)
RECOMMENDED = "dapo"
"""The method README's "Which sampler should I use" recommends for a finite prompt set; `recommended` runs it."""
METHODS["recommended"] = (f"Recommended ({METHODS[RECOMMENDED][0]})", METHODS[RECOMMENDED][1])
TOURNAMENT_METHODS = ["grpo_n4", "grpo_n16", "dapo", "seq_balance", "knapsack", "dapo_gated", "dapo_gated_fitted"]
"""The tournament, read at equal completions (`--completions_budget`)."""
BUDGET_EVAL_POINTS = 8
"""With `--completions_budget`, the held-out is measured each time a run crosses another eighth of the budget."""

# The stream comparison's default methods (its published table); the finite comparison adds the round policy and the
# authors' setting.
STREAM_METHODS = ["grpo_n4", "grpo_n8", "grpo_n16", "dapo", "seq_pos", "seq_balance", "seq_balance_log", "est"]
FINITE_METHODS = [
    "grpo_n4",
    "grpo_n8",
    "grpo_n16",
    "dapo",
    "seq_pos",
    "seq_balance",
    "seq_balance_tracked",
    "est",
    "seq_balance_log",
    "seq_balance_authors",
]
# The predictor comparison (both testbeds): Est and Seq-balance with and without the learned predictor, DAPO, GRPO.
PREDICTOR_METHODS = ["grpo_n4", "grpo_n16", "dapo", "seq_balance", "seq_balance_learned", "est", "est_learned"]
# Reinforce-Ada's own methods: the candidates for "best adaptive method" (DAPO is the peer baseline, not one of them).
ADAPTIVE_METHODS = (
    "seq_pos",
    "seq_balance",
    "seq_balance_tracked",
    "seq_balance_predictive",
    "est",
    "seq_balance_log",
    "seq_balance_authors",
    "est_learned",
    "seq_balance_learned",
)
# Paired differences are taken against these, when they ran.
PAIRED_REFERENCES = ("dapo", "grpo_n4")
TASKS = ("arithmetic", "trace")
"""`--task`: the one-shot arithmetic testbed (`trl_ada.tiny`) or the trace-arithmetic one (finite mode only)."""


def task_parts(task: str) -> tuple[Any, Any, int]:
    """A task's model loader, reward function and completion length in tokens."""
    if task == "trace":
        from trl_ada.tasks.trace_arithmetic import MAX_COMPLETION_LENGTH, final_answer_reward, load_tiny_trace_model

        return load_tiny_trace_model, final_answer_reward, MAX_COMPLETION_LENGTH
    from trl_ada.tasks.arithmetic import exact_match_reward
    from trl_ada.tiny import load_tiny_arith_model

    return load_tiny_arith_model, exact_match_reward, 8


def heldout_pass_rates(
    task: str, model: Any, tokenizer: Any, problems: Sequence[dict], *, num_samples: int, seed: int
) -> dict[str, Any]:
    """Held-out pass rate at temperature 1, overall and per ``level`` key, as `accuracy_by_level` returns it."""
    from trl_ada.tasks.arithmetic import accuracy_by_level, sample_completions

    if task == "arithmetic":
        return accuracy_by_level(
            model, tokenizer, problems, temperature=1.0, num_samples=num_samples, max_new_tokens=8, seed=seed
        )
    _, reward, max_new_tokens = task_parts(task)
    texts = sample_completions(
        model,
        tokenizer,
        [problem["prompt"] for problem in problems],
        temperature=1.0,
        num_samples=num_samples,
        max_new_tokens=max_new_tokens,
        seed=seed,
        keep_special_tokens=True,
    )
    rewards = reward(texts, [problem["answer"] for problem in problems for _ in range(num_samples)])
    per_level: dict[Any, list[float]] = {}
    for index, value in enumerate(rewards):
        per_level.setdefault(problems[index // num_samples]["level"], []).append(value)
    return {
        "overall": sum(rewards) / len(rewards),
        "per_level": {level: sum(values) / len(values) for level, values in sorted(per_level.items())},
    }


def make_config(
    method: str, seed: int, steps: int, lr: float, out: Path, prompts_per_step: int, max_completion_length: int = 8
) -> Any:
    """The `AdaGRPOConfig` of one run: the method's overrides on the settings every method shares."""
    from trl_ada import AdaGRPOConfig

    overrides = METHODS[method][1]
    return AdaGRPOConfig(
        **training_args(
            str(out / f"{method}-seed{seed}"),
            seed,
            steps,
            lr,
            prompts_per_step * overrides["num_generations"],
            max_completion_length,
        ),
        **overrides,
    )


def training_args(
    output_dir: str, seed: int, steps: int, lr: float, rows_per_step: int, max_completion_length: int
) -> dict[str, Any]:
    """The training arguments every learning benchmark's runs share (a config of any GRPO trainer takes them)."""
    return {
        "output_dir": output_dir,
        "per_device_train_batch_size": rows_per_step,
        "max_completion_length": max_completion_length,
        "temperature": 1.0,
        "learning_rate": lr,
        "lr_scheduler_type": "constant",
        "beta": 0.0,
        "max_steps": steps,
        "logging_steps": 1,
        "save_strategy": "no",
        "report_to": "none",
        "use_cpu": True,
        "bf16": False,
        "disable_tqdm": True,
        "seed": seed,
    }


def draw_accounting(entries: Sequence[dict]) -> dict[str, Any]:
    """
    A run's draws per pass-rate band of the pool summed from the trainer's `ada/draws/*_total`
    counters (`trl_ada.samplers.accounting`), which each log entry holds summed over its window: completions drawn,
    those that served an update group with a signal (useful) and those in it (trained), overall and per band.
    """
    from trl_ada.samplers.accounting import BANDS

    def total(name: str) -> float:
        return math.fsum(entry.get(f"ada/draws/{name}_total") or 0.0 for entry in entries)

    bands = {band: {"drawn": total(f"{band}/drawn"), "useful": total(f"{band}/useful")} for band in BANDS}
    return {
        "total": total("drawn"),
        "useful": total("useful"),
        "trained": total("trained"),
        "bands": {b: v for b, v in bands.items() if v["drawn"]},
    }


def train_seconds(entries: Sequence[dict]) -> float:
    """
    The training seconds of the steps `entries` cover (log entries with TRL's `step_time`, in order from the run's
    first): each entry's `step_time` is the mean over the optimizer steps since the previous entry, so it weighs that
    many steps.
    """
    steps = [entry["step"] for entry in entries]
    return math.fsum(
        entry["step_time"] * (step - previous)
        for entry, step, previous in zip(entries, steps, [0, *steps], strict=False)
    )


def gate_passes(entries: Sequence[dict]) -> float | None:
    """
    The rows DAPO's refill walk stepped past in a run because the sampler predicted them unmixed (`sampler=
    "dapo_gated"`), summed from `ada/dapo/passed_over_total` (each log entry's sum over its window); None for a run
    without a refill. Kept apart from `draws`, which a gated run that passed over nothing shares with DAPO's.
    """
    logged = [entry["ada/dapo/passed_over_total"] for entry in entries if "ada/dapo/passed_over_total" in entry]
    return float(sum(logged)) if logged else None


class EvaluationPlan:
    """
    When a run measures its held-out and when it stops: every `eval_every` steps and at the last step; or, with a
    completions budget, each time the completions drawn cross another `1 / BUDGET_EVAL_POINTS` of it, stopping once
    they reach it (every method then ends at the same completions, whatever it draws per step).
    """

    def __init__(self, steps: int, eval_every: int, budget: int | None) -> None:
        self.steps, self.eval_every, self.budget = steps, eval_every, budget
        self.next_mark = None if budget is None else budget / BUDGET_EVAL_POINTS

    def evaluate_now(self, step: int, completions: float) -> bool:
        if self.budget is None:
            return step % self.eval_every == 0 or step == self.steps
        if completions >= self.budget or step == self.steps:
            return True
        if completions < self.next_mark:
            return False
        while self.next_mark <= completions:
            self.next_mark += self.budget / BUDGET_EVAL_POINTS
        return True

    def stop_now(self, completions: float) -> bool:
        return self.budget is not None and completions >= self.budget


def budget_steps(budget: int | None, steps: int, prompts_per_step: int) -> int:
    """The step cap of a run: `steps`, or with a budget enough for any method drawing 2 or more completions a prompt."""
    return steps if budget is None else max(steps, math.ceil(budget / (2 * prompts_per_step)))


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
    from transformers import TrainerCallback

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

    class HeldOut(TrainerCallback):
        def on_step_end(self, args, state, control, model=None, **kwargs):
            if plan.evaluate_now(state.global_step, scored[0]):
                # samples and train_seconds are filled in after training: on_step_end runs before the step's own
                # log entry is written, so the history here would miss the step the point is taken at.
                curve.append({"step": state.global_step, "heldout": evaluate(model)})
            control.should_training_stop |= plan.stop_now(scored[0])

    dataset = make_dataset(max(steps * PROMPTS_PER_STEP * 2, 4000), seed=seed)
    trainer = AdaGRPOTrainer(
        model,
        [exact_match],
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[HeldOut()],
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
        "start_heldout": start_accuracy,
        "curve": [{"step": 0, "heldout": start_accuracy, "samples": 0.0, "train_seconds": 0.0}, *curve],
        "median_step_seconds": statistics.median(e["step_time"] for e in entries),
        "train_pass_rate": [e.get("ada/pass_rate/mean") for e in entries],
        "draws": draw_accounting(entries),
        "gate_passed_over": gate_passes(entries),
        "completions": scored[0],
        "steps_run": trainer.state.global_step,
    }


def run_settings(settings: dict[str, Any], method: str) -> dict[str, Any]:
    """What one run depends on: the shared settings, and its method's overrides when they are not the built-in ones
    (a `--method_config` may reuse a name with other fields)."""
    if METHODS[method][1] == BUILT_IN_METHODS.get(method, (None, None))[1]:
        return settings
    return {**settings, "overrides": METHODS[method][1]}


def add_method_config(spec: str) -> str:
    """`NAME='{json}'` (`--method_config`) as a method of `METHODS`; `ValueError` naming the fix when it is not one."""
    from dataclasses import fields

    from trl_ada.samplers import SamplerSettings

    name, sep, text = spec.partition("=")
    name = name.strip()
    if not sep or not name.isidentifier():
        raise ValueError(
            f"--method_config {spec!r}: write NAME='{{json}}', NAME a plain word, e.g. my_rule='{{...}}'."
        )
    try:
        overrides = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(
            f"--method_config {name}: the config is not JSON ({error}); quote it: {name}='{{...}}'."
        ) from None
    if not isinstance(overrides, dict) or "sampler" not in overrides:
        raise ValueError(f'--method_config {name}: give a JSON object with at least a "sampler", got {text!r}.')
    overrides = {"num_generations": 4, **overrides}
    known = {field.name for field in fields(SamplerSettings)}
    # The sampler's knobs are checked here, before any run starts; the rest are AdaGRPOConfig's, checked by it.
    SamplerSettings(**{key: value for key, value in overrides.items() if key in known}).validated()
    METHODS[name] = (name, overrides)
    return name


def reusable(path: Path, settings: dict[str, Any]) -> bool:
    """Whether the run at ``path`` finished with exactly ``settings`` (a run without recorded settings is not)."""
    return path.exists() and json.loads(path.read_text()).get("settings") == settings


def first_reach(curve: list[dict], key: str, target: float) -> float:
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


def mean_curve(runs: list[dict]) -> list[dict]:
    """Average the runs of one method point by point (same eval steps)."""
    return [
        {
            key: statistics.fmean(run["curve"][i][key] for run in runs)
            for key in ("step", "heldout", "samples", "train_seconds")
        }
        for i in range(min(len(run["curve"]) for run in runs))
    ]


def summarize(results: list[dict]) -> dict:
    by_method: dict[str, list[dict]] = {}
    for result in results:
        by_method.setdefault(result["method"], []).append(result)
    table = {}
    for method, runs in by_method.items():
        finals = [run["curve"][-1]["heldout"] for run in runs]
        table[method] = {
            "label": runs[0]["label"],
            "seeds": len(runs),
            "final_heldout_mean": statistics.fmean(finals),
            "final_heldout_sd": statistics.stdev(finals) if len(finals) > 1 else 0.0,
            "start_heldout_mean": statistics.fmean(run["start_heldout"] for run in runs),
            "samples_total_mean": statistics.fmean(run["curve"][-1]["samples"] for run in runs),
            "median_step_seconds": statistics.fmean(run["median_step_seconds"] for run in runs),
            "curve": mean_curve(runs),
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


def plot(summary: dict, out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5), dpi=100)
    for key, ax, xlabel in zip(
        ("step", "samples", "train_seconds"),
        axes,
        ("optimizer steps", "completions generated", "training wall time (s, one core)"),
        strict=True,
    ):
        for method in summary["methods"].values():
            curve = method["curve"]
            ax.plot(
                [p[key] for p in curve], [p["heldout"] for p in curve], marker="o", markersize=3, label=method["label"]
            )
        ax.set_xlabel(xlabel)
        ax.set_ylabel("held-out pass rate (T=1)")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle("Tiny arithmetic model: held-out reward against steps, samples and wall time (mean over seeds)")
    fig.tight_layout()
    path = out / "learning_curves.png"
    fig.savefig(path)
    plt.close(fig)
    return path


# ---------------------------------------------------------------------------------------------------------------------
# Finite mode: epochs over a fixed prompt set, held-out pass rate per band, intervals over seeds
# ---------------------------------------------------------------------------------------------------------------------


def load_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of a JSON-lines prompt set (as `recipes/finite-arithmetic/build_data.sh` writes them)."""
    with open(path) as handle:
        return [json.loads(line) for line in handle if line.strip()]


def band_sort_key(band: str) -> tuple[float, int, float]:
    """Orders band labels such as ``"[0, 0]"``, ``"(0, 0.2]"`` by their lower end (closed before open), then upper."""
    try:
        low, high = (float(part) for part in band.strip("[]()").split(","))
    except ValueError:  # not an interval: after the intervals, by name
        return (math.inf, 0, math.inf)
    return (low, 0 if band.startswith("[") else 1, high)


def steps_per_epoch(train_size: int, prompts_per_step: int) -> int:
    """Optimizer steps in one pass over the set: TRL's sampler drops an epoch's last, incomplete batch."""
    return train_size // prompts_per_step


def epoch_visits(visits: Sequence[Sequence[int]], per_epoch: int) -> list[dict[str, int]]:
    """Per epoch: the distinct rows scored and the most steps any row was scored in (1 when no row came twice).

    ``visits[k]`` holds the rows scored during optimizer step ``k`` (its batch, plus DAPO's refills).
    """
    stats = []
    for start in range(0, len(visits), per_epoch):
        counts: dict[int, int] = {}
        for step in visits[start : start + per_epoch]:
            for row in set(step):
                counts[row] = counts.get(row, 0) + 1
        stats.append({"distinct": len(counts), "max_steps_per_row": max(counts.values(), default=0)})
    return stats


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
    from datasets import Dataset
    from transformers import TrainerCallback

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
    # accuracy_by_level groups by its "level" key: handing it the band there gives the per-band pass rates.
    heldout = [{"prompt": row["prompt"], "answer": row["answer"], "level": row["band"]} for row in heldout_rows]
    per_epoch = steps_per_epoch(len(rows), prompts_per_step)
    if per_epoch < 1:
        raise ValueError(f"The training set ({len(rows)} prompts) is smaller than one step ({prompts_per_step}).")
    if len(rows) % prompts_per_step:
        logger.warning(
            "%d prompts, %d per step: each epoch skips %d prompts (a different few each time).",
            len(rows),
            prompts_per_step,
            len(rows) % prompts_per_step,
        )
    steps = budget_steps(completions_budget, steps, prompts_per_step)
    plan = EvaluationPlan(steps, eval_every, completions_budget)
    config = make_config(method, seed, steps, lr, out, prompts_per_step, max_completion_length)
    # prompt and answer, plus level and band when every row has them (the reward ignores them; they ride along).
    keys = ["prompt", "answer", *(key for key in ("level", "band") if all(key in row for row in rows))]
    columns = {key: [row[key] for row in rows] for key in keys}
    dataset = Dataset.from_dict({**columns, "row_index": list(range(len(rows)))})

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

    class HeldOut(TrainerCallback):
        def on_step_end(self, args, state, control, model=None, **kwargs):
            done = sum(scored[: state.global_step])
            if plan.evaluate_now(state.global_step, done):
                curve.append(point(state.global_step, model))
            control.should_training_stop |= plan.stop_now(done)

    trainer = AdaGRPOTrainer(
        model, [exact_match], args=config, train_dataset=dataset, processing_class=tokenizer, callbacks=[HeldOut()]
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
    }


def t_quantile(probability: float, df: int) -> float:
    """The ``probability`` quantile of Student's t with ``df`` degrees of freedom (bisection on its CDF).

    The CDF is the regularised incomplete beta function, evaluated by its continued fraction (Lentz), so no scipy is
    needed; accurate to ~1e-10, e.g. ``t_quantile(0.975, 4) = 2.7764451``.
    """
    if df < 1:
        raise ValueError(f"df must be >= 1, got {df}.")
    if not 0 < probability < 1:
        raise ValueError(f"probability must be in (0, 1), got {probability}.")

    def incomplete_beta(a: float, b: float, x: float, y: float) -> float:
        """I_x(a, b), with ``y = 1 - x`` passed in exactly (it is tiny where the t-CDF is needed most)."""
        if x <= 0:
            return 0.0
        if y <= 0:
            return 1.0
        if x > (a + 1) / (a + b + 2):  # the continued fraction converges fast only below the mean
            return 1.0 - incomplete_beta(b, a, y, x)
        log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log(y)
        tiny = 1e-300
        c, d = 1.0, 1.0 - (a + b) * x / (a + 1)
        d = 1.0 / (d if abs(d) > tiny else tiny)
        fraction = d
        for m in range(1, 300):
            for numerator in (
                m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
            ):
                d = 1.0 + numerator * d
                d = 1.0 / (d if abs(d) > tiny else tiny)
                c = 1.0 + numerator / c
                c = c if abs(c) > tiny else tiny
                fraction *= c * d
            if abs(c * d - 1.0) < 1e-15:
                break
        return math.exp(log_front) * fraction / a

    def upper_tail(t: float) -> float:  # P(T > t) for t >= 0
        return 0.5 * incomplete_beta(df / 2, 0.5, df / (df + t * t), t * t / (df + t * t))

    # The distribution is symmetric: solve in the upper half, where the tail is computed without cancellation.
    if probability == 0.5:
        return 0.0
    tail = 1.0 - probability if probability > 0.5 else probability
    low, high = 0.0, 1.0
    while upper_tail(high) > tail:
        high *= 2
    for _ in range(200):
        middle = (low + high) / 2
        if upper_tail(middle) > tail:
            low = middle
        else:
            high = middle
        if high - low < 1e-12:
            break
    value = (low + high) / 2
    return value if probability > 0.5 else -value


def mean_ci(values: Sequence[float], confidence: float = 0.95) -> dict[str, Any]:
    """Mean and two-sided t-interval over independent values (seeds): ``mean ± t_{(1+c)/2, n-1} · sd / sqrt(n)``.

    Returns ``{"mean", "ci_low", "ci_high", "half_width", "sd", "n"}``; with one value the interval is unknown
    (``None``).
    """
    values = [float(value) for value in values]
    if not values:
        return {"mean": None, "ci_low": None, "ci_high": None, "half_width": None, "sd": None, "n": 0}
    mean = statistics.fmean(values)
    if len(values) < 2:
        return {"mean": mean, "ci_low": None, "ci_high": None, "half_width": None, "sd": None, "n": 1}
    sd = statistics.stdev(values)
    half = t_quantile((1 + confidence) / 2, len(values) - 1) * sd / math.sqrt(len(values))
    return {
        "mean": mean,
        "ci_low": mean - half,
        "ci_high": mean + half,
        "half_width": half,
        "sd": sd,
        "n": len(values),
    }


def paired_difference(runs: Sequence[dict], reference: Sequence[dict], value: Any) -> dict[str, Any]:
    """Mean and t-interval of ``value(run) - value(reference run)`` over the seeds both ran (paired by seed)."""
    by_seed = {run["seed"]: run for run in reference}
    seeds = sorted(run["seed"] for run in runs if run["seed"] in by_seed)
    mine = {run["seed"]: run for run in runs}
    result = mean_ci([value(mine[seed]) - value(by_seed[seed]) for seed in seeds])
    result["seeds"] = seeds
    return result


def _final(run: dict) -> float:
    return run["curve"][-1]["heldout"]


def _final_band(band: str) -> Any:
    return lambda run: run["curve"][-1]["bands"].get(band, math.nan)


def finite_curve(runs: Sequence[dict], bands: Sequence[str]) -> list[dict]:
    """The runs of one method averaged point by point (same evaluation steps), with t-intervals over seeds."""
    points = []
    for i in range(min(len(run["curve"]) for run in runs)):
        overall = mean_ci([run["curve"][i]["heldout"] for run in runs])
        per_band = {band: mean_ci([run["curve"][i]["bands"].get(band, math.nan) for run in runs]) for band in bands}
        points.append(
            {
                **{key: statistics.fmean(run["curve"][i][key] for run in runs) for key in ("step", "epoch")},
                **{
                    key: statistics.fmean(run["curve"][i][key] for run in runs) for key in ("samples", "train_seconds")
                },
                "heldout": overall["mean"],
                "heldout_ci": [overall["ci_low"], overall["ci_high"]],
                "bands": {band: per_band[band]["mean"] for band in bands},
                "bands_ci": {band: [per_band[band]["ci_low"], per_band[band]["ci_high"]] for band in bands},
            }
        )
    return points


def summarize_finite(results: list[dict]) -> dict:
    """Per method: final held-out pass rate overall and per band with 95% t-intervals over seeds, completions and
    time; paired differences against DAPO and GRPO-n4; completions for the best adaptive method to reach GRPO-n16's
    final held-out."""
    by_method: dict[str, list[dict]] = {}
    for result in results:
        by_method.setdefault(result["method"], []).append(result)
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
            "curve": finite_curve(runs, bands),
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


def _fmt(stat: dict[str, Any], signed: bool = False) -> str:
    """``0.462 [0.441, 0.483]`` (or ``+0.012 [-0.004, +0.028]``); the interval is left out when unknown."""
    if stat["mean"] is None or not math.isfinite(stat["mean"]):
        return "n/a"
    spec = "+.3f" if signed else ".3f"
    if stat["ci_low"] is None:
        return format(stat["mean"], spec)
    return f"{stat['mean']:{spec}} [{stat['ci_low']:{spec}}, {stat['ci_high']:{spec}}]"


def finite_table(summary: dict) -> str:
    """The markdown tables of a finite run: final held-out per band, paired differences, the completions ratio."""
    bands = summary["bands"]
    methods = summary["methods"]
    seeds = max((len(method["seeds"]) for method in methods.values()), default=0)
    lines = [
        f"Final held-out pass rate (T=1): mean [95% t-interval over {seeds} seeds]",
        "",
        "| method | seeds | epochs | overall | " + " | ".join(bands) + " | completions | train s | s/step |",
        "|---|---:|---:|---:|" + "---:|" * len(bands) + "---:|---:|---:|",
    ]
    for method in methods.values():
        cells = [_fmt(method["final_heldout"]), *(_fmt(method["final_bands"][band]) for band in bands)]
        lines.append(
            f"| {method['label']} | {len(method['seeds'])} | {method['epochs']:.2f} | "
            + " | ".join(cells)
            + f" | {method['samples_total']['mean']:,.0f} | {method['train_seconds']['mean']:.1f} | "
            f"{method['median_step_seconds']:.3f} |"
        )
    for reference, rows in summary["paired"].items():
        lines += [
            "",
            f"Paired difference against {methods[reference]['label']} (same seed), final held-out: mean [95% t-interval]",
            "",
            "| method | seeds | overall | " + " | ".join(bands) + " |",
            "|---|---:|---:|" + "---:|" * len(bands),
        ]
        for method, row in rows.items():
            cells = [_fmt(row["overall"], signed=True), *(_fmt(row["bands"][band], signed=True) for band in bands)]
            lines.append(
                f"| {methods[method]['label']} | {len(row['overall']['seeds'])} | " + " | ".join(cells) + " |"
            )
    ratio = summary["completions_to_grpo_n16_final"]
    if ratio is not None:
        per_seed = ratio["per_seed_ratio"]
        lines += [
            "",
            f"Completions for the best adaptive method ({methods[ratio['best_adaptive']]['label']}) to reach "
            f"GRPO-n16's final held-out ({ratio['target_heldout']:.3f}): {ratio['samples_best']:,.0f} against "
            f"{ratio['samples_grpo_n16']:,.0f}, ratio **{ratio['ratio']:.3f}** (mean curves); per seed "
            + (
                _fmt(per_seed)
                if per_seed is not None
                else f"reached in {ratio['per_seed_reached']} of {len(ratio['per_seed'])} seeds"
            )
            + ".",
        ]
    return "\n".join(lines) + "\n"


def plot_finite(summary: dict, out: Path) -> list[Path]:
    """``learning_curves.png`` (overall held-out against steps, completions and wall time, 95% bands over seeds) and
    ``band_curves.png`` (held-out per band against steps)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def band_fill(ax: Any, xs: list[float], intervals: list[list[float | None]]) -> None:
        if all(low is not None for low, _ in intervals):
            ax.fill_between(xs, [low for low, _ in intervals], [high for _, high in intervals], alpha=0.15)

    paths = []
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5), dpi=100)
    for key, ax, xlabel in zip(
        ("step", "samples", "train_seconds"),
        axes,
        ("optimizer steps", "completions generated", "training wall time (s, one core)"),
        strict=True,
    ):
        for method in summary["methods"].values():
            curve = method["curve"]
            xs = [p[key] for p in curve]
            ax.plot(xs, [p["heldout"] for p in curve], marker="o", markersize=3, label=method["label"])
            band_fill(ax, xs, [p["heldout_ci"] for p in curve])
        ax.set_xlabel(xlabel)
        ax.set_ylabel("held-out pass rate (T=1)")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle("Finite prompt set: held-out pass rate against steps, completions and wall time (mean, 95% CI)")
    fig.tight_layout()
    paths.append(out / "learning_curves.png")
    fig.savefig(paths[-1])
    plt.close(fig)

    bands = summary["bands"]
    fig, axes = plt.subplots(1, max(len(bands), 1), figsize=(4.2 * max(len(bands), 1), 4), dpi=100, squeeze=False)
    for band, ax in zip(bands, axes[0], strict=False):
        for method in summary["methods"].values():
            curve = method["curve"]
            xs = [p["step"] for p in curve]
            ax.plot(xs, [p["bands"][band] for p in curve], marker="o", markersize=2, label=method["label"])
            band_fill(ax, xs, [p["bands_ci"][band] for p in curve])
        ax.set_title(f"held-out band {band}")
        ax.set_xlabel("optimizer steps")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("held-out pass rate (T=1)")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    paths.append(out / "band_curves.png")
    fig.savefig(paths[-1])
    plt.close(fig)
    return paths


def add_method_arguments(parser: argparse.ArgumentParser, methods: dict, defaults: str, budget_help: str) -> None:
    """The options every learning benchmark shares: which methods (`--methods`, `--method_config`), the equal
    completions stop (`--completions_budget`) and the tournament (`--tournament`)."""
    parser.add_argument(
        "--methods",
        nargs="+",
        default=None,
        help=f"any of {' '.join(methods)}, or a name given by --method_config (default: {defaults}; "
        f"--tournament: {' '.join(TOURNAMENT_METHODS)})",
    )
    parser.add_argument(
        "--method_config",
        action="append",
        default=[],
        metavar="NAME='{json}'",
        help="a method of one's own: AdaGRPOConfig fields as JSON, e.g. "
        """my_rule='{"sampler": "seq_balance", "max_rounds": 2}' (num_generations defaults to 4); repeatable""",
    )
    parser.add_argument(
        "--completions_budget",
        type=int,
        default=None,
        help=f"train every method until it has drawn this many completions (equal completions), {budget_help}",
    )
    parser.add_argument(
        "--tournament",
        action="store_true",
        help=f"the tournament's methods ({' '.join(TOURNAMENT_METHODS)}) unless --methods says otherwise, and the tournament "
        "report (tournament.md / tournament.json: paired differences against DAPO at equal completions and at equal "
        "training time, the useful-draw shares per band); needs --completions_budget",
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="results folder (default: benchmarks/results/learning; finite mode: benchmarks/results/finite/<train set>)",
    )
    add_method_arguments(
        parser,
        METHODS,
        defaults=f"{' '.join(STREAM_METHODS)}; finite mode: {' '.join(FINITE_METHODS)}",
        budget_help=f"measuring the held-out at each {1}/{BUDGET_EVAL_POINTS} of it; --steps/--epochs then only cap "
        "the steps",
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
        "--model",
        type=Path,
        default=None,
        help="a tiny-model directory to start from instead of the task's shipped one",
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
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    for spec in args.method_config:
        try:
            add_method_config(spec)
        except ValueError as error:
            parser.error(str(error))
    if args.tournament and args.completions_budget is None:
        parser.error("--tournament compares methods at equal completions: give --completions_budget (e.g. DAPO's).")
    if args.completions_budget is not None and args.completions_budget < 1:
        parser.error("--completions_budget must be a positive number of completions.")
    if args.methods is None and args.tournament:
        args.methods = list(TOURNAMENT_METHODS)
    unknown = [method for method in args.methods or () if method not in METHODS]
    if unknown:
        parser.error(f"unknown methods {unknown}: choose from {sorted(METHODS)}, or define one with --method_config.")
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
    settings: dict[str, Any] = {"steps": steps, "eval_every": args.eval_every, "learning_rate": args.learning_rate}
    if args.completions_budget is not None:
        settings["completions_budget"] = args.completions_budget
    if args.task != "arithmetic":  # absent for the default, so runs recorded before --task existed still match
        settings["task"] = args.task
    if args.model is not None:  # absent for the shipped model, for the same reason
        if not args.report_only and not (args.model / "config.json").is_file():
            parser.error(
                f"--model {args.model} holds no model (config.json); build one with scripts/build_trace_model.py."
            )
        settings["model"] = str(args.model)

    if is_finite:
        settings |= {
            "train_data": str(args.train_data),
            "heldout_data": str(args.heldout_data),
            "prompts_per_step": prompts_per_step,
            "eval_samples": eval_samples,
        }
    else:
        settings["heldout_size"] = args.heldout_size

    if args.run:  # child process: one run, written as JSON
        method, seed = args.run[0], int(args.run[1])
        with tempfile.TemporaryDirectory() as scratch:  # the trainers' output dirs are not results
            if is_finite:
                result = run_finite(
                    method,
                    seed,
                    args.steps,
                    args.eval_every,
                    args.learning_rate,
                    Path(scratch),
                    train_data=args.train_data,
                    heldout_data=args.heldout_data,
                    eval_samples=eval_samples,
                    prompts_per_step=prompts_per_step,
                    completions_budget=args.completions_budget,
                    task=args.task,
                    model_dir=args.model,
                )
            else:
                result = run_one(
                    method,
                    seed,
                    args.steps,
                    args.eval_every,
                    args.heldout_size,
                    args.learning_rate,
                    Path(scratch),
                    completions_budget=args.completions_budget,
                )
        result["settings"] = run_settings(settings, method)
        (args.out / "runs" / f"{method}-seed{seed}.json").write_text(json.dumps(result))
        return 0

    (args.out / "runs").mkdir(exist_ok=True)
    pending = [(m, s) for s in args.seeds for m in args.methods]
    if args.report_only:
        pending = []
    elif args.reuse_runs:
        pending = [
            (m, s)
            for m, s in pending
            if not reusable(args.out / "runs" / f"{m}-seed{s}.json", run_settings(settings, m))
        ]
        logger.info("Reusing %d finished runs.", len(args.seeds) * len(args.methods) - len(pending))
    running: list[tuple[subprocess.Popen, str, int, float]] = []
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    common = [
        "--out",
        str(args.out),
        "--steps",
        str(steps),
        "--eval_every",
        str(args.eval_every),
        "--heldout_size",
        str(args.heldout_size),
        "--learning_rate",
        str(args.learning_rate),
        "--task",
        args.task,
    ]
    for spec in args.method_config:
        common += ["--method_config", spec]
    if args.completions_budget is not None:
        common += ["--completions_budget", str(args.completions_budget)]
    if is_finite:  # the child gets the step count, not the epochs
        common += ["--train_data", str(args.train_data), "--heldout_data", str(args.heldout_data)]
        if args.model is not None:
            common += ["--model", str(args.model)]
        common += ["--prompts_per_step", str(prompts_per_step), "--eval_samples", str(eval_samples)]
    failed = []
    while pending or running:
        while pending and len(running) < args.jobs:
            method, seed = pending.pop(0)
            log = open(args.out / "runs" / f"{method}-seed{seed}.log", "w")  # noqa: SIM115
            process = subprocess.Popen(
                [sys.executable, __file__, *common, "--run", method, str(seed)], env=env, stdout=log, stderr=log
            )
            running.append((process, method, seed, time.time()))
        time.sleep(1)
        for entry in list(running):
            process, method, seed, started = entry
            if process.poll() is not None:
                running.remove(entry)
                status = "ok" if process.returncode == 0 else f"FAILED ({process.returncode})"
                if process.returncode != 0:
                    failed.append(f"{method}-seed{seed}")
                logger.info("%s seed %d: %s in %.0f s", method, seed, status, time.time() - started)
    results = []
    for method in args.methods:
        for seed in args.seeds:
            # Only runs made with this invocation's settings: an older run in the folder does not slip into a table.
            path = args.out / "runs" / f"{method}-seed{seed}.json"
            if reusable(path, run_settings(settings, method)):
                results.append(json.loads(path.read_text()))
    if args.report_only:
        missing = missing_runs(results, args.methods, args.seeds)
        if missing and args.tournament:  # a tournament paired by seed, built from part of its runs, misleads
            parser.error(
                f"--report_only --tournament: no run with these settings in {args.out / 'runs'} for "
                f"{', '.join(missing)}. Run them (recipes/finite-arithmetic/run_tournament.sh, or these arguments "
                "without --report_only and with --reuse_runs), or give --methods/--seeds that ran."
            )
        if missing:
            logger.warning("--report_only: no run with these settings for %s; the tables leave them out.", missing)
    if args.tournament:
        write_tournament(args.out, results, args.completions_budget)
    if is_finite:
        return report_finite(args, results, steps, prompts_per_step, eval_samples, failed)
    summary = summarize(results)
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
    plot(summary, args.out)
    print(f"{'method':<28}{'seeds':>6}{'start':>8}{'final':>8}{'sd':>7}{'samples':>10}{'s/step':>8}")
    for method in summary["methods"].values():
        print(
            f"{method['label']:<28}{method['seeds']:>6}{method['start_heldout_mean']:>8.3f}"
            f"{method['final_heldout_mean']:>8.3f}{method['final_heldout_sd']:>7.3f}"
            f"{method['samples_total_mean']:>10.0f}{method['median_step_seconds']:>8.3f}"
        )
    for name, value in summary["ratios"].items():
        print(f"{name}: {value:.3f}")
    return 0


def missing_runs(results: Sequence[dict], methods: Sequence[str], seeds: Sequence[int]) -> list[str]:
    """The `METHOD-seedN` runs asked for that `results` lack."""
    have = {(run["method"], run["seed"]) for run in results}
    return [f"{method}-seed{seed}" for method in methods for seed in seeds if (method, seed) not in have]


def heldout_at(run: dict, key: str, value: float) -> float:
    """The run's held-out where its `key` (`train_seconds`, `samples`) reaches `value`, linear between evaluations;
    past its last evaluation, the last held-out."""
    curve = run["curve"]
    for before, after in zip(curve, curve[1:]):
        if after[key] >= value:
            span = after[key] - before[key]
            share = 1.0 if span <= 0 else max(0.0, value - before[key]) / span
            return before["heldout"] + share * (after["heldout"] - before["heldout"])
    return curve[-1]["heldout"]


def heldout_at_seconds(run: dict, seconds: float) -> float | None:
    """The run's held-out at `seconds` of training (linear between its evaluations); None if it stopped before."""
    if run["curve"][-1]["train_seconds"] < seconds:
        return None
    return heldout_at(run, "train_seconds", seconds)


def heldout_at_completions(run: dict, completions: float) -> float | None:
    """The run's held-out at `completions` drawn, linear between the two evaluations around them; None if its curve
    ended short of them (a reading there would be an extrapolation)."""
    if run["curve"][-1]["samples"] < completions:
        return None
    return heldout_at(run, "samples", completions)


def curve_to_budget(curve: list[dict], budget: float) -> list[dict]:
    """A curve's evaluations before `budget` completions and, if it got there, its reading at the budget: a run's last
    evaluation lies up to a step's draws past the budget, completions the other methods did not get."""
    kept = [{"samples": point["samples"], "heldout": point["heldout"]} for point in curve if point["samples"] < budget]
    reading = heldout_at_completions({"curve": curve}, budget)
    if reading is not None:
        kept.append({"samples": float(budget), "heldout": reading})
    return kept


def mean_curve_to_budget(runs: Sequence[dict], budget: float) -> list[dict]:
    """The runs' curves read at each `1 / BUDGET_EVAL_POINTS` of the budget and averaged, up to the last point every
    run reached (a run that ended short is not extrapolated)."""
    points = []
    for k in range(BUDGET_EVAL_POINTS + 1):
        completions = budget * k / BUDGET_EVAL_POINTS
        readings = [heldout_at_completions(run, completions) for run in runs]
        if any(reading is None for reading in readings):
            break
        points.append({"samples": completions, "heldout": statistics.fmean(readings)})
    return points


def tournament_summary(results: list[dict], budget: int, reference: str = "dapo") -> dict[str, Any]:
    """
    The tournament: per method, the held-out at the completions budget (`final`: each curve read at the budget,
    linear between the evaluations around it; a run that ended short of it is listed in `short_of_budget` and left
    out) and at the reference's mean training time, each as a mean with its 95% interval and as a paired (same-seed)
    difference against the reference; the completions a method's mean curve needs to reach the reference's level at
    the budget, over the reference's own mean curve's (`to_reference_final`; the reference's row reads 1 by
    construction); the completions, training seconds and draw accounting (useful and trained shares, per band)
    summed over seeds.
    """
    by_method: dict[str, list[dict]] = {}
    for run in results:
        by_method.setdefault(run["method"], []).append(run)

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
            "short_of_budget": sorted(
                (
                    {"seed": run["seed"], "completions": run["curve"][-1]["samples"]}
                    for run in runs
                    if at_budget(run) is None
                ),
                key=lambda entry: entry["seed"],
            ),
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
            # A rule can draw exactly what the reference draws (dapo_gated where no prompt it would pass over comes
            # back: the code task's 5 seeds): same draws and held-out at every evaluation, seed for seed. Said, not
            # hidden in a difference of 0.000.
            paired = [(run, ref_by_seed[run["seed"]]) for run in runs if run["seed"] in ref_by_seed]
            row["identical_to_reference"] = bool(paired) and all(same_run(run, ref) for run, ref in paired)
            # Equal time, per seed: both curves read at the training time both runs reached (the shorter run's total;
            # every run stops at the budget, so the faster method cannot be read later).
            differences, seeds = [], []
            for run in runs:
                ref = ref_by_seed.get(run["seed"])
                if ref is None:
                    continue
                common = min(run["curve"][-1]["train_seconds"], ref["curve"][-1]["train_seconds"])
                differences.append(heldout_at_seconds(run, common) - heldout_at_seconds(ref, common))
                seeds.append(run["seed"])
            row["minus_reference_at_equal_time"] = {**mean_ci(differences), "seeds": seeds}
        methods[method] = row
    return {"budget": budget, "reference": reference, "reference_seconds": ref_seconds, "methods": methods}


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
    lines = [
        f"Every run stops once it has drawn {summary['budget']:,} completions, and each curve is read at exactly that "
        "many (equal completions; linear between the evaluations around it, since a run's last step overshoots by up "
        f"to a step's draws); 'at equal time' reads a method's curve and {reference}'s of the same seed at the "
        "training time both reached (the shorter run's). Differences are paired by seed, with 95% t-intervals. "
        f"'Completions to {reference}'s final': the completions at which the method's mean curve first reaches "
        f"{reference}'s mean held-out at the budget, over those {reference}'s own mean curve needs ({reference}: "
        "1.00x by construction); in brackets, the seeds whose own curve reached it within the budget.",
        "",
        f"| method | seeds | held-out at equal completions | - {reference} | - {reference} at equal time | completions | "
        f"training s | useful draws | trained draws | completions to {reference}'s final (seeds) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in summary["methods"].values():
        diff = _fmt(row["minus_reference"], signed=True) if "minus_reference" in row else "-"
        at_time = row.get("minus_reference_at_equal_time")
        timed = "-" if at_time is None else _fmt(at_time, signed=True)
        label = row["label"]
        if row.get("identical_to_reference"):
            seeds = ", ".join(str(seed) for seed in row["seeds"])
            label += (
                f" (= {reference} run for run: same draws and held-out, seed{'s' * (len(row['seeds']) > 1)} {seeds})"
            )
        seeds_cell = str(len(row["seeds"]))
        if row.get("short_of_budget"):  # runs written before the reading at the budget lack it
            seeds_cell += f" ({len(row['short_of_budget'])} short)"
        lines.append(
            f"| {label} | {seeds_cell} | {_fmt(row['final'])} | {diff} | {timed} | "
            f"{row['completions']:,.0f} | {row['train_seconds']:.1f} | {row['useful_share']:.3f} | "
            f"{row['trained_share']:.3f} | {_reach(row.get('to_reference_final'))} |"
        )
    short = [
        (row["label"], row["short_of_budget"]) for row in summary["methods"].values() if row.get("short_of_budget")
    ]
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
        "| method | " + " | ".join(BANDS) + " |",
        "|---|" + "---:|" * len(BANDS),
    ]
    for row in summary["methods"].values():
        cells = []
        for band in BANDS:
            entry = row["bands"].get(band)
            cells.append("-" if entry is None else f"{entry['share']:.3f} ({entry['useful_share']:.2f})")
        lines.append(f"| {row['label']} | " + " | ".join(cells) + " |")
    gates = [
        (row["label"], row["gate_passed_over"]) for row in summary["methods"].values() if "gate_passed_over" in row
    ]
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


def write_tournament(out: Path, results: list[dict], budget: int) -> None:
    """Writes `tournament.json` and `tournament.md` under `out` and prints the table."""
    if not results:
        return
    summary = tournament_summary(results, budget)
    (out / "tournament.json").write_text(json.dumps(summary, indent=1))
    table = tournament_table(summary)
    (out / "tournament.md").write_text(table)
    print(table)


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
        "train_data": str(args.train_data),
        "heldout_data": str(args.heldout_data),
        "epochs": args.epochs,
        "steps": steps,
        "prompts_per_step": prompts_per_step,
        "eval_every": args.eval_every,
        "eval_samples": eval_samples,
        "learning_rate": args.learning_rate,
        "seeds": args.seeds,
        "methods": args.methods,
    }
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
