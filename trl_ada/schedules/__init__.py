"""
Generation schedules: how one generation batch's draws are made, the one home of both (`generation_schedule`).

A schedule is the loop around a pure sampling step of `trl_ada.samplers`: it begins the step on the driver's sampler,
has the driver generate and score what the step asks for, feeds the rewards back and finishes the step. Its one
method, `sample(driver, group_inputs, keys)`, takes one dataset row per prompt of the batch and the prompts' keys
(`prompt_keys`), and returns a [`ScheduledBatch`]: the `Selection`, every prompt's pool of `PoolEntry`s in draw order
(index k is draw k, as the selection's pools) and a [`ScheduleStats`]. Schedules log nothing and know nothing of DAPO
(refills call a schedule once per batch: `trl_ada.samplers.dapo.fill_update`); what they need of the side that
generates and scores is a [`ScheduleDriver`].

- `"rounds"` (`rounds.py`): Algorithm 2's rounds, every active prompt's request in one batched generation per round.
  Any [`ScheduleDriver`] can drive it.
- `"continuous"` (`continuous.py`): round-free, each draw its own request to a vLLM server, the exit rule checked
  per prompt (`trl_ada.samplers.continuous.ContinuousStep` is its pure rule). Its draws go through AdaGRPOTrainer's
  vLLM client and every process's collectives, so its driver must also hold that trainer (`driver.trainer`).

Who drives: `AdaGRPOTrainer` through `trl_ada.schedules.driver` (its `TrainerDriver`, and `sample_step`, one training
step's sampling: the batch layout, DAPO refills, the kept rows handed to TRL). A trainer that generates in rounds
drives `"rounds"` with a driver of its own: a sampler, whether truncated draws are masked, and `run_round`, which
generates and scores requested rows.

Where the generation loop is not ours, the pure step under both schedules is the interface: the asynchronous trainer's
rollout worker (`trl_ada.async_grpo.rollout`) runs inside TRL's own loop, which pulls one request at a time, so it
drives `trl_ada.samplers.continuous.begin_streaming` (the `ContinuousStep` of `"continuous"`, or one request per
prompt for `est`) directly: `requests()` says what to draw next, `complete(draw, reward)` takes each draw back in
submission order, `finish()` gives the `Selection`. The exit rule, the pools and the selection are therefore the same
code in all three places.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Sequence
from typing import Any, NamedTuple, Protocol

from ..samplers import PromptKey, Sampler, ScheduleStats, Selection
from ..samplers.predictor import prompt_text

__all__ = [
    "SCHEDULES",
    "GenerationSchedule",
    "RoundResult",
    "ScheduleDriver",
    "ScheduleStats",
    "ScheduledBatch",
    "get_schedule",
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
        ...

    @property
    def mask_truncated(self) -> bool:
        """Whether truncated draws are masked: they then neither satisfy an exit rule nor take kept slots."""
        ...

    def run_round(self, requests: Sequence[tuple[int, int]], group_inputs: list[dict[str, Any]], round_index: int):
        """
        Generate and score the requested rows (`(prompt, count)` pairs, prompts indexing `group_inputs`) and return a
        [`RoundResult`]; `round_index` (1-based) names the round in errors. With several processes, collective.
        """
        ...


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


def get_schedule(name: str) -> GenerationSchedule:
    """The schedule `generation_schedule=name` selects."""
    try:
        return SCHEDULES[name]
    except KeyError:
        raise ValueError(f"unknown generation_schedule {name!r}; choose one of {sorted(SCHEDULES)}.") from None


def prompt_key(row: dict[str, Any]) -> str:
    """
    A stable id for a prompt: the dataset's `prompt_id` column when present, else a hash of the prompt and its images
    (or of the whole row, when an environment supplies the prompt), the same on every process.
    """
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


# The schedules themselves import the interface above.
from .continuous import ContinuousSchedule  # noqa: E402
from .rounds import RoundsSchedule  # noqa: E402

SCHEDULES: dict[str, GenerationSchedule] = {"rounds": RoundsSchedule(), "continuous": ContinuousSchedule()}
"""Every generation schedule by its `generation_schedule` name."""
