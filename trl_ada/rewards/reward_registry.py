"""The registry of reward functions by name, and how trainers and jobs resolve and call them.

[`REWARD_FUNCS`] maps the names a config or the command line uses (``reward_funcs: [math_verify]``) to trl-ada's
own functions and TRL's argument-free ones; a dotted import path (``my_package.rewards.my_reward``) names any other.
[`resolve_reward_funcs`] is what `AdaGRPOTrainer` calls on its ``reward_funcs``; [`score_completions`] calls a reward
function the way TRL's trainer does (evaluation, data preparation).
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import os
from collections.abc import Iterable, Sequence
from typing import Any

from ..tasks.arithmetic import exact_match_reward
from .code import CodeExecutionReward, code_execution_reward
from .math import math_verify_reward
from .text import RewardFunc, accept_text_completions, as_messages

# Parameters of a reward function that TRL fills itself (not dataset columns).
_TRAINER_PARAMS = frozenset(
    {"completions", "prompts", "completion_ids", "trainer_state", "log_extra", "log_metric", "environments"}
)


def _trl_reward_funcs() -> dict[str, RewardFunc]:
    """TRL's argument-free reward functions, wrapped to also accept plain-string completions (TRL's factories, such
    as ``get_cosine_scaled_reward``, need arguments: name a function built with them by its dotted import path)."""
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
    """Scores several completions per prompt with one reward function, called the way TRL's trainer calls it:
    ``completions[i]`` holds the completions (text) of ``prompts[i]`` (passed as messages where that prompt is
    conversational), ``columns`` the dataset's values per prompt, and ``chunk_size`` rows go to each call.

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


__all__ = [
    "REWARD_FUNCS",
    "failing_reward_name",
    "get_reward_funcs",
    "required_reward_columns",
    "resolve_reward_funcs",
    "score_completions",
]
