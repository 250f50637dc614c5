"""
Overheads of AdaGRPOTrainer, as ratios against a baseline measured in the same run.

1. Step time of `AdaGRPOTrainer(sampler="uniform")` against `trl.GRPOTrainer` on identical work (same tiny model,
   data, seed): the two trainers alternate in blocks so machine noise hits both; medians are compared.
2. Sampler control time per step (everything the pure-Python sampler does: requests, observe, finish) for 1024
   prompts with a cap of 128 completions per prompt, against the time to merely draw the Bernoulli rewards.

    python benchmarks/overhead.py [--steps 30] [--repeats 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

logger = logging.getLogger("overhead")


def _exact_reward(completions, answer, **kwargs):
    from trl_ada.tasks.arithmetic import exact_match_reward

    return exact_match_reward(completions, answer)


def step_times(trainer_name: str, steps: int, output_dir: str) -> list[float]:
    """Per-step wall times (seconds) of one training run on the tiny arithmetic model."""
    from trl import GRPOConfig, GRPOTrainer

    from trl_ada import AdaGRPOConfig, AdaGRPOTrainer
    from trl_ada.tasks.arithmetic import make_dataset
    from trl_ada.tiny import load_tiny_arith_model

    model, tokenizer = load_tiny_arith_model()
    common = dict(
        output_dir=output_dir,
        per_device_train_batch_size=64,
        num_generations=4,
        max_completion_length=8,
        max_steps=steps,
        learning_rate=3e-5,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        seed=0,
        use_cpu=True,
        bf16=False,
        disable_tqdm=True,
    )
    dataset = make_dataset(steps * 16, seed=0)
    if trainer_name == "grpo":
        trainer = GRPOTrainer(
            model, [_exact_reward], args=GRPOConfig(**common), train_dataset=dataset, processing_class=tokenizer
        )
    else:
        config = AdaGRPOConfig(**common, sampler="uniform")
        trainer = AdaGRPOTrainer(
            model, [_exact_reward], args=config, train_dataset=dataset, processing_class=tokenizer
        )
    trainer.train()
    times = [entry["step_time"] for entry in trainer.state.log_history if "step_time" in entry]
    return times[1:]  # the first step pays one-time warm-up


def sampler_control_time(num_prompts: int, cap: int, pass_rates_seed: int = 0) -> tuple[float, float]:
    """Seconds per step spent in the sampler vs. drawing the same Bernoulli rewards, seq_balance with `cap`."""
    from trl_ada.samplers import SamplerSettings, build_sampler

    rng = random.Random(pass_rates_seed)
    rates = [rng.random() for _ in range(num_prompts)]
    settings = SamplerSettings(
        scale_rewards="none", seed=0, sampler="seq_balance", num_generations=4, round_size=cap // 4, max_rounds=4
    )
    sampler = build_sampler(settings)
    total = draw = 0.0
    repeats = 5
    for _ in range(repeats):
        start = time.perf_counter()
        step = sampler.begin(num_prompts)
        drawing = 0.0
        while requests := step.requests():
            t0 = time.perf_counter()
            rewards = [float(rng.random() < rates[i]) for i, count in requests for _ in range(count)]
            drawing += time.perf_counter() - t0
            step.observe(requests, rewards)
        step.finish()
        total += time.perf_counter() - start - drawing
        draw += drawing
    return total / repeats, draw / repeats


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=30, help="training steps per run")
    parser.add_argument("--repeats", type=int, default=3, help="runs per trainer, alternating")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)

    times: dict[str, list[float]] = {"grpo": [], "ada_uniform": []}
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            for name in ("grpo", "ada_uniform") if repeat % 2 == 0 else ("ada_uniform", "grpo"):
                times[name].extend(step_times(name, args.steps, f"{tmp}/{name}-{repeat}"))
                logger.info("%s run %d done", name, repeat)
    grpo, ada = statistics.median(times["grpo"]), statistics.median(times["ada_uniform"])
    control, drawing = sampler_control_time(1024, 128)
    result = {
        "grpo_median_step_s": grpo,
        "ada_uniform_median_step_s": ada,
        "step_time_ratio": ada / grpo,
        "steps_measured_each": len(times["grpo"]),
        "sampler_control_ms_per_step_1024_prompts_cap_128": 1000 * control,
        "bernoulli_draw_ms_per_step": 1000 * drawing,
    }
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
