"""Replayed successes (`replay="successes"`): which prompts hold a stored correct completion of their own. Pure Python."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class StoredSuccess:
    """A prompt's latest correct completion, as the sampler knows it (the completion itself stays with the trainer)."""

    batch: int
    """The generation batch it was drawn in (counted by [`SuccessReplay.batches`])."""
    reward: float


class SuccessReplay:
    """The latest correct completion of at most `capacity` prompts, by key, the least recently stored forgotten first.
    Every process keeps the same index; the trainer keeps the completions, each on the process that generated it."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.batches = 0
        """Generation batches finished so far: a stored success's age is counted in them."""
        self.stored: OrderedDict[str, StoredSuccess] = OrderedDict()

    def lookup(self, key: Hashable) -> StoredSuccess | None:
        return self.stored.get(str(key))

    def store(self, key: Hashable, reward: float) -> None:
        name = str(key)
        self.stored.pop(name, None)
        self.stored[name] = StoredSuccess(self.batches, reward)
        while len(self.stored) > self.capacity:
            self.stored.popitem(last=False)

    def age(self, success: StoredSuccess) -> int:
        """Generation batches since `success` was drawn (1 for the batch right before the current one)."""
        return self.batches - success.batch

    def state_dict(self) -> dict[str, Any]:
        return {
            "batches": self.batches,
            "stored": [[key, success.batch, success.reward] for key, success in self.stored.items()],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.batches = int(state["batches"])
        self.stored = OrderedDict(
            (key, StoredSuccess(int(batch), float(reward))) for key, batch, reward in state["stored"]
        )
