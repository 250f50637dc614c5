"""
How well the learned pass-rate predictor (`pass_rate_predictor="learned"`) predicts prompts it has never seen.

A stream of fresh arithmetic prompts (`trl_ada.tasks.arithmetic`, all six levels, every prompt once: no repeats, so
no per-prompt count ever helps) arrives in batches of `--batch-size`. Each prompt gets `--draws` scored draws. Before
a batch's outcomes are revealed every predictor predicts each prompt's pass rate; the score is the mean per-draw
log-loss (and Brier score) of those predictions against the draws. Predictors:

- `learned`: `LearnedPassRatePredictor` (defaults of `AdaGRPOConfig`), updated on each batch after it is scored.
- `tracker`: what the default tracker reads for an unseen prompt, the prior mean `α / (α + β)` = 0.5.
- `batch_mean`: the share of positives among all draws of the earlier batches (the best constant known online).
- `level_oracle`: each prompt's difficulty level's pass rate, known in advance (with `--outcomes level` the true
  rate, so no predictor of the level can do better in expectation; with `--outcomes model` the level's share of
  positives over the whole stream, in hindsight).

Outcomes: `--outcomes level` draws Bernoulli outcomes at the per-level temperature-1 pass rates measured for the shipped
tiny model (`trl_ada/assets/tiny-arith/build_report.json`, `final.t1`), so every prompt of a level has the same pass
rate; `--outcomes model` samples the shipped tiny model at temperature 1 (exact-match reward), where prompts of one
level differ and a prompt-level predictor may beat the level oracle.

    python benchmarks/predictor_quality.py [--outcomes level|model] [--prompts 3072] [--draws 8] [--out DIR]
    python benchmarks/predictor_quality.py --cost [--out DIR]

Writes `predictor_quality_<outcomes>.json` and `.txt` to `--out` (default `benchmarks/results/predictor_quality`).
`--cost` instead times one step of the learned predictor (estimate, then update on the outcomes) for 64, 256 and 512
prompts, on the arithmetic prompts (8 characters) and on 600-character prompts, against what generating that step's
`4` completions per prompt costs with the shipped tiny model (`model.generate`, CPU, temperature 1, up to 8 new
tokens): `predictor_cost.json` / `.txt`.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import random
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from trl_ada.samplers import PromptKey
from trl_ada.samplers.predictor import LearnedPassRatePredictor, calibration
from trl_ada.tasks.arithmetic import LEVELS, make_problems

logger = logging.getLogger("predictor_quality")

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "predictor_quality"
ASSETS = Path(__file__).resolve().parent.parent / "trl_ada" / "assets" / "tiny-arith"
PREDICTORS = ("learned", "tracker", "batch_mean", "level_oracle")


def fresh_stream(num_prompts: int, seed: int) -> list[dict[str, Any]]:
    """`num_prompts` distinct training problems in stream order (a level whose problems run out stops appearing)."""
    seen: set[str] = set()
    stream: list[dict[str, Any]] = []
    for problem in make_problems(4 * num_prompts, seed=seed):
        if problem["prompt"] not in seen:
            seen.add(problem["prompt"])
            stream.append(problem)
        if len(stream) == num_prompts:
            return stream
    raise ValueError(f"only {len(stream)} distinct problems found; ask for fewer --prompts")


def level_rates() -> dict[int, float]:
    """Per-level temperature-1 pass rates of the shipped tiny model, as its build measured them."""
    report = json.loads((ASSETS / "build_report.json").read_text())
    return {int(level): rate for level, rate in report["final"]["t1"]["per_level"].items()}


def bernoulli_outcomes(stream: Sequence[dict[str, Any]], draws: int, seed: int) -> list[int]:
    rates = level_rates()
    rng = random.Random(seed)
    return [sum(rng.random() < rates[p["level"]] for _ in range(draws)) for p in stream]


def model_outcomes(stream: Sequence[dict[str, Any]], draws: int, seed: int, batch_size: int = 512) -> list[int]:
    """Positives out of `draws` temperature-1 samples of the shipped tiny model, per prompt (exact-match reward)."""
    import torch

    from trl_ada.tasks.arithmetic import exact_match_reward
    from trl_ada.tiny import load_tiny

    model, tokenizer = load_tiny(ASSETS)
    model.eval()
    torch.manual_seed(seed)
    rows = [p for p in stream for _ in range(draws)]
    rewards: list[float] = []
    with torch.no_grad():
        for start in range(0, len(rows), batch_size):
            batch = rows[start : start + batch_size]
            enc = tokenizer([r["prompt"] for r in batch], return_tensors="pt", add_special_tokens=False)
            out = model.generate(
                **enc,
                max_new_tokens=8,
                do_sample=True,
                temperature=1.0,
                top_k=0,
                top_p=1.0,
                pad_token_id=tokenizer.pad_token_id,
                eos_token_id=tokenizer.eos_token_id,
            )
            texts = tokenizer.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=False)
            texts = [text.replace(tokenizer.pad_token, "") for text in texts]
            rewards.extend(exact_match_reward(texts, [r["answer"] for r in batch]))
    return [int(sum(rewards[i * draws : (i + 1) * draws])) for i in range(len(stream))]


def evaluate(
    stream: Sequence[dict[str, Any]],
    positives: Sequence[int],
    draws: int,
    batch_size: int,
    oracle: dict[int, float],
    learning_rate: float = 0.1,
) -> dict[str, Any]:
    """Per-batch calibration of every predictor, and the learned predictor's seconds per batch (predict + update)."""
    learned = LearnedPassRatePredictor(learning_rate=learning_rate)
    seen_draws = seen_positives = 0
    per_batch: dict[str, list[dict[str, float]]] = {name: [] for name in PREDICTORS}
    seconds: list[float] = []
    for start in range(0, len(stream), batch_size):
        batch = stream[start : start + batch_size]
        hits = list(positives[start : start + batch_size])
        totals = [draws] * len(batch)
        keys = [PromptKey(p["prompt"], p["prompt"]) for p in batch]
        started = time.perf_counter()
        predictions = {"learned": learned.estimate(keys)}
        learned.update(keys, totals, hits)
        seconds.append(time.perf_counter() - started)
        mean = seen_positives / seen_draws if seen_draws else 0.5
        predictions["tracker"] = [0.5] * len(batch)
        predictions["batch_mean"] = [min(max(mean, 1e-6), 1 - 1e-6)] * len(batch)
        predictions["level_oracle"] = [min(max(oracle[p["level"]], 1e-6), 1 - 1e-6) for p in batch]
        for name, values in predictions.items():
            per_batch[name].append(calibration(values, totals, hits))
        seen_draws += sum(totals)
        seen_positives += sum(hits)
    return {"per_batch": per_batch, "seconds_per_batch": seconds}


def summarize(per_batch: dict[str, list[dict[str, float]]], skip: int) -> dict[str, dict[str, float]]:
    """Mean log-loss and Brier per predictor over all batches, and over the batches after the first `skip`."""
    summary: dict[str, dict[str, float]] = {}
    for name, batches in per_batch.items():
        later = batches[skip:]
        summary[name] = {
            "log_loss_all": _mean(b["log_loss"] for b in batches),
            "brier_all": _mean(b["brier"] for b in batches),
            f"log_loss_after_{skip}": _mean(b["log_loss"] for b in later),
            f"brier_after_{skip}": _mean(b["brier"] for b in later),
        }
    return summary


def cost(out: Path, seed: int, repeats: int = 5) -> list[str]:
    """Seconds per step of the learned predictor against the tiny task's generation of the same step (medians)."""
    import torch

    from trl_ada.tiny import load_tiny

    model, tokenizer = load_tiny(ASSETS)
    model.eval()
    torch.manual_seed(seed)
    rng = random.Random(seed)
    stream = fresh_stream(512 * (repeats + 1), seed)
    filler = "Find the number of ordered pairs of integers (a, b) such that a^2 + b^2 is a multiple of seven. "
    rows: list[dict[str, Any]] = []
    for batch_size in (64, 256, 512):
        timings: dict[str, list[float]] = {"arithmetic": [], "long_600": [], "generation": []}
        for repeat in range(repeats):
            chunk = stream[repeat * batch_size : (repeat + 1) * batch_size]
            for name in ("arithmetic", "long_600"):
                predictor = LearnedPassRatePredictor()
                texts = [p["prompt"] if name == "arithmetic" else (p["prompt"] + filler * 7)[:600] for p in chunk]
                warm = [PromptKey(f"w{i}", t[::-1]) for i, t in enumerate(texts)]  # weights exist, features new
                predictor.update(warm, [4] * len(warm), [rng.randint(0, 4) for _ in warm])
                keys = [PromptKey(f"k{i}", t) for i, t in enumerate(texts)]
                started = time.perf_counter()
                predictor.estimate(keys)
                predictor.update(keys, [4] * len(keys), [rng.randint(0, 4) for _ in keys])
                timings[name].append(time.perf_counter() - started)
            enc = tokenizer(
                [p["prompt"] for p in chunk for _ in range(4)], return_tensors="pt", add_special_tokens=False
            )
            started = time.perf_counter()
            with torch.no_grad():
                model.generate(
                    **enc,
                    max_new_tokens=8,
                    do_sample=True,
                    temperature=1.0,
                    top_k=0,
                    pad_token_id=tokenizer.pad_token_id,
                    eos_token_id=tokenizer.eos_token_id,
                )
            timings["generation"].append(time.perf_counter() - started)
        medians = {name: sorted(v)[len(v) // 2] for name, v in timings.items()}
        rows.append({"prompts": batch_size, **medians})
    lines = [
        f"seconds per step (median of {repeats}; predictor = estimate + update; generation = 4 draws per prompt, "
        f"shipped tiny model, torch threads {torch.get_num_threads()})",
        f"{'prompts':>8}{'arithmetic':>12}{'600 chars':>12}{'generation':>12}{'arith/gen':>11}",
    ]
    for row in rows:
        lines.append(
            f"{row['prompts']:>8}{row['arithmetic']:>12.4f}{row['long_600']:>12.4f}{row['generation']:>12.4f}"
            f"{row['arithmetic'] / row['generation']:>11.3f}"
        )
    out.mkdir(parents=True, exist_ok=True)
    (out / "predictor_cost.json").write_text(json.dumps({"rows": rows, "repeats": repeats}, indent=1) + "\n")
    (out / "predictor_cost.txt").write_text("\n".join(lines) + "\n")
    return lines


def _mean(values: Any) -> float:
    values = list(values)
    return sum(values) / len(values) if values else math.nan


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--outcomes", choices=["level", "model"], default="level")
    parser.add_argument("--prompts", type=int, default=3072)
    parser.add_argument("--draws", type=int, default=8, help="scored draws per prompt")
    parser.add_argument("--batch-size", type=int, default=64, help="prompts per step")
    parser.add_argument("--skip", type=int, default=10, help="batches left out of the *_after_N columns (warm-up)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--learning-rate", type=float, default=0.1, help="pass_rate_predictor_learning_rate")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--cost", action="store_true", help="time the predictor against generation instead")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.cost:
        for line in cost(args.out, args.seed):
            logger.info(line)
        return 0

    stream = fresh_stream(args.prompts, args.seed)
    started = time.perf_counter()
    if args.outcomes == "level":
        positives = bernoulli_outcomes(stream, args.draws, args.seed)
        oracle = level_rates()
    else:
        positives = model_outcomes(stream, args.draws, args.seed)
        by_level: dict[int, list[int]] = {}
        for problem, k in zip(stream, positives, strict=True):
            by_level.setdefault(problem["level"], []).append(k)
        oracle = {level: sum(ks) / (len(ks) * args.draws) for level, ks in by_level.items()}
    outcome_seconds = time.perf_counter() - started
    result = evaluate(stream, positives, args.draws, args.batch_size, oracle, args.learning_rate)
    summary = summarize(result["per_batch"], args.skip)
    seconds = sorted(result["seconds_per_batch"])
    report = {
        "command": " ".join(["python", "benchmarks/predictor_quality.py", *(sys.argv[1:] if argv is None else argv)]),
        "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "levels": {LEVELS[level]: sum(p["level"] == level for p in stream) for level in range(len(LEVELS))},
        "oracle_rates": {LEVELS[level]: rate for level, rate in sorted(oracle.items())},
        "outcome_seconds": outcome_seconds,
        "learned_seconds_per_batch": {"median": seconds[len(seconds) // 2], "max": seconds[-1]},
        "summary": summary,
        "per_batch_log_loss": {
            name: [b["log_loss"] for b in batches] for name, batches in result["per_batch"].items()
        },
    }
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / f"predictor_quality_{args.outcomes}"
    stem.with_suffix(".json").write_text(json.dumps(report, indent=1) + "\n")
    skip = args.skip
    lines = [
        f"{len(stream)} fresh prompts ({args.batch_size} per batch), {args.draws} draws each, outcomes={args.outcomes}",
        f"per-draw log-loss / Brier (mean over batches; after_{skip}: batches {skip + 1}..)",
        f"{'predictor':<14}{'log_loss':>10}{'brier':>9}{f'll_after_{skip}':>14}{f'br_after_{skip}':>13}",
    ]
    for name, row in summary.items():
        lines.append(
            f"{name:<14}{row['log_loss_all']:>10.4f}{row['brier_all']:>9.4f}"
            f"{row[f'log_loss_after_{skip}']:>14.4f}{row[f'brier_after_{skip}']:>13.4f}"
        )
    lines.append(
        f"learned predictor, predict + update of one batch of {args.batch_size}: median "
        f"{seconds[len(seconds) // 2] * 1e3:.2f} ms, max {seconds[-1] * 1e3:.2f} ms"
    )
    stem.with_suffix(".txt").write_text("\n".join(lines) + "\n")
    for line in lines:
        logger.info(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
