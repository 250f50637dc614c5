"""Reward functions: math (Math-Verify), exact match, code execution in a sandbox, and their registry by name.

Every function follows TRL's reward-function protocol: ``func(completions, **dataset_columns) -> list[float | None]``.
The parts: [`trl_ada.rewards.text`] (completions as text), [`trl_ada.rewards.math`], [`trl_ada.rewards.code`] (run in
[`trl_ada.rewards.sandbox`]) and [`trl_ada.rewards.reward_registry`] (``REWARD_FUNCS``, ``--reward_funcs math_verify``). This
package re-exports their public names (``from trl_ada.rewards import math_verify_reward``), loaded on first use, so
importing `trl_ada.rewards.sandbox` or `trl_ada.rewards.code` alone does not import TRL or torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the names `__getattr__` loads, for type checkers and readers
    from ..tasks.arithmetic import exact_match_reward  # noqa: F401
    from .code import CodeExecutionReward, code_execution_reward  # noqa: F401
    from .math import (
        answer_span,
        last_boxed,
        math_verify_reward,
        normalize_reference,
        reference_as_completion,
        reference_verifies,
    )
    from .reward_registry import (
        REWARD_FUNCS,
        failing_reward_name,
        get_reward_funcs,
        required_reward_columns,
        resolve_reward_funcs,
        score_completions,
    )
    from .text import RewardFunc, accept_text_completions, as_messages, completion_text  # noqa: F401

_HOMES = {
    "RewardFunc": ".text",
    "accept_text_completions": ".text",
    "as_messages": ".text",
    "completion_text": ".text",
    "answer_span": ".math",
    "last_boxed": ".math",
    "math_verify_reward": ".math",
    "normalize_reference": ".math",
    "reference_as_completion": ".math",
    "reference_verifies": ".math",
    "CodeExecutionReward": ".code",
    "code_execution_reward": ".code",
    "exact_match_reward": "..tasks.arithmetic",
    "REWARD_FUNCS": ".reward_registry",
    "failing_reward_name": ".reward_registry",
    "get_reward_funcs": ".reward_registry",
    "required_reward_columns": ".reward_registry",
    "resolve_reward_funcs": ".reward_registry",
    "score_completions": ".reward_registry",
}
"""Where each name this package exports lives."""

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


def __getattr__(name: str) -> Any:
    # Lazy, as `trl_ada` itself: the sandbox and the code reward must not pay for importing TRL and torch.
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'trl_ada.rewards' has no attribute {name!r}")
    value = getattr(importlib.import_module(home, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOMES})
