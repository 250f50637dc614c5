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
from pathlib import Path

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
}


def run_one(method: str, seed: int, steps: int, eval_every: int, heldout_size: int, lr: float, out: Path) -> dict:
    """One training run (called in a child process); returns its curve and final numbers."""
    import torch
    from transformers import TrainerCallback

    from trl_ada import AdaGRPOConfig, AdaGRPOTrainer
    from trl_ada.tasks.arithmetic import accuracy_by_level, exact_match_reward, held_out_problems, make_dataset
    from trl_ada.tiny import load_tiny_arith_model

    torch.set_num_threads(1)
    label, overrides = METHODS[method]
    n = overrides["num_generations"]
    model, tokenizer = load_tiny_arith_model()
    heldout = held_out_problems(heldout_size, seed=1234)
    config = AdaGRPOConfig(
        output_dir=str(out / f"{method}-seed{seed}"),
        per_device_train_batch_size=PROMPTS_PER_STEP * n,
        max_completion_length=8,
        temperature=1.0,
        learning_rate=lr,
        lr_scheduler_type="constant",
        beta=0.0,
        max_steps=steps,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        bf16=False,
        disable_tqdm=True,
        seed=seed,
        **overrides,
    )
    curve: list[dict] = []

    def evaluate(trainer_model) -> float:
        return accuracy_by_level(
            trainer_model, tokenizer, heldout, temperature=1.0, num_samples=1, max_new_tokens=8, seed=seed
        )["overall"]

    class HeldOut(TrainerCallback):
        def on_step_end(self, args, state, control, model=None, **kwargs):
            if state.global_step % eval_every == 0 or state.global_step == steps:
                history = [e for e in state.log_history if "step_time" in e]
                curve.append(
                    {
                        "step": state.global_step,
                        "heldout": evaluate(model),
                        "samples": sum(
                            e.get("ada/samples_per_prompt/mean", n)
                            * PROMPTS_PER_STEP
                            * (1 + e.get("ada/dapo/extra_batches", 0.0))
                            for e in history
                        ),
                        "train_seconds": sum(e["step_time"] for e in history),
                    }
                )

    dataset = make_dataset(max(steps * PROMPTS_PER_STEP * 2, 4000), seed=seed)
    trainer = AdaGRPOTrainer(
        model,
        [exact_match_reward],
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[HeldOut()],
    )
    start_accuracy = evaluate(trainer.model)
    trainer.train()
    entries = [e for e in trainer.state.log_history if "step_time" in e]
    return {
        "method": method,
        "label": label,
        "seed": seed,
        "start_heldout": start_accuracy,
        "curve": [{"step": 0, "heldout": start_accuracy, "samples": 0.0, "train_seconds": 0.0}, *curve],
        "median_step_seconds": statistics.median(e["step_time"] for e in entries),
        "train_pass_rate": [e.get("ada/pass_rate/mean") for e in entries],
    }


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/learning"))
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--eval_every", type=int, default=25)
    parser.add_argument("--heldout_size", type=int, default=600)
    parser.add_argument("--learning_rate", type=float, default=3e-5)
    parser.add_argument("--jobs", type=int, default=2, help="runs at a time (one CPU thread each)")
    parser.add_argument("--run", nargs=2, metavar=("METHOD", "SEED"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    args.out.mkdir(parents=True, exist_ok=True)

    if args.run:  # child process: one run, written as JSON
        method, seed = args.run[0], int(args.run[1])
        with tempfile.TemporaryDirectory() as scratch:  # the trainers' output dirs are not results
            result = run_one(
                method, seed, args.steps, args.eval_every, args.heldout_size, args.learning_rate, Path(scratch)
            )
        (args.out / "runs" / f"{method}-seed{seed}.json").write_text(json.dumps(result))
        return 0

    (args.out / "runs").mkdir(exist_ok=True)
    pending = [(m, s) for s in args.seeds for m in args.methods]
    running: list[tuple[subprocess.Popen, str, int, float]] = []
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    common = [
        "--out",
        str(args.out),
        "--steps",
        str(args.steps),
        "--eval_every",
        str(args.eval_every),
        "--heldout_size",
        str(args.heldout_size),
        "--learning_rate",
        str(args.learning_rate),
    ]
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
                logger.info("%s seed %d: %s in %.0f s", method, seed, status, time.time() - started)
    results = []
    for method in args.methods:
        for seed in args.seeds:
            path = args.out / "runs" / f"{method}-seed{seed}.json"
            if path.exists():
                results.append(json.loads(path.read_text()))
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


if __name__ == "__main__":
    sys.exit(main())
