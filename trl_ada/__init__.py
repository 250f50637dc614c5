"""trl-ada: Reinforce-Ada adaptive sampling (arXiv 2510.04996) as a drop-in `GRPOTrainer` for TRL."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

__all__ = ["AdaAsyncGRPOConfig", "AdaAsyncGRPOTrainer", "AdaGRPOConfig", "AdaGRPOTrainer", "__version__"]

if TYPE_CHECKING:
    from .async_grpo import AdaAsyncGRPOConfig, AdaAsyncGRPOTrainer
    from .config import AdaGRPOConfig
    from .trainer import AdaGRPOTrainer

# Lazy: `trl_ada.samplers` and `trl-ada simulate` must not pay for importing torch and TRL.
_HOMES = {
    "AdaGRPOConfig": ".config",
    "AdaGRPOTrainer": ".trainer",
    "AdaAsyncGRPOConfig": ".async_grpo",
    "AdaAsyncGRPOTrainer": ".async_grpo",
}


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'trl_ada' has no attribute {name!r}")
    return getattr(importlib.import_module(_HOMES[name], __name__), name)
