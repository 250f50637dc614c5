"""Arithmetic with a written trace: the completion works the problem step by step, the reward checks only the answer.

The prompts are those of [`trl_ada.tasks.arithmetic`]; the completion is a character-level trace of the school
procedure, then the final answer after the marker ``:A=`` (``" 47*  8="`` -> ``"7*8+0=56,4*8+5=37:A=376"``).
[`final_answer_reward`] parses only the text after the marker, as RLVR does. [`write_trace`] can inject errors inside
the procedure and continue faithfully from the wrong value. The split is the arithmetic task's prompt hash. The
formats, the noise model and the shipped model's numbers are in docs/trace-arithmetic.md.
"""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .arithmetic import _completion_text, cut_at_stop, draw_problems, is_held_out, match_rewards, operand_problem

LEVELS: tuple[str, ...] = ("add_2d", "add_3d", "mul_2dx1d", "mul_3dx1d", "mul_2dx2d")
"""Names of the difficulty levels; a problem's ``level`` is an index into this tuple."""

OPERAND_RANGES: tuple[tuple[tuple[int, int], str, tuple[int, int]], ...] = (
    ((10, 99), "+", (10, 99)),
    ((100, 999), "+", (100, 999)),
    ((10, 99), "*", (2, 9)),
    ((100, 999), "*", (2, 9)),
    ((10, 99), "*", (10, 99)),
)
"""Per level: the range of the first operand, the operator and the range of the second (both inclusive)."""

FINAL_MARKER = ":A="
"""Separates the trace from the final answer; the reward reads only what follows it."""

STEP_SEPARATOR = ","
SECTION_SEPARATOR = ":"
PARTIAL_PREFIX = "P="

MAX_COMPLETION_LENGTH = 96
"""Tokens (one per character) enough for the longest trace, ``99*99``, with its answer and eos."""

TINY_TRACE_ASSETS: Path = Path(__file__).resolve().parent.parent / "assets" / "tiny-trace"
"""Where the shipped trace model (built by ``scripts/build_trace_model.py``) lives inside the package."""

# Salts keep the streams of training and held-out problems unrelated even for equal seeds.
_TRAIN_SALT = 0x7ACE
_HELD_OUT_SALT = 0x4ACE


@dataclass(frozen=True)
class TraceNoise:
    """Error rates of [`write_trace`]; all zero writes the correct procedure.

    Attributes:
        fact: Mean probability that one step (a column sum or a digit product) gets a wrong value. Each fact (the
            two digits and the carry) has its own rate, between 0 and ``2 * fact``, fixed by a hash, so some facts
            are "hard" for every prompt that needs them.
        carry: Probability that a non-zero carry is dropped (written and used as 0).
        copy: Probability that a partial product is copied with one wrong digit.
        hard_share: Share of facts (fixed by a hash) that are misconceptions: such a fact gets one fixed wrong value
            with probability ``hard_rate`` instead of the ``fact`` rate (above one half, greedy decoding of a model
            that learns these traces gets it wrong, so only a sampled success teaches the right value).
        hard_rate: Probability that a misconception fact is written with its wrong value.
    """

    fact: float = 0.0
    carry: float = 0.0
    copy: float = 0.0
    hard_share: float = 0.0
    hard_rate: float = 0.0

    def __post_init__(self) -> None:
        for name in ("fact", "carry", "copy", "hard_share", "hard_rate"):
            value = getattr(self, name)
            if not 0.0 <= value <= (0.5 if name == "fact" else 1.0):
                limit = "0.5" if name == "fact" else "1"
                raise ValueError(f"TraceNoise.{name} must be in [0, {limit}], got {value}.")


def _fact_uniform(kind: str, x: int, y: int, carry: int, tag: str = "") -> float:
    """A fixed number in [0, 1) for one fact and purpose ``tag`` (a hash, the same on every machine)."""
    digest = hashlib.sha256(f"{tag}{kind}{x},{y},{carry}".encode()).digest()
    return int.from_bytes(digest[:4], "big") / 2**32


class _Writer:
    """Writes one trace, drawing the injected errors from ``rng`` (unused when ``noise`` is ``None``)."""

    def __init__(self, noise: TraceNoise | None, rng: random.Random | None) -> None:
        if noise is not None and rng is None:
            raise ValueError("write_trace needs rng when noise is given.")
        self.noise = noise
        self.rng = rng

    def _draw(self, probability: float) -> bool:
        return self.noise is not None and probability > 0 and self.rng.random() < probability  # type: ignore[union-attr]

    def carry_in(self, carry: int) -> int:
        return 0 if carry and self._draw(self.noise.carry if self.noise else 0.0) else carry

    def value(self, kind: str, x: int, y: int, carry: int, correct: int, limit: int) -> int:
        if self.noise is None:
            return correct
        candidates = [v for v in range(correct - 3, correct + 4) if v != correct and 0 <= v <= limit]
        if _fact_uniform(kind, x, y, carry, "hard:") < self.noise.hard_share:
            if not self._draw(self.noise.hard_rate):
                return correct
            return candidates[int(_fact_uniform(kind, x, y, carry, "misconception:") * len(candidates))]
        if not self._draw(self.noise.fact * 2.0 * _fact_uniform(kind, x, y, carry)):
            return correct
        return self.rng.choice(candidates)  # type: ignore[union-attr]

    def copy(self, digits: str) -> str:
        if not self._draw(self.noise.copy if self.noise else 0.0):
            return digits
        i = self.rng.randrange(len(digits))  # type: ignore[union-attr]
        choices = [d for d in "0123456789" if d != digits[i] and (i or len(digits) == 1 or d != "0")]
        return digits[:i] + self.rng.choice(choices) + digits[i + 1 :]  # type: ignore[union-attr]

    def add(self, x: str, y: str) -> tuple[list[str], str]:
        """Column sum of two digit strings; returns the steps and the result's digits."""
        width = max(len(x), len(y))
        columns = [(int(x[-1 - i]) if i < len(x) else 0, int(y[-1 - i]) if i < len(y) else 0) for i in range(width)]
        return self._carry_through("+", columns, 19)

    def multiply(self, x: str, multiplier: int) -> tuple[list[str], str]:
        """Product of a digit string by one digit; returns the steps and the result's digits."""
        return self._carry_through("*", [(int(x[-1 - i]), multiplier) for i in range(len(x))], 89)

    def _carry_through(self, kind: str, columns: list[tuple[int, int]], limit: int) -> tuple[list[str], str]:
        """Works the columns (lowest digit first) with a carry, one step each ``x<kind>y+carry=value``; returns the
        steps and the result's digits."""
        steps, digits, carry = [], [], 0
        for x, y in columns:
            carry = self.carry_in(carry)
            exact = x + y + carry if kind == "+" else x * y + carry
            value = self.value(kind, x, y, carry, exact, limit)
            steps.append(f"{x}{kind}{y}+{carry}={value}")
            digits.append(str(value % 10))
            carry = value // 10
        if carry:
            digits.append(str(carry))
        return steps, _strip_zeros("".join(reversed(digits)))


def _strip_zeros(digits: str) -> str:
    return digits.lstrip("0") or "0"


def write_trace(
    a: int, op: str, b: int, *, noise: TraceNoise | None = None, rng: random.Random | None = None
) -> tuple[str, str]:
    """The trace completion of ``a op b`` (without eos) and the final answer it states: ``solve(a, op, b)`` without
    ``noise``; with it (and an ``rng`` to draw from), errors are injected inside the procedure and the rest of the
    trace follows from the wrong value, so the answer is the one the trace implies."""
    if a < 0 or b < 0:
        raise ValueError(f"Operands must be non-negative, got {a} and {b}.")
    writer = _Writer(noise, rng)
    if op == "+":
        steps, answer = writer.add(str(a), str(b))
        sections = [STEP_SEPARATOR.join(steps)]
    elif op == "*":
        multiplier = str(b)
        if len(multiplier) == 1:
            steps, answer = writer.multiply(str(a), b)
            sections = [STEP_SEPARATOR.join(steps)]
        else:
            sections, partials = [], []
            for shift, digit in enumerate(reversed(multiplier)):
                steps, row = writer.multiply(str(a), int(digit))
                partial = writer.copy(row + "0" * shift if row != "0" else "0")
                partials.append(partial)
                sections.append(STEP_SEPARATOR.join([*steps, PARTIAL_PREFIX + partial]))
            answer = partials[0]
            for partial in partials[1:]:
                steps, answer = writer.add(answer, partial)
                sections.append(STEP_SEPARATOR.join(steps))
    else:
        raise ValueError(f"Unknown operator {op!r}; expected '+' or '*'.")
    return SECTION_SEPARATOR.join(sections) + FINAL_MARKER + answer, answer


def extract_final_answer(completion: Any, eos_token: str = "<eos>") -> str | None:
    """The final answer a completion states: the digits after the first ``:A=``, up to eos or newline; ``None`` when
    the marker is missing or what follows is not a plain non-negative integer (empty, other characters, a leading 0)."""
    text = cut_at_stop(_completion_text(completion), eos_token)
    _, marker, answer = text.partition(FINAL_MARKER)
    answer = answer.strip()
    if not marker or not re.fullmatch(r"0|[1-9]\d*", answer):
        return None
    return answer


def final_answer_reward(completions: list[Any], answer: list[str], **kwargs: Any) -> list[float]:
    """TRL reward function: 1.0 when the final answer after ``:A=`` is exactly ``answer``, else 0.0 (a missing marker
    or a malformed answer scores 0). The trace before the marker is not checked; extra columns are ignored."""
    return match_rewards(completions, answer, extract_final_answer)


_STEP_RE = re.compile(r"(\d)([+*])(\d)\+(\d)=(\d+)")


@dataclass(frozen=True)
class TraceStep:
    """One written step ``x op y + carry = value``."""

    x: int
    op: str
    y: int
    carry: int
    value: int


@dataclass(frozen=True)
class ParsedTrace:
    """A trace split into sections (rows of steps), their partial products (or ``None``) and the final answer."""

    sections: tuple[tuple[TraceStep, ...], ...]
    partials: tuple[str | None, ...]
    answer: str | None


def parse_trace(completion: Any, eos_token: str = "<eos>") -> ParsedTrace:
    """Parses a trace completion into its steps, partial products and final answer; raises ``ValueError`` naming
    what before the final marker does not follow the trace format."""
    text = cut_at_stop(_completion_text(completion), eos_token)
    body, marker, _ = text.partition(FINAL_MARKER)
    if not marker:
        raise ValueError(f"No final marker {FINAL_MARKER!r} in {text!r}.")
    sections, partials = [], []
    for section in body.split(SECTION_SEPARATOR):
        items = section.split(STEP_SEPARATOR)
        partial = None
        if items and items[-1].startswith(PARTIAL_PREFIX):
            partial = items.pop()[len(PARTIAL_PREFIX) :]
            if not re.fullmatch(r"\d+", partial):
                raise ValueError(f"Malformed partial product {partial!r} in {text!r}.")
        steps = []
        for item in items:
            match = _STEP_RE.fullmatch(item)
            if match is None:
                raise ValueError(f"Malformed step {item!r} in {text!r}.")
            x, op, y, carry, value = match.groups()
            steps.append(TraceStep(int(x), op, int(y), int(carry), int(value)))
        sections.append(tuple(steps))
        partials.append(partial)
    return ParsedTrace(tuple(sections), tuple(partials), extract_final_answer(text, eos_token))


def _make_problem(level: int, rng: random.Random) -> dict[str, Any]:
    (a_lo, a_hi), op, (b_lo, b_hi) = OPERAND_RANGES[level]
    return operand_problem(level, (rng.randint(a_lo, a_hi), op, rng.randint(b_lo, b_hi)))


def parse_prompt(prompt: str) -> tuple[int, str, int]:
    """The ``(a, op, b)`` of a prompt written by [`trl_ada.tasks.arithmetic.format_prompt`]."""
    match = re.fullmatch(r" *(\d+)([+*]) *(\d+)=", prompt)
    if match is None:
        raise ValueError(f"Not an arithmetic prompt: {prompt!r}.")
    return int(match.group(1)), match.group(2), int(match.group(3))


def _generate(
    num_problems: int, seed: int, salt: int, levels: Sequence[int] | None, held_out: bool
) -> list[dict[str, Any]]:
    rng = random.Random(f"trace-{salt}-{seed}")
    return draw_problems(
        num_problems, rng, levels, len(LEVELS), _make_problem, lambda prompt: is_held_out(prompt) == held_out
    )


def make_problems(num_problems: int, *, seed: int, levels: Sequence[int] | None = None) -> list[dict[str, Any]]:
    """Draws training problems in the format of [`trl_ada.tasks.arithmetic.make_problems`] (balanced over levels,
    shuffled, deterministic for a seed, drawn with replacement), never a held-out problem."""
    return _generate(num_problems, seed, _TRAIN_SALT, levels, held_out=False)


def held_out_problems(
    num_problems: int, *, seed: int = 0, levels: Sequence[int] | None = None
) -> list[dict[str, Any]]:
    """Draws held-out problems (same format and balancing as [`make_problems`]); never a training problem."""
    return _generate(num_problems, seed, _HELD_OUT_SALT, levels, held_out=True)


def make_dataset(num_problems: int, *, seed: int, levels: Sequence[int] | None = None):
    """Training problems as a `datasets.Dataset` with columns ``prompt``, ``answer``, ``level`` (TRL's prompt-only
    format; ``answer`` reaches [`final_answer_reward`] as a keyword argument)."""
    from datasets import Dataset

    problems = make_problems(num_problems, seed=seed, levels=levels)
    return Dataset.from_dict({key: [problem[key] for problem in problems] for key in ("prompt", "answer", "level")})


def load_tiny_trace_model() -> tuple[Any, Any]:
    """The shipped tiny trace model and its tokenizer (the character-level tokenizer of `trl_ada.tiny`)."""
    from ..tiny import load_tiny

    if not (TINY_TRACE_ASSETS / "model.safetensors").is_file():
        raise FileNotFoundError(
            f"No trace model in {TINY_TRACE_ASSETS}; build it with `python scripts/build_trace_model.py`."
        )
    return load_tiny(TINY_TRACE_ASSETS)
