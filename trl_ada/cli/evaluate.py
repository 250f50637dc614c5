"""Evaluate a checkpoint: Ave@k and pass@k on one or more math datasets, scored by a verifier.

Draws --num_samples completions per problem (by default the paper's Ave@32 setting), scores them with the reward and
reports per dataset Ave@n (accuracy averaged over each problem's n samples, then over problems) and the unbiased
pass@k for each --pass_at_k value, in a JSON file and a markdown table (with the paper's "weighted average" row when
there are several datasets).

    trl-ada evaluate --model_name_or_path outputs/seq-balance --use_vllm \\
        --dataset_name HuggingFaceH4/MATH-500 --num_samples 32 --output results/seq-balance.json

Datasets without a ``prompt`` column get prompts built from --problem_column as ``trl-ada prepare-data`` builds them
(same defaults). In a checkout, ``python scripts/evaluate.py`` takes the same flags.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from trl_ada.data import DEFAULT_INSTRUCTION, DEFAULT_SYSTEM_PROMPT, add_sampling_arguments
from trl_ada.reporting.metrics import average_at_k, count_correct, mean_pass_at_k, weighted_average

logger = logging.getLogger("evaluate")

DEFAULT_PASS_AT_K = (1, 2, 4, 8, 16, 32, 64, 128, 256)

__all__ = [
    "DEFAULT_PASS_AT_K",
    "build_parser",
    "dataset_prompts",
    "evaluate",
    "main",
    "markdown_table",
    "resolve_ks",
    "reward_columns",
    "summarize",
]


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    """The command-line parser (`prog`: the command's name in usage and errors, e.g. ``trl-ada evaluate``)."""
    parser = argparse.ArgumentParser(
        prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model_name_or_path", required=True, help="Checkpoint directory or hub id.")
    parser.add_argument(
        "--dataset_name",
        nargs="+",
        required=True,
        help="One or more datasets: hub ids or local .parquet/.jsonl/.json/.csv files or directories.",
    )
    parser.add_argument("--dataset_config")
    parser.add_argument("--split", default="test", help="Split to evaluate (a local file is whatever split you name).")
    parser.add_argument("--problem_column", default="problem", help="Used when the dataset has no 'prompt' column.")
    parser.add_argument(
        "--reference_column",
        default="auto",
        help="Column holding the reference answer, passed to the reward under the name it expects ('solution' for "
        "math_verify, 'answer' for exact_match). 'auto': that name if present, else 'answer', else 'solution'.",
    )
    parser.add_argument("--limit", type=int, help="Evaluate only the first N problems of each dataset.")
    parser.add_argument(
        "--prompt_format",
        choices=["auto", "conversational", "text"],
        default="auto",
        help="For datasets without 'prompt': messages if the tokenizer has a chat template ('auto'), or plain text.",
    )
    parser.add_argument("--system_prompt", default=DEFAULT_SYSTEM_PROMPT, help="'' for none.")
    parser.add_argument("--instruction", default=DEFAULT_INSTRUCTION, help="Appended to each problem; '' for none.")
    parser.add_argument("--reward", default="math_verify", help="Reward name (see trl_ada.rewards.REWARD_FUNCS).")
    parser.add_argument("--num_samples", type=int, default=32, help="Samples per problem (n of Ave@n).")
    parser.add_argument(
        "--pass_at_k",
        type=int,
        nargs="*",
        help="k values for pass@k (each <= --num_samples). Default: powers of two up to --num_samples.",
    )
    add_sampling_arguments(parser)
    parser.add_argument("--output", type=Path, required=True, help="JSON file to write.")
    parser.add_argument("--save_completions", action="store_true", help="Also store every completion and reward.")
    parser.add_argument("--log_level", default="INFO")
    return parser


def resolve_ks(args: argparse.Namespace) -> list[int]:
    """The pass@k values to report (validated against --num_samples)."""
    if args.num_samples < 1:
        raise ValueError(f"--num_samples must be >= 1, got {args.num_samples}.")
    if args.pass_at_k is None:
        return [k for k in DEFAULT_PASS_AT_K if k <= args.num_samples]
    bad = [k for k in args.pass_at_k if not 1 <= k <= args.num_samples]
    if bad:
        raise ValueError(f"--pass_at_k values must be in [1, --num_samples={args.num_samples}], got {bad}.")
    return sorted(set(args.pass_at_k))


def reward_columns(dataset: Any, reward_func: Any, reference_column: str) -> dict[str, list[Any]]:
    """The columns passed to the reward: every dataset column but ``prompt``, plus the reference under each name the
    reward needs that the dataset lacks."""
    from trl_ada.rewards.reward_registry import required_reward_columns

    columns = {name: dataset[name] for name in dataset.column_names if name != "prompt"}
    needed = [name for name in required_reward_columns([reward_func]) if name not in columns]
    if not needed:
        return columns
    source = reference_column
    if source == "auto":
        source = next((name for name in ("answer", "solution") if name in columns), None)
    if source is None or source not in columns:
        raise ValueError(
            f"The reward needs column(s) {needed}; the dataset has {dataset.column_names}. Pass --reference_column "
            "naming the column that holds the reference answer."
        )
    for name in needed:
        columns[name] = columns[source]
    return columns


def dataset_prompts(dataset: Any, args: argparse.Namespace, tokenizer: Any) -> list[Any]:
    """The prompts of a dataset: its ``prompt`` column, or prompts built from --problem_column."""
    from trl_ada.data import make_prompt, wants_chat_messages

    if "prompt" in dataset.column_names:
        return list(dataset["prompt"])
    if args.problem_column not in dataset.column_names:
        raise ValueError(
            f"The dataset has neither 'prompt' nor {args.problem_column!r}; it has {dataset.column_names}. Set "
            "--problem_column."
        )
    conversational = wants_chat_messages(args.prompt_format, tokenizer)
    return [
        make_prompt(
            problem,
            system_prompt=args.system_prompt or None,
            instruction=args.instruction or None,
            conversational=conversational,
        )
        for problem in dataset[args.problem_column]
    ]


def summarize(correct_counts: Sequence[int], num_samples: int, ks: Sequence[int]) -> dict[str, float | None]:
    """``{"ave@n": ..., "pass@k": ...}`` over the scored problems (``None`` when no problem was scored)."""
    if not correct_counts:
        return {f"ave@{num_samples}": None, **{f"pass@{k}": None for k in ks}}
    metrics = {f"ave@{num_samples}": average_at_k(correct_counts, num_samples)}
    for k in ks:
        metrics[f"pass@{k}"] = mean_pass_at_k(correct_counts, num_samples, k)
    return metrics


def markdown_table(results: dict[str, Any]) -> str:
    """A markdown table with one row per dataset (and the weighted average), values in percent."""
    first = next(iter(results["datasets"].values()))
    names = list(first["metrics"])
    lines = [
        "| dataset | problems | " + " | ".join(names) + " |",
        "|---|---:|" + "---:|" * len(names),
    ]
    rows = list(results["datasets"].items())
    if "weighted_average" in results:
        rows.append(("weighted average", results["weighted_average"]))

    def show(value: float | None) -> str:
        return "n/a" if value is None or math.isnan(value) else f"{100 * value:.1f}"

    for name, entry in rows:
        lines.append(
            f"| {name} | {entry['num_scored']} | " + " | ".join(show(entry["metrics"][m]) for m in names) + " |"
        )
    return "\n".join(lines)


def evaluate(args: argparse.Namespace, generator: Any = None, tokenizer: Any = None) -> dict[str, Any]:
    """Samples, scores and aggregates every dataset; writes the JSON and returns the results. ``generator``
    (``generator(prompts, n) -> list[list[str]]``) and ``tokenizer`` replace what --model_name_or_path would load."""
    from trl_ada.data import generator_from_args, load_prompt_dataset, tokenize_prompts
    from trl_ada.rewards.reward_registry import get_reward_funcs, score_completions

    ks = resolve_ks(args)
    reward_func = get_reward_funcs([args.reward])[0]
    if args.limit is not None and args.limit < 1:
        raise ValueError(f"--limit must be >= 1, got {args.limit}.")
    datasets = []
    for name in args.dataset_name:
        dataset = load_prompt_dataset(name, split=args.split, config=args.dataset_config)
        if args.limit is not None:
            dataset = dataset.select(range(min(args.limit, len(dataset))))
        if len(dataset) == 0:
            raise ValueError(f"{name} (split {args.split!r}) has no rows; check --split and --dataset_config.")
        datasets.append((name, dataset, reward_columns(dataset, reward_func, args.reference_column)))

    if tokenizer is None and generator is None:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(args.model_name_or_path)
    # Build (and check) every dataset's prompts before sampling anything, so a format error costs no generation.
    prompts_of = []
    for name, dataset, _ in datasets:
        prompts = dataset_prompts(dataset, args, tokenizer)
        if tokenizer is not None:
            try:
                tokenize_prompts(tokenizer, prompts[:1])
            except ValueError as error:
                raise ValueError(f"{name}: {error}") from error
        prompts_of.append(prompts)
    if generator is None:
        generator = generator_from_args(args)

    n = args.num_samples
    results: dict[str, Any] = {
        "model": args.model_name_or_path,
        "reward": args.reward,
        "num_samples": n,
        "pass_at_k": ks,
        "temperature": args.temperature,
        "top_p": args.top_p,
        "max_new_tokens": args.max_new_tokens,
        "seed": args.seed,
        "datasets": {},
    }
    for position, ((name, _, columns), prompts) in enumerate(zip(datasets, prompts_of, strict=True)):
        key = name if name not in results["datasets"] else f"{name}#{position}"
        logger.info("Sampling %d x %d completions for %s.", len(prompts), n, name)
        completions = generator(prompts, n)
        rewards = score_completions(reward_func, prompts, completions, columns)
        problems, scored_counts = [], []
        for index, row_rewards in enumerate(rewards):
            count = count_correct(row_rewards)
            problem: dict[str, Any] = {"index": index, "num_correct": count, "num_samples": n}
            problem["pass_rate"] = None if count is None else count / n
            if args.save_completions:
                problem.update(prompt=prompts[index], completions=completions[index], rewards=row_rewards)
            problems.append(problem)
            if count is not None:
                scored_counts.append(count)
        skipped = len(problems) - len(scored_counts)
        if skipped:
            logger.warning("%s: %d problems skipped (the reward returned None for all their samples).", name, skipped)
        results["datasets"][key] = {
            "split": args.split,
            "num_problems": len(problems),
            "num_scored": len(scored_counts),
            "num_skipped": skipped,
            "metrics": summarize(scored_counts, n, ks),
            "problems": problems,
        }
    if len(results["datasets"]) > 1:
        entries = list(results["datasets"].values())
        weights = [entry["num_scored"] for entry in entries]
        metrics: dict[str, float | None] = {}
        for metric in entries[0]["metrics"]:
            values = [entry["metrics"][metric] or 0.0 for entry in entries]
            average = weighted_average(values, weights)
            metrics[metric] = None if math.isnan(average) else average
        results["weighted_average"] = {"num_scored": sum(weights), "metrics": metrics}
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(results, indent=2, ensure_ascii=False, default=str) + "\n")
    return results


def main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    """Command-line entry point: `trl-ada evaluate` and `scripts/evaluate.py`."""
    args = build_parser(prog).parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from trl_ada.runtime.model_path import check_model_name

    try:
        check_model_name(args.model_name_or_path, "--model_name_or_path")  # before any dataset or model loads
        results = evaluate(args)
    except (ValueError, FileNotFoundError) as error:
        logger.error("%s", error)
        return 2
    print(markdown_table(results))
    print(f"\nWrote {args.output}.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
