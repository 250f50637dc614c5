"""Prepare an OpenR1-Math-style training set the way the Reinforce-Ada paper does (Section 4.1, "Data").

Stages, each counted in a JSON report:

1. deduplicate prompts (problem text with whitespace normalised; the first occurrence is kept);
2. drop prompts whose reference answer fails verification (Math-Verify cannot parse it, or a completion stating it
   as its boxed answer does not get reward 1);
3. optionally drop prompts longer than --max_prompt_length tokens (as the trainer tokenises them);
4. difficulty filter: sample --num_samples completions per prompt from a base model (temperature 1), score them
   with the reward, keep prompts whose pass rate lies in a band.

The result is TRL's prompt-only format (``prompt``, ``solution`` = the reference answer, ``problem``, plus
``num_correct``/``pass_rate`` when stage 4 ran), ready for ``scripts/train_ada.py --dataset_name <output>``. A reward
that reads the reference under the answer column's own name (``--reward exact_match`` reads ``answer``) finds it
there too. Every column the reward reads is checked against the output's columns before any stage runs.

The paper's moderate set (discard pass rate > 0.375 and 0 correct of 16) and its hard set (1-2 correct of 16):

    python scripts/prepare_data.py --dataset_name open-r1/OpenR1-Math-220k --dataset_config default \\
        --model_name_or_path Qwen/Qwen2.5-Math-1.5B --use_vllm --num_samples 16 --max_new_tokens 4096 \\
        --pass_rate_band 0 0.375 --output data/openr1_moderate.parquet       # band (0, 0.375]: 1..6 of 16
    python scripts/prepare_data.py ... --correct_range 1 2 --output data/openr1_hard.parquet

Instead of one band, --band_mix selects a set with given counts per band (stage 5), e.g. 1,000 prompts in the
paper's training mix (984/3,082/870/63 of 4,999 prompts at pass rate 0, (0, 0.2], (0.2, 0.5], above 0.5), each
prompt's band written in a ``band`` column:

    python scripts/prepare_data.py ... --band_mix "[0,0]:984" "(0,0.2]:3082" "(0.2,0.5]:870" "(0.5,1]:63" \\
        --mix_total 1000 --output data/mix.jsonl

Without --pass_rate_band/--correct_range/--band_mix, stages 1-3 run and no model is sampled.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

logger = logging.getLogger("prepare_data")

_OUTPUT_SUFFIXES = (".parquet", ".jsonl", ".json")


def build_parser() -> argparse.ArgumentParser:
    """The command-line parser."""
    from trl_ada.data import DEFAULT_INSTRUCTION, DEFAULT_SYSTEM_PROMPT

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    data = parser.add_argument_group("data")
    data.add_argument(
        "--dataset_name",
        required=True,
        help="Hub id, or a local .parquet/.jsonl/.json/.csv file or directory (also save_to_disk directories).",
    )
    data.add_argument("--dataset_config", default=None, help="Dataset configuration (e.g. 'default' for OpenR1).")
    data.add_argument("--split", default="train")
    data.add_argument("--problem_column", default="problem")
    data.add_argument(
        "--answer_column",
        default="auto",
        help="Column with the reference answer; 'auto' picks 'answer' if present, else 'solution'. It is written as "
        "'solution' (what the math_verify reward reads), and also kept under its own name when --reward reads that "
        "column (exact_match reads 'answer').",
    )
    data.add_argument("--keep_columns", nargs="*", default=[], help="Other input columns to carry into the output.")
    data.add_argument("--limit", type=int, default=None, help="Use only the first N input rows (a dry run).")
    data.add_argument(
        "--output", required=True, type=Path, help="Output file: .parquet, .jsonl or .json (JSON lines)."
    )
    data.add_argument("--report", type=Path, default=None, help="JSON report path (default: <output>.report.json).")

    prompts = parser.add_argument_group("prompt format")
    prompts.add_argument(
        "--prompt_format",
        choices=["auto", "conversational", "text"],
        default="auto",
        help="Chat messages or plain text; 'auto': messages if the model's tokenizer has a chat template (or no model "
        "is given), else text.",
    )
    prompts.add_argument("--system_prompt", default=DEFAULT_SYSTEM_PROMPT, help="'' for none. Default: the authors'.")
    prompts.add_argument(
        "--instruction",
        default=DEFAULT_INSTRUCTION,
        help="Appended to each problem; '' for none. Default: the authors'.",
    )
    prompts.add_argument(
        "--max_prompt_length",
        type=int,
        default=None,
        help="Drop prompts longer than this many tokens (needs --model_name_or_path for the tokenizer).",
    )

    difficulty = parser.add_argument_group("difficulty filter (runs when a band is given)")
    band = difficulty.add_mutually_exclusive_group()
    band.add_argument(
        "--pass_rate_band",
        nargs=2,
        type=float,
        metavar=("LOW", "HIGH"),
        help="Keep prompts whose pass rate lies between LOW and HIGH; ends set by --band_ends. The paper: 0 0.375.",
    )
    band.add_argument(
        "--correct_range",
        nargs=2,
        type=int,
        metavar=("MIN", "MAX"),
        help="Keep prompts with MIN..MAX correct samples (both included). The paper's hard set: 1 2 (of 16).",
    )
    band.add_argument(
        "--band_mix",
        nargs="+",
        metavar="BAND:COUNT",
        help="Select COUNT prompts from each pass-rate BAND, written as an interval with its brackets, e.g. "
        "'[0,0]:984' '(0,0.2]:3082'. Bands must not overlap; prompts outside every band are dropped. Counts are "
        "exact, or weights when --mix_total is set. Adds a 'band' column (the band, as written in the report).",
    )
    difficulty.add_argument(
        "--mix_total",
        type=int,
        default=None,
        help="With --band_mix: scale the counts to this many prompts in all (largest remainder rounding).",
    )
    difficulty.add_argument(
        "--band_ends",
        choices=["(]", "[]", "[)", "()"],
        default="(]",
        help="Which ends of --pass_rate_band are included: '(]' (default, the paper's (0, 0.375]) excludes LOW and "
        "includes HIGH.",
    )
    difficulty.add_argument("--model_name_or_path", default=None, help="Base model to sample from (dir or hub id).")
    difficulty.add_argument("--num_samples", type=int, default=16, help="Completions per prompt (k).")
    difficulty.add_argument("--max_new_tokens", type=int, default=4096)
    difficulty.add_argument("--temperature", type=float, default=1.0)
    difficulty.add_argument("--top_p", type=float, default=1.0)
    difficulty.add_argument("--reward", default="math_verify", help="Reward name (see trl_ada.rewards.REWARD_FUNCS).")
    difficulty.add_argument("--use_vllm", action="store_true", help="Sample with vLLM when it is installed.")
    difficulty.add_argument("--batch_size", type=int, default=64, help="Rows per transformers generate call.")
    difficulty.add_argument("--dtype", default="auto", help="Model dtype: auto, bfloat16, float16, float32.")
    difficulty.add_argument("--gpu_memory_utilization", type=float, default=0.9, help="vLLM only.")
    difficulty.add_argument("--tensor_parallel_size", type=int, default=1, help="vLLM only.")
    difficulty.add_argument("--seed", type=int, default=0)
    parser.add_argument("--log_level", default="INFO")
    return parser


def check_args(args: argparse.Namespace) -> None:
    """Argument checks that need no data (fail fast, with the fix in the message)."""
    from trl_ada.rewards import get_reward_funcs

    get_reward_funcs([args.reward])
    if args.output.suffix.lower() not in _OUTPUT_SUFFIXES:
        raise ValueError(f"--output must end in one of {_OUTPUT_SUFFIXES}, got {args.output}.")
    filtering = any(value is not None for value in (args.pass_rate_band, args.correct_range, args.band_mix))
    if args.num_samples < 1:
        raise ValueError(f"--num_samples must be >= 1, got {args.num_samples}.")
    if filtering:
        band_of(args)  # validates the band
    if args.band_mix is not None:
        mix_counts(parse_band_mix(args.band_mix), args.mix_total, args.num_samples)  # validates the mix
    elif args.mix_total is not None:
        raise ValueError("--mix_total only applies to --band_mix.")
    if (filtering or args.max_prompt_length is not None) and not args.model_name_or_path:
        raise ValueError(
            "--pass_rate_band/--correct_range/--band_mix and --max_prompt_length need --model_name_or_path."
        )
    if args.limit is not None and args.limit < 1:
        raise ValueError(f"--limit must be >= 1, got {args.limit}.")


def band_of(args: argparse.Namespace) -> Any:
    """The pass-rate band the arguments describe, or ``None`` when no difficulty filter was asked for."""
    from trl_ada.metrics import PassRateBand

    if args.correct_range is not None:
        return PassRateBand.from_correct_range(*args.correct_range, args.num_samples)
    if args.pass_rate_band is not None:
        return PassRateBand.from_ends(*args.pass_rate_band, ends=args.band_ends)
    if getattr(args, "band_mix", None) is not None:
        # Score every prompt; the mix selection (stage 5) then picks by band.
        return PassRateBand.from_ends(0, 1, ends="[]")
    return None


_BAND_SPEC = re.compile(r"^\s*([\[(])\s*([0-9.]+)\s*,\s*([0-9.]+)\s*([\])])\s*:\s*([0-9.]+)\s*$")


def parse_band_mix(specs: Sequence[str]) -> list[tuple[Any, float]]:
    """Parses ``--band_mix`` entries (``"(0,0.2]:3082"``) into ``(PassRateBand, count)`` pairs, in order."""
    from trl_ada.metrics import PassRateBand

    mix = []
    for spec in specs:
        match = _BAND_SPEC.match(spec)
        if match is None:
            raise ValueError(
                f"--band_mix entry {spec!r} is not BAND:COUNT with BAND an interval such as '(0,0.2]' or '[0,0]'."
            )
        opening, low, high, closing, count = match.groups()
        band = PassRateBand.from_ends(float(low), float(high), ends=opening + closing)
        if float(count) < 0:
            raise ValueError(f"--band_mix counts must be >= 0, got {spec!r}.")
        mix.append((band, float(count)))
    return mix


def mix_counts(mix: Sequence[tuple[Any, float]], total: int | None, num_samples: int) -> list[int]:
    """The number of prompts to select from each band of ``mix``.

    Without ``total`` the counts must be whole numbers and are taken as they are. With ``total`` they are weights,
    scaled to sum to ``total`` by largest remainder (ties to the earlier band), so e.g. the paper's 984/3082/870/63
    of 4,999 becomes 197/616/174/13 of 1,000.

    Raises:
        ValueError: on an empty mix, counts that are not whole (without ``total``), weights summing to 0, or bands
            that overlap on a pass rate ``c / num_samples`` (a prompt must belong to at most one band).
    """
    if not mix:
        raise ValueError("--band_mix needs at least one BAND:COUNT.")
    for first in range(len(mix)):
        for second in range(first + 1, len(mix)):
            shared = [
                c
                for c in range(num_samples + 1)
                if mix[first][0].contains(c, num_samples) and mix[second][0].contains(c, num_samples)
            ]
            if shared:
                raise ValueError(
                    f"--band_mix bands {mix[first][0]} and {mix[second][0]} overlap at {shared[0]} of {num_samples} "
                    "correct; make them disjoint (mind the brackets)."
                )
    weights = [count for _, count in mix]
    if total is None:
        if any(weight != int(weight) for weight in weights):
            raise ValueError(f"--band_mix counts must be whole numbers without --mix_total, got {weights}.")
        return [int(weight) for weight in weights]
    if total < 0 or sum(weights) <= 0:
        raise ValueError(f"--mix_total must be >= 0 and the --band_mix weights must not all be 0, got {total}.")
    exact = [total * weight / sum(weights) for weight in weights]
    counts = [int(value) for value in exact]
    # Hand the rounding remainder to the largest fractional parts (stable: ties go to the earlier band).
    order = sorted(range(len(mix)), key=lambda i: -(exact[i] - counts[i]))
    for i in order[: total - sum(counts)]:
        counts[i] += 1
    return counts


def select_band_mix(
    dataset: Any, mix: Sequence[tuple[Any, float]], counts: Sequence[int], num_samples: int, seed: int
) -> tuple[Any, dict[str, dict[str, int]]]:
    """Stage 5: picks ``counts[i]`` rows of ``dataset`` (scored: a ``num_correct`` column) from band ``mix[i]``,
    uniformly at random (``random.Random(seed)``), keeps them in dataset order and adds a ``band`` column.

    Returns:
        The selected rows, and ``{band: {"requested", "available"}}`` per band.

    Raises:
        ValueError: when a band holds fewer scored prompts than requested (score a larger pool).
    """
    rng = random.Random(f"band-mix-{seed}")
    members: list[list[int]] = [[] for _ in mix]
    for index, correct in enumerate(dataset["num_correct"]):
        for position, (band, _) in enumerate(mix):
            if band.contains(correct, num_samples):
                members[position].append(index)
                break
    stats = {
        str(band): {"requested": count, "available": len(rows)}
        for (band, _), count, rows in zip(mix, counts, members, strict=True)
    }
    short = {name: value for name, value in stats.items() if value["available"] < value["requested"]}
    if short:
        raise ValueError(
            f"Too few scored prompts for --band_mix: {short}. Score a larger pool (more input rows) or lower the "
            "counts."
        )
    labels: dict[int, str] = {}
    for (band, _), count, rows in zip(mix, counts, members, strict=True):
        for index in rng.sample(rows, count):
            labels[index] = str(band)
    keep = sorted(labels)
    selected = dataset.select(keep)
    return selected.add_column("band", [labels[index] for index in keep]), stats


def reference_aliases(reward_func: Any, answer_column: str, output_columns: Sequence[str]) -> list[str]:
    """Names besides ``solution`` under which the output must hold the reference answer for ``reward_func``.

    The reward reads the dataset columns it declares ([`trl_ada.rewards.required_reward_columns`]). The reference is
    always written as ``solution``; when the reward reads the answer column by its input name (``exact_match`` reads
    ``answer``), the reference stays under that name too.

    Raises:
        ValueError: when the reward reads a column the output will not have, naming it and the flags that fix it.
            Called before any stage, so a mismatch costs no sampling.
    """
    from trl_ada.rewards import required_reward_columns

    needed = required_reward_columns([reward_func])
    aliases = [name for name in needed if name == answer_column and name != "solution"]
    missing = [name for name in needed if name not in {*output_columns, *aliases}]
    if missing:
        raise ValueError(
            f"The reward reads column(s) {missing}, which the output would not have: it holds {list(output_columns)} "
            f"(the reference answer, from {answer_column!r}, is written as 'solution'). Set --answer_column to the "
            f"column the reward reads as the reference, add the column to --keep_columns, or pick a --reward that "
            f"reads 'solution' (math_verify)."
        )
    return aliases


def normalize_whitespace(text: Any) -> str:
    """The deduplication key of a problem: its words joined by single spaces."""
    return " ".join(str(text).split())


def deduplicate(dataset: Any, column: str) -> tuple[Any, int]:
    """Keeps the first row of each problem (whitespace-normalised); returns the dataset and the number removed."""
    seen: set[str] = set()
    keep = []
    for index, value in enumerate(dataset[column]):
        key = normalize_whitespace(value)
        if key not in seen:
            seen.add(key)
            keep.append(index)
    return dataset.select(keep), len(dataset) - len(keep)


def filter_verifiable_references(dataset: Any, column: str) -> tuple[Any, list[Any]]:
    """Drops rows whose reference fails [`trl_ada.rewards.reference_verifies`]; returns the dataset and the failing
    references (in row order)."""
    from tqdm.auto import tqdm

    from trl_ada.rewards import reference_verifies

    references = dataset[column]
    verdicts: dict[Any, bool] = {}
    for reference in tqdm(references, desc="Checking references", unit="prompt"):
        key = reference if isinstance(reference, str) else repr(reference)
        if key not in verdicts:
            verdicts[key] = reference_verifies(reference)
    keep, failed = [], []
    for index, reference in enumerate(references):
        if verdicts[reference if isinstance(reference, str) else repr(reference)]:
            keep.append(index)
        else:
            failed.append(reference)
    return dataset.select(keep), failed


def filter_long_prompts(dataset: Any, tokenizer: Any, max_prompt_length: int) -> tuple[Any, int]:
    """Drops prompts longer than ``max_prompt_length`` tokens (tokenised as the trainer does)."""
    from trl_ada.data import tokenize_prompts

    lengths = [len(ids) for ids in tokenize_prompts(tokenizer, dataset["prompt"])]
    keep = [index for index, length in enumerate(lengths) if length <= max_prompt_length]
    return dataset.select(keep), len(dataset) - len(keep)


def difficulty_filter(
    dataset: Any, generator: Any, reward_func: Any, num_samples: int, band: Any
) -> tuple[Any, dict[str, Any]]:
    """Samples ``num_samples`` completions per prompt, scores them and keeps the prompts inside ``band``.

    Adds the columns ``num_correct`` and ``pass_rate``. A completion is correct when its reward exceeds 0.5; a prompt
    whose rewards are all ``None`` is "unscorable" and dropped.

    Returns:
        The kept rows, and ``{"too_hard", "too_easy", "unscorable", "histogram"}`` (histogram: prompts per number
        of correct samples, over every scored prompt).
    """
    from trl_ada.metrics import count_correct, pass_rate_histogram
    from trl_ada.rewards import score_completions

    prompts = dataset["prompt"]
    completions = generator(prompts, num_samples)
    if len(completions) != len(prompts) or any(len(texts) != num_samples for texts in completions):
        raise RuntimeError(f"The generator must return {num_samples} completions for each of {len(prompts)} prompts.")
    columns = {name: dataset[name] for name in dataset.column_names if name != "prompt"}
    rewards = score_completions(reward_func, prompts, completions, columns)
    counts = [count_correct(row) for row in rewards]
    stats: dict[str, Any] = {"too_hard": 0, "too_easy": 0, "unscorable": 0}
    keep = []
    for index, count in enumerate(counts):
        if count is None:
            stats["unscorable"] += 1
            continue
        side = band.side(count, num_samples)
        if side == "inside":
            keep.append(index)
        else:
            stats["too_hard" if side == "below" else "too_easy"] += 1
    stats["histogram"] = pass_rate_histogram((count for count in counts if count is not None), num_samples)
    scored = dataset.add_column("num_correct", [-1 if count is None else count for count in counts])
    scored = scored.add_column("pass_rate", [float("nan") if c is None else c / num_samples for c in counts])
    return scored.select(keep), stats


def write_dataset(dataset: Any, path: Path) -> None:
    """Writes ``dataset`` as parquet or JSON lines, by the file suffix."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix.lower() == ".parquet":
        dataset.to_parquet(str(path))
    else:
        dataset.to_json(str(path), lines=True, force_ascii=False)


def prepare(args: argparse.Namespace, generator: Any = None, tokenizer: Any = None) -> dict[str, Any]:
    """Runs every stage, writes the dataset and the report, and returns the report.

    Args:
        args: Parsed arguments (see [`build_parser`]).
        generator: Optional completion generator (``generator(prompts, k) -> list[list[str]]``) used instead of
            loading --model_name_or_path; tests inject a deterministic one.
        tokenizer: Optional tokenizer used instead of loading the model's.
    """
    from trl_ada.data import generator_from_args, load_prompt_dataset, to_prompt_format
    from trl_ada.rewards import get_reward_funcs

    check_args(args)
    band = band_of(args)
    reward_func = get_reward_funcs([args.reward])[0]

    dataset = load_prompt_dataset(args.dataset_name, split=args.split, config=args.dataset_config)
    if args.limit is not None:
        dataset = dataset.select(range(min(args.limit, len(dataset))))
    answer_column = args.answer_column
    if answer_column == "auto":
        answer_column = "answer" if "answer" in dataset.column_names else "solution"
    missing = [c for c in (args.problem_column, answer_column, *args.keep_columns) if c not in dataset.column_names]
    if missing:
        raise ValueError(
            f"{args.dataset_name} has no column(s) {missing}; it has {dataset.column_names}. Set --problem_column, "
            "--answer_column or --keep_columns accordingly."
        )
    keep_columns = [c for c in dict.fromkeys([args.problem_column, *args.keep_columns]) if c != answer_column]
    aliases = reference_aliases(reward_func, answer_column, ["prompt", "solution", *keep_columns])
    counts: dict[str, int] = {"input": len(dataset)}
    removed: dict[str, int] = {}
    examples: dict[str, list[Any]] = {}

    # 1. Deduplicate.
    dataset, removed["duplicates"] = deduplicate(dataset, args.problem_column)
    counts["after_deduplication"] = len(dataset)
    logger.info("Deduplication removed %d prompts; %d left.", removed["duplicates"], len(dataset))

    # 2. References that fail verification (Math-Verify; other rewards check their own references).
    if args.reward == "math_verify":
        dataset, failed = filter_verifiable_references(dataset, answer_column)
        removed["unverifiable_reference"] = len(failed)
        examples["unverifiable_reference"] = failed[:10]
        logger.info("Reference check removed %d prompts; %d left.", len(failed), len(dataset))
    else:
        removed["unverifiable_reference"] = 0
        logger.info("Reference check skipped: it uses Math-Verify and --reward is %r.", args.reward)
    counts["after_reference_check"] = len(dataset)

    # Prompt format (the tokenizer decides 'auto').
    if tokenizer is None and args.model_name_or_path:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(args.model_name_or_path)
    if args.prompt_format == "auto":
        conversational = tokenizer is None or bool(getattr(tokenizer, "chat_template", None))
    else:
        conversational = args.prompt_format == "conversational"
    dataset = to_prompt_format(
        dataset,
        problem_column=args.problem_column,
        solution_column=answer_column,
        system_prompt=args.system_prompt or None,
        conversational=conversational,
        instruction=args.instruction or None,
        keep_columns=keep_columns,
    )
    for alias in aliases:
        dataset = dataset.add_column(alias, dataset["solution"])

    # 3. Too-long prompts.
    removed["too_long"] = 0
    if args.max_prompt_length is not None:
        dataset, removed["too_long"] = filter_long_prompts(dataset, tokenizer, args.max_prompt_length)
        logger.info("Length filter removed %d prompts; %d left.", removed["too_long"], len(dataset))
    counts["after_length_filter"] = len(dataset)

    # 4. Difficulty filter.
    histogram = None
    if band is not None:
        if len(dataset):
            if generator is None:
                generator = generator_from_args(args)
            dataset, stats = difficulty_filter(dataset, generator, reward_func, args.num_samples, band)
            histogram = stats.pop("histogram")
            removed.update(stats)
        else:
            removed.update(too_hard=0, too_easy=0, unscorable=0)
            histogram = dict.fromkeys(range(args.num_samples + 1), 0)
        logger.info(
            "Difficulty filter %s: %d too hard, %d too easy, %d unscorable; %d left.",
            band,
            removed["too_hard"],
            removed["too_easy"],
            removed["unscorable"],
            len(dataset),
        )
        counts["after_difficulty_filter"] = len(dataset)

    # 5. Band mix: counts per band from the scored prompts.
    mix_stats = None
    if args.band_mix is not None:
        mix = parse_band_mix(args.band_mix)
        dataset, mix_stats = select_band_mix(
            dataset, mix, mix_counts(mix, args.mix_total, args.num_samples), args.num_samples, args.seed
        )
        logger.info("Band mix: %s; %d selected.", json.dumps(mix_stats), len(dataset))
        counts["after_band_mix"] = len(dataset)
    counts["output"] = len(dataset)

    write_dataset(dataset, args.output)
    report_path = args.report or args.output.with_name(args.output.stem + ".report.json")
    report = {
        "dataset": args.dataset_name,
        "dataset_config": args.dataset_config,
        "split": args.split,
        "output": str(args.output),
        "answer_column": answer_column,
        "prompt_format": "conversational" if conversational else "text",
        "model": args.model_name_or_path if band is not None else None,
        "reward": args.reward,
        "num_samples": args.num_samples if band is not None else None,
        "band": str(band) if band is not None else None,
        "counts": counts,
        "removed": removed,
        "pass_rate_histogram": {str(k): v for k, v in histogram.items()} if histogram is not None else None,
        "band_mix": mix_stats,
        "examples": examples,
        "settings": {key: (str(value) if isinstance(value, Path) else value) for key, value in vars(args).items()},
    }
    report_path.parent.mkdir(parents=True, exist_ok=True)
    report_path.write_text(json.dumps(report, indent=2, ensure_ascii=False, default=str) + "\n")
    report["report_path"] = str(report_path)
    return report


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        report = prepare(args)
    except (ValueError, FileNotFoundError) as error:
        logger.error("%s", error)
        return 2
    stages = ", ".join(f"{name} {count}" for name, count in report["counts"].items())
    print(f"Prompts: {stages}.")
    print(f"Removed: {json.dumps(report['removed'])}.")
    if report["pass_rate_histogram"] is not None:
        print(f"Correct of {report['num_samples']} -> prompts: {json.dumps(report['pass_rate_histogram'])}.")
    print(f"Wrote {report['output']} and {report['report_path']}.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
