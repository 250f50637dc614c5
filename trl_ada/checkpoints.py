"""Checkpoint helpers: which checkpoint a resume starts from (the same on every process), whether a checkpoint can be
loaded, and where the sampler's state lives in one."""

from __future__ import annotations

import glob
import json
import logging
import os
import re
import zipfile
from collections.abc import Callable
from typing import Any

from accelerate.utils import broadcast_object_list, gather_object
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


def read_sampler_state(checkpoint: str | os.PathLike, *, require_refill: bool = True) -> dict[str, Any] | None:
    """The sampler state saved in `checkpoint`, or `None` when it has none (a checkpoint of `trl.GRPOTrainer`); raises
    `CheckpointError`, naming the file, when it is not the JSON object `AdaGRPOTrainer` writes.
    `require_refill=False`: the asynchronous trainer's state, which has no DAPO refill position."""
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
    if require_refill and (not isinstance(refill, dict) or not {"epoch", "position"} <= set(refill)):
        raise CheckpointError(f"{path} is not a sampler state (no 'refill' object with 'epoch' and 'position')")
    return state


def checkpoint_problem(path: str | os.PathLike) -> str | None:
    """Why resuming from `path` would fail, or `None` when it looks loadable. Reads only what is cheap:
    `trainer_state.json` (written last, so a save cut short lacks it), the sampler state, every safetensors header and
    the shards an index names, and the zip directory of the `torch.save` files (not DeepSpeed or FSDP sub-folders)."""
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
        # The asynchronous trainer's state names it and has no DAPO refill position; the synchronous one's must.
        state = read_sampler_state(path, require_refill=False)
        if state is not None and "trainer" not in state:
            read_sampler_state(path)
    except CheckpointError as error:
        return str(error)

    def files(*patterns: str) -> list[str]:
        return sorted(name for pattern in patterns for name in glob.glob(os.path.join(path, pattern)))

    # Top level: the model (or PEFT adapter) and its shards; one level down: the adapters of a multi-adapter model.
    checks = [
        (_safetensors_problem, files("*.safetensors", os.path.join("*", "*.safetensors"))),
        (_index_problem, files("*.index.json")),
        (_torch_archive_problem, files("*.pt", "*.pth", "*.bin")),
    ]
    for check, names in checks:
        for name in names:
            problem = check(name)
            if problem:
                return problem
    return None


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
    """The newest loadable `checkpoint-N` in `output_dir`, or `None`: unlike `transformers`' `get_last_checkpoint`, one
    that cannot be loaded ([`checkpoint_problem`]) is skipped, and with `warn` logged with the reason."""
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
    """A sentence listing the checkpoints of `output_dir`, oldest first, marking those that cannot be loaded."""
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


def resolve_resume_checkpoint(
    resume_from_checkpoint: str | os.PathLike | bool | None,
    output_dir: str | os.PathLike,
    *,
    is_main_process: bool,
    broadcast: Callable[[list[Any]], list[Any]] = broadcast_object_list,
    gather: Callable[[list[Any]], list[Any]] = gather_object,
) -> str | os.PathLike | bool | None:
    """What `Trainer.train(resume_from_checkpoint=...)` gets: `True` becomes the newest loadable `checkpoint-N` of
    `output_dir`, picked on the main process and broadcast to all; a path is returned as given once
    [`check_resumable`] passes on every process; `False` and `None` pass through. `broadcast` and `gather` are the
    collectives every process enters (replaceable for a test). Raises `ValueError` on every process, before anything
    loads, when `True` finds no loadable checkpoint or the path cannot be resumed from."""
    if resume_from_checkpoint is True:
        picked = latest_complete_checkpoint(output_dir, warn=True) if is_main_process else None
        [resume_from_checkpoint] = broadcast([picked])
        if resume_from_checkpoint is None:
            raise ValueError(
                f"resume_from_checkpoint=True, but {output_dir!r} holds no complete checkpoint-N "
                f"directory that can be loaded: {describe_checkpoints(output_dir)} Pass a checkpoint "
                "path, or start without resume_from_checkpoint."
            )
    if isinstance(resume_from_checkpoint, str | os.PathLike):
        check_resumable(os.fspath(resume_from_checkpoint), output_dir, is_main_process=is_main_process, gather=gather)
    return resume_from_checkpoint


def check_resumable(
    checkpoint: str,
    output_dir: str | os.PathLike,
    *,
    is_main_process: bool,
    gather: Callable[[list[Any]], list[Any]] = gather_object,
) -> None:
    """Fail on every process together (`gather` is their collective), before anything loads, when `checkpoint`
    cannot be resumed from: the main process's copy decides whether it exists and loads, and every process must see
    a loadable copy."""
    problem = checkpoint_problem(checkpoint)
    listing = None
    if problem is not None and is_main_process:
        directories = [os.path.dirname(os.path.normpath(checkpoint)) or ".", output_dir]
        listing = " ".join(
            describe_checkpoints(directory)
            for i, directory in enumerate(directories)
            if os.path.realpath(directory) not in {os.path.realpath(d) for d in directories[:i]}
        )
    statuses = gather([(os.path.exists(checkpoint), problem, listing)])
    main_exists, main_problem, main_listing = statuses[0]
    if not main_exists:
        raise ValueError(
            f"resume_from_checkpoint={checkpoint!r} does not exist. {main_listing} Pass one of those checkpoints, "
            "resume_from_checkpoint=True for the newest loadable one, or start without resume_from_checkpoint."
        )
    if main_problem is not None:
        raise ValueError(
            f"Cannot resume from {checkpoint!r}: {main_problem}. {main_listing} Pass another checkpoint, "
            "resume_from_checkpoint=True for the newest loadable one, or start without resume_from_checkpoint."
        )
    blind = [rank for rank, (_, rank_problem, _) in enumerate(statuses) if rank_problem is not None]
    if blind:
        raise ValueError(
            f"Process(es) {blind} of {len(statuses)} cannot read the complete checkpoint {checkpoint!r}. The "
            "Trainer writes the model on the main process only, so resuming needs output_dir on a filesystem every "
            "machine shares (or copy the checkpoint to each machine at the same path)."
        )


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
