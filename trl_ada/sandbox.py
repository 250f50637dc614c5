"""Moved: the code sandbox lives in `trl_ada.rewards.sandbox`.

This module re-exports its public names, so ``from trl_ada.sandbox import Sandbox, SandboxLimits`` keeps working.
"""

from .rewards.sandbox import *  # noqa: F403 - its public names, as its __all__ lists them

# and the names importable here before the move that its __all__ does not list
from .rewards.sandbox import Isolation, Status, __all__  # noqa: F401
