"""Prepare an OpenR1-Math-style training set the way the Reinforce-Ada paper does (Section 4.1, "Data").

Stages, each counted in a JSON report:

1. deduplicate prompts (problem text with whitespace normalised; the first occurrence is kept);
2. drop prompts whose reference answer fails verification (Math-Verify cannot parse it, or a completion stating it
   as its boxed answer does not get reward 1);
3. optionally drop prompts longer than --max_prompt_length tokens (as the trainer tokenises them);
4. difficulty filter: sample --num_samples completions per prompt from a base model, score them with the reward,
   keep prompts whose pass rate lies in a band (--pass_rate_band or --correct_range);
5. with --band_mix instead of a band: stage 4 scores every prompt, then given counts per pass-rate band are
   selected, each prompt's band written in a ``band`` column.

Without a band, stages 1-3 run and no model is sampled. The output is TRL's prompt-only format (``prompt``,
``solution`` = the reference answer, ``problem``, plus ``num_correct``/``pass_rate`` when stage 4 ran), ready for
``trl-ada train --dataset_name <output>``; every column the reward reads is checked before any stage runs. The
paper's moderate set (pass rate in (0, 0.375]: 1..6 of 16; its hard set: --correct_range 1 2):

    trl-ada prepare-data --dataset_name open-r1/OpenR1-Math-220k --dataset_config default \\
        --model_name_or_path Qwen/Qwen2.5-Math-1.5B --use_vllm --num_samples 16 --max_new_tokens 4096 \\
        --pass_rate_band 0 0.375 --output data/openr1_moderate.parquet

Code datasets (--task code, see docs/code-rl.md): stage 2 drops rows without runnable tests (``no_tests``) and rows
whose reference solution fails its own tests in the sandbox (``failing_reference``); stage 4 scores with
``--reward code_execution``. In a checkout, ``python scripts/prepare_data.py`` takes the same flags.
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import random
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from trl_ada.data import DEFAULT_INSTRUCTION, DEFAULT_SYSTEM_PROMPT, add_sampling_arguments
from trl_ada.reporting.metrics import PassRateBand, count_correct, pass_rate_histogram

logger = logging.getLogger("prepare_data")

_OUTPUT_SUFFIXES = (".parquet", ".jsonl", ".json")

DEFAULT_CODE_SYSTEM_PROMPT = "You are an expert Python programmer. Reason step by step, then give your final solution."
"""The default system prompt of code datasets (``--task code``)."""
DEFAULT_CODE_INSTRUCTION = "Write your final solution as Python code in a single ```python code block."
"""The default instruction appended to each problem of a code dataset: the reward runs the last Python block."""

CODE_TEST_FORMATS = ("verification_info", "tests")
"""The test formats of [`trl_ada.rewards.code.CodeExecutionReward`], which are also the default column names."""
_REFERENCE_SOLUTION_COLUMNS = ("solution", "canonical_solution", "code", "gold_standard_solution")
_REFERENCE_CHUNK = 256  # references per reward call (one progress step)
_MATH_DEFAULTS = (DEFAULT_SYSTEM_PROMPT, DEFAULT_INSTRUCTION)


def _shorten(text: Any, limit: int = 200) -> Any:
    """A report example: long problem texts cut to ``limit`` characters."""
    return text[: limit - 3] + "..." if isinstance(text, str) and len(text) > limit else text


__all__ = [
    "DEFAULT_CODE_INSTRUCTION",
    "DEFAULT_CODE_SYSTEM_PROMPT",
    "band_of",
    "build_parser",
    "check_code_references",
    "code_test_columns",
    "filter_rows_without_tests",
    "check_args",
    "deduplicate",
    "default_report_path",
    "difficulty_filter",
    "filter_long_prompts",
    "filter_verifiable_references",
    "main",
    "mix_counts",
    "normalize_whitespace",
    "parse_band_mix",
    "prepare",
    "reference_aliases",
    "resolve_task",
    "select_band_mix",
    "write_dataset",
]


def default_report_path(output: Path) -> Path:
    """Where the report goes without `--report`: beside `output`, with `.report.json` for its suffix."""
    return output.with_name(output.stem + ".report.json")


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    """The command-line parser (`prog`: the command's name in usage and errors, e.g. ``trl-ada prepare-data``)."""
    parser = argparse.ArgumentParser(
        prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    data = parser.add_argument_group("data")
    example_output = Path("data/train.parquet")
    data.add_argument(
        "--dataset_name",
        required=True,
        help="Hub id, or a local .parquet/.jsonl/.json/.csv file or directory (also save_to_disk directories).",
    )
    data.add_argument("--dataset_config", help="Dataset configuration (e.g. 'default' for OpenR1).")
    data.add_argument(
        "--task",
        choices=["auto", "math", "code"],
        default="auto",
        help="Maths (reference answers) or code (tests run in a sandbox). 'auto': code when --reward is "
        "code_execution, or when no --reward is given and the dataset has a 'verification_info' or 'tests' column "
        "(or the named --test_column); else math.",
    )
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
    data.add_argument("--limit", type=int, help="Use only the first N input rows (a dry run).")
    data.add_argument(
        "--output", required=True, type=Path, help="Output file: .parquet, .jsonl or .json (JSON lines)."
    )
    data.add_argument(
        "--report",
        type=Path,
        help="JSON report path (default: the --output path with .report.json for its suffix, e.g. "
        f"{default_report_path(example_output)} for {example_output}).",
    )

    prompts = parser.add_argument_group("prompt format")
    prompts.add_argument(
        "--prompt_format",
        choices=["auto", "conversational", "text"],
        default="auto",
        help="Chat messages or plain text; 'auto': messages if the model's tokenizer has a chat template (or no model "
        "is given), else text.",
    )
    prompts.add_argument(
        "--system_prompt",
        help=f"'' for none. Default: the authors' for maths ({DEFAULT_SYSTEM_PROMPT!r}), for code "
        f"{DEFAULT_CODE_SYSTEM_PROMPT!r}.",
    )
    prompts.add_argument(
        "--instruction",
        help=f"Appended to each problem; '' for none. Default: the authors' for maths ({DEFAULT_INSTRUCTION!r}), for "
        f"code {DEFAULT_CODE_INSTRUCTION!r}.",
    )
    prompts.add_argument(
        "--max_prompt_length",
        type=int,
        help="Drop prompts longer than this many tokens (needs --model_name_or_path for the tokenizer).",
    )

    code = parser.add_argument_group("code datasets (--task code)")
    code.add_argument(
        "--test_column",
        default="auto",
        help="Column holding each row's tests. 'auto': 'verification_info' and/or 'tests', whichever exist (a row "
        "with both is tested with verification_info, as the reward does). MBPP: test_list; HumanEval: test.",
    )
    code.add_argument(
        "--test_format",
        choices=["auto", *CODE_TEST_FORMATS],
        default="auto",
        help="Format of --test_column: open-r1 'verification_info' (stdin/stdout cases) or assert-style 'tests'. "
        "'auto': the column's name if it is one of these, else read from its first value.",
    )
    code.add_argument(
        "--solution_column",
        default="auto",
        help="Column with the reference solution (code), run against its own tests; written as 'solution'. 'auto': "
        f"the first of {list(_REFERENCE_SOLUTION_COLUMNS)} present; 'none' skips the reference check.",
    )
    code.add_argument(
        "--entry_point_column",
        default="entry_point",
        help="Column naming the function HumanEval's check(candidate) receives (used when present).",
    )

    difficulty = parser.add_argument_group("difficulty filter (runs when a band is given)")
    band = difficulty.add_mutually_exclusive_group()
    for flag, number, ends, help_text in (
        (
            "--pass_rate_band",
            float,
            ("LOW", "HIGH"),
            "Keep prompts whose pass rate lies between LOW and HIGH; ends set by --band_ends. The paper: 0 0.375.",
        ),
        (
            "--correct_range",
            int,
            ("MIN", "MAX"),
            "Keep prompts with MIN..MAX correct samples (both included). The paper's hard set: 1 2 (of 16).",
        ),
    ):
        band.add_argument(flag, nargs=2, type=number, metavar=ends, help=help_text)
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
        help="With --band_mix: scale the counts to this many prompts in all (largest remainder rounding).",
    )
    difficulty.add_argument(
        "--band_ends",
        choices=["(]", "[]", "[)", "()"],
        default="(]",
        # A metavar without brackets: argparse's usage line deletes the choices' empty bracket pairs ("{,,,}").
        metavar="ENDS",
        help="Which ends of --pass_rate_band are included: one of '(]', '[]', '[)', '()'. '(]' (default, the paper's "
        "(0, 0.375]) excludes LOW and includes HIGH.",
    )
    difficulty.add_argument("--model_name_or_path", help="Base model to sample from (dir or hub id).")
    difficulty.add_argument("--num_samples", type=int, default=16, help="Completions per prompt (k).")
    difficulty.add_argument(
        "--reward",
        help="Reward name (see trl_ada.rewards.REWARD_FUNCS) or dotted path. Default: math_verify for maths, "
        "code_execution for code.",
    )
    add_sampling_arguments(difficulty)
    parser.add_argument("--log_level", default="INFO")
    return parser


def check_args(args: argparse.Namespace) -> None:
    """Argument checks that need no data (fail fast, with the fix in the message)."""
    from trl_ada.rewards.code import CodeExecutionReward
    from trl_ada.rewards.reward_registry import get_reward_funcs

    if args.reward is not None:
        reward_func = get_reward_funcs([args.reward])[0]
        if args.task == "math" and isinstance(reward_func, CodeExecutionReward):
            raise ValueError(
                f"--reward {args.reward} runs code against tests, but --task is math; pass --task code (or auto)."
            )
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


def resolve_task(args: argparse.Namespace, columns: Sequence[str] = ()) -> str:
    """``"math"`` or ``"code"``: ``--task``, or for ``auto`` what the reward and the dataset's ``columns`` suggest
    (as ``--task``'s help says)."""
    from trl_ada.rewards.code import CodeExecutionReward
    from trl_ada.rewards.reward_registry import get_reward_funcs

    if args.task != "auto":
        return args.task
    if args.reward is not None:
        return "code" if isinstance(get_reward_funcs([args.reward])[0], CodeExecutionReward) else "math"
    candidates = CODE_TEST_FORMATS if args.test_column == "auto" else (args.test_column,)
    return "code" if any(column in columns for column in candidates) else "math"


def _detect_test_format(dataset: Any, column: str) -> str:
    """The test format of ``column`` from its first non-empty value (a dict or JSON object: verification_info)."""
    for value in dataset[column]:
        if value is None or (isinstance(value, (str, list)) and not value):
            continue
        if isinstance(value, dict):
            return "verification_info"
        if isinstance(value, str):
            try:
                parsed = json.loads(value)
            except (json.JSONDecodeError, RecursionError):
                return "tests"
            return "verification_info" if isinstance(parsed, dict) else "tests"
        return "tests"
    raise ValueError(
        f"Cannot tell the test format of column {column!r}: it has no value. Pass --test_format verification_info "
        "or --test_format tests (or drop the empty column)."
    )


def code_test_columns(args: argparse.Namespace, dataset: Any, reward: Any) -> dict[str, str]:
    """``{input column: output column}`` of the test column(s) (and the entry point, when present); the output names
    are those ``reward`` (a [`trl_ada.rewards.code.CodeExecutionReward`]) reads. Raises `ValueError`, naming the flags
    that fix it, when the named --test_column is missing, or with ``auto`` there is no test column."""
    columns = dataset.column_names
    output_name = {"verification_info": reward.verification_info_column, "tests": reward.tests_column}
    if args.test_column == "auto":
        formats = {column: column for column in CODE_TEST_FORMATS if column in columns}
        if not formats:
            raise ValueError(
                f"{args.dataset_name} has neither a 'verification_info' nor a 'tests' column; it has {columns}. Name "
                "the column holding the tests with --test_column (and its format with --test_format), e.g. "
                "--test_column test_list for MBPP or --test_column test for HumanEval."
            )
    else:
        if args.test_column not in columns:
            raise ValueError(
                f"{args.dataset_name} has no column {args.test_column!r} (--test_column); it has {columns}."
            )
        test_format = args.test_format
        if test_format == "auto":
            if args.test_column in CODE_TEST_FORMATS:
                test_format = args.test_column
            else:
                test_format = _detect_test_format(dataset, args.test_column)
        formats = {args.test_column: test_format}
    mapping = {column: output_name[test_format] for column, test_format in formats.items()}
    if len(set(mapping.values())) != len(mapping):
        raise ValueError(f"Two test columns would be written under one name: {mapping}.")
    if args.entry_point_column in columns:
        mapping[args.entry_point_column] = reward.entry_point_column
    return mapping


def _row_tests_problem(row: dict[str, Any], reward: Any) -> str | None:
    """Why a row (output column names) has no runnable tests, or ``None`` when it has some (as ``reward`` reads)."""
    from trl_ada.rewards.code import build_assert_plan, parse_verification_info

    info = row.get(reward.verification_info_column)
    tests = row.get(reward.tests_column)
    try:
        if info is not None:
            return None if parse_verification_info(info) is not None else "no Python stdin_stdout test case"
        if tests is not None:
            if not isinstance(tests, str):
                tests = "\n".join(str(test) for test in tests)
            entry_point = row.get(reward.entry_point_column)
            plan = build_assert_plan(tests, str(entry_point) if entry_point else None)
            return None if plan is not None else "no assert in the test code"
    except ValueError as error:
        return str(error)
    return "no test column value"


def _test_column_values(dataset: Any, reward: Any) -> dict[str, list[Any]]:
    """The values of each test column ``reward`` reads (tests and entry point) that ``dataset`` has."""
    names = (reward.verification_info_column, reward.tests_column, reward.entry_point_column)
    return {column: dataset[column] for column in names if column in dataset.column_names}


def filter_rows_without_tests(dataset: Any, reward: Any, problem_column: str) -> tuple[Any, list[dict[str, Any]]]:
    """Stage 2a (code): drops rows the reward would score ``None`` (no tests, or tests that do not parse); returns the
    kept rows and ``{"problem", "reason"}`` of each dropped row."""
    values = _test_column_values(dataset, reward)
    problems = dataset[problem_column]
    keep, dropped = [], []
    for index in range(len(dataset)):
        reason = _row_tests_problem({column: column_values[index] for column, column_values in values.items()}, reward)
        if reason is None:
            keep.append(index)
        else:
            dropped.append({"problem": _shorten(problems[index]), "reason": reason})
    return dataset.select(keep), dropped


def _runnable_reference(reference: str, problem: Any, entry_point: Any) -> str:
    """A HumanEval-style reference (a function body, not defining ``entry_point``) prefixed by the problem's stub."""
    if entry_point and isinstance(problem, str):
        definition = re.compile(rf"^\s*(async\s+)?def\s+{re.escape(str(entry_point))}\s*\(", re.MULTILINE)
        if not definition.search(reference) and definition.search(problem):
            return problem.rstrip("\n") + "\n" + reference
    return reference


def check_code_references(
    dataset: Any, reward: Any, solution_column: str, problem_column: str
) -> tuple[Any, list[dict[str, Any]], dict[str, int]]:
    """Stage 2b (code): runs each reference solution (``solution_column``) against its own tests with ``reward`` (a
    [`trl_ada.rewards.code.CodeExecutionReward`], sandboxed) and keeps the rows where it passes every test; a
    HumanEval-style body is appended to the problem's stub (``problem_column``). Returns the kept rows,
    ``{"problem", "outcome"}`` of each dropped row, and the count of each outcome (``passed``, ``timeout``, ...).

    Raises:
        RuntimeError: when the sandbox failed to start for a reference: dropping rows for that would silently shrink
            the dataset.
    """
    from collections import Counter

    from tqdm.auto import tqdm

    columns = _test_column_values(dataset, reward)
    entry_points = columns.get(reward.entry_point_column, [None] * len(dataset))
    problems = dataset[problem_column]
    references = dataset[solution_column]
    present = [i for i, ref in enumerate(references) if isinstance(ref, str) and ref.strip()]
    outcomes = ["no_reference"] * len(dataset)
    if present:
        programs = [_runnable_reference(references[i], problems[i], entry_points[i]) for i in present]
        logger.info("Running %d reference solutions against their tests in the sandbox.", len(programs))
        with tqdm(total=len(programs), desc="Running references", unit="prompt") as progress:
            for start in range(0, len(programs), _REFERENCE_CHUNK):
                rows = present[start : start + _REFERENCE_CHUNK]
                reward.score(
                    programs[start : start + _REFERENCE_CHUNK],
                    **{column: [values[i] for i in rows] for column, values in columns.items()},
                )
                for index, outcome in zip(rows, reward.last_row_outcomes, strict=True):
                    outcomes[index] = outcome
                progress.update(len(rows))
    counts = dict(Counter(outcomes))
    if counts.get("sandbox_error"):
        raise RuntimeError(
            f"The sandbox failed to start for {counts['sandbox_error']} reference solutions; fix the sandbox (see the "
            "warnings above; `bwrap` must run unprivileged) and rerun: no row was dropped for it."
        )
    keep = [index for index, outcome in enumerate(outcomes) if outcome == "passed"]
    dropped = [
        {"problem": _shorten(problems[index]), "outcome": outcome}
        for index, outcome in enumerate(outcomes)
        if outcome != "passed"
    ]
    return dataset.select(keep), dropped, counts


def band_of(args: argparse.Namespace) -> Any:
    """The pass-rate band the arguments describe, or ``None`` when no difficulty filter was asked for."""
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
    """The number of prompts to select from each band of ``mix``: its whole counts as they are, or with ``total`` its
    weights scaled to sum to ``total`` by largest remainder (984/3082/870/63 becomes 197/616/174/13 of 1,000).
    Raises `ValueError` on an empty mix, counts that are not whole, weights summing to 0, or overlapping bands."""
    if not mix:
        raise ValueError("--band_mix needs at least one BAND:COUNT.")
    for (first, _), (second, _) in itertools.combinations(mix, 2):
        shared = [c for c in range(num_samples + 1) if all(band.contains(c, num_samples) for band in (first, second))]
        if shared:
            raise ValueError(
                f"--band_mix bands {first} and {second} overlap at {shared[0]} of {num_samples} correct; make them "
                "disjoint (mind the brackets)."
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
    uniformly at random (seeded), keeps them in dataset order and adds a ``band`` column. Returns them and
    ``{band: {"requested", "available"}}``; raises `ValueError` when a band holds fewer scored prompts than requested."""
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
    """Names besides ``solution`` under which the output must hold the reference answer for ``reward_func``: the
    answer column's own name when the reward reads it (``exact_match`` reads ``answer``). Raises `ValueError` when
    the reward reads a column the output will not have, naming it and the flags that fix it."""
    from trl_ada.rewards.reward_registry import required_reward_columns

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

    from trl_ada.rewards.math import reference_verifies

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
    """Samples ``num_samples`` completions per prompt, scores them and keeps the prompts inside ``band``, adding the
    columns ``num_correct`` and ``pass_rate`` (a prompt whose rewards are all ``None`` is "unscorable" and dropped).
    Returns the kept rows and ``{"too_hard", "too_easy", "unscorable", "histogram"}`` (prompts per correct count)."""
    from trl_ada.rewards.reward_registry import score_completions

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
    """Runs every stage, writes the dataset and the report, and returns the report. ``generator``
    (``generator(prompts, k) -> list[list[str]]``) and ``tokenizer`` replace what --model_name_or_path would load."""
    from trl_ada.data import generator_from_args, load_prompt_dataset, to_prompt_format, wants_chat_messages
    from trl_ada.rewards.code import CodeExecutionReward, code_execution_reward
    from trl_ada.rewards.reward_registry import get_reward_funcs

    check_args(args)
    band = band_of(args)

    dataset = load_prompt_dataset(args.dataset_name, split=args.split, config=args.dataset_config)
    if args.limit is not None:
        dataset = dataset.select(range(min(args.limit, len(dataset))))
    task = resolve_task(args, dataset.column_names)
    reward_name = args.reward or ("code_execution" if task == "code" else "math_verify")
    reward_func = get_reward_funcs([reward_name])[0]  # check_args refused a code reward on a math task
    defaults = (DEFAULT_CODE_SYSTEM_PROMPT, DEFAULT_CODE_INSTRUCTION) if task == "code" else _MATH_DEFAULTS
    system_prompt = defaults[0] if args.system_prompt is None else args.system_prompt
    instruction = defaults[1] if args.instruction is None else args.instruction

    code_checker: Any = None
    test_columns: dict[str, str] = {}
    skip_reference_check = False
    if task == "code":
        # The reference check runs the reward itself when it is a code reward (same limits and column names).
        code_checker = reward_func if isinstance(reward_func, CodeExecutionReward) else code_execution_reward
        test_columns = code_test_columns(args, dataset, code_checker)
        answer_column = args.solution_column
        if answer_column == "auto":
            answer_column = next((c for c in _REFERENCE_SOLUTION_COLUMNS if c in dataset.column_names), "none")
            if answer_column == "none":
                logger.warning(
                    "No reference solution column (%s) in %s: the reference check is skipped. Name one with "
                    "--solution_column.",
                    "/".join(_REFERENCE_SOLUTION_COLUMNS),
                    args.dataset_name,
                )
    else:
        answer_column = args.answer_column
        if answer_column == "auto":
            answer_column = "answer" if "answer" in dataset.column_names else "solution"
    needed = [args.problem_column, *([answer_column] if answer_column != "none" else []), *args.keep_columns]
    missing = [c for c in needed if c not in dataset.column_names]
    if missing:
        raise ValueError(
            f"{args.dataset_name} has no column(s) {missing}; it has {dataset.column_names}. Set --problem_column, "
            f"{'--solution_column' if task == 'code' else '--answer_column'} or --keep_columns accordingly."
        )
    if task == "code":
        # Tests under the names the reward reads; a reference-less dataset gets an empty 'solution'.
        clashes = [c for c in test_columns.values() if c in dataset.column_names and c not in test_columns]
        if clashes:
            logger.info("Replacing the existing column(s) %s with the test column(s) %s.", clashes, test_columns)
            dataset = dataset.remove_columns(clashes)
        dataset = dataset.rename_columns({old: new for old, new in test_columns.items() if old != new})
        if answer_column == "none":
            if "solution" in dataset.column_names:
                dataset = dataset.remove_columns("solution")
            dataset = dataset.add_column("solution", [None] * len(dataset))
            answer_column = "solution"
            skip_reference_check = True
        extra_columns = [*test_columns.values(), *args.keep_columns]
    else:
        extra_columns = list(args.keep_columns)
    keep_columns = [c for c in dict.fromkeys([args.problem_column, *extra_columns]) if c != answer_column]
    aliases = reference_aliases(reward_func, answer_column, ["prompt", "solution", *keep_columns])
    if code_checker is not None and len(dataset) and not (skip_reference_check and band is None):
        code_checker.sandbox  # noqa: B018 - fails now, with the install command, when bubblewrap is missing
    counts: dict[str, int] = {"input": len(dataset)}
    removed: dict[str, int] = {}
    examples: dict[str, list[Any]] = {}
    reference_outcomes: dict[str, int] | None = None

    # 1. Deduplicate.
    dataset, removed["duplicates"] = deduplicate(dataset, args.problem_column)
    counts["after_deduplication"] = len(dataset)
    logger.info("Deduplication removed %d prompts; %d left.", removed["duplicates"], len(dataset))

    # 2. References that fail verification (Math-Verify; other rewards check their own references).
    if task == "code":
        dataset, no_tests = filter_rows_without_tests(dataset, code_checker, args.problem_column)
        removed["no_tests"] = len(no_tests)
        examples["no_tests"] = no_tests[:10]
        counts["after_test_check"] = len(dataset)
        logger.info("Test check removed %d prompts without runnable tests; %d left.", len(no_tests), len(dataset))
        if skip_reference_check:
            removed["failing_reference"] = 0
            logger.info("Reference check skipped: no reference solution column.")
        else:
            dataset, failing, reference_outcomes = check_code_references(
                dataset, code_checker, answer_column, args.problem_column
            )
            removed["failing_reference"] = len(failing)
            examples["failing_reference"] = failing[:10]
            logger.info(
                "Reference check removed %d prompts whose reference solution fails its tests (%s); %d left.",
                len(failing),
                ", ".join(f"{name} {n}" for name, n in sorted(reference_outcomes.items()) if name != "passed")
                or "none",
                len(dataset),
            )
    elif reward_name == "math_verify":
        dataset, failed = filter_verifiable_references(dataset, answer_column)
        removed["unverifiable_reference"] = len(failed)
        examples["unverifiable_reference"] = failed[:10]
        logger.info("Reference check removed %d prompts; %d left.", len(failed), len(dataset))
    else:
        removed["unverifiable_reference"] = 0
        logger.info("Reference check skipped: it uses Math-Verify and --reward is %r.", reward_name)
    counts["after_reference_check"] = len(dataset)

    # Prompt format (the tokenizer decides 'auto').
    if tokenizer is None and args.model_name_or_path:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(args.model_name_or_path)
    conversational = wants_chat_messages(args.prompt_format, tokenizer)
    dataset = to_prompt_format(
        dataset,
        problem_column=args.problem_column,
        solution_column=answer_column,
        system_prompt=system_prompt or None,
        conversational=conversational,
        instruction=instruction or None,
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
    report_path = args.report or default_report_path(args.output)
    report = {
        "dataset": args.dataset_name,
        "dataset_config": args.dataset_config,
        "split": args.split,
        "output": str(args.output),
        "task": task,
        "answer_column": answer_column,
        "test_columns": test_columns or None,
        "reference_outcomes": reference_outcomes,
        "prompt_format": "conversational" if conversational else "text",
        "model": args.model_name_or_path if band is not None else None,
        "reward": reward_name,
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


def main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    """Command-line entry point: `trl-ada prepare-data` and `scripts/prepare_data.py`."""
    args = build_parser(prog).parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        report = prepare(args)
    except (ValueError, FileNotFoundError, RuntimeError) as error:
        logger.error("%s", error)
        return 2
    stages = ", ".join(f"{name} {count}" for name, count in report["counts"].items())
    print(f"Prompts: {stages}.")
    print(f"Removed: {json.dumps(report['removed'])}.")
    if report["reference_outcomes"] is not None:
        print(f"Reference solutions against their tests: {json.dumps(report['reference_outcomes'])}.")
    if report["pass_rate_histogram"] is not None:
        print(f"Correct of {report['num_samples']} -> prompts: {json.dumps(report['pass_rate_histogram'])}.")
    print(f"Wrote {report['output']} and {report['report_path']}.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
