"""Generation schedules: how one generation batch's draws are made (`generation_schedule`).

A schedule is the loop around a pure sampling step of `trl_ada.samplers`: its one method, `sample(driver,
group_inputs, keys)`, has the driver ([`ScheduleDriver`]) generate and score what the step asks for and returns a
[`ScheduledBatch`] (the `Selection`, every prompt's pool in draw order, [`ScheduleStats`]). `"rounds"` (`rounds.py`)
is Algorithm 2's rounds and runs on any driver; `"continuous"` (`continuous.py`) sends each draw as its own request
to a vLLM server and needs AdaGRPOTrainer's driver (`driver.py`, which also runs one training step's sampling).
`base.py` is the interface both share; `pools.py` the rank-local pools they fill. The asynchronous rollout worker
drives the pure step itself (`trl_ada.samplers.streaming.begin_streaming`), so the exit rule, the pools and the
selection are the same code everywhere.
"""

from __future__ import annotations

from .continuous import ContinuousSchedule
from .rounds import RoundsSchedule
from .schedule import (
    GenerationSchedule,
    RoundResult,
    ScheduledBatch,
    ScheduleDriver,
    ScheduleStats,
    prompt_key,
    prompt_keys,
)

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
