"""Moved: the code sandbox lives in `trl_ada.rewards.sandbox`.

This module re-exports its public names, so ``from trl_ada.sandbox import Sandbox, SandboxLimits`` keeps working.
"""

from .rewards.sandbox import (  # noqa: F401 - re-exports
    INSTALL_HINT,
    PROGRAM_FILE,
    SCRATCH_DIR,
    Isolation,
    Sandbox,
    SandboxLimits,
    SandboxResult,
    Status,
    bwrap_available,
)

__all__ = [
    "INSTALL_HINT",
    "PROGRAM_FILE",
    "SCRATCH_DIR",
    "Sandbox",
    "SandboxLimits",
    "SandboxResult",
    "bwrap_available",
]
