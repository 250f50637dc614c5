"""A verifiable arithmetic task with graded difficulty, for CPU tests and small GRPO experiments.

Six levels, from trivial to hard for a ~0.6M-parameter character-level model:

- 0 ``add_1d``: 1-digit + (``"  3+  5="``)
- 1 ``add_2d_nocarry``: 2-digit + without any carry (``" 23+ 45="``)
- 2 ``add_2d_carry``: 2-digit + with at least one carry (``" 47+ 85="``)
- 3 ``add_3d``: 3-digit + (``"147+385="``)
- 4 ``mul_2dx1d``: 2-digit x 1-digit (``" 47*  8="``)
- 5 ``mul_2dx2d``: 2-digit x 2-digit (``" 47* 85="``)

Every prompt has the same width (operands right-aligned to three characters, then ``=``), so a batch of prompts
never needs padding. The answer is the exact integer, written without padding; a completion is correct when it is
exactly that integer (see [`exact_match_reward`]).

Train/held-out split: every problem belongs to exactly one split by a fixed hash of its prompt
(about 10% held out). [`make_problems`] and [`make_dataset`] only ever return training problems and
[`held_out_problems`] only held-out ones, whatever the seeds, so the two can never overlap.
"""

from __future__ import annotations

import hashlib
import logging
import random
from collections.abc import Callable, Sequence
from typing import Any

import torch

logger = logging.getLogger(__name__)

LEVELS: tuple[str, ...] = (
    "add_1d",
    "add_2d_nocarry",
    "add_2d_carry",
    "add_3d",
    "mul_2dx1d",
    "mul_2dx2d",
)
"""Names of the difficulty levels; a problem's ``level`` is an index into this tuple."""

OPERAND_WIDTH = 3
"""Every operand is right-aligned to this many characters."""

PROMPT_WIDTH = 2 * OPERAND_WIDTH + 2
"""Length in characters of every prompt (two operands, the operator and ``=``)."""

HELD_OUT_PERMILLE = 100
"""Problems whose prompt hash falls below this (out of 1000) form the held-out split (about 10%)."""

# Salts keep the streams of training and held-out problems unrelated even for equal seeds.
_TRAIN_SALT = 0x7A11
_HELD_OUT_SALT = 0x4E1D


def _sample_operands(level: int, rng: random.Random) -> tuple[int, str, int]:
    """Draws one problem ``(a, op, b)`` of ``level`` uniformly from that level's problem set."""
    if level == 0:
        return rng.randint(0, 9), "+", rng.randint(0, 9)
    if level == 1:
        # 2-digit + without any carry: units and tens digit sums both stay below 10.
        while True:
            a, b = rng.randint(10, 99), rng.randint(10, 99)
            if a % 10 + b % 10 < 10 and a // 10 + b // 10 < 10:
                return a, "+", b
    if level == 2:
        # 2-digit + with at least one carry.
        while True:
            a, b = rng.randint(10, 99), rng.randint(10, 99)
            if a % 10 + b % 10 >= 10 or a // 10 + b // 10 >= 10:
                return a, "+", b
    if level == 3:
        return rng.randint(100, 999), "+", rng.randint(100, 999)
    if level == 4:
        return rng.randint(10, 99), "*", rng.randint(2, 9)
    if level == 5:
        return rng.randint(10, 99), "*", rng.randint(10, 99)
    raise ValueError(f"level must be in [0, {len(LEVELS) - 1}], got {level}.")


def format_prompt(a: int, op: str, b: int) -> str:
    """Formats a problem as a fixed-width prompt, e.g. ``format_prompt(47, "+", 385) == " 47+385="``."""
    return f"{a:>{OPERAND_WIDTH}d}{op}{b:>{OPERAND_WIDTH}d}="


def solve(a: int, op: str, b: int) -> int:
    """Returns the exact result of ``a op b``."""
    if op == "+":
        return a + b
    if op == "*":
        return a * b
    raise ValueError(f"Unknown operator {op!r}.")


def is_held_out(prompt: str) -> bool:
    """Whether a prompt belongs to the held-out split (a fixed hash rule, independent of any seed)."""
    digest = hashlib.sha256(prompt.encode("utf-8")).digest()
    return int.from_bytes(digest[:4], "big") % 1000 < HELD_OUT_PERMILLE


def check_levels(levels: Sequence[int] | None, num_levels: int) -> list[int]:
    """The difficulty levels asked for (`None`: all `num_levels`), checked; shared by the tasks."""
    if levels is None:
        return list(range(num_levels))
    levels = list(levels)
    if not levels:
        raise ValueError("levels must not be empty; pass None for all levels.")
    for level in levels:
        if not 0 <= level < num_levels:
            raise ValueError(f"Each level must be in [0, {num_levels - 1}] (see LEVELS), got {level}.")
    return levels


def draw_problems(
    num_problems: int,
    rng: random.Random,
    levels: Sequence[int] | None,
    num_levels: int,
    sample_operands: Callable[[int, random.Random], tuple[int, str, int]],
    keep: Callable[[str], bool],
) -> list[dict[str, Any]]:
    """`num_problems` problems split as evenly as possible over `levels` (the first levels get one more when it does
    not divide), each drawn by `sample_operands(level, rng)` until `keep` accepts its prompt, then shuffled; shared by
    the arithmetic tasks."""
    if num_problems < 0:
        raise ValueError(f"num_problems must be >= 0, got {num_problems}.")
    levels = check_levels(levels, num_levels)
    counts = [num_problems // len(levels) + (i < num_problems % len(levels)) for i in range(len(levels))]
    problems: list[dict[str, Any]] = []
    for level, count in zip(levels, counts, strict=True):
        for _ in range(count):
            while True:
                a, op, b = sample_operands(level, rng)
                prompt = format_prompt(a, op, b)
                if keep(prompt):
                    break
            problems.append({"prompt": prompt, "answer": str(solve(a, op, b)), "level": level})
    rng.shuffle(problems)
    return problems


def _generate(
    num_problems: int, seed: int, salt: int, levels: Sequence[int] | None, keep: Callable[[str], bool]
) -> list[dict[str, Any]]:
    return draw_problems(num_problems, random.Random(f"{salt}-{seed}"), levels, len(LEVELS), _sample_operands, keep)


def make_problems(num_problems: int, *, seed: int, levels: Sequence[int] | None = None) -> list[dict[str, Any]]:
    """Draws training problems, balanced over levels and deterministic for a seed.

    Args:
        num_problems: How many problems to return. They are split as evenly as possible over ``levels`` (the
            first levels get one more when it does not divide) and shuffled. Problems are drawn with
            replacement, so small levels (``add_1d`` has ~90 training problems) repeat.
        seed: Seed of the problem stream.
        levels: Level indices to draw from (see [`LEVELS`]); ``None`` means all.

    Returns:
        A list of dicts with keys ``prompt`` (str, fixed width), ``answer`` (str, the exact integer) and ``level``
        (int). Never contains a held-out problem (see [`held_out_problems`]).
    """
    return _generate(num_problems, seed, _TRAIN_SALT, levels, lambda prompt: not is_held_out(prompt))


def held_out_problems(
    num_problems: int, *, seed: int = 0, levels: Sequence[int] | None = None
) -> list[dict[str, Any]]:
    """Draws held-out problems (same format and balancing as [`make_problems`]).

    Held-out problems are selected by a fixed hash rule ([`is_held_out`]), so they can never appear in
    [`make_problems`] or [`make_dataset`] for any seed. The held-out ``add_1d`` set is small (about ten problems),
    so that level repeats when many problems are requested.
    """
    return _generate(num_problems, seed, _HELD_OUT_SALT, levels, is_held_out)


def make_dataset(num_problems: int, *, seed: int, levels: Sequence[int] | None = None):
    """Training problems as a `datasets.Dataset` with columns ``prompt``, ``answer``, ``level``.

    This is TRL's standard prompt-only format: ``GRPOTrainer`` generates from ``prompt`` and passes ``answer`` and
    ``level`` to the reward functions as keyword arguments.
    """
    from datasets import Dataset

    problems = make_problems(num_problems, seed=seed, levels=levels)
    return Dataset.from_dict({key: [problem[key] for problem in problems] for key in ("prompt", "answer", "level")})


def _completion_text(completion: Any) -> str:
    """The text of a completion: TRL passes strings, or a list of messages for conversational data."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list) and completion and isinstance(completion[-1], dict):
        return str(completion[-1].get("content", ""))
    return str(completion)


def extract_answer(completion: Any, eos_token: str = "<eos>") -> str:
    """The answer a completion gives: text before the first eos token or newline, stripped of whitespace."""
    text = _completion_text(completion)
    for stop in (eos_token, "\n"):
        if stop:
            text = text.split(stop, 1)[0]
    return text.strip()


def exact_match_reward(completions: list[Any], answer: list[str], **kwargs: Any) -> list[float]:
    """TRL reward function: 1.0 when the completion is exactly the answer, else 0.0.

    The completion is cut at the first ``<eos>`` or newline and stripped of whitespace before comparison, so
    ``"12"``, ``" 12 "`` and ``"12<eos>junk"`` all match the answer ``"12"`` while ``"012"`` or ``"12 3"`` do not.
    Extra dataset columns that TRL passes (``prompts``, ``level``, ``completion_ids``, ...) are ignored.
    """
    if len(completions) != len(answer):
        raise ValueError(f"Got {len(completions)} completions but {len(answer)} answers.")
    return [
        1.0 if extract_answer(completion) == str(target).strip() else 0.0
        for completion, target in zip(completions, answer, strict=True)
    ]


@torch.no_grad()
def sample_completions(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[str],
    *,
    temperature: float,
    num_samples: int = 1,
    max_new_tokens: int,
    batch_size: int = 512,
    seed: int | None = None,
    keep_special_tokens: bool = False,
) -> list[str]:
    """``num_samples`` completions per prompt (consecutive), sampled (or greedy at ``temperature=0``) with plain
    batched ``model.generate`` (left padding where prompt lengths differ); shared by the tasks. Decoded without special
    tokens, or with them but without padding (``keep_special_tokens``: a reward that needs the end-of-sequence token).
    Runs under ``seed`` when given; the global torch RNG state is restored afterwards."""
    rows = [prompt for prompt in prompts for _ in range(num_samples)]
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    gen_kwargs: dict[str, Any] = {
        "max_new_tokens": max_new_tokens,
        "pad_token_id": tokenizer.pad_token_id,
        "eos_token_id": tokenizer.eos_token_id,
    }
    if temperature > 0:
        gen_kwargs.update(do_sample=True, temperature=temperature, top_k=0, top_p=1.0)
    else:
        gen_kwargs.update(do_sample=False)
    texts: list[str] = []
    with torch.random.fork_rng(devices=[]):
        if seed is not None:
            torch.manual_seed(seed)
        for start in range(0, len(rows), batch_size):
            batch = rows[start : start + batch_size]
            enc = tokenizer(
                batch, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False
            ).to(device)
            out = model.generate(**enc, **gen_kwargs)
            decoded = tokenizer.batch_decode(
                out[:, enc["input_ids"].shape[1] :], skip_special_tokens=not keep_special_tokens
            )
            if keep_special_tokens:
                decoded = [text.replace(tokenizer.pad_token, "") for text in decoded]
            texts.extend(decoded)
    if was_training:
        model.train()
    return texts


@torch.no_grad()
def accuracy_by_level(
    model: Any,
    tokenizer: Any,
    problems: Sequence[dict[str, Any]],
    *,
    temperature: float,
    num_samples: int = 1,
    max_new_tokens: int = 8,
    batch_size: int = 512,
    seed: int | None = None,
) -> dict[str, Any]:
    """Sampled (or greedy) accuracy of ``model`` on ``problems``, overall and per level.

    Uses plain batched ``model.generate`` (left padding if prompt lengths differ).

    Args:
        model: A causal LM.
        tokenizer: Its tokenizer (plain-text prompts, no chat template).
        problems: Dicts with ``prompt``, ``answer`` and ``level`` (as returned by [`make_problems`]).
        temperature: Sampling temperature; ``0`` means greedy decoding.
        num_samples: Completions per problem; accuracy averages over all of them.
        max_new_tokens: Generation budget per completion (the longest answer, ``99*99=9801``, needs 5 tokens).
        batch_size: Rows per ``generate`` call.
        seed: If given, sampling runs under this torch seed (the global RNG state is restored afterwards).

    Returns:
        ``{"overall": float, "per_level": {level: float}, "num_completions": int}``; ``overall`` averages over
        all completions (so over levels weighted by their share of ``problems``).
    """
    if num_samples < 1:
        raise ValueError(f"num_samples must be >= 1, got {num_samples}.")
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}.")
    rows = [problem for problem in problems for _ in range(num_samples)]
    if not rows:
        return {"overall": float("nan"), "per_level": {}, "num_completions": 0}

    texts = sample_completions(
        model,
        tokenizer,
        [problem["prompt"] for problem in problems],
        temperature=temperature,
        num_samples=num_samples,
        max_new_tokens=max_new_tokens,
        batch_size=batch_size,
        seed=seed,
        keep_special_tokens=True,
    )
    return mean_reward_by_level(rows, exact_match_reward(texts, [row["answer"] for row in rows]))


def mean_reward_by_level(rows: Sequence[dict[str, Any]], rewards: Sequence[float]) -> dict[str, Any]:
    """The mean of ``rewards`` (one per row, rows carrying a ``level``) overall and per level, levels in order:
    ``{"overall", "per_level": {level: mean}, "num_completions"}``."""
    per_level: dict[int, list[float]] = {}
    for row, reward in zip(rows, rewards, strict=True):
        per_level.setdefault(row["level"], []).append(reward)
    return {
        "overall": sum(rewards) / len(rewards),
        "per_level": {level: sum(values) / len(values) for level, values in sorted(per_level.items())},
        "num_completions": len(rewards),
    }


def format_accuracy(result: dict[str, Any]) -> str:
    """One-line summary of an [`accuracy_by_level`] result, e.g. ``overall 0.41 | add_1d 0.93 | ...``."""
    parts = [f"overall {result['overall']:.3f}"]
    parts += [f"{LEVELS[level]} {acc:.3f}" for level, acc in result["per_level"].items()]
    return " | ".join(parts)
