"""
Reinforce-Ada in TRL's asynchronous trainer (`trl.experimental.async_grpo`): [`AdaAsyncGRPOTrainer`] and
[`AdaAsyncGRPOConfig`] (`trainer.py`, `config.py`), the rollout loop that draws the pools (`rollout.py`), and a
plain-torch tree attention for machines without TRL's GPU kernel (`tree_attention.py`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = ["AdaAsyncGRPOConfig", "AdaAsyncGRPOTrainer"]

if TYPE_CHECKING:
    from .config import AdaAsyncGRPOConfig
    from .trainer import AdaAsyncGRPOTrainer


def __getattr__(name: str) -> Any:
    # Lazy, as trl_ada's own: importing the package does not import TRL's asynchronous trainer.
    if name == "AdaAsyncGRPOConfig":
        from .config import AdaAsyncGRPOConfig

        return AdaAsyncGRPOConfig
    if name == "AdaAsyncGRPOTrainer":
        from .trainer import AdaAsyncGRPOTrainer

        return AdaAsyncGRPOTrainer
    raise AttributeError(f"module 'trl_ada.async_grpo' has no attribute {name!r}")
