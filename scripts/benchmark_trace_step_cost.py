"""Seconds per GRPO step on the trace-arithmetic testbed against the one-shot arithmetic testbed, in one run.

    nice -n 10 python scripts/benchmark_trace_step_cost.py --steps 12 \\
        --output benchmarks/results/trace-arithmetic/step_cost.json

Each testbed trains its shipped model with `AdaGRPOTrainer` on its own task for ``--steps`` steps at the same
settings (16 prompts per step, n=4, temperature 1, one torch thread); the median wall time of a step (the first
step excluded) is reported per sampler, along with the mean completion length.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from transformers import TrainerCallback

logger = logging.getLogger("benchmark_trace_step_cost")


class _StepTimer(TrainerCallback):
    """Records the wall time of every optimizer step."""

    def __init__(self) -> None:
        self.durations: list[float] = []
        self._start = 0.0

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._start = time.perf_counter()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.durations.append(time.perf_counter() - self._start)


def run(testbed: str, sampler: str, steps: int, seed: int) -> dict[str, Any]:
    """Trains ``testbed``'s shipped model for ``steps`` steps and returns its step times and log."""
    from trl_ada import AdaGRPOConfig, AdaGRPOTrainer

    if testbed == "arithmetic":
        from trl_ada import tiny
        from trl_ada.tasks import arithmetic as task

        reward, load, max_completion_length = task.exact_match_reward, tiny.load_tiny_arith_model, 8
    else:
        from trl_ada.tasks import trace_arithmetic as task

        reward, load, max_completion_length = (
            task.final_answer_reward,
            task.load_tiny_trace_model,
            task.MAX_COMPLETION_LENGTH,
        )
    model, tokenizer = load()
    timer = _StepTimer()
    with tempfile.TemporaryDirectory() as tmp:
        args = AdaGRPOConfig(
            output_dir=tmp,
            use_cpu=True,
            bf16=False,
            per_device_train_batch_size=64,
            num_generations=4,
            sampler=sampler,
            max_completion_length=max_completion_length,
            learning_rate=3e-5,
            max_steps=steps,
            logging_steps=1,
            report_to="none",
            save_strategy="no",
            seed=seed,
            disable_tqdm=True,
        )
        trainer = AdaGRPOTrainer(
            model=model,
            processing_class=tokenizer,
            reward_funcs=reward,
            args=args,
            train_dataset=task.make_dataset(16 * steps * 4, seed=seed),
            callbacks=[timer],
        )
        trainer.train()
    logs = [entry for entry in trainer.state.log_history if "loss" in entry]
    return {
        "testbed": testbed,
        "sampler": sampler,
        "steps": steps,
        "median_step_seconds": statistics.median(timer.durations[1:]),
        "step_seconds": timer.durations,
        "mean_reward": statistics.mean(entry["reward"] for entry in logs),
        "mean_completion_length": statistics.mean(entry["completions/mean_length"] for entry in logs),
    }


def main(argv: list[str] | None = None) -> None:
    """Runs both testbeds for each sampler and writes the JSON report."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--samplers", nargs="+", default=["uniform", "seq_balance"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", type=Path, default=None)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    torch.set_num_threads(1)
    results = []
    for sampler in args.samplers:
        for testbed in ("arithmetic", "trace"):
            result = run(testbed, sampler, args.steps, args.seed)
            logger.info(
                "%s %s: median %.3f s/step, mean completion length %.1f, mean reward %.3f",
                testbed,
                sampler,
                result["median_step_seconds"],
                result["mean_completion_length"],
                result["mean_reward"],
            )
            results.append(result)
    text = json.dumps(
        {
            "command": "python scripts/benchmark_trace_step_cost.py",
            "args": vars(args) | {"output": str(args.output)},
            "results": results,
        },
        indent=2,
    )
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(text + "\n", encoding="utf-8")
    logger.info("%s", text)


if __name__ == "__main__":
    main()
