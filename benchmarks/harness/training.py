"""What every learning run shares while it trains: its training arguments, when it evaluates and stops, and the
totals it reads from its trainer's log."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

BUDGET_EVAL_POINTS = 8
"""With a completions budget, the held-out is measured each time a run crosses another eighth of the budget."""


def training_args(
    output_dir: str, seed: int, steps: int, lr: float, rows_per_step: int, max_completion_length: int
) -> dict[str, Any]:
    """The training arguments every learning benchmark's runs share (a config of any GRPO trainer takes them)."""
    return {
        "output_dir": output_dir,
        "per_device_train_batch_size": rows_per_step,
        "max_completion_length": max_completion_length,
        "temperature": 1.0,
        "learning_rate": lr,
        "lr_scheduler_type": "constant",
        "beta": 0.0,
        "max_steps": steps,
        "logging_steps": 1,
        "save_strategy": "no",
        "report_to": "none",
        "use_cpu": True,
        "bf16": False,
        "disable_tqdm": True,
        "seed": seed,
    }


def draw_accounting(entries: Sequence[dict]) -> dict[str, Any]:
    """A run's draws per pass-rate band of the pool summed from the trainer's `ada/draws/*_total` counters
    (`trl_ada.samplers.accounting`), which each log entry holds summed over its window: completions drawn, those that
    served an update group with a signal (useful) and those in it (trained), overall and per band."""
    from trl_ada.samplers.accounting import BANDS

    def total(name: str) -> float:
        return math.fsum(entry.get(f"ada/draws/{name}_total") or 0.0 for entry in entries)

    bands = {band: {"drawn": total(f"{band}/drawn"), "useful": total(f"{band}/useful")} for band in BANDS}
    return {
        "total": total("drawn"),
        "useful": total("useful"),
        "trained": total("trained"),
        "bands": {b: v for b, v in bands.items() if v["drawn"]},
    }


def step_shapes(entries: Sequence[dict], group_rows: int | None) -> dict[str, list[float]]:
    """Each step's shape, for pricing it at another scale (`harness.gpu_time`): its generate calls (rounds plus DAPO's
    extra batches), the completions it drew and the rows its update trained on, `group_rows` a step (TRL's batch) or,
    with `None` (`train_on="pool"`), every completion drawn. Read from log entries of one step each
    (`logging_steps=1`, as `training_args` sets)."""
    drawn = [float(entry.get("ada/draws/drawn_total") or 0.0) for entry in entries]
    return {
        "generate_calls": [
            float(entry.get("ada/rounds", 1.0)) + float(entry.get("ada/dapo/extra_batches", 0.0)) for entry in entries
        ],
        "completions": drawn,
        "update_rows": list(drawn) if group_rows is None else [float(group_rows)] * len(entries),
    }


def train_seconds(entries: Sequence[dict]) -> float:
    """The training seconds of the steps `entries` cover (log entries with TRL's `step_time`, in order from the run's
    first): each entry's `step_time` is the mean over the optimizer steps since the previous entry, so it weighs that
    many steps."""
    steps = [entry["step"] for entry in entries]
    return math.fsum(
        entry["step_time"] * (step - previous)
        for entry, step, previous in zip(entries, steps, [0, *steps], strict=False)
    )


def gate_passes(entries: Sequence[dict]) -> float | None:
    """The rows DAPO's refill walk stepped past in a run because the sampler predicted them unmixed
    (`sampler= "dapo_gated"`), summed from `ada/dapo/passed_over_total` (each log entry's sum over its window); None
    for a run without a refill. Kept apart from `draws`, which a gated run that passed over nothing shares with DAPO's.
    """
    logged = [entry["ada/dapo/passed_over_total"] for entry in entries if "ada/dapo/passed_over_total" in entry]
    return float(sum(logged)) if logged else None


class EvaluationPlan:
    """When a run measures its held-out and when it stops: every `eval_every` steps and at the last step; or, with a
    completions budget, each time the completions drawn cross another `1 / BUDGET_EVAL_POINTS` of it, stopping once
    they reach it (every method then ends at the same completions, whatever it draws per step)."""

    def __init__(self, steps: int, eval_every: int, budget: int | None) -> None:
        self.steps, self.eval_every, self.budget = steps, eval_every, budget
        self.next_mark = None if budget is None else budget / BUDGET_EVAL_POINTS

    def evaluate_now(self, step: int, completions: float) -> bool:
        """Whether to measure the held-out after optimizer step `step`, `completions` drawn so far."""
        if self.budget is None:
            return step % self.eval_every == 0 or step == self.steps
        if completions >= self.budget or step == self.steps:
            return True
        if completions < self.next_mark:
            return False
        while self.next_mark <= completions:
            self.next_mark += self.budget / BUDGET_EVAL_POINTS
        return True

    def stop_now(self, completions: float) -> bool:
        """Whether the run has drawn its budget."""
        return self.budget is not None and completions >= self.budget


def evaluation_callback(
    plan: EvaluationPlan, drawn: Callable[[int], float], point: Callable[[int, Any], dict], curve: list[dict]
) -> Any:
    """A `TrainerCallback` that, after each optimizer step, appends `point(step, model)` to `curve` when `plan` says
    and stops the run once it has drawn its budget; `drawn(step)`: the completions the first `step` steps drew."""
    from transformers import TrainerCallback

    class HeldOut(TrainerCallback):
        def on_step_end(self, args, state, control, model=None, **kwargs):
            done = drawn(state.global_step)
            if plan.evaluate_now(state.global_step, done):
                curve.append(point(state.global_step, model))
            control.should_training_stop |= plan.stop_now(done)

    return HeldOut()


def budget_steps(budget: int | None, steps: int, prompts_per_step: int) -> int:
    """The step cap of a run: `steps`, or with a budget enough for any method drawing 2 or more per prompt."""
    return steps if budget is None else max(steps, math.ceil(budget / (2 * prompts_per_step)))
