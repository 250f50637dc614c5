"""Small verifiable tasks for tests and CPU experiments."""

from .arithmetic import (
    LEVELS,
    accuracy_by_level,
    exact_match_reward,
    format_accuracy,
    held_out_problems,
    make_dataset,
    make_problems,
)

__all__ = [
    "LEVELS",
    "accuracy_by_level",
    "exact_match_reward",
    "format_accuracy",
    "held_out_problems",
    "make_dataset",
    "make_problems",
]
