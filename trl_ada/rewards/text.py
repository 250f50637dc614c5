"""Completions as text: TRL passes a reward function strings for plain-text datasets and lists of chat messages
(``[{"role": "assistant", "content": ...}]``) for conversational ones. [`completion_text`] reads either;
[`as_messages`] and [`accept_text_completions`] go the other way, for TRL's reward functions that read only messages.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

RewardFunc = Callable[..., list[float | None]]


def completion_text(completion: Any) -> str:
    """The text of one completion: the string TRL passes, or the content of the last of its messages (the final
    answer comes last in multi-turn completions); ``None`` and malformed values give ``""`` rather than raising."""
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


def accept_text_completions(func: RewardFunc) -> RewardFunc:
    """Wraps a TRL reward function that only reads conversational completions so it also accepts strings.

    The wrapper keeps the wrapped function's name (TRL logs rewards under ``__name__``) and signature.
    """

    @functools.wraps(func)
    def wrapper(completions: list[Any], *args: Any, **kwargs: Any) -> list[float | None]:
        return func([as_messages(completion) for completion in completions], *args, **kwargs)

    return wrapper


__all__ = ["RewardFunc", "accept_text_completions", "as_messages", "completion_text"]
