"""Moved: the code-execution reward lives in `trl_ada.rewards.code` (its sandbox in `trl_ada.rewards.sandbox`).

This module re-exports its public names, so ``from trl_ada.code_reward import CodeExecutionReward`` keeps working.
"""

from .rewards.code import *  # noqa: F403 - its public names, as its __all__ lists them

# and the names importable here before the move that its __all__ does not list
from .rewards.code import Isolation, Outcome, Sandbox, SandboxLimits, SandboxResult, __all__  # noqa: F401
