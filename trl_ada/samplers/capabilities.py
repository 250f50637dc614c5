"""
The capabilities a sampler may declare beyond the contract, each by subclassing its class beside `Sampler`
(`class MySampler(ChoosesPrompts, Sampler)`). The trainers test the declaration (`isinstance`), never the presence of
a method; the methods are abstract, so a sampler that declares a capability without its methods cannot be built.
Pure Python.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Hashable, Sequence
from typing import Any


class ChoosesPrompts(ABC):
    """A sampler that draws each generation batch's prompts by weight, in place of TRL's shuffle (`sampler="spo"`).
    The asynchronous worker draws each row of its one prompt stream with probability its weight over
    `max_priority()`."""

    @abstractmethod
    def prompt_priorities(self, keys: Sequence[Hashable]) -> list[float]:
        """Each prompt's sampling weight, positive and finite, identical on every process."""

    @abstractmethod
    def max_priority(self) -> float:
        """The largest weight `prompt_priorities` can return, positive and finite."""


class GatesRefills(ABC):
    """A sampler whose DAPO refill passes over some prompts (`sampler="dapo_gated"`), asked of each by key."""

    @abstractmethod
    def refill_passes_over(self, key: Hashable) -> bool:
        """Whether the refill passes over this prompt."""


class RunsRoundFree(ABC):
    """A sampler whose exit rule reads each prompt's own pool (`seq_pos`, `seq_balance`), so the round-free schedule can
    draw every prompt's rounds without waiting for the others (`generation_schedule="continuous"`)."""

    @abstractmethod
    def begin_continuous(self, num_prompts: int, prompt_keys: Sequence[Hashable] | None = None) -> Any:
        """Start a generation batch drawn prompt by prompt (`trl_ada.samplers.streaming.ContinuousStep`)."""
