"""Checkpoint helpers: which checkpoint a resume should start from, and where the sampler's state lives in one."""

from __future__ import annotations

import glob
import json
import logging
import os
import re
import zipfile
from typing import Any

from transformers.trainer import TRAINER_STATE_NAME
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

logger = logging.getLogger(__name__)

SAMPLER_STATE_NAME = "ada_sampler_state.json"
"""File holding the sampler's training state (downsampling RNG, pass-rate trackers, DAPO refill position)."""

_CHECKPOINT_PATTERN = re.compile(rf"^{PREFIX_CHECKPOINT_DIR}-(\d+)$")
_ZIP_MAGIC = b"PK"
"""`torch.save` writes a zip archive (since torch 1.6); an older pickle format is not checked."""


class CheckpointError(ValueError):
    """A checkpoint file that cannot be loaded; the message names the file and why."""


def read_sampler_state(checkpoint: str | os.PathLike) -> dict[str, Any] | None:
    """
    The sampler state saved in `checkpoint`, or `None` when it has none (a checkpoint of `trl.GRPOTrainer`).

    Raises:
        CheckpointError: naming the file, when it is not the JSON object `AdaGRPOTrainer` writes.
    """
    path = os.path.join(checkpoint, SAMPLER_STATE_NAME)
    if not os.path.exists(path):
        return None
    try:
        with open(path) as f:
            state = json.load(f)
    except (OSError, ValueError) as error:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise CheckpointError(f"{path} cannot be read as JSON ({type(error).__name__}: {error})") from error
    if not isinstance(state, dict) or not isinstance(state.get("sampler"), dict):
        raise CheckpointError(f"{path} is not a sampler state (no 'sampler' object)")
    refill = state.get("refill")
    if not isinstance(refill, dict) or not {"epoch", "position"} <= set(refill):
        raise CheckpointError(f"{path} is not a sampler state (no 'refill' object with 'epoch' and 'position')")
    return state


def checkpoint_problem(path: str | os.PathLike) -> str | None:
    """
    Why resuming from `path` would fail, or `None` when it looks loadable. Reads only what is cheap (no tensor
    data): `trainer_state.json`, which the Trainer writes last, so a save cut short (SIGTERM, full disk) lacks a
    readable one; the sampler state; the header of every safetensors file (which also checks that the file is as long
    as the header says) and every shard an index names; the zip directory of the `torch.save` files (optimizer,
    scheduler, RNG state). DeepSpeed and FSDP sub-folders are not inspected.
    """
    path = os.fspath(path)
    if not os.path.isdir(path):
        return f"{path} does not exist" if not os.path.exists(path) else f"{path} is not a directory"
    state_path = os.path.join(path, TRAINER_STATE_NAME)
    if not os.path.isfile(state_path):
        return f"{state_path} is missing (the Trainer writes it last, so the save was cut short)"
    try:
        with open(state_path) as f:
            json.load(f)
    except (OSError, ValueError) as error:
        return f"{state_path} cannot be read as JSON ({type(error).__name__}: {error})"
    try:
        read_sampler_state(path)
    except CheckpointError as error:
        return str(error)
    # Top level: the model (or PEFT adapter) and its shards; one level down: the adapters of a multi-adapter model.
    for weights in sorted(
        glob.glob(os.path.join(path, "*.safetensors")) + glob.glob(os.path.join(path, "*", "*.safetensors"))
    ):
        problem = _safetensors_problem(weights)
        if problem:
            return problem
    for index in sorted(glob.glob(os.path.join(path, "*.index.json"))):
        problem = _index_problem(index)
        if problem:
            return problem
    for archive in sorted(
        glob.glob(os.path.join(path, "*.pt"))
        + glob.glob(os.path.join(path, "*.pth"))
        + glob.glob(os.path.join(path, "*.bin"))
    ):
        problem = _torch_archive_problem(archive)
        if problem:
            return problem
    return None


def is_complete_checkpoint(path: str | os.PathLike) -> bool:
    """Whether `path` holds a whole, loadable checkpoint (see [`checkpoint_problem`])."""
    return checkpoint_problem(path) is None


def checkpoint_dirs(output_dir: str | os.PathLike) -> list[str]:
    """The `checkpoint-N` directories of `output_dir`, newest (highest N) first; empty when it does not exist."""
    if not os.path.isdir(output_dir):
        return []
    steps = []
    for name in os.listdir(output_dir):
        match = _CHECKPOINT_PATTERN.match(name)
        if match and os.path.isdir(os.path.join(output_dir, name)):
            steps.append((int(match.group(1)), name))
    return [os.path.join(output_dir, name) for _, name in sorted(steps, reverse=True)]


def latest_complete_checkpoint(output_dir: str | os.PathLike, *, warn: bool = False) -> str | None:
    """
    The newest loadable `checkpoint-N` in `output_dir`, or `None`. Unlike `transformers`' `get_last_checkpoint`, a
    checkpoint that cannot be loaded (a save cut short, a corrupt model, optimizer or sampler state: see
    [`checkpoint_problem`]) is skipped rather than picked and failed on; with `warn`, each one skipped is logged with
    the reason.
    """
    for path in checkpoint_dirs(output_dir):
        problem = checkpoint_problem(path)
        if problem is None:
            return path
        if warn:
            logger.warning(
                "Skipping %s for resume_from_checkpoint=True: %s. Trying the next older one.", path, problem
            )
    return None


def describe_checkpoints(output_dir: str | os.PathLike) -> str:
    """
    A sentence listing the checkpoints of `output_dir` for an error message, oldest first, marking those that cannot
    be loaded.
    """
    directory = os.fspath(output_dir) or "."
    if not os.path.isdir(directory):
        return f"{directory!r} does not exist."
    paths = checkpoint_dirs(directory)[::-1]
    if not paths:
        return f"{directory!r} holds no checkpoint-N directory."
    names = [
        os.path.basename(path) + ("" if checkpoint_problem(path) is None else " (cannot be loaded)") for path in paths
    ]
    return f"{directory!r} holds {', '.join(names)}."


def _safetensors_problem(path: str) -> str | None:
    from safetensors import safe_open

    try:
        with safe_open(path, framework="pt"):  # reads the header, memory-maps the data: no tensor is loaded
            pass
    except Exception as error:  # SafetensorError derives from Exception only; an unreadable file is an OSError
        return f"{path} is not a readable safetensors file ({error})"
    return None


def _index_problem(path: str) -> str | None:
    """A sharded model's index must parse and every shard it names must be there."""
    try:
        with open(path) as f:
            shards = set(json.load(f)["weight_map"].values())
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
        return f"{path} is not a readable shard index ({type(error).__name__}: {error})"
    missing = sorted(shard for shard in shards if not os.path.isfile(os.path.join(os.path.dirname(path), shard)))
    if missing:
        return f"{path} names shard(s) {missing}, which are missing"
    return None


def _torch_archive_problem(path: str) -> str | None:
    try:
        with open(path, "rb") as f:
            if f.read(len(_ZIP_MAGIC)) != _ZIP_MAGIC:
                return None  # not a zip archive: an old torch format or another file, left to the loader
        with zipfile.ZipFile(path):  # reads the central directory at the end, which a truncated file lacks
            pass
    except (OSError, zipfile.BadZipFile) as error:
        return f"{path} is not a readable torch.save archive ({type(error).__name__}: {error})"
    return None
