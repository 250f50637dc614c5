"""The one place where trl-ada touches the private API of TRL (and of accelerate, where TRL's asynchronous trainer
relies on it), which moves between releases. This package refuses an unsupported TRL at import, before any of its
modules imports a private name of TRL, saying what to do (`TRL_ADA_ALLOW_UNSUPPORTED_TRL=1` tries anyway, with a
warning). Each touchpoint is a row of `TOUCHPOINTS` in `tests/test_trl_touchpoints.py` (the asynchronous trainer's:
`ASYNC_TOUCHPOINTS` in `tests/test_trl_async_touchpoints.py`), checked against the installed TRL.

Each module holds what touches one thing:

- `grpo_private`: `GRPOTrainer`'s private methods and attributes, the inline behaviours of its
  `_generate_and_score_completions` trl-ada repeats (reward sum, truncation test), its `RepeatSampler`,
  `unwrap_model_for_generation`, and the fused LM head of `trl.trainer.utils` (refused off CUDA/XPU on TRL 1.15).
- `vllm_generation`: TRL's vLLM client and `VLLMGeneration` (server-mode requests and their broadcast, colocated
  sleep mode).
- `batch_dispatch`: accelerate's `DataLoaderDispatcher`, which hands the asynchronous trainer's batches out, and the
  broadcast by which the main process makes the processes waiting in it raise its error.
- `async_grpo_private`: TRL's experimental `AsyncGRPOTrainer` and its rollout worker (pinned sources, the worker class
  it builds, its trained rows, weight sync and peak FLOPs)."""

from __future__ import annotations

import logging
import os

import trl
from packaging.specifiers import SpecifierSet
from packaging.version import Version

logger = logging.getLogger(__name__)

SUPPORTED_TRL = SpecifierSet(">=1.14,<1.17")
"""TRL releases whose private API every touchpoint of this package was checked against, each run by a CI stage."""

ALLOW_UNSUPPORTED_ENV = "TRL_ADA_ALLOW_UNSUPPORTED_TRL"


def refuse_unsupported(message: str) -> None:
    """Raise `ImportError(message)`, or only warn when `TRL_ADA_ALLOW_UNSUPPORTED_TRL=1` asks to try anyway."""
    if os.environ.get(ALLOW_UNSUPPORTED_ENV, "") == "1":
        logger.warning("%s Continuing because %s=1.", message, ALLOW_UNSUPPORTED_ENV)
        return
    raise ImportError(message)


def check_trl_version(version: str | None = None) -> None:
    """Refuse (`refuse_unsupported`) an installed TRL (or `version`) outside [`SUPPORTED_TRL`]."""
    version = version or trl.__version__
    if Version(version) in SUPPORTED_TRL:
        return
    message = (
        f"trl-ada supports TRL {SUPPORTED_TRL} (its private GRPOTrainer API, checked per release in "
        f"trl_ada/trl_seam/); TRL {version} is installed. Install a supported TRL (pip install 'trl{SUPPORTED_TRL}'), "
        f"or set {ALLOW_UNSUPPORTED_ENV}=1 to try this one anyway."
    )
    refuse_unsupported(message)


check_trl_version()

__all__ = ["ALLOW_UNSUPPORTED_ENV", "SUPPORTED_TRL", "check_trl_version"]
