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

The interface both share (`ScheduledBatch`, `ScheduleDriver`, `RoundResult`, `prompt_keys`) is `base.py`, re-exported
here; `pools.py` holds the rank-local pools of drawn completions (`PoolEntry`, `LocalRow`) that the schedules fill.

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

from .base import (
    GenerationSchedule,
    RoundResult,
    ScheduledBatch,
    ScheduleDriver,
    ScheduleStats,
    prompt_key,
    prompt_keys,
)
from .continuous import ContinuousSchedule
from .rounds import RoundsSchedule

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

SCHEDULES: dict[str, GenerationSchedule] = {"rounds": RoundsSchedule(), "continuous": ContinuousSchedule()}
"""Every generation schedule by its `generation_schedule` name."""


def get_schedule(name: str) -> GenerationSchedule:
    """The schedule `generation_schedule=name` selects."""
    try:
        return SCHEDULES[name]
    except KeyError:
        raise ValueError(f"unknown generation_schedule {name!r}; choose one of {sorted(SCHEDULES)}.") from None
