"""The math reward, [`math_verify_reward`]: TRL's Math-Verify [`trl.rewards.accuracy_reward`] with the answer and
reference handling of the paper's authors (only the last ``\\boxed{}`` counts, bare references are boxed).
"""

from __future__ import annotations

import functools
import logging
import threading
from typing import Any

from .text import as_messages, completion_text

logger = logging.getLogger(__name__)

_warned_unparsable_reference = False
_warn_lock = threading.Lock()


def last_boxed(text: str) -> str | None:
    """The last complete ``\\boxed{...}`` of ``text`` (braces balanced; an unclosed box is skipped), or ``None``: the
    paper's authors score only the last boxed answer, where Math-Verify alone reads several as a set."""
    start = text.rfind("\\boxed")
    while start != -1:
        brace = start + len("\\boxed")
        while brace < len(text) and text[brace] == " ":
            brace += 1
        if brace < len(text) and text[brace] == "{":
            depth = 0
            for end in range(brace, len(text)):
                if text[end] == "{":
                    depth += 1
                elif text[end] == "}":
                    depth -= 1
                    if depth == 0:
                        return "\\boxed" + text[brace : end + 1]
        start = text.rfind("\\boxed", 0, start)
    return None


def answer_span(completion: Any) -> str:
    """The part of a completion that is verified: its last complete ``\\boxed{...}`` if it has one, else all its text
    (Math-Verify then looks for another anchored answer such as "the final answer is $x$")."""
    text = completion_text(completion)
    return last_boxed(text) or text


def _timeouts() -> tuple[int | None, int | None]:
    # math-verify times out with signal.alarm, which only works in the main thread (as in TRL's accuracy_reward).
    if threading.current_thread() is threading.main_thread():
        return 10, 5
    logging.getLogger("math_verify.parser").setLevel(logging.ERROR)
    logging.getLogger("math_verify.grader").setLevel(logging.ERROR)
    return None, None


def _parses_to_expression(text: str) -> bool:
    """Whether Math-Verify parses ``text`` into a mathematical object (not only its raw-string fallback)."""
    from math_verify import parse

    parsing_timeout, _ = _timeouts()
    try:
        parsed = parse(text, parsing_timeout=parsing_timeout)
    except Exception:  # math-verify swallows most errors itself; be safe against the rest.
        return False
    return any(not isinstance(item, str) for item in parsed)


@functools.lru_cache(maxsize=65536)
def normalize_reference(reference: str) -> str | None:
    """The reference answer in a form Math-Verify parses, or ``None`` if it cannot be parsed (cached: a reference
    repeats once per completion of its prompt). One with LaTeX delimiters (``\\boxed{...}``, ``$...$``) is parsed as
    it is; a bare answer (``"12"``, ``"1, 2"``) is wrapped in ``\\boxed{}`` first, as the paper's authors do (parsed
    raw, ``"1, 2"`` would read as ``2``), else tried raw (a worked solution ending in a boxed answer also works)."""
    if not isinstance(reference, str):
        return None
    text = reference.strip()
    if not text:
        return None
    candidates = [text] if ("\\boxed" in text or "$" in text) else [f"\\boxed{{{text}}}", text]
    for candidate in candidates:
        if _parses_to_expression(candidate):
            return candidate
    return None


def _warn_unparsable_reference(reference: Any) -> None:
    global _warned_unparsable_reference
    with _warn_lock:
        if _warned_unparsable_reference:
            return
        _warned_unparsable_reference = True
    shown = repr(reference) if not isinstance(reference, str) or len(reference) <= 80 else repr(reference[:77] + "...")
    logger.warning(
        "Math-Verify cannot parse the reference answer %s; math_verify_reward returns None (not applicable) for its "
        "completions, so the prompt teaches nothing. Drop such prompts before training with "
        "`trl-ada prepare-data` (stage 'unverifiable_reference'). This warning is shown once.",
        shown,
    )


def reference_as_completion(reference: str) -> str:
    """How a model would state ``reference`` as its final answer: ``\\boxed{reference}`` (unchanged if boxed)."""
    text = reference.strip()
    if "\\boxed" in text:
        return text
    if len(text) >= 2 and text.startswith("$") and text.endswith("$"):
        text = text.strip("$").strip()
    return f"The final answer is \\boxed{{{text}}}."


def reference_verifies(reference: Any) -> bool:
    """Whether a reference answer is usable for training: Math-Verify parses it, and a completion stating it as its
    boxed answer gets reward 1 from [`math_verify_reward`] (the exact path training uses)."""
    if not isinstance(reference, str) or normalize_reference(reference) is None:
        return False
    return math_verify_reward([reference_as_completion(reference)], [reference]) == [1.0]


def math_verify_reward(completions: list[Any], solution: list[Any], **kwargs: Any) -> list[float | None]:
    r"""TRL reward function: 1.0 when Math-Verify judges the completion's final answer equal to the reference.

    The verification itself is TRL's [`trl.rewards.accuracy_reward`] (an answer needs an anchor such as ``\boxed{}``,
    ``$...$`` or "final answer is"). On top of it, as the paper's authors do: only the last complete ``\boxed{}`` of a
    completion is verified ([`last_boxed`]; Math-Verify alone would read several boxes as a set), and a bare reference
    (``"12"``, ``"1, 2"``, ``"x^2+1"``) is wrapped in ``\boxed{}`` before parsing ([`normalize_reference`]).
    ``completions`` may be strings or lists of chat messages; ``solution`` is the dataset's column of references;
    ``log_extra`` (TRL's hook) is forwarded so the parsed answers show up in the completions table.

    Returns:
        One reward per completion: 1.0, 0.0 (also for no parsable answer), or ``None`` where Math-Verify cannot parse
        the reference (TRL: not applicable; a warning is logged once).
    """
    from trl.rewards import accuracy_reward

    if len(completions) != len(solution):
        raise ValueError(f"Got {len(completions)} completions but {len(solution)} solutions.")
    references = []
    for reference in solution:
        normalized = normalize_reference(reference) if isinstance(reference, str) else None
        if normalized is None:
            _warn_unparsable_reference(reference)
        # An empty reference makes TRL's accuracy_reward return None for the row, which is what we want.
        references.append(normalized or "")
    messages = [as_messages(answer_span(completion)) for completion in completions]
    log_extra = kwargs.get("log_extra")
    try:
        return accuracy_reward(messages, references, log_extra=log_extra)
    except Exception as error:  # Never let one malformed row kill a training step: score rows one by one.
        logger.warning("math_verify_reward failed on a batch (%s); scoring its rows one at a time.", error)
    rewards: list[float | None] = []
    for message, reference in zip(messages, references, strict=True):
        try:
            rewards.extend(accuracy_reward([message], [reference]))
        except Exception:
            rewards.append(None if not reference else 0.0)
    return rewards


__all__ = [
    "answer_span",
    "last_boxed",
    "math_verify_reward",
    "normalize_reference",
    "reference_as_completion",
    "reference_verifies",
]
