"""Moved: the code-execution reward lives in `trl_ada.rewards.code` (its sandbox in `trl_ada.rewards.sandbox`).

This module re-exports its public names, so ``from trl_ada.code_reward import CodeExecutionReward`` keeps working.
"""

from .rewards.code import (  # noqa: F401 - re-exports
    HARNESS,
    OUTCOMES,
    AssertPlan,
    CodeExecutionReward,
    Isolation,
    Outcome,
    Sandbox,
    SandboxLimits,
    SandboxResult,
    StdioCase,
    available_cpus,
    build_assert_plan,
    code_execution_reward,
    extract_program,
    normalize_output,
    parse_verification_info,
)

__all__ = [
    "HARNESS",
    "OUTCOMES",
    "AssertPlan",
    "CodeExecutionReward",
    "StdioCase",
    "available_cpus",
    "build_assert_plan",
    "code_execution_reward",
    "extract_program",
    "normalize_output",
    "parse_verification_info",
]
