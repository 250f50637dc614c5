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
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))  # the shared harness, benchmarks/harness

from harness.curves import CURVE_KEYS, first_reach, mean_curve
from harness.methods import (
    DAPO,
    DAPO_GATED,
    KNAPSACK,
    SEQ_BALANCE,
    SPO,
    add_method_arguments,
    check_method_arguments,
    method_settings,
    update_group_rows,
)
from harness.report import LEARNING_PANELS, fmt, markdown_table, plot_curves
from harness.runs import Child, group_by_method, matching_runs, missing_runs, reusable, run_processes
from harness.stats import mean_ci, paired_difference
from harness.tournament import write_tournament
from harness.training import (
    EvaluationPlan,
    budget_steps,
    draw_accounting,
    gate_passes,
    step_shapes,
    training_args,
)

logger = logging.getLogger("code_learning")

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "code_learning"

# name -> (label, AdaGRPOConfig overrides); the update group is n=4 for every method but GRPO n=16.
METHODS: dict[str, tuple[str, dict[str, Any]]] = {
    "grpo_n4": ("GRPO n=4", {"sampler": "uniform", "num_generations": 4}),
    "grpo_n16": ("GRPO n=16", {"sampler": "uniform", "num_generations": 16}),
    "dapo": ("DAPO n=4", DAPO),
    "seq_balance": ("Seq-balance n=4 (rounds of 8, at most 4)", SEQ_BALANCE),
    # The tournament's entries, the arithmetic benchmark's configurations (harness/methods.py).
    "knapsack": ("Knapsack-RL", KNAPSACK),
    "dapo_gated": ("DAPO, gated refill", DAPO_GATED),
    # A mechanism that trains on draws a group baseline wastes (harness/methods.py).
    "spo": ("SPO n=2", SPO),
}
BUILT_IN_METHODS = dict(METHODS)
DEFAULT_METHODS = ["grpo_n4", "grpo_n16", "dapo", "seq_balance"]
"""The published code table's methods (`--methods` without `--tournament`)."""
TOURNAMENT_METHODS = ["grpo_n4", "grpo_n16", "dapo", "seq_balance", "knapsack", "dapo_gated"]
"""The tournament on this task (`--tournament`), read at equal completions (`--completions_budget`)."""
SHARE_METHODS = ("grpo_n4", "seq_balance")


# ---- One run (in a child process) -----------------------------------------------------------------------------------


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
    output_dir = tempfile.mkdtemp(prefix=f"code_learning-{method}-seed{seed}-")  # nothing is saved there
    rows_per_step = prompts * overrides["num_generations"]
    arguments = training_args(output_dir, seed, steps, spec["learning_rate"], rows_per_step, 12)
    config = AdaGRPOConfig(**arguments, **overrides)
    # Prompts with room for DAPO's refills. Under a budget a run uses at most budget / 2 prompts (every method draws 2
    # or more completions a prompt): sizing by its raised step cap would only slow the set's generation.
    dataset = make_dataset(max(spec["steps"] * prompts * 12, 2000, budget or 0), seed=seed)

    per_step: list[dict[str, float]] = []
    curve: list[dict[str, Any]] = []
    last = {"seconds": 0.0, "completions": 0}

    def evaluate(trainer_model: Any) -> dict[str, Any]:
        samples = spec["eval_samples"]
        result = pass_rate_by_level(
            trainer_model, tokenizer, heldout, reward=eval_reward, temperature=1.0, num_samples=samples, seed=seed
        )
        return {"heldout": result["overall"], "levels": {str(k): v for k, v in result["per_level"].items()}}

    class Record(TrainerCallback):
        def on_step_end(self, args, state, control, model=None, **kwargs):
            completions = float(reward.completions - last["completions"])
            per_step.append({"reward_seconds": reward.seconds - last["seconds"], "completions": completions})
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
        "prompts_per_step": prompts,
        "step_shapes": step_shapes(entries, update_group_rows(overrides, prompts)),
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
    method = spec.get("method")
    if method is None:
        return settings
    return method_settings(settings, spec["overrides"], BUILT_IN_METHODS.get(method))


def method_spec(base: dict[str, Any], method: str, seed: int) -> dict[str, Any]:
    """One run's spec: the shared settings, the method (its label and overrides travel with it) and the seed."""
    label, overrides = METHODS[method]
    return {**base, "method": method, "label": label, "overrides": overrides, "seed": seed}


def launch(spec: dict[str, Any], path: Path) -> dict[str, Any]:
    """Runs ``spec`` in a child process and returns what it wrote to ``path``; raises if the child failed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    spec_path = path.with_suffix(".spec.json")
    spec_path.write_text(json.dumps(spec))
    child = Child(spec["method"], spec["seed"], [sys.executable, __file__, "--_run", str(spec_path), str(path)])
    if run_processes([child]):
        raise RuntimeError(f"{spec['method']} seed {spec['seed']} failed (its output is above).")
    spec_path.unlink()
    result = json.loads(path.read_text())
    logger.info(
        "%s seed %d: median step %.2f s, reward share %.2f%s",
        spec["method"],
        spec["seed"],
        result["median_step_seconds"],
        result["median_reward_share"],
        f", held-out {result['curve'][0]['heldout']:.3f} -> {result['curve'][-1]['heldout']:.3f}"
        if result["curve"]
        else "",
    )
    return result


# ---- Report ---------------------------------------------------------------------------------------------------------


def _final(run: dict) -> float:
    return run["curve"][-1]["heldout"]


def summarize(runs: list[dict], shares: list[dict]) -> dict[str, Any]:
    """Per method the held-out (start, final with its interval over seeds, per level), completions, times, reward
    share and mean curve; paired differences against DAPO; where each mean curve first reaches GRPO n=16's final;
    the reward share of a step per method, source and sandbox workers."""
    by_method = group_by_method(runs)
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
        paired = {m: paired_difference(by_method[m], by_method["dapo"], _final) for m in methods if m != "dapo"}
    reach = {}
    if "grpo_n16" in methods:
        target = methods["grpo_n16"]["final_heldout"]["mean"]
        for method, row in methods.items():
            reach[method] = {key: first_reach(row["curve"], key, target) for key in CURVE_KEYS}
        reach = {"target": target, "by_method": reach}
    share_rows: dict[str, Any] = {}
    for share in shares:
        key = f"{share.get('source', 'short runs')}:{share['method']}@{share['reward_concurrency']}"
        share_rows.setdefault(key, []).append(share)
    share_table = {}
    for key, group in sorted(share_rows.items()):
        group.sort(key=lambda run: run["seed"])  # the steps column reads the first seed's
        share_table[key] = {
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
    return {"methods": methods, "paired_vs_dapo": paired, "reach_grpo_n16_final": reach, "reward_share": share_table}


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
        names = " | ".join(LEVELS[int(level)] for level in levels)
        header = (
            f"method | seeds | start | final held-out | {names} | completions | train s | median step s | "
            "reward share of step"
        )
        rows = [
            [row["label"], str(len(row["seeds"])), f"{row['start_heldout']['mean']:.3f}", fmt(row["final_heldout"]),
             *(f"{row['final_levels'][level]['mean']:.3f}" for level in levels), f"{row['completions']['mean']:,.0f}",
             f"{row['train_seconds']['mean']:.0f}", f"{row['median_step_seconds']['mean']:.2f}",
             f"{row['median_reward_share']['mean']:.2f}"]
            for row in methods.values()
        ]  # fmt: skip
        lines += markdown_table(header, rows)
    start = summary.get("start_model_controls")
    if start:
        lines += [
            "",
            "The starting model on the same held-out set (the control: what sharpening alone gives): "
            + ", ".join(f"{name} {start[name]['overall']:.3f}" for name in ("t1", "t0.5", "greedy") if name in start),
        ]
    if summary["paired_vs_dapo"]:
        differences = [
            [f"{methods[method]['label']} - DAPO", fmt(stat, signed=True)]
            for method, stat in summary["paired_vs_dapo"].items()
        ]
        lines += [
            "",
            "Paired differences against DAPO (same seed), final held-out:",
            "",
            *markdown_table("method | difference", differences),
        ]
    reach = summary["reach_grpo_n16_final"]
    if reach:
        crossings = [
            [methods[method]["label"], f"{row['step']:.0f}", f"{row['samples']:,.0f}", f"{row['train_seconds']:.0f}"]
            for method, row in reach["by_method"].items()
        ]
        lines += [
            "",
            f"First reaching GRPO n=16's final held-out ({reach['target']:.3f}) on the mean curves (interpolated; "
            "inf: never):",
            "",
            *markdown_table("method | steps | completions | train s", crossings),
        ]
    if summary["reward_share"]:
        header = (
            "method | measured in | sandbox workers | steps x runs | completions / step | median step s | "
            "median reward s | share"
        )
        shares = [
            [row["label"], row["source"], str(row["concurrency"]), f"{row['steps']} x {row['runs']}",
             f"{row['completions_per_step']:.1f}", f"{row['median_step_seconds']:.2f}",
             f"{row['median_reward_seconds']:.2f}", f"{row['median_share']:.2f}"]
            for row in summary["reward_share"].values()
        ]  # fmt: skip
        lines += [
            "",
            "Reward share of a training step (time inside the reward function / step time, median over steps):",
            "",
            *markdown_table(header, shares, left=2),
        ]
    return "\n".join(lines) + "\n"


def plot(summary: dict[str, Any], out: Path) -> Path | None:
    """``learning_curves.png``: the mean curves against steps, completions and training seconds (None without
    matplotlib)."""
    title = "Code task (sandboxed reward): held-out pass rate, mean and 95% t-interval over seeds"
    try:
        return plot_curves(out / "learning_curves.png", summary["methods"].values(), LEARNING_PANELS, title)
    except ImportError:
        return None


# ---- Main -----------------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    add_method_arguments(
        parser,
        METHODS,
        defaults=" ".join(DEFAULT_METHODS),
        tournament_methods=TOURNAMENT_METHODS,
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
    example = "4683, DAPO's mean total in BENCHMARKS.md's code table"
    check_method_arguments(parser, args, METHODS, tournament_methods=TOURNAMENT_METHODS, budget_example=example)
    if args.methods is None:
        args.methods = list(DEFAULT_METHODS)

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
        "out": str(out), "steps": args.steps, "prompts_per_step": args.prompts_per_step,
        "learning_rate": args.learning_rate, "eval_every": args.eval_every, "heldout_size": args.heldout_size,
        "eval_samples": args.eval_samples, "concurrency": None, "completions_budget": args.completions_budget,
    }  # fmt: skip
    if not args.report_only:
        run_all(args, base, runs_dir, share_dir)

    def settings_for(method: str) -> dict[str, Any]:
        return settings_of(method_spec(base, method, 0))

    # Every matching run of the methods this invocation defines, in file-name order as the tournament table lists them.
    runs = matching_runs(runs_dir, sorted(METHODS), args.seeds, settings_for)
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
    meta = {
        **settings_of(base),
        "cpu_count": os.cpu_count(),
        "wall_seconds_this_invocation": time.perf_counter() - started,
    }
    summary["meta"] = meta
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str) + "\n")
    (out / "table.md").write_text(table(summary, meta))
    figure = plot(summary, out) if summary["methods"] else None
    print(f"wrote {out / 'table.md'} and {out / 'summary.json'}" + (f" and {figure}" if figure else ""))
    print((out / "table.md").read_text())
    if args.tournament:
        # Every matching run of the chosen methods, whichever invocation added its seed.
        write_tournament(
            out,
            [run for run in runs if run["method"] in args.methods],
            args.completions_budget,
            lambda method, prompts: update_group_rows(METHODS[method][1], prompts),
        )
    return 0


def run_all(args: argparse.Namespace, base: dict[str, Any], runs_dir: Path, share_dir: Path) -> None:
    """The start model's controls, the learning runs not already there (`--reuse_runs`) and the reward-share runs."""
    from trl_ada.tasks.code_synthesis import load_tiny_code_model

    out: Path = args.out
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
                if args.reuse_runs and reusable(path, settings_of(spec)):
                    logger.info("reusing %s", path)
                    continue
                launch(spec, path)
    for concurrency in args.share_concurrency:
        for method in SHARE_METHODS:
            spec = {**method_spec(base, method, 0), "steps": args.share_steps, "eval_every": 0}
            spec["completions_budget"] = None  # a fixed number of steps: the share is per step
            spec["concurrency"] = concurrency
            launch(spec, share_dir / f"{method}-c{concurrency}.json")


if __name__ == "__main__":
    sys.exit(main())
