"""
Learning comparison on the CPU code task (`trl_ada.tasks.code_synthesis`), scored by the sandboxed code reward.

The warm-started tiny code model (`load_tiny_code_model`: noisy-label SFT, built and cached on first use) trains on a
stream of program-synthesis prompts from all six levels (drawn with replacement, so a few come back) with GRPO n=4,
GRPO n=16, DAPO n=4 and Seq-balance (n=4, rounds of 8, at most 4), the same learning rate, steps and prompts per step,
several seeds. Every completion is scored by `CodeExecutionReward` in the bubblewrap sandbox (all-or-nothing over 4
shown and 4 hidden test inputs), at the reward's default concurrency (one sandbox per CPU). Every `--eval_every` steps
each run measures its held-out pass rate: `--eval_samples` completions at temperature 1 per prompt of a fixed held-out
set, scored in the sandbox (each distinct expression once per prompt). Runs are one child process each, one at a time,
one torch thread each (the other core runs the sandboxes).

The report (`table.md`, `summary.json` in `--out`): per method the final held-out pass rate with a 95% t-interval
over seeds, per level, completions drawn and training seconds (the trainer's `step_time`, evaluation excluded);
paired (same-seed) differences against DAPO; the mean curves against completions and against training seconds; and
the reward's share of a training step (time inside the reward function / step time, median over steps), from the
learning runs (default concurrency) and from short extra runs at `--share_concurrency` sandbox workers.

    nice -n 10 python benchmarks/code_learning.py --seeds 0 1 2 [--steps 60 --prompts_per_step 8]
    nice -n 10 python benchmarks/code_learning.py --share_only --share_concurrency 1 2   # only the reward share

Runs already in `OUT/runs/` with the same settings are reused (`--reuse_runs`), so seeds can be added in separate
invocations; the report is rebuilt from every matching run.

The tournament (`--tournament --completions_budget N`, as in `scripts/benchmark_learning.py`): GRPO n=4 and
n=16, DAPO, Seq-balance, Knapsack-RL and DAPO with a gated refill (or `--methods`, plus any `--method_config
NAME='{json}'`), every run stopped once it has drawn N completions, the held-out measured each time it crosses another
eighth of N; `tournament.md` / `tournament.json` hold the same columns as the arithmetic testbeds' (held-out at equal
completions, paired differences against DAPO at equal completions and at equal training time, useful draws).

    nice -n 10 python benchmarks/code_learning.py --tournament --completions_budget 4683 --seeds 0 1 2 3 4 \
        --out benchmarks/results/code-tournament --reuse_runs      # or: recipes/finite-arithmetic/run_tournament.sh code
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import benchmark_learning  # noqa: E402
from benchmark_learning import (  # noqa: E402
    EvaluationPlan,
    add_method_arguments,
    add_method_config,
    budget_steps,
    draw_accounting,
    first_reach,
    gate_passes,
    mean_ci,
    missing_runs,
    paired_difference,
    write_tournament,
)

logger = logging.getLogger("code_learning")

DEFAULT_OUT = ROOT / "benchmarks" / "results" / "code_learning"

# name -> (label, AdaGRPOConfig overrides); the update group is n=4 for every method but GRPO n=16.
METHODS: dict[str, tuple[str, dict[str, Any]]] = {
    "grpo_n4": ("GRPO n=4", {"sampler": "uniform", "num_generations": 4}),
    "grpo_n16": ("GRPO n=16", {"sampler": "uniform", "num_generations": 16}),
    "dapo": ("DAPO n=4", {"sampler": "dapo", "num_generations": 4, "dapo_on_exhausted": "keep_partial"}),
    "seq_balance": (
        "Seq-balance n=4 (rounds of 8, at most 4)",
        {"sampler": "seq_balance", "num_generations": 4, "round_size": 8, "max_rounds": 4},
    ),
    # The tournament's entries, the arithmetic benchmark's configurations. The task's problems are drawn with
    # replacement and a run meets few of them twice (BENCHMARKS.md counts the repeats), so the gated refill seldom has
    # a visit to judge a prompt by and mostly draws what DAPO draws, and Knapsack-RL gives most prompts their
    # first-visit budget of num_generations.
    "knapsack": benchmark_learning.METHODS["knapsack"],
    "dapo_gated": benchmark_learning.METHODS["dapo_gated"],
}
BUILT_IN_METHODS = dict(METHODS)
DEFAULT_METHODS = ["grpo_n4", "grpo_n16", "dapo", "seq_balance"]
"""The published code table's methods (`--methods` without `--tournament`)."""
TOURNAMENT_METHODS = ["grpo_n4", "grpo_n16", "dapo", "seq_balance", "knapsack", "dapo_gated"]
"""The tournament on this task (`--tournament`), read at equal completions (`--completions_budget`)."""
SHARE_METHODS = ("grpo_n4", "seq_balance")


# ---------------------------------------------------------------------------------------------------------------------
# One run (in a child process)
# ---------------------------------------------------------------------------------------------------------------------


def run_one(spec: dict[str, Any]) -> dict[str, Any]:
    """One training run; ``spec`` holds the method, seed and shared settings. Returns its curve and per-step times."""
    import torch
    from transformers import PrinterCallback, TrainerCallback

    from trl_ada import AdaGRPOConfig, AdaGRPOTrainer
    from trl_ada.tasks.code_synthesis import (
        CodeSynthesisReward,
        held_out_problems,
        load_tiny_code_model,
        make_dataset,
        pass_rate_by_level,
    )

    torch.set_num_threads(1)
    method, seed = spec["method"], spec["seed"]
    # The parent hands over the method itself: a --method_config one is not in this process's METHODS.
    label, overrides = spec["label"], spec["overrides"]
    prompts = spec["prompts_per_step"]
    budget = spec.get("completions_budget")
    steps = budget_steps(budget, spec["steps"], prompts)
    plan = EvaluationPlan(steps, spec["eval_every"], budget)
    model, tokenizer = load_tiny_code_model()
    reward = CodeSynthesisReward(**({"concurrency": spec["concurrency"]} if spec.get("concurrency") else {}))
    eval_reward = CodeSynthesisReward()
    heldout = held_out_problems(spec["heldout_size"], seed=1234) if spec["eval_every"] or budget else []
    config = AdaGRPOConfig(
        **benchmark_learning.training_args(
            tempfile.mkdtemp(prefix=f"code_learning-{method}-seed{seed}-"),  # nothing is saved there
            seed,
            steps,
            spec["learning_rate"],
            prompts * overrides["num_generations"],
            12,
        ),
        **overrides,
    )
    # Prompts with room for DAPO's refills. Under a budget a run uses at most budget / 2 prompts (every method
    # draws 2 or more completions a prompt, as budget_steps assumes): sizing by its raised step cap would only slow the
    # set's generation (28k problems at the code table's budget, half a minute).
    dataset = make_dataset(max(spec["steps"] * prompts * 12, 2000, budget or 0), seed=seed)

    per_step: list[dict[str, float]] = []
    curve: list[dict[str, Any]] = []
    last = {"seconds": 0.0, "completions": 0}

    def evaluate(trainer_model: Any) -> dict[str, Any]:
        result = pass_rate_by_level(
            trainer_model,
            tokenizer,
            heldout,
            reward=eval_reward,
            temperature=1.0,
            num_samples=spec["eval_samples"],
            seed=seed,
        )
        return {"heldout": result["overall"], "levels": {str(k): v for k, v in result["per_level"].items()}}

    class Record(TrainerCallback):
        def on_step_end(self, args, state, control, model=None, **kwargs):
            per_step.append(
                {
                    "reward_seconds": reward.seconds - last["seconds"],
                    "completions": float(reward.completions - last["completions"]),
                }
            )
            last["seconds"], last["completions"] = reward.seconds, reward.completions
            # reward.completions: every completion drawn, each scored once (rounds and refills included).
            if heldout and plan.evaluate_now(state.global_step, reward.completions):
                curve.append({"step": state.global_step, **evaluate(model)})
            control.should_training_stop |= plan.stop_now(reward.completions)

    trainer = AdaGRPOTrainer(
        model, [reward], args=config, train_dataset=dataset, processing_class=tokenizer, callbacks=[Record()]
    )
    trainer.remove_callback(PrinterCallback)  # every step's log dict on stdout; the run's JSON keeps what matters
    started = time.perf_counter()
    start_point = {"step": 0, **evaluate(trainer.model)} if heldout else None
    trainer.train()
    shutil.rmtree(config.output_dir, ignore_errors=True)
    run_seconds = time.perf_counter() - started
    entries = [e for e in trainer.state.log_history if "step_time" in e]
    if len(entries) != len(per_step):
        raise RuntimeError(f"{len(entries)} logged steps but {len(per_step)} recorded ones")
    for entry, record in zip(entries, per_step, strict=True):
        record["step_time"] = entry["step_time"]
        record["share"] = record["reward_seconds"] / entry["step_time"] if entry["step_time"] > 0 else math.nan
        for key in ("ada/zero_variance_share/first_n", "ada/zero_variance_share/kept", "ada/samples_per_prompt/mean"):
            if key in entry:
                record[key.removeprefix("ada/")] = entry[key]
    points = [start_point, *curve] if start_point else []
    for point in points:
        done = per_step[: point["step"]]
        point["samples"] = sum(r["completions"] for r in done)
        point["train_seconds"] = sum(r["step_time"] for r in done)
    load = os.getloadavg()
    return {
        "method": method,
        "label": label,
        "seed": seed,
        "settings": settings_of(spec),
        "curve": points,
        "per_step": per_step,
        "draws": draw_accounting(entries),
        "gate_passed_over": gate_passes(entries),
        "completions": reward.completions,
        "median_step_seconds": statistics.median(r["step_time"] for r in per_step),
        "median_reward_share": statistics.median(r["share"] for r in per_step),
        "reward_concurrency": reward.reward.concurrency,
        "run_seconds": run_seconds,
        "load_average_at_end": load,
    }


def controls(heldout_size: int, eval_samples: int) -> dict[str, Any]:
    """The starting model's held-out pass rate at temperature 1, 0.5 and greedy: how much of any RL gain is
    sharpening (what a lower temperature gives for free)."""
    import torch

    from trl_ada.tasks.code_synthesis import (
        CodeSynthesisReward,
        held_out_problems,
        load_tiny_code_model,
        pass_rate_by_level,
    )

    torch.set_num_threads(1)
    model, tokenizer = load_tiny_code_model()
    reward = CodeSynthesisReward()
    heldout = held_out_problems(heldout_size, seed=1234)
    result = {}
    for name, temperature in (("t1", 1.0), ("t0.5", 0.5), ("greedy", 0.0)):
        samples = eval_samples if temperature > 0 else 1
        rate = pass_rate_by_level(
            model, tokenizer, heldout, reward=reward, temperature=temperature, num_samples=samples, seed=0
        )
        result[name] = {"overall": rate["overall"], "per_level": {str(k): v for k, v in rate["per_level"].items()}}
    return result


def settings_of(spec: dict[str, Any]) -> dict[str, Any]:
    """What a run's result depends on besides its method and seed: `--reuse_runs` and the report keep a run only when
    these match. The budget and the method's overrides are in only when set and not built in, so runs recorded before
    they existed still match."""
    keys = ("steps", "prompts_per_step", "learning_rate", "eval_every", "heldout_size", "eval_samples", "concurrency")
    settings = {key: spec.get(key) for key in keys}
    if spec.get("completions_budget") is not None:
        settings["completions_budget"] = spec["completions_budget"]
    method, overrides = spec.get("method"), spec.get("overrides")
    if method is not None and overrides is not None and overrides != BUILT_IN_METHODS.get(method, (None, None))[1]:
        settings["overrides"] = overrides  # a --method_config may reuse a name with other fields
    return settings


def method_spec(base: dict[str, Any], method: str, seed: int) -> dict[str, Any]:
    """One run's spec: the shared settings, the method (its label and overrides travel with it) and the seed."""
    label, overrides = METHODS[method]
    return {**base, "method": method, "label": label, "overrides": overrides, "seed": seed}


def launch(spec: dict[str, Any], path: Path) -> dict[str, Any]:
    """Runs ``spec`` in a child process (one at a time) and returns what it wrote to ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    spec_path = path.with_suffix(".spec.json")
    spec_path.write_text(json.dumps(spec))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    started = time.perf_counter()
    subprocess.run([sys.executable, __file__, "--_run", str(spec_path), str(path)], check=True, env=env)
    spec_path.unlink()
    result = json.loads(path.read_text())
    logger.info(
        "%s seed %d: %.0f s, median step %.2f s, reward share %.2f%s",
        spec["method"],
        spec["seed"],
        time.perf_counter() - started,
        result["median_step_seconds"],
        result["median_reward_share"],
        f", held-out {result['curve'][0]['heldout']:.3f} -> {result['curve'][-1]['heldout']:.3f}"
        if result["curve"]
        else "",
    )
    return result


# ---------------------------------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------------------------------


def _final(run: dict) -> float:
    return run["curve"][-1]["heldout"]


def mean_curve(runs: list[dict]) -> list[dict[str, Any]]:
    points = []
    for i in range(min(len(run["curve"]) for run in runs)):
        stat = mean_ci([run["curve"][i]["heldout"] for run in runs])
        points.append(
            {
                **{key: statistics.fmean(run["curve"][i][key] for run in runs) for key in ("step", "samples")},
                "train_seconds": statistics.fmean(run["curve"][i]["train_seconds"] for run in runs),
                "heldout": stat["mean"],
                "heldout_ci": [stat["ci_low"], stat["ci_high"]],
            }
        )
    return points


def summarize(runs: list[dict], shares: list[dict]) -> dict[str, Any]:
    by_method: dict[str, list[dict]] = {}
    for run in runs:
        by_method.setdefault(run["method"], []).append(run)
    methods: dict[str, Any] = {}
    for method in METHODS:
        if method not in by_method:
            continue
        group = sorted(by_method[method], key=lambda run: run["seed"])
        levels = sorted(group[0]["curve"][-1]["levels"], key=int)
        methods[method] = {
            "label": group[0]["label"],
            "seeds": [run["seed"] for run in group],
            "start_heldout": mean_ci([run["curve"][0]["heldout"] for run in group]),
            "final_heldout": mean_ci([_final(run) for run in group]),
            "final_levels": {level: mean_ci([run["curve"][-1]["levels"][level] for run in group]) for level in levels},
            "completions": mean_ci([run["curve"][-1]["samples"] for run in group]),
            "train_seconds": mean_ci([run["curve"][-1]["train_seconds"] for run in group]),
            "median_step_seconds": mean_ci([run["median_step_seconds"] for run in group]),
            "median_reward_share": mean_ci([run["median_reward_share"] for run in group]),
            "reward_concurrency": group[0]["reward_concurrency"],
            "zero_variance_first_n": mean_ci(
                [
                    statistics.fmean(r["zero_variance_share/first_n"] for r in run["per_step"])
                    for run in group
                    if all("zero_variance_share/first_n" in r for r in run["per_step"])
                ]
            ),
            "curve": mean_curve(group),
        }
    paired = {}
    if "dapo" in by_method:
        paired = {
            method: paired_difference(by_method[method], by_method["dapo"], _final)
            for method in methods
            if method != "dapo"
        }
    reach = {}
    if "grpo_n16" in methods:
        target = methods["grpo_n16"]["final_heldout"]["mean"]
        for method, row in methods.items():
            reach[method] = {
                key: first_reach(row["curve"], key, target) for key in ("step", "samples", "train_seconds")
            }
        reach = {"target": target, "by_method": reach}
    share_rows: dict[str, Any] = {}
    for share in shares:
        key = f"{share.get('source', 'short runs')}:{share['method']}@{share['reward_concurrency']}"
        share_rows.setdefault(key, []).append(share)
    share_table = {
        key: {
            "method": group[0]["method"],
            "label": group[0]["label"],
            "source": group[0].get("source", "short runs"),
            "runs": len(group),
            "concurrency": group[0]["reward_concurrency"],
            "steps": len(group[0]["per_step"]),
            "median_share": statistics.fmean(run["median_reward_share"] for run in group),
            "median_step_seconds": statistics.fmean(run["median_step_seconds"] for run in group),
            "median_reward_seconds": statistics.fmean(
                statistics.median(r["reward_seconds"] for r in run["per_step"]) for run in group
            ),
            "completions_per_step": statistics.fmean(
                statistics.fmean(r["completions"] for r in run["per_step"]) for run in group
            ),
        }
        for key, group in sorted(share_rows.items())
    }
    return {"methods": methods, "paired_vs_dapo": paired, "reach_grpo_n16_final": reach, "reward_share": share_table}


def _fmt(stat: dict[str, Any], spec: str = ".3f") -> str:
    if stat.get("mean") is None or not math.isfinite(stat["mean"]):
        return "n/a"
    if stat.get("ci_low") is None:
        return format(stat["mean"], spec)
    return f"{stat['mean']:{spec}} [{stat['ci_low']:{spec}}, {stat['ci_high']:{spec}}]"


def table(summary: dict[str, Any], meta: dict[str, Any]) -> str:
    """The markdown report."""
    from trl_ada.tasks.code_synthesis import LEVELS

    methods = summary["methods"]
    lines = [
        f"Code task, {meta['steps']} steps of {meta['prompts_per_step']} prompts, lr {meta['learning_rate']}, "
        f"held-out {meta['heldout_size']} prompts x {meta['eval_samples']} samples at T=1, sandboxed reward; "
        "mean [95% t-interval over seeds]",
        "",
    ]
    if methods:
        levels = sorted({level for row in methods.values() for level in row["final_levels"]}, key=int)
        lines += [
            "| method | seeds | start | final held-out | "
            + " | ".join(LEVELS[int(level)] for level in levels)
            + " | completions | train s | median step s | reward share of step |",
            "|---|---:|---:|---:|" + "---:|" * len(levels) + "---:|---:|---:|---:|",
        ]
        for row in methods.values():
            lines.append(
                f"| {row['label']} | {len(row['seeds'])} | {row['start_heldout']['mean']:.3f} | "
                f"{_fmt(row['final_heldout'])} | "
                + " | ".join(f"{row['final_levels'][level]['mean']:.3f}" for level in levels)
                + f" | {row['completions']['mean']:,.0f} | {row['train_seconds']['mean']:.0f} | "
                f"{row['median_step_seconds']['mean']:.2f} | {row['median_reward_share']['mean']:.2f} |"
            )
    start = summary.get("start_model_controls")
    if start:
        lines += [
            "",
            "The starting model on the same held-out set (the control: what sharpening alone gives): "
            + ", ".join(f"{name} {start[name]['overall']:.3f}" for name in ("t1", "t0.5", "greedy") if name in start),
        ]
    if summary["paired_vs_dapo"]:
        lines += ["", "Paired differences against DAPO (same seed), final held-out:", "", "| method | difference |"]
        lines.append("|---|---:|")
        for method, stat in summary["paired_vs_dapo"].items():
            lines.append(f"| {methods[method]['label']} - DAPO | {_fmt(stat, '+.3f')} |")
    reach = summary["reach_grpo_n16_final"]
    if reach:
        lines += [
            "",
            f"First reaching GRPO n=16's final held-out ({reach['target']:.3f}) on the mean curves (interpolated; "
            "inf: never):",
            "",
            "| method | steps | completions | train s |",
            "|---|---:|---:|---:|",
        ]
        for method, row in reach["by_method"].items():
            lines.append(
                f"| {methods[method]['label']} | {row['step']:.0f} | {row['samples']:,.0f} | {row['train_seconds']:.0f} |"
            )
    if summary["reward_share"]:
        lines += [
            "",
            "Reward share of a training step (time inside the reward function / step time, median over steps):",
            "",
            "| method | measured in | sandbox workers | steps x runs | completions / step | median step s | "
            "median reward s | share |",
            "|---|---|---:|---:|---:|---:|---:|---:|",
        ]
        for row in summary["reward_share"].values():
            lines.append(
                f"| {row['label']} | {row['source']} | {row['concurrency']} | {row['steps']} x {row['runs']} | "
                f"{row['completions_per_step']:.1f} | "
                f"{row['median_step_seconds']:.2f} | {row['median_reward_seconds']:.2f} | {row['median_share']:.2f} |"
            )
    return "\n".join(lines) + "\n"


def plot(summary: dict[str, Any], out: Path) -> Path | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    figure, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for row in summary["methods"].values():
        curve = row["curve"]
        for axis, key in zip(axes, ("step", "samples", "train_seconds"), strict=True):
            xs = [p[key] for p in curve]
            axis.plot(xs, [p["heldout"] for p in curve], marker="o", label=row["label"])
            lows = [p["heldout_ci"][0] for p in curve]
            if all(v is not None for v in lows):
                axis.fill_between(xs, lows, [p["heldout_ci"][1] for p in curve], alpha=0.15)
    for axis, name in zip(axes, ("optimizer steps", "completions drawn", "training seconds"), strict=True):
        axis.set_xlabel(name)
        axis.set_ylabel("held-out pass rate (T=1)")
        axis.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    figure.suptitle("Code task (sandboxed reward): held-out pass rate, mean and 95% t-interval over seeds")
    figure.tight_layout()
    path = out / "learning_curves.png"
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


# ---------------------------------------------------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    add_method_arguments(
        parser,
        METHODS,
        defaults=" ".join(DEFAULT_METHODS),
        budget_help="measuring the held-out each time it crosses another eighth of it; --steps then only sets a floor "
        "on the step cap",
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--prompts_per_step", type=int, default=8)
    parser.add_argument("--learning_rate", type=float, default=2e-4)
    parser.add_argument("--eval_every", type=int, default=20)
    parser.add_argument("--heldout_size", type=int, default=300, help="held-out prompts (50 per level by default)")
    parser.add_argument("--eval_samples", type=int, default=2, help="held-out completions per prompt")
    parser.add_argument("--reuse_runs", action="store_true", help="keep matching runs already in OUT/runs")
    parser.add_argument("--share_only", action="store_true", help="only the reward-share runs (no learning runs)")
    parser.add_argument("--share_concurrency", type=int, nargs="*", default=[], help="sandbox workers to measure")
    parser.add_argument("--share_steps", type=int, default=20)
    parser.add_argument("--report_only", action="store_true", help="rebuild the report from OUT/runs")
    parser.add_argument("--_run", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    # Bad input is refused here, before the warm start is built or any run starts.
    for spec in args.method_config:
        try:
            name = add_method_config(spec)  # validated against the sampler settings, added to its METHODS
        except ValueError as error:
            parser.error(str(error))
        METHODS[name] = benchmark_learning.METHODS[name]
    if args.tournament and args.completions_budget is None:
        parser.error(
            "--tournament compares methods at equal completions: give --completions_budget "
            "(e.g. 4683, DAPO's mean total in BENCHMARKS.md's code table)."
        )
    if args.completions_budget is not None and args.completions_budget < 1:
        parser.error("--completions_budget must be a positive number of completions.")
    if args.methods is None:
        args.methods = list(TOURNAMENT_METHODS if args.tournament else DEFAULT_METHODS)
    unknown = [method for method in args.methods if method not in METHODS]
    if unknown:
        parser.error(f"unknown methods {unknown}: choose from {sorted(METHODS)}, or define one with --method_config.")

    if args._run:
        spec_path, out_path = map(Path, args._run)
        import datasets
        from transformers.utils import logging as hf_logging

        datasets.disable_progress_bars()
        hf_logging.set_verbosity_error()
        result = run_one(json.loads(spec_path.read_text()))
        Path(out_path).write_text(json.dumps(result, indent=1))
        return 0

    out: Path = args.out
    runs_dir, share_dir = out / "runs", out / "share"
    started = time.perf_counter()
    base = {
        "out": str(out),
        "steps": args.steps,
        "prompts_per_step": args.prompts_per_step,
        "learning_rate": args.learning_rate,
        "eval_every": args.eval_every,
        "heldout_size": args.heldout_size,
        "eval_samples": args.eval_samples,
        "concurrency": None,
        "completions_budget": args.completions_budget,
    }
    if not args.report_only:
        from trl_ada.tasks.code_synthesis import load_tiny_code_model

        load_tiny_code_model()  # build and cache the warm start once, before the runs
        controls_path = out / "controls.json"
        wanted = {"heldout_size": args.heldout_size, "eval_samples": args.eval_samples}
        if not (controls_path.exists() and json.loads(controls_path.read_text()).get("settings") == wanted):
            out.mkdir(parents=True, exist_ok=True)
            result = controls(args.heldout_size, args.eval_samples)
            controls_path.write_text(json.dumps({"settings": wanted, **result}, indent=1) + "\n")
        if not args.share_only:
            for seed in args.seeds:
                for method in args.methods:
                    spec = method_spec(base, method, seed)
                    path = runs_dir / f"{method}-seed{seed}.json"
                    if args.reuse_runs and path.exists():
                        if json.loads(path.read_text()).get("settings") == settings_of(spec):
                            logger.info("reusing %s", path)
                            continue
                    launch(spec, path)
        for concurrency in args.share_concurrency:
            for method in SHARE_METHODS:
                spec = {**method_spec(base, method, 0), "steps": args.share_steps, "eval_every": 0}
                spec["completions_budget"] = None  # a fixed number of steps: the share is per step
                spec["concurrency"] = concurrency
                launch(spec, share_dir / f"{method}-c{concurrency}.json")

    settings = settings_of(base)
    runs = []
    for path in sorted(runs_dir.glob("*.json")):
        if path.name.endswith(".spec.json"):
            continue
        run = json.loads(path.read_text())
        if run["seed"] not in args.seeds:  # as scripts/benchmark_learning.py: the table holds the seeds asked for
            continue
        # A method not defined in this invocation (an earlier --method_config) counts only with built-in settings.
        wanted = settings_of(method_spec(base, run["method"], run["seed"])) if run["method"] in METHODS else settings
        if run.get("settings") == wanted:
            runs.append(run)
    if args.tournament and args.report_only:  # a tournament paired by seed, built from part of its runs, misleads
        missing = missing_runs(runs, args.methods, args.seeds)
        if missing:
            parser.error(
                f"--report_only --tournament: no run with these settings in {runs_dir} for {', '.join(missing)}. "
                "Run them (these arguments without --report_only, with --reuse_runs), or give --methods/--seeds "
                "that ran."
            )
    shares = [json.loads(p.read_text()) for p in sorted(share_dir.glob("*.json")) if not p.name.endswith(".spec.json")]
    # The learning runs measured the share at the reward's default concurrency too.
    shares += [{**run, "source": "learning runs"} for run in runs if run["method"] in SHARE_METHODS]
    summary = summarize(runs, shares)
    controls_path = out / "controls.json"
    summary["start_model_controls"] = json.loads(controls_path.read_text()) if controls_path.exists() else None
    meta = {**settings, "cpu_count": os.cpu_count(), "wall_seconds_this_invocation": time.perf_counter() - started}
    summary["meta"] = meta
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str) + "\n")
    (out / "table.md").write_text(table(summary, meta))
    figure = plot(summary, out) if summary["methods"] else None
    print(f"wrote {out / 'table.md'} and {out / 'summary.json'}" + (f" and {figure}" if figure else ""))
    print((out / "table.md").read_text())
    if args.tournament:
        # Every matching run of the chosen methods, whichever invocation added its seed.
        write_tournament(out, [run for run in runs if run["method"] in args.methods], args.completions_budget)
    return 0


if __name__ == "__main__":
    sys.exit(main())
