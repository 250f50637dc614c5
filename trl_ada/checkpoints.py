"""Checkpoint helpers: which checkpoint a resume should start from, and where the sampler's state lives in one."""

from __future__ import annotations

import json
import os
import re

from transformers.trainer import TRAINER_STATE_NAME
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

SAMPLER_STATE_NAME = "ada_sampler_state.json"
"""File holding the sampler's training state (downsampling RNG, pass-rate trackers, DAPO refill position)."""

_CHECKPOINT_PATTERN = re.compile(rf"^{PREFIX_CHECKPOINT_DIR}-(\d+)$")


def is_complete_checkpoint(path: str | os.PathLike) -> bool:
    """
    Whether `path` holds a whole checkpoint. The Trainer writes `trainer_state.json` last (after the model, optimizer
    and sampler state), so a checkpoint whose save was killed midway lacks a readable one.
    """
    try:
        with open(os.path.join(path, TRAINER_STATE_NAME)) as f:
            json.load(f)
    except (OSError, ValueError):
        return False
    return True


def latest_complete_checkpoint(output_dir: str | os.PathLike) -> str | None:
    """
    The newest complete `checkpoint-N` in `output_dir`, or `None`. Unlike `transformers`' `get_last_checkpoint`, a
    checkpoint whose save was interrupted (SIGTERM, out of disk) is skipped rather than picked and failed on.
    """
    if not os.path.isdir(output_dir):
        return None
    steps = []
    for name in os.listdir(output_dir):
        match = _CHECKPOINT_PATTERN.match(name)
        if match and os.path.isdir(os.path.join(output_dir, name)):
            steps.append((int(match.group(1)), name))
    for _, name in sorted(steps, reverse=True):
        path = os.path.join(output_dir, name)
        if is_complete_checkpoint(path):
            return path
    return None
