"""Build the tiny trace-arithmetic model on CPU and save it (by default into the package assets).

    nice -n 10 python scripts/build_trace_model.py                       # -> trl_ada/assets/tiny-trace/
    python scripts/build_trace_model.py --output-dir /tmp/m --steps 200  # a quick try elsewhere

The model is the character-level Qwen2 of `trl_ada.tiny` (same tokenizer and builder as the arithmetic model),
trained from scratch by supervised fine-tuning on written traces of `trl_ada.tasks.trace_arithmetic` (completion-only
loss, fresh training problems every step, balanced over the levels). The traces carry injected errors inside the
procedure (`TraceNoise`: wrong sums or products for some digit pairs, dropped carries, a wrong digit when copying a
partial product, and misconceptions: 15% of the facts usually written with one fixed wrong value), so that the model's mistakes at temperature 1 happen in the procedure.

At the end the script samples 16 completions per held-out problem at temperature 1 and writes the pass rates by level,
the distribution of per-prompt pass rates and the command into ``build_report.json`` beside the model.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import os
import random
import shlex
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

logger = logging.getLogger("build_trace_model")

PASS_RATE_BANDS: tuple[tuple[str, float, float], ...] = (
    ("0", 0.0, 0.0),
    ("(0,0.375]", 0.0, 0.375),
    ("(0.375,1)", 0.375, 1.0),
    ("1", 1.0, 1.0),
)
"""Bands of per-prompt pass rate: never solved, the paper's training band, solved sometimes, always solved."""


def _band(rate: float) -> str:
    if rate == 0.0:
        return "0"
    if rate == 1.0:
        return "1"
    return "(0,0.375]" if rate <= 0.375 else "(0.375,1)"


def sft_batch(
    tokenizer: Any, problems: Sequence[dict[str, Any]], noise: Any, rng: random.Random
) -> dict[str, torch.Tensor]:
    """Right-padded prompt + trace + eos ids with labels only on the completion (prompt and padding are -100)."""
    from trl_ada.tasks.trace_arithmetic import parse_prompt, write_trace

    rows, labels = [], []
    for problem in problems:
        completion, _ = write_trace(*parse_prompt(problem["prompt"]), noise=noise, rng=rng)
        prompt_ids = tokenizer(problem["prompt"], add_special_tokens=False).input_ids
        completion_ids = [*tokenizer(completion, add_special_tokens=False).input_ids, tokenizer.eos_token_id]
        rows.append(prompt_ids + completion_ids)
        labels.append([-100] * len(prompt_ids) + completion_ids)
    width = max(len(row) for row in rows)
    pad = tokenizer.pad_token_id
    input_ids = torch.tensor([row + [pad] * (width - len(row)) for row in rows])
    label_ids = torch.tensor([row + [-100] * (width - len(row)) for row in labels])
    # No attention mask: padding is on the right and attention is causal, so it never reaches a real token.
    return {"input_ids": input_ids, "labels": label_ids}


def train(
    model: Any,
    tokenizer: Any,
    *,
    steps: int,
    batch_size: int,
    learning_rate: float,
    warmup_steps: int,
    noise: Any,
    seed: int,
    long_every: int = 3,
    log_every: int = 100,
) -> list[dict[str, float]]:
    """AdamW with linear warm-up then cosine decay to 10%, on fresh noisy traces each step; returns the loss log.

    Every ``long_every``-th batch holds only the hardest level (the longest traces), the others the other levels.
    """
    from trl_ada.tasks.trace_arithmetic import make_problems

    optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate, weight_decay=0.0, betas=(0.9, 0.98))

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = (step - warmup_steps) / max(steps - warmup_steps, 1)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
    from trl_ada.tasks.trace_arithmetic import LEVELS

    # Short and long traces go in separate batches so that short ones are not padded to the longest.
    long_levels = [len(LEVELS) - 1]
    short_levels = list(range(len(LEVELS) - 1))
    rng = random.Random(f"trace-noise-{seed}")
    model.train()
    log, running, start = [], 0.0, time.perf_counter()
    for step in range(steps):
        levels = long_levels if step % long_every == long_every - 1 else short_levels
        problems = make_problems(batch_size, seed=seed * 1_000_003 + step, levels=levels)
        batch = sft_batch(tokenizer, problems, noise, rng)
        loss = model(**batch).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        running += loss.item()
        if (step + 1) % log_every == 0 or step + 1 == steps:
            count = (step % log_every) + 1
            entry = {"step": step + 1, "loss": running / count, "seconds": time.perf_counter() - start}
            log.append(entry)
            logger.info("step %d loss %.4f (%.0f s)", entry["step"], entry["loss"], entry["seconds"])
            running = 0.0
    model.eval()
    return log


@torch.no_grad()
def pass_rates(
    model: Any,
    tokenizer: Any,
    problems: Sequence[dict[str, Any]],
    *,
    num_samples: int,
    temperature: float,
    seed: int,
    batch_size: int = 512,
) -> list[float]:
    """Per-problem share of ``num_samples`` completions whose final answer is right (prompts are fixed width)."""
    from trl_ada.tasks.arithmetic import sample_completions
    from trl_ada.tasks.trace_arithmetic import MAX_COMPLETION_LENGTH, final_answer_reward

    texts = sample_completions(
        model,
        tokenizer,
        [problem["prompt"] for problem in problems],
        temperature=temperature,
        num_samples=num_samples,
        max_new_tokens=MAX_COMPLETION_LENGTH,
        batch_size=batch_size,
        seed=seed,
        keep_special_tokens=True,
    )
    rewards = final_answer_reward(texts, [problem["answer"] for problem in problems for _ in range(num_samples)])
    return [sum(rewards[i * num_samples : (i + 1) * num_samples]) / num_samples for i in range(len(problems))]


def summarize(problems: Sequence[dict[str, Any]], rates: Sequence[float]) -> dict[str, Any]:
    """Mean pass rate by level and overall, and the share of prompts in each pass-rate band (overall and by level)."""
    from trl_ada.tasks.trace_arithmetic import LEVELS

    by_level: dict[str, list[float]] = {}
    for problem, rate in zip(problems, rates, strict=True):
        by_level.setdefault(LEVELS[problem["level"]], []).append(rate)

    def bands(values: Sequence[float]) -> dict[str, float]:
        return {name: sum(_band(v) == name for v in values) / len(values) for name, _, _ in PASS_RATE_BANDS}

    return {
        "overall": sum(rates) / len(rates),
        "per_level": {name: sum(v) / len(v) for name, v in by_level.items()},
        "bands": bands(rates),
        "bands_per_level": {name: bands(v) for name, v in by_level.items()},
        "num_problems": len(problems),
    }


def main(argv: list[str] | None = None) -> None:
    """Parses arguments, trains the model, evaluates it and saves it with its report."""
    from trl_ada.tasks.trace_arithmetic import TINY_TRACE_ASSETS, TraceNoise, held_out_problems
    from trl_ada.tiny import build_char_tokenizer, build_tiny_model, save_tiny

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output-dir", type=Path, default=TINY_TRACE_ASSETS)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--learning-rate", type=float, default=3e-3)
    parser.add_argument("--warmup-steps", type=int, default=50)
    parser.add_argument("--long-every", type=int, default=3, help="Every n-th batch is of the hardest level.")
    parser.add_argument("--fact-noise", type=float, default=0.05, help="Mean per-step error rate (TraceNoise.fact).")
    parser.add_argument("--carry-noise", type=float, default=0.1, help="Dropped-carry rate (TraceNoise.carry).")
    parser.add_argument("--copy-noise", type=float, default=0.03, help="Partial-product copy error rate.")
    parser.add_argument("--hard-share", type=float, default=0.15, help="Share of misconception facts.")
    parser.add_argument("--hard-rate", type=float, default=0.75, help="How often a misconception is written.")
    parser.add_argument("--hidden-size", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--intermediate-size", type=int, default=256)
    parser.add_argument("--eval-problems", type=int, default=50, help="Held-out problems per level.")
    parser.add_argument("--eval-samples", type=int, default=16)
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads (one: more only contend on shared cores)."
    )
    args = parser.parse_args(argv)

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    tokenizer = build_char_tokenizer()
    model = build_tiny_model(
        tokenizer,
        hidden_size=args.hidden_size,
        num_hidden_layers=args.layers,
        intermediate_size=args.intermediate_size,
        seed=args.seed,
    )
    parameters = sum(p.numel() for p in model.parameters())
    logger.info("Built tiny model: %d parameters", parameters)
    noise = TraceNoise(
        fact=args.fact_noise,
        carry=args.carry_noise,
        copy=args.copy_noise,
        hard_share=args.hard_share,
        hard_rate=args.hard_rate,
    )

    start = time.perf_counter()
    log = train(
        model,
        tokenizer,
        steps=args.steps,
        batch_size=args.batch_size,
        learning_rate=args.learning_rate,
        warmup_steps=args.warmup_steps,
        noise=noise,
        seed=args.seed,
        long_every=args.long_every,
    )
    train_seconds = time.perf_counter() - start

    from trl_ada.tasks.trace_arithmetic import LEVELS

    problems = held_out_problems(args.eval_problems * len(LEVELS), seed=args.seed + 1)
    eval_start = time.perf_counter()
    rates = pass_rates(model, tokenizer, problems, num_samples=args.eval_samples, temperature=1.0, seed=args.seed)
    t1 = summarize(problems, rates)
    greedy = summarize(problems, pass_rates(model, tokenizer, problems, num_samples=1, temperature=0.0, seed=0))
    eval_seconds = time.perf_counter() - eval_start
    logger.info("Held-out T=1 pass rate by level: %s", json.dumps(t1["per_level"]))
    logger.info("Held-out T=1 bands: %s", json.dumps(t1["bands"]))
    logger.info("Held-out greedy by level: %s", json.dumps(greedy["per_level"]))

    model.config.use_cache = True
    save_tiny(model, tokenizer, args.output_dir)
    report = {
        "command": " ".join(
            ["python scripts/build_trace_model.py", shlex.join(argv if argv is not None else sys.argv[1:])]
        ).strip(),
        "args": {key: str(value) if isinstance(value, Path) else value for key, value in vars(args).items()},
        "parameters": parameters,
        "noise": dataclasses.asdict(noise),
        "train_seconds": train_seconds,
        "eval_seconds": eval_seconds,
        "loss_log": log,
        "held_out_t1": {"num_samples": args.eval_samples, **t1},
        "held_out_greedy": greedy,
        "torch_threads": torch.get_num_threads(),
    }
    (Path(args.output_dir) / "build_report.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    size = sum(f.stat().st_size for f in Path(args.output_dir).iterdir() if f.is_file())
    logger.info("Saved to %s (%.2f MB)", args.output_dir, size / 1e6)


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
