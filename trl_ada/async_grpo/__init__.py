"""Reinforce-Ada in TRL's asynchronous trainer (`trl.experimental.async_grpo`): [`AdaAsyncGRPOTrainer`] and
[`AdaAsyncGRPOConfig`] (`async_grpo_trainer.py`, `async_grpo_config.py`, named as TRL names its own), the rollout loop that draws the pools (`rollout.py`), and a
plain-torch tree attention for machines without TRL's GPU kernel (`tree_attention.py`)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__all__ = ["AdaAsyncGRPOConfig", "AdaAsyncGRPOTrainer"]

if TYPE_CHECKING:
    from .async_grpo_config import AdaAsyncGRPOConfig
    from .async_grpo_trainer import AdaAsyncGRPOTrainer

# Lazy, as trl_ada's own: importing the package does not import TRL's asynchronous trainer.
_HOMES = {"AdaAsyncGRPOConfig": ".async_grpo_config", "AdaAsyncGRPOTrainer": ".async_grpo_trainer"}


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'trl_ada.async_grpo' has no attribute {name!r}")
    return getattr(importlib.import_module(_HOMES[name], __name__), name)
