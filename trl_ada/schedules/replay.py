"""The completions behind `replay="successes"` (what the sampler's [`~trl_ada.samplers.replay.SuccessReplay`] index
points to): each prompt's latest correct completion, kept as the `PoolEntry` of its draw, so a replayed row is
routed like any kept row."""

from __future__ import annotations

import os
import pickle
from collections.abc import Sequence
from typing import Any

import torch

from ..samplers import PromptKey, Selection
from .pools import PoolEntry

REPLAY_ROWS_NAME = "ada_replay_rows_{rank}.pkl"
"""Each process's stored successes in a checkpoint (its own completions; the others' rewards and holders)."""


def take_replayed(
    store: dict[str, PoolEntry], keys: Sequence[PromptKey], pools: Sequence[Sequence[PoolEntry]], selection: Selection
) -> dict[int, PoolEntry]:
    """The stored successes one generation batch's `selection` replays, by prompt index, read before the batch's own
    successes are stored in `store` (`Selection.replay_stored`)."""
    replayed = {}
    for index, result in enumerate(selection.prompts):
        if result.replayed is not None:
            entry = store.get(str(keys[index]))
            if entry is None:
                raise RuntimeError(
                    f"replay='successes' chose prompt {str(keys[index])!r}'s stored success, which this process does "
                    "not hold: the sampler's index and the stored completions disagree."
                )
            replayed[index] = entry
    for index, draw in enumerate(selection.replay_stored):
        if draw is not None:
            store[str(keys[index])] = pools[index][draw]
    return replayed


def forget_unindexed(store: dict[str, PoolEntry], indexed: Any) -> None:
    """Drop from `store` the prompts the sampler's index no longer holds (`indexed`: a container of keys)."""
    for key in [key for key in store if key not in indexed]:
        del store[key]


def save_replay_rows(store: dict[str, PoolEntry], checkpoint: str, rank: int) -> None:
    """Write this process's `store` into `checkpoint` (every process writes its own file, as TRL's RNG states)."""
    entries = {
        key: (entry.rewards_per_func.cpu(), entry.truncated, entry.holder, entry.row) for key, entry in store.items()
    }
    os.makedirs(checkpoint, exist_ok=True)  # another process may not have made the checkpoint's folder yet
    with open(os.path.join(checkpoint, REPLAY_ROWS_NAME.format(rank=rank)), "wb") as f:
        pickle.dump(entries, f, protocol=pickle.HIGHEST_PROTOCOL)


def load_replay_rows(checkpoint: str, rank: int, device: torch.device | str) -> dict[str, PoolEntry] | None:
    """This process's stored successes from `checkpoint`, or None when it has no file for this process."""
    path = os.path.join(checkpoint, REPLAY_ROWS_NAME.format(rank=rank))
    if not os.path.isfile(path):
        return None
    with open(path, "rb") as f:
        entries = pickle.load(f)  # written by save_replay_rows into the run's own checkpoint, as torch.load reads it
    return {
        key: PoolEntry(rewards.to(device), truncated, holder, row)
        for key, (rewards, truncated, holder, row) in entries.items()
    }
