"""Does plain GRPO move held-out accuracy on the trace-arithmetic testbed? One seed, a quick probe, not a benchmark.

    nice -n 10 python scripts/probe_trace_grpo.py --learning-rate 1e-4 --steps 60 \\
        --output benchmarks/results/trace-arithmetic/grpo_probe/uniform-lr1e-4.json

Loads a trace model (the shipped one by default), scores held-out problems at temperature 1 and 0.5 (the sharpening
control) and greedily, trains it with `AdaGRPOTrainer` (16 prompts per step, n=4, constant learning rate, no KL) on a
fresh stream of training problems, then scores the same held-out problems again.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from build_trace_model import pass_rates, summarize  # noqa: E402

logger = logging.getLogger("probe_trace_grpo")


def score(model: Any, tokenizer: Any, problems: list[dict[str, Any]], temperature: float, samples: int) -> dict:
    """Mean held-out pass rate, overall and by level, rounded for reading."""
    rates = pass_rates(
        model, tokenizer, problems, num_samples=samples if temperature > 0 else 1, temperature=temperature, seed=0
    )
    result = summarize(problems, rates)
    return {"overall": round(result["overall"], 3), **{k: round(v, 3) for k, v in result["per_level"].items()}}


def main(argv: list[str] | None = None) -> None:
    """Scores, trains, scores again and writes the JSON report."""
    from trl_ada import AdaGRPOConfig, AdaGRPOTrainer
    from trl_ada.tasks import trace_arithmetic as task
    from trl_ada.tiny import load_tiny

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=task.TINY_TRACE_ASSETS)
    parser.add_argument("--learning-rate", type=float, default=1e-4)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--sampler", default="uniform")
    parser.add_argument("--eval-problems", type=int, default=40, help="Held-out problems per level.")
    parser.add_argument("--eval-samples", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", type=Path, default=None)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    torch.set_num_threads(1)

    model, tokenizer = load_tiny(args.model)
    problems = task.held_out_problems(args.eval_problems * len(task.LEVELS), seed=7)
    report: dict[str, Any] = {"command": "python scripts/probe_trace_grpo.py " + " ".join(argv or sys.argv[1:])}
    report["args"] = {key: str(value) for key, value in vars(args).items()}
    report["before"] = {
        name: score(model, tokenizer, problems, temperature, args.eval_samples)
        for name, temperature in (("t1", 1.0), ("t0.5", 0.5), ("greedy", 0.0))
    }
    logger.info("Before: %s", report["before"])
    with tempfile.TemporaryDirectory() as tmp:
        config = AdaGRPOConfig(
            output_dir=tmp,
            use_cpu=True,
            bf16=False,
            per_device_train_batch_size=64,
            num_generations=4,
            sampler=args.sampler,
            max_completion_length=task.MAX_COMPLETION_LENGTH,
            learning_rate=args.learning_rate,
            lr_scheduler_type="constant",
            beta=0.0,
            max_steps=args.steps,
            logging_steps=10,
            report_to="none",
            save_strategy="no",
            seed=args.seed,
            disable_tqdm=True,
        )
        trainer = AdaGRPOTrainer(
            model=model,
            processing_class=tokenizer,
            reward_funcs=task.final_answer_reward,
            args=config,
            train_dataset=task.make_dataset(16 * args.steps, seed=args.seed),
        )
        start = time.perf_counter()
        trainer.train()
        report["train_seconds"] = time.perf_counter() - start
    report["train_reward_every_10_steps"] = [round(e["reward"], 3) for e in trainer.state.log_history if "reward" in e]
    report["after"] = {
        name: score(model, tokenizer, problems, temperature, args.eval_samples)
        for name, temperature in (("t1", 1.0), ("greedy", 0.0))
    }
    logger.info("After: %s", report["after"])
    text = json.dumps(report, indent=2)
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(text + "\n", encoding="utf-8")
    logger.info("%s", text)


if __name__ == "__main__":
    main()
