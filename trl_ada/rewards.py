"""Reward functions for math RL (the paper's Math-Verify verifier) and a registry of reward functions by name.

Every function here follows TRL's reward-function protocol: ``func(completions, **dataset_columns) -> list[float |
None]``. ``completions`` are strings for plain-text datasets or lists of chat messages (``[{"role": "assistant",
"content": ...}]``) for conversational ones; ``None`` marks a row the function does not apply to (TRL then ignores
it).

[`math_verify_reward`] reuses TRL's own [`trl.rewards.accuracy_reward`] (Math-Verify parsing and verification of a
``\\boxed{}`` answer, or of another LaTeX answer after an anchor such as "final answer is") and adds what a training
run on OpenR1-style data needs, following the paper's authors where TRL differs: only the last ``\\boxed{}`` of a
completion counts, references written as bare answers (``"1, 2"``, ``"x^2+1"``) are wrapped in ``\\boxed{}``,
plain-string completions are accepted, and an unparsable reference is reported once.
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import inspect
import logging
import os
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from .code_reward import CodeExecutionReward, code_execution_reward
from .tasks.arithmetic import exact_match_reward

logger = logging.getLogger(__name__)

RewardFunc = Callable[..., list[float | None]]

# Parameters of a reward function that TRL fills itself (not dataset columns).
_TRAINER_PARAMS = frozenset(
    {"completions", "prompts", "completion_ids", "trainer_state", "log_extra", "log_metric", "environments"}
)

_warned_unparsable_reference = False
_warn_lock = threading.Lock()


# ---------------------------------------------------------------------------------------------------------------------
# Completions
# ---------------------------------------------------------------------------------------------------------------------


def completion_text(completion: Any) -> str:
    """The text of one completion: TRL passes a string, or a list of messages for conversational data.

    For a list of messages the content of the last message is returned (the final answer comes last in multi-turn
    completions). ``None`` and malformed values give ``""`` rather than raising.
    """
    if completion is None:
        return ""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, dict):
        return str(completion.get("content") or "")
    if isinstance(completion, Sequence) and completion:
        last = completion[-1]
        if isinstance(last, dict):
            return str(last.get("content") or "")
        return str(last)
    return str(completion) if completion else ""


def as_messages(completion: Any) -> list[dict[str, str]]:
    """One completion as the single-message list TRL's conversational reward functions index (``[0]["content"]``)."""
    return [{"role": "assistant", "content": completion_text(completion)}]


def last_boxed(text: str) -> str | None:
    """The last complete ``\\boxed{...}`` of ``text`` (braces balanced), or ``None`` if there is none.

    Math-Verify alone reads ``"\\boxed{7} and \\boxed{12}"`` as the set ``{7, 12}``; the paper's authors score only
    the last boxed answer, and so does [`math_verify_reward`]. An unclosed box (a truncated completion) is skipped.
    """
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


def accept_text_completions(func: RewardFunc) -> RewardFunc:
    """Wraps a TRL reward function that only reads conversational completions so it also accepts strings.

    The wrapper keeps the wrapped function's name (TRL logs rewards under ``__name__``) and signature.
    """

    @functools.wraps(func)
    def wrapper(completions: list[Any], *args: Any, **kwargs: Any) -> list[float | None]:
        return func([as_messages(completion) for completion in completions], *args, **kwargs)

    return wrapper


# ---------------------------------------------------------------------------------------------------------------------
# References
# ---------------------------------------------------------------------------------------------------------------------


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
    """The reference answer in a form Math-Verify parses, or ``None`` if it cannot be parsed.

    A reference that already carries LaTeX delimiters (``\\boxed{...}``, ``$...$``) is parsed as it is. A bare answer
    (``"12"``, ``"\\frac{1}{2}"``, ``"1, 2"``) is wrapped in ``\\boxed{}`` first, as the paper's authors do: parsed
    raw, ``"1, 2"`` would read as ``2``. If that fails the raw text is tried (a worked solution ending in a boxed
    answer also works). Results are cached: a reference repeats once per completion of its prompt.
    """
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
    """Whether a reference answer is usable for training: Math-Verify parses it and it verifies against itself.

    "Verifies against itself" means that a completion stating the reference as its boxed answer gets reward 1 from
    [`math_verify_reward`], i.e. the exact path training uses.
    """
    if not isinstance(reference, str) or normalize_reference(reference) is None:
        return False
    return math_verify_reward([reference_as_completion(reference)], [reference]) == [1.0]


# ---------------------------------------------------------------------------------------------------------------------
# Reward functions
# ---------------------------------------------------------------------------------------------------------------------


def math_verify_reward(completions: list[Any], solution: list[Any], **kwargs: Any) -> list[float | None]:
    r"""TRL reward function: 1.0 when Math-Verify judges the completion's final answer equal to the reference.

    The verification itself is TRL's [`trl.rewards.accuracy_reward`] (LaTeX extraction with ``\boxed{}`` tried
    first; an answer needs an anchor such as ``\boxed{}``, ``$...$`` or "final answer is"). On top of it:

    - ``completions`` may be strings or lists of chat messages;
    - only the last complete ``\boxed{}`` of a completion is verified (see [`last_boxed`]), as the paper's authors
      do; Math-Verify alone would read several boxes as a set;
    - a bare reference (``"12"``, ``"1, 2"``, ``"x^2+1"``) is wrapped in ``\boxed{}`` before parsing (see
      [`normalize_reference`]), as the paper's authors do;
    - a completion with no parsable answer scores 0.0;
    - a reference Math-Verify cannot parse gives ``None`` (TRL: not applicable) and a warning, logged once.

    Args:
        completions: One completion per row (string, or list of messages).
        solution: The reference answer of each row (the dataset's ``solution`` column, which TRL passes by name).
        **kwargs: Other dataset columns and trainer hooks; ``log_extra`` (given by TRL's trainers) is forwarded so the
            parsed answers show up in the completions table.

    Returns:
        One reward per completion: 1.0, 0.0, or ``None``.
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


def _trl_reward_funcs() -> dict[str, RewardFunc]:
    """TRL's argument-free reward functions, wrapped to also accept plain-string completions.

    TRL's factories (``get_cosine_scaled_reward``, ``get_soft_overlong_punishment``,
    ``get_repetition_penalty_reward``) need arguments, so they are not listed: pass a dotted import path to a
    function you build with them instead.
    """
    try:
        from trl.rewards import accuracy_reward, reasoning_accuracy_reward, think_format_reward
    except ImportError:  # pragma: no cover - every supported TRL has them.
        return {}
    return {
        "accuracy_reward": accept_text_completions(accuracy_reward),
        "reasoning_accuracy_reward": accept_text_completions(reasoning_accuracy_reward),
        "think_format_reward": accept_text_completions(think_format_reward),
    }


REWARD_FUNCS: dict[str, RewardFunc] = {
    "math_verify": math_verify_reward,
    "exact_match": exact_match_reward,
    "code_execution": code_execution_reward,
    **_trl_reward_funcs(),
}
"""Reward functions by the name a config or the command line uses (``reward_funcs: [math_verify]``)."""


def _import_reward_func(path: str) -> RewardFunc:
    module_name, _, attribute = path.rpartition(".")
    try:
        module = importlib.import_module(module_name)
        func = getattr(module, attribute)
    except (ImportError, AttributeError) as error:
        raise ValueError(
            f"Could not import reward function {path!r} ({error}). Known names: {sorted(REWARD_FUNCS)}; a dotted path "
            "must name an importable function, e.g. 'my_package.rewards.my_reward'."
        ) from error
    if not callable(func):
        raise ValueError(f"{path!r} is not callable; a reward function takes (completions, **columns).")
    return func


def get_reward_funcs(names: Iterable[str]) -> list[RewardFunc]:
    """Resolves reward-function names (keys of [`REWARD_FUNCS`], or dotted import paths as in TRL's ``grpo.py``).

    Raises:
        ValueError: on an empty list or an unknown name, listing the known names. Call this before loading any model
            so a typo fails in seconds.
    """
    if isinstance(names, str):
        names = [names]
    names = list(names)
    if not names:
        raise ValueError(f"No reward function given; pass --reward_funcs with one or more of {sorted(REWARD_FUNCS)}.")
    funcs = []
    for name in names:
        if name in REWARD_FUNCS:
            funcs.append(REWARD_FUNCS[name])
        elif "." in name:
            funcs.append(_import_reward_func(name))
        else:
            raise ValueError(
                f"Unknown reward function {name!r}. Known names: {sorted(REWARD_FUNCS)}, or a dotted import path "
                "such as 'my_package.rewards.my_reward'."
            )
    return funcs


def required_reward_columns(funcs: Iterable[RewardFunc]) -> list[str]:
    """Dataset columns the reward functions need: their parameters without a default, other than TRL's own
    (``completions``, ``prompts``, ``completion_ids``, ...). E.g. ``["solution"]`` for [`math_verify_reward`]."""
    columns: list[str] = []
    for func in funcs:
        try:
            parameters = inspect.signature(func).parameters.values()
        except (TypeError, ValueError):  # builtins or C callables: nothing to check
            continue
        for parameter in parameters:
            if (
                parameter.kind in (parameter.POSITIONAL_OR_KEYWORD, parameter.KEYWORD_ONLY)
                and parameter.default is parameter.empty
                and parameter.name not in _TRAINER_PARAMS
                and parameter.name not in columns
            ):
                columns.append(parameter.name)
    return columns


def score_completions(
    reward_func: RewardFunc,
    prompts: Sequence[Any],
    completions: Sequence[Sequence[str]],
    columns: dict[str, Sequence[Any]] | None = None,
    *,
    chunk_size: int = 4096,
) -> list[list[float | None]]:
    """Scores several completions per prompt with one reward function, called the way TRL's trainer calls it.

    Args:
        reward_func: A TRL reward function.
        prompts: One prompt per problem (string or messages). Completions of conversational prompts are passed as
            messages, as TRL does.
        completions: ``completions[i]`` holds the completions (text) of prompt ``i``.
        columns: Dataset columns, one value per prompt, passed as keyword arguments (repeated per completion).
        chunk_size: Rows per reward-function call.

    Returns:
        ``rewards[i][j]``: the reward of completion ``j`` of prompt ``i`` (``None`` where the function abstains).
    """
    from trl.data_utils import is_conversational

    columns = dict(columns or {})
    if len(completions) != len(prompts):
        raise ValueError(f"Got {len(prompts)} prompts but completions for {len(completions)}.")
    for name, values in columns.items():
        if len(values) != len(prompts):
            raise ValueError(f"Column {name!r} has {len(values)} values for {len(prompts)} prompts.")
    rows = [(i, text) for i, texts in enumerate(completions) for text in texts]
    flat: list[float | None] = []
    for start in range(0, len(rows), chunk_size):
        chunk = rows[start : start + chunk_size]
        batch_completions = [
            as_messages(text) if is_conversational({"prompt": prompts[i]}) else text for i, text in chunk
        ]
        kwargs = {name: [values[i] for i, _ in chunk] for name, values in columns.items()}
        kwargs["prompts"] = [prompts[i] for i, _ in chunk]
        rewards = reward_func(completions=batch_completions, **kwargs)
        if inspect.isawaitable(rewards):  # an async reward (e.g. code_execution), as TRL's trainer awaits it
            rewards = asyncio.run(rewards)
        if len(rewards) != len(chunk):
            raise ValueError(f"The reward function returned {len(rewards)} rewards for {len(chunk)} completions.")
        flat.extend(None if reward is None else float(reward) for reward in rewards)
    result: list[list[float | None]] = [[] for _ in prompts]
    for (i, _), reward in zip(rows, flat, strict=True):
        result[i].append(reward)
    return result


__all__ = [
    "REWARD_FUNCS",
    "accept_text_completions",
    "as_messages",
    "completion_text",
    "answer_span",
    "get_reward_funcs",
    "last_boxed",
    "math_verify_reward",
    "normalize_reference",
    "reference_as_completion",
    "reference_verifies",
    "failing_reward_name",
    "required_reward_columns",
    "resolve_reward_funcs",
    "score_completions",
]


def resolve_reward_funcs(reward_funcs: Any) -> Any:
    """
    Replace reward-function names of trl-ada's registry (`"math_verify"`, `"exact_match"`, ...) and dotted import paths
    by the functions; hub ids and local paths (reward models) stay for TRL. A bare unknown name would otherwise be
    retried against the Hub as a model id for about a minute.
    """
    if reward_funcs is None:
        return None
    names = reward_funcs if isinstance(reward_funcs, list) else [reward_funcs]
    resolved = []
    for func in names:
        if not isinstance(func, str) or os.path.exists(func):
            resolved.append(func)
        elif func in REWARD_FUNCS or ("." in func and "/" not in func):
            resolved.extend(get_reward_funcs([func]))
        elif "/" in func:
            resolved.append(func)  # a Hub reward model, e.g. "org/reward-model"
        else:
            raise ValueError(
                f"Unknown reward function {func!r}: not a trl-ada reward name ({sorted(REWARD_FUNCS)}), a dotted "
                "import path, a local reward-model directory, or a Hub id of the form 'org/model'. Pass a callable, "
                "or one of those."
            )
    for func in resolved:
        if isinstance(func, CodeExecutionReward):
            func.sandbox  # noqa: B018 - builds the sandbox now: a missing bubblewrap fails before the model loads
    return resolved if isinstance(reward_funcs, list) else resolved[0]


def failing_reward_name(error: BaseException, funcs: list[Any], names: list[str]) -> str:
    """Which reward function raised `error`: the innermost traceback frame that runs one of them."""
    codes = {}
    for func, name in zip(funcs, names, strict=True):
        code = getattr(getattr(func, "__wrapped__", func), "__code__", None) or getattr(func, "__code__", None)
        if code is not None:
            codes[code] = name
    found = None
    traceback = error.__traceback__
    while traceback is not None:
        found = codes.get(traceback.tb_frame.f_code, found)
        traceback = traceback.tb_next
    return f"Reward function {found!r}" if found else f"A reward function (one of {names})"
