"""trl-ada: Reinforce-Ada adaptive sampling (arXiv 2510.04996) as a drop-in `GRPOTrainer` for TRL."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

__all__ = ["AdaAsyncGRPOConfig", "AdaAsyncGRPOTrainer", "AdaGRPOConfig", "AdaGRPOTrainer", "__version__"]

if TYPE_CHECKING:
    from .async_grpo import AdaAsyncGRPOConfig, AdaAsyncGRPOTrainer
    from .config import AdaGRPOConfig
    from .trainer import AdaGRPOTrainer


def __getattr__(name: str) -> Any:
    # Lazy: `trl_ada.samplers` and `trl-ada simulate` must not pay for importing torch and TRL.
    if name == "AdaGRPOConfig":
        from .config import AdaGRPOConfig

        return AdaGRPOConfig
    if name == "AdaGRPOTrainer":
        from .trainer import AdaGRPOTrainer

        return AdaGRPOTrainer
    if name in ("AdaAsyncGRPOConfig", "AdaAsyncGRPOTrainer"):
        from . import async_grpo

        return getattr(async_grpo, name)
    raise AttributeError(f"module 'trl_ada' has no attribute {name!r}")
