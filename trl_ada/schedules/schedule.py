"""The interface every generation schedule shares (re-exported by `trl_ada.schedules`), in a module of its own so that
the schedules import it without importing the package that registers them."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Sequence
from typing import Any, NamedTuple, Protocol

from ..samplers import PromptKey, Sampler, Selection
from ..samplers.predictor import prompt_text
from ..samplers.streaming import ScheduleStats

__all__ = [
    "GenerationSchedule",
    "RoundResult",
    "ScheduleDriver",
    "ScheduleStats",
    "ScheduledBatch",
    "prompt_key",
    "prompt_keys",
]


class RoundResult(NamedTuple):
    """One round's (or scoring batch's) requested rows, generated and scored, in request order."""

    order: list[int]
    """The prompt (index into the batch) of each requested row."""
    entries: list[Any]
    """Each row's `trl_ada.schedules.pools.PoolEntry` (rewards per function, truncation flag, the process holding it)."""
    rewards: list[float]
    """Each row's summed reward (NaN where no reward function scored it), the same on every process."""


class ScheduleDriver(Protocol):
    """What a schedule needs of the side that generates and scores (AdaGRPOTrainer's: `driver.TrainerDriver`)."""

    @property
    def sampler(self) -> Sampler:
        """The sampler whose steps the schedule runs (`begin`, or `begin_continuous` on the continuous schedule)."""

    @property
    def mask_truncated(self) -> bool:
        """Whether truncated draws are masked: they then neither satisfy an exit rule nor take kept slots."""

    def run_round(self, requests: Sequence[tuple[int, int]], group_inputs: list[dict[str, Any]], round_index: int):
        """Generate and score the requested `(prompt, count)` rows into a [`RoundResult`]; `round_index` (1-based)
        names the round in errors. With several processes, collective."""


@dataclasses.dataclass
class ScheduledBatch:
    """What a schedule returns for one generation batch; the same on every process except the rows the pools hold."""

    selection: Selection
    pools: list[list[Any]]
    """Every prompt's `PoolEntry`s in draw order; a completion itself stays on the process that generated it."""
    stats: ScheduleStats


class GenerationSchedule(Protocol):
    """A generation schedule: runs one generation batch of prompts (see the module docstring)."""

    name: str

    def sample(
        self, driver: ScheduleDriver, group_inputs: list[dict[str, Any]], keys: Sequence[PromptKey]
    ) -> ScheduledBatch: ...


def prompt_key(row: dict[str, Any]) -> str:
    """A stable id for a prompt: the dataset's `prompt_id` column when present, else a hash of the prompt and its
    images (or of the whole row, when an environment supplies the prompt), the same on every process."""
    if "prompt_id" in row:
        return str(row["prompt_id"])
    task = {name: row[name] for name in ("prompt", "image", "images") if name in row} if "prompt" in row else row
    text = json.dumps(task, sort_keys=True, default=_stable_repr)
    return hashlib.sha1(text.encode("utf-8")).hexdigest()


def prompt_keys(group_inputs: Sequence[dict[str, Any]]) -> list[PromptKey]:
    """The keys a schedule is given: each row's `prompt_key`, carrying the prompt's text for a learned predictor."""
    keys = [prompt_key(row) for row in group_inputs]
    return [
        PromptKey(key, prompt_text(row["prompt"]) if "prompt" in row else key)
        for key, row in zip(keys, group_inputs, strict=True)
    ]


def _stable_repr(value: Any) -> str:
    """JSON stand-in for a non-JSON value; an image (anything with `tobytes`) by its content, not its address."""
    if hasattr(value, "tobytes"):
        return f"{type(value).__name__}:{getattr(value, 'size', '')}:{hashlib.sha1(value.tobytes()).hexdigest()}"
    return str(value)
