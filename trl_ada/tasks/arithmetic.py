"""A verifiable arithmetic task with graded difficulty, for CPU tests and small GRPO experiments.

Six levels ([`LEVELS`]) from 1-digit sums to 2-digit products, hard for a ~0.6M-parameter character-level model at
the top. Every prompt has the same width (operands right-aligned to three characters, then ``=``: ``" 47+385="``), so
a batch never needs padding; a completion is correct when it is exactly the answer's integer ([`exact_match_reward`]).
Every prompt belongs to one split by a fixed hash (about 10% held out): [`make_problems`] and [`make_dataset`] return
only training problems and [`held_out_problems`] only held-out ones, whatever the seeds.
"""

from __future__ import annotations

import hashlib
import logging
import random
from collections.abc import Callable, Sequence
from typing import Any

import torch

logger = logging.getLogger(__name__)

LEVELS: tuple[str, ...] = ("add_1d", "add_2d_nocarry", "add_2d_carry", "add_3d", "mul_2dx1d", "mul_2dx2d")
"""Names of the difficulty levels; a problem's ``level`` is an index into this tuple: 1-digit +, 2-digit + without any
carry, 2-digit + with at least one, 3-digit +, 2-digit x 1-digit, 2-digit x 2-digit."""

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
    make_problem: Callable[[int, random.Random], dict[str, Any]],
    keep: Callable[[str], bool],
) -> list[dict[str, Any]]:
    """`num_problems` problems split as evenly as possible over `levels` (the first levels get one more when it does
    not divide), each drawn by `make_problem(level, rng)` until `keep` accepts its prompt, then shuffled; shared by
    the tasks."""
    if num_problems < 0:
        raise ValueError(f"num_problems must be >= 0, got {num_problems}.")
    levels = check_levels(levels, num_levels)
    counts = [num_problems // len(levels) + (i < num_problems % len(levels)) for i in range(len(levels))]
    problems: list[dict[str, Any]] = []
    for level, count in zip(levels, counts, strict=True):
        for _ in range(count):
            problem = make_problem(level, rng)
            while not keep(problem["prompt"]):
                problem = make_problem(level, rng)
            problems.append(problem)
    rng.shuffle(problems)
    return problems


def operand_problem(level: int, operands: tuple[int, str, int]) -> dict[str, Any]:
    """The problem ``a op b`` of ``level``: ``prompt`` (fixed width), ``answer`` (the exact integer, as text) and
    ``level``; shared by the arithmetic tasks."""
    return {"prompt": format_prompt(*operands), "answer": str(solve(*operands)), "level": level}


def _generate(
    num_problems: int, seed: int, salt: int, levels: Sequence[int] | None, keep: Callable[[str], bool]
) -> list[dict[str, Any]]:
    def make_problem(level: int, rng: random.Random) -> dict[str, Any]:
        return operand_problem(level, _sample_operands(level, rng))

    return draw_problems(num_problems, random.Random(f"{salt}-{seed}"), levels, len(LEVELS), make_problem, keep)


def make_problems(num_problems: int, *, seed: int, levels: Sequence[int] | None = None) -> list[dict[str, Any]]:
    """Draws training problems, balanced over ``levels`` (indices into [`LEVELS`], ``None`` for all; the first levels
    get one more when it does not divide), shuffled and deterministic for ``seed``: dicts with ``prompt`` (fixed
    width), ``answer`` (the exact integer, as text) and ``level``. Drawn with replacement, so small levels repeat
    (``add_1d`` has ~90 training problems); never a held-out problem."""
    return _generate(num_problems, seed, _TRAIN_SALT, levels, lambda prompt: not is_held_out(prompt))


def held_out_problems(
    num_problems: int, *, seed: int = 0, levels: Sequence[int] | None = None
) -> list[dict[str, Any]]:
    """Draws held-out problems (same format and balancing as [`make_problems`], never a training problem). The
    held-out ``add_1d`` set is about ten problems, so that level repeats when many are requested."""
    return _generate(num_problems, seed, _HELD_OUT_SALT, levels, is_held_out)


def make_dataset(num_problems: int, *, seed: int, levels: Sequence[int] | None = None):
    """Training problems as a `datasets.Dataset` with columns ``prompt``, ``answer``, ``level`` (TRL's prompt-only
    format: ``GRPOTrainer`` passes ``answer`` and ``level`` to the reward functions as keyword arguments)."""
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


def cut_at_stop(text: str, eos_token: str = "<eos>") -> str:
    """``text`` before its first ``eos_token`` or newline; shared by the tasks."""
    for stop in (eos_token, "\n"):
        if stop:
            text = text.split(stop, 1)[0]
    return text


def extract_answer(completion: Any, eos_token: str = "<eos>") -> str:
    """The answer a completion gives: text before the first eos token or newline, stripped of whitespace."""
    return cut_at_stop(_completion_text(completion), eos_token).strip()


def exact_match_reward(completions: list[Any], answer: list[str], **kwargs: Any) -> list[float]:
    """TRL reward function: 1.0 when the completion is exactly the answer, else 0.0 (extra columns are ignored).

    The completion is cut at the first ``<eos>`` or newline and stripped of whitespace before comparison, so
    ``"12"``, ``" 12 "`` and ``"12<eos>junk"`` all match the answer ``"12"`` while ``"012"`` or ``"12 3"`` do not.
    """
    return match_rewards(completions, answer, extract_answer)


def match_rewards(completions: list[Any], answer: list[str], extract: Callable[[Any], str | None]) -> list[float]:
    """1.0 for each completion whose ``extract``-ed answer is exactly its row's ``answer``, else 0.0; shared by the
    tasks' reward functions."""
    if len(completions) != len(answer):
        raise ValueError(f"Got {len(completions)} completions but {len(answer)} answers.")
    return [1.0 if extract(c) == str(target).strip() else 0.0 for c, target in zip(completions, answer, strict=True)]


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
    """Sampled (or greedy, at ``temperature=0``) accuracy of ``model`` on ``problems`` (as [`make_problems`] returns
    them), ``num_samples`` completions each by [`sample_completions`] (the longest answer, ``9801``, is 5 tokens):
    ``{"overall": float, "per_level": {level: float}, "num_completions": int}``, ``overall`` averaging over all
    completions (so over levels weighted by their share of ``problems``)."""
    if num_samples < 1:
        raise ValueError(f"num_samples must be >= 1, got {num_samples}.")
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}.")
    rows = [problem for problem in problems for _ in range(num_samples)]
    if not rows:
        return {"overall": float("nan"), "per_level": {}, "num_completions": 0}

    prompts = [problem["prompt"] for problem in problems]
    sampling = {"temperature": temperature, "num_samples": num_samples, "max_new_tokens": max_new_tokens, "seed": seed}
    texts = sample_completions(model, tokenizer, prompts, batch_size=batch_size, keep_special_tokens=True, **sampling)
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
