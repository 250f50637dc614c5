"""A CPU code task: program synthesis from input/output examples, scored by the sandboxed code-execution reward.

A prompt shows four input/output pairs of a hidden integer function ``f``, inputs sorted, outputs right-aligned to
three characters (every prompt is :data:`PROMPT_WIDTH` wide, so a batch never needs padding)::

    0:  1,3:  7,5: 11,8: 17=

and the completion is a one-line Python expression in ``x`` that computes ``f`` (``2*x+1``, or any equivalent). The
six levels (:data:`LEVELS`): ``offset`` (``7``, ``x+3``), ``scale`` (``a*x``), ``affine`` (``a*x+b``),
``abs_floordiv`` (``abs(x-c)``, the shown inputs on both sides of ``c``, or ``x//a``), ``quadratic`` (``x*x+b``,
``a*x*x``) and ``composite`` (``a*abs(x-c)``, ``x*x+a*x``).

A row's ``tests`` (``assert f(3) == 7`` lines, one sandboxed run for all, decided outside the sandbox) hold the four
shown pairs and four hidden inputs in ``[-3, 15]``, so a lookup of the shown pairs fails. [`CodeSynthesisReward`]
scores the completion, as ``def f(x): return (<expression>)``, with the real sandboxed reward, all-or-nothing. About
10% of prompts are held out by a fixed hash ([`held_out_problems`]; never in [`make_problems`]).
[`load_tiny_code_model`] gives the tiny model of [`trl_ada.tiny`], warm-started on this task.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import random
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from trl_ada.tasks import arithmetic
from trl_ada.tasks.arithmetic import cut_at_stop, draw_problems, is_held_out
from trl_ada.tiny import _is_saved_model, default_cache_dir, right_padded, sft_step  # one layout for both models

logger = logging.getLogger(__name__)

LEVELS: tuple[str, ...] = ("offset", "scale", "affine", "abs_floordiv", "quadratic", "composite")
"""Names of the difficulty levels; a problem's ``level`` is an index into this tuple."""

NUM_SHOWN = 4
"""Input/output pairs shown in a prompt."""
NUM_HIDDEN = 4
"""Further test inputs, not shown in the prompt."""
SHOWN_INPUTS = range(0, 10)
"""Shown inputs are distinct one-digit numbers (sorted in the prompt)."""
HIDDEN_INPUTS = range(-3, 16)
"""Hidden test inputs are drawn from here (never a shown one)."""
OUTPUT_WIDTH = 3
"""Shown outputs are right-aligned to this many characters (every shown output lies in ``[-99, 999]``)."""
PROMPT_WIDTH = NUM_SHOWN * (2 + OUTPUT_WIDTH) + NUM_SHOWN
"""Length in characters of every prompt: four ``d:vvv`` pairs, three commas and the final ``=``."""
MAX_COMPLETION_CHARS = 12
"""Longest canonical expression is 10 characters (``3*abs(x-4)``); a budget of 12 tokens plus eos leaves room."""
ENTRY_POINT = "f"

CODE_MODEL_VERSION = "tiny-code-v1"
"""Cache sub-folder of the warm-started model; bump it when the recipe changes."""

_TRAIN_SALT = 0xC0DE
_HELD_OUT_SALT = 0x5EED


def _signed(value: int) -> str:
    return f"+{value}" if value >= 0 else f"-{-value}"


def _sample_function(level: int, rng: random.Random) -> str:
    """A hidden function of ``level`` as its canonical expression in ``x``."""
    if level == 0:
        if rng.random() < 0.25:
            return str(rng.randint(0, 9))
        return "x" + _signed(rng.choice([b for b in range(-9, 10) if b]))
    if level == 1:
        return f"{rng.randint(2, 9)}*x"
    if level == 2:
        return f"{rng.randint(2, 9)}*x" + _signed(rng.choice([b for b in range(-9, 10) if b]))
    if level == 3:
        if rng.random() < 0.6:
            return f"abs(x-{rng.randint(1, 8)})"
        return f"x//{rng.randint(2, 4)}"
    if level == 4:
        kind = rng.random()
        if kind < 0.6:
            b = rng.randint(-9, 9)
            return "x*x" + (_signed(b) if b else "")
        return f"{rng.randint(2, 5)}*x*x"
    if level == 5:
        if rng.random() < 0.5:
            return f"{rng.randint(2, 5)}*abs(x-{rng.randint(1, 8)})"
        a = rng.randint(1, 9)
        return "x*x+" + ("x" if a == 1 else f"{a}*x")
    raise ValueError(f"level must be in [0, {len(LEVELS) - 1}], got {level}.")


def evaluate_expression(expression: str, x: int) -> int:
    """The value of one of this module's own (trusted) canonical expressions at ``x``. Never call it on model output:
    completions are scored only in the sandbox ([`CodeSynthesisReward`])."""
    return int(eval(expression, {"__builtins__": {"abs": abs}}, {"x": x}))  # noqa: S307 - trusted, generated here


def _shown_inputs(expression: str, rng: random.Random) -> list[int]:
    """Four distinct sorted inputs; for ``abs(x-c)`` at least one on each side of ``c`` (else it looks affine)."""
    while True:
        inputs = sorted(rng.sample(list(SHOWN_INPUTS), NUM_SHOWN))
        if "abs(x-" in expression:
            c = int(expression.split("abs(x-", 1)[1].split(")", 1)[0])
            if not (inputs[0] < c < inputs[-1]):
                continue
        return inputs


def format_prompt(pairs: Sequence[tuple[int, int]]) -> str:
    """``format_prompt([(0, 1), (3, 7), (5, 11), (8, 17)]) == "0:  1,3:  7,5: 11,8: 17="``."""
    return ",".join(f"{x}:{y:>{OUTPUT_WIDTH}d}" for x, y in pairs) + "="


def format_tests(pairs: Sequence[tuple[int, int]]) -> str:
    """Assert-style test code, one ``assert f(x) == y`` per pair (the literal form, checked outside the sandbox)."""
    return "\n".join(f"assert {ENTRY_POINT}({x}) == {y}" for x, y in pairs)


def make_problem(level: int, rng: random.Random) -> dict[str, Any]:
    """One problem of ``level``: ``prompt``, ``solution`` (the canonical expression), ``tests``, ``entry_point``,
    ``level`` and ``hidden_inputs`` (the test inputs the prompt does not show)."""
    expression = _sample_function(level, rng)
    shown = _shown_inputs(expression, rng)
    hidden = sorted(rng.sample([x for x in HIDDEN_INPUTS if x not in shown], NUM_HIDDEN))
    shown_pairs = [(x, evaluate_expression(expression, x)) for x in shown]
    hidden_pairs = [(x, evaluate_expression(expression, x)) for x in hidden]
    return {
        "prompt": format_prompt(shown_pairs),
        "solution": expression,
        "tests": format_tests(shown_pairs + hidden_pairs),
        "entry_point": ENTRY_POINT,
        "level": level,
        "hidden_inputs": hidden,
    }


def _generate(
    num_problems: int, seed: int, salt: int, levels: Sequence[int] | None, keep: Callable[[str], bool]
) -> list[dict[str, Any]]:
    return draw_problems(num_problems, random.Random(f"{salt}-{seed}"), levels, len(LEVELS), make_problem, keep)


def make_problems(num_problems: int, *, seed: int, levels: Sequence[int] | None = None) -> list[dict[str, Any]]:
    """Draws training problems, balanced over levels (the first levels get one more when it does not divide),
    shuffled and deterministic for a seed. Drawn with replacement from about 46,000 distinct training prompts (per
    level from about 1,500 for ``scale`` to 27,000 for ``affine``), so a stream of a few hundred prompts per level
    rarely repeats one. Never returns a held-out prompt."""
    return _generate(num_problems, seed, _TRAIN_SALT, levels, lambda prompt: not is_held_out(prompt))


def held_out_problems(
    num_problems: int, *, seed: int = 0, levels: Sequence[int] | None = None
) -> list[dict[str, Any]]:
    """Draws held-out problems (same format and balancing as [`make_problems`], disjoint from it for every seed)."""
    return _generate(num_problems, seed, _HELD_OUT_SALT, levels, is_held_out)


DATASET_COLUMNS = ("prompt", "tests", "entry_point", "solution", "level")


def make_dataset(num_problems: int, *, seed: int, levels: Sequence[int] | None = None, held_out: bool = False):
    """Problems as a `datasets.Dataset` with columns ``prompt``, ``tests``, ``entry_point``, ``solution``, ``level``
    (TRL's prompt-only format: the trainer generates from ``prompt`` and passes the other columns to the reward)."""
    from datasets import Dataset

    problems = (held_out_problems if held_out else make_problems)(num_problems, seed=seed, levels=levels)
    return Dataset.from_dict({key: [problem[key] for problem in problems] for key in DATASET_COLUMNS})


def extract_expression(completion: Any, eos_token: str = "<eos>") -> str:
    """The expression a completion gives: its text (or its last message's) before the first eos token or newline,
    stripped."""
    from trl_ada.rewards.text import completion_text

    return cut_at_stop(completion_text(completion), eos_token).strip()


def expression_program(completion: Any) -> str:
    """The program a completion is scored as: ``def f(x):\\n    return (<expression>)\\n``."""
    return f"def {ENTRY_POINT}(x):\n    return ({extract_expression(completion)})\n"


class CodeSynthesisReward:
    """TRL reward function of the task: each completion's expression, as [`expression_program`], scored by a
    [`trl_ada.rewards.code.CodeExecutionReward`] against the row's ``tests`` (1 when every test passes, else 0).

    An async callable, like the reward it wraps (``reward``, default ``CodeExecutionReward(all_or_nothing=True,
    **reward_kwargs)``). ``seconds``, ``calls`` and ``completions`` accumulate the time spent inside calls (the
    reward's share of a step), the calls and the completions scored.
    """

    def __init__(self, reward: Any = None, **reward_kwargs: Any) -> None:
        from trl_ada.rewards.code import CodeExecutionReward
        from trl_ada.rewards.sandbox import SandboxLimits

        if reward is not None and reward_kwargs:
            raise ValueError("Pass either a reward or keyword arguments for a new one, not both.")
        if reward is None:
            reward_kwargs.setdefault("all_or_nothing", True)
            reward_kwargs.setdefault("limits", SandboxLimits(wall_time_s=5, cpu_time_s=2))
            reward = CodeExecutionReward(**reward_kwargs)
        self.reward = reward
        self.__name__ = "code_synthesis_reward"
        self.seconds = 0.0
        self.calls = 0
        self.completions = 0

    async def __call__(self, completions: list[Any], **kwargs: Any) -> list[float | None]:
        start = time.perf_counter()
        try:
            return await self.reward([expression_program(c) for c in completions], **kwargs)
        finally:
            self.seconds += time.perf_counter() - start
            self.calls += 1
            self.completions += len(completions)

    def score(self, completions: list[Any], **kwargs: Any) -> list[float | None]:
        """The rewards of a batch, from synchronous code."""
        return asyncio.run(self(completions, **kwargs))

    def __repr__(self) -> str:
        return f"CodeSynthesisReward({self.reward!r})"


def sample_completions(model: Any, tokenizer: Any, prompts: Sequence[str], **options: Any) -> list[str]:
    """``num_samples`` completions per prompt (consecutive): [`trl_ada.tasks.arithmetic.sample_completions`] with
    this task's completion budget (``max_new_tokens=MAX_COMPLETION_CHARS`` unless given); ``options`` are that
    function's keyword arguments."""
    return arithmetic.sample_completions(
        model, tokenizer, prompts, **{"max_new_tokens": MAX_COMPLETION_CHARS, **options}
    )


def pass_rate_by_level(
    model: Any,
    tokenizer: Any,
    problems: Sequence[dict[str, Any]],
    *,
    reward: CodeSynthesisReward,
    temperature: float,
    num_samples: int = 1,
    seed: int | None = None,
    deduplicate: bool = True,
) -> dict[str, Any]:
    """Sampled pass rate of ``model`` on ``problems``, overall and per level, every completion scored by ``reward``
    (the sandbox): ``{"overall", "per_level": {level: rate}, "num_completions", "distinct_runs", "outcomes"}``. With
    ``deduplicate`` each distinct (expression, tests) pair runs once, its score shared by its copies (the same result
    for every expression that reads no clock or random source).

    Raises:
        RuntimeError: when a program could not be scored (the sandbox failed to start): no rate is reported from
            part of the completions.
    """
    if num_samples < 1:
        raise ValueError(f"num_samples must be >= 1, got {num_samples}.")
    if not problems:
        return {"overall": float("nan"), "per_level": {}, "num_completions": 0, "distinct_runs": 0, "outcomes": {}}
    texts = sample_completions(
        model, tokenizer, [p["prompt"] for p in problems], temperature=temperature, num_samples=num_samples, seed=seed
    )
    rows = [problem for problem in problems for _ in range(num_samples)]
    keys = [(extract_expression(text), row["tests"]) for text, row in zip(texts, rows, strict=True)]
    unique = list(dict.fromkeys(keys)) if deduplicate else keys
    scores = reward.score([expression for expression, _ in unique], tests=[tests for _, tests in unique])
    outcomes = dict(reward.reward.last_outcomes)
    if any(score is None for score in scores):  # unscorable (the sandbox did not start): no pass rate to report
        raise RuntimeError(
            f"{sum(score is None for score in scores)} of {len(scores)} programs could not be scored (outcomes "
            f"{outcomes}); the sandbox failed to start: fix it (see trl_ada.rewards.sandbox) and rerun the evaluation."
        )
    by_key = dict(zip(unique, scores, strict=True)) if deduplicate else None
    rewards = [float(by_key[key]) for key in keys] if by_key is not None else [float(s) for s in scores]
    return {
        **arithmetic.mean_reward_by_level(rows, rewards),
        "distinct_runs": len(unique),
        "outcomes": outcomes,
    }


def format_pass_rate(result: dict[str, Any]) -> str:
    """One line: ``overall 0.41 | offset 0.93 | ...``."""
    parts = [f"overall {result['overall']:.3f}"]
    parts += [f"{LEVELS[level]} {rate:.3f}" for level, rate in result["per_level"].items()]
    return " | ".join(parts)


def _test_pairs(tests: str) -> list[tuple[int, int]]:
    pairs = []
    for line in tests.splitlines():
        call, expected = line.removeprefix(f"assert {ENTRY_POINT}(").split(") == ")
        pairs.append((int(call), int(expected)))
    return pairs


def corrupt_expression(problem: dict[str, Any], rng: random.Random) -> str:
    """A plausible wrong expression for ``problem``: one integer of the solution shifted by 1-3 (a new constant
    appended when it has none), or a ``+``/``-`` flipped. It is wrong on at least one of the problem's tests and
    never longer than :data:`MAX_COMPLETION_CHARS`."""
    solution = problem["solution"]
    pairs = _test_pairs(problem["tests"])
    for _ in range(100):
        positions = [
            i for i, char in enumerate(solution) if char.isdigit() and (i == 0 or not solution[i - 1].isdigit())
        ]
        signs = [i for i, char in enumerate(solution) if char in "+-" and i > 0 and solution[i - 1] != "("]
        kind = rng.random()
        if kind < 0.2 and signs:
            i = rng.choice(signs)
            wrong = solution[:i] + ("-" if solution[i] == "+" else "+") + solution[i + 1 :]
        elif positions:
            i = rng.choice(positions)
            j = i
            while j < len(solution) and solution[j].isdigit():
                j += 1
            value = int(solution[i:j]) + rng.choice([-1, 1]) * rng.randint(1, 3)
            if value < 0:
                continue
            wrong = solution[:i] + str(value) + solution[j:]
        else:
            wrong = solution + _signed(rng.choice([-2, -1, 1, 2]))
        if len(wrong) > MAX_COMPLETION_CHARS:
            continue
        try:
            if any(evaluate_expression(wrong, x) != y for x, y in pairs):
                return wrong
        except (ZeroDivisionError, SyntaxError):
            continue
    return solution + "+1"


def _sft_batches(
    tokenizer: Any, num_steps: int, batch_size: int, *, seed: int, noise: float
) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Tokenised (input_ids, attention_mask, labels) batches of fresh training problems; prompts have a fixed width
    and completions are right-padded, so no real token's position depends on padding."""
    problems = make_problems(num_steps * batch_size, seed=seed)
    rng = random.Random(f"noise-{seed}")
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    batches = []
    for start in range(0, len(problems), batch_size):
        chunk = problems[start : start + batch_size]
        sequences, label_rows = [], []
        for problem in chunk:
            target = corrupt_expression(problem, rng) if noise > 0 and rng.random() < noise else problem["solution"]
            prompt_ids = tokenizer(problem["prompt"], add_special_tokens=False)["input_ids"]
            target_ids = tokenizer(target, add_special_tokens=False)["input_ids"] + [eos]
            sequences.append(prompt_ids + target_ids)
            label_rows.append([-100] * len(prompt_ids) + target_ids)
        batches.append(right_padded(sequences, label_rows, pad))
    return batches


def _sft(
    model: Any,
    batches: Sequence[tuple[torch.Tensor, torch.Tensor, torch.Tensor]],
    *,
    learning_rate: float,
    warmup_steps: int,
    cosine: bool,
) -> list[float]:
    """Plain-torch completion-only SFT (AdamW, no weight decay, linear warm-up then cosine or constant); the losses
    of every 50th step."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate, weight_decay=0.0)
    total = len(batches)

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        if not cosine:
            return 1.0
        progress = (step - warmup_steps) / max(total - warmup_steps, 1)
        return 0.5 * (1.0 + math.cos(math.pi * progress))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
    model.train()
    losses = []
    for step, (ids, mask, labels) in enumerate(batches):
        loss = sft_step(model, optimizer, scheduler, ids, mask, labels)
        if step % 50 == 0 or step == total - 1:
            losses.append(float(loss.detach()))
    model.eval()
    return losses


def build_warm_started_code_model(
    *,
    seed: int = 0,
    clean_steps: int = 900,
    noisy_steps: int = 200,
    batch_size: int = 64,
    threads: int | None = 1,
    noise: float = 0.3,
    eval_problems: int = 300,
    reward: CodeSynthesisReward | None = None,
    model_kwargs: dict[str, Any] | None = None,
) -> tuple[Any, Any, dict[str, Any]]:
    """Builds the warm-started code model from scratch on CPU (deterministic for ``seed`` on a given machine and
    thread count).

    Phase 1: completion-only SFT on fresh clean training problems of all levels (AdamW lr 2e-3, 30 warm-up steps,
    cosine). Phase 2: SFT on fresh problems where a share ``noise`` of the targets is a plausible wrong expression
    ([`corrupt_expression`]; lr 5e-4 constant after 30 warm-up steps), so sampling at temperature 1 is noisy and RL
    has something to sharpen. After each phase the held-out pass rate at temperature 1 is measured in the sandbox
    (``eval_problems=0`` skips it). Training runs on ``threads`` torch threads (default one, so the result does not
    depend on the core count; ``None`` keeps torch's setting).

    Returns:
        ``(model, tokenizer, report)``; ``report`` holds per-phase losses, timings and pass rates.
    """
    from transformers import set_seed

    from trl_ada.tiny import build_char_tokenizer, build_tiny_model

    previous_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        set_seed(seed)
        tokenizer = build_char_tokenizer()
        model = build_tiny_model(tokenizer, seed=seed, **(model_kwargs or {}))
        report: dict[str, Any] = {
            "version": CODE_MODEL_VERSION,
            "seed": seed,
            "parameters": sum(p.numel() for p in model.parameters()),
            "threads": torch.get_num_threads(),
            "phases": {},
        }
        heldout = held_out_problems(eval_problems, seed=seed) if eval_problems else []
        if heldout and reward is None:
            reward = CodeSynthesisReward()
        phases = [("clean", clean_steps, 0.0, 2e-3, True)]
        if noisy_steps:
            phases.append(("noisy", noisy_steps, noise, 5e-4, False))
        for index, (name, steps, phase_noise, lr, cosine) in enumerate(phases):
            start = time.perf_counter()
            batches = _sft_batches(tokenizer, steps, batch_size, seed=seed * 1000 + index, noise=phase_noise)
            losses = _sft(model, batches, learning_rate=lr, warmup_steps=min(30, steps), cosine=cosine)
            phase: dict[str, Any] = {"steps": steps, "seconds": time.perf_counter() - start, "losses": losses}
            if heldout:
                result = pass_rate_by_level(model, tokenizer, heldout, reward=reward, temperature=1.0, seed=seed)
                phase["held_out_t1"] = result
                seconds, rate = phase["seconds"], format_pass_rate(result)
                logger.info("After %s SFT (%d steps, %.0f s): held-out T=1 %s", name, steps, seconds, rate)
            report["phases"][name] = phase
        model.config.use_cache = True
        return model, tokenizer, report
    finally:
        torch.set_num_threads(previous_threads)


def default_code_cache_dir() -> Path:
    """``$TRL_ADA_CACHE/tiny-code-v1`` if the variable is set, else ``~/.cache/trl_ada/tiny-code-v1``."""
    return default_cache_dir(CODE_MODEL_VERSION)


def load_tiny_code_model(cache_dir: str | os.PathLike[str] | None = None, *, seed: int = 0) -> tuple[Any, Any]:
    """The warm-started code model and its tokenizer, from ``cache_dir`` (default [`default_code_cache_dir`]); built
    with [`build_warm_started_code_model`] and cached first when it is not there (a few minutes on CPU). The build's
    report is saved beside it as ``build_report.json``."""
    from trl_ada.tiny import load_tiny, save_folder_atomically, save_tiny

    path = Path(cache_dir) if cache_dir is not None else default_code_cache_dir()
    if not _is_saved_model(path):
        logger.info("No warm-started code model in %s; building it (SFT on CPU, a few minutes).", path)
        start = time.perf_counter()
        model, tokenizer, report = build_warm_started_code_model(seed=seed)
        report["build_seconds"] = time.perf_counter() - start

        def write(folder: Path) -> None:
            save_tiny(model, tokenizer, folder)
            (folder / "build_report.json").write_text(
                json.dumps(report, indent=2, default=str) + "\n", encoding="utf-8"
            )

        save_folder_atomically(path, write)
    return load_tiny(path)


__all__ = [
    "CODE_MODEL_VERSION",
    "DATASET_COLUMNS",
    "LEVELS",
    "PROMPT_WIDTH",
    "CodeSynthesisReward",
    "build_warm_started_code_model",
    "corrupt_expression",
    "default_code_cache_dir",
    "evaluate_expression",
    "expression_program",
    "extract_expression",
    "format_pass_rate",
    "format_prompt",
    "format_tests",
    "held_out_problems",
    "is_held_out",
    "load_tiny_code_model",
    "make_dataset",
    "make_problem",
    "make_problems",
    "pass_rate_by_level",
    "sample_completions",
]
