"""Samplers that give every prompt a budget of completions once per step (`est`, `knapsack`). Pure Python."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

from .base import Sampler, SamplingStep, Selection, learn_pass_rates
from .predictor import build_pass_rate_estimator
from .settings import SamplerSettings
from .tracker import PassRateEstimator, checked_estimates


class BudgetedSampler(Sampler):
    """A prompt's completions are its budget, drawn in one round: `begin` reads every prompt's pass-rate estimate from
    `self.estimator` (by default the one `pass_rate_predictor` names) and `plan_budgets` fills `step.budgets` from
    them. The update trains on every draw (`trains_on_every_draw`) or on the pool downsampled to `num_generations`."""

    def __init__(self, settings: SamplerSettings, estimator: PassRateEstimator | None = None) -> None:
        super().__init__(settings)
        self.estimator: PassRateEstimator = estimator or build_pass_rate_estimator(self.settings)

    def begin(self, num_prompts: int, prompt_keys: Sequence[Hashable] | None = None) -> SamplingStep:
        if prompt_keys is None or len(prompt_keys) != num_prompts:
            raise ValueError(f"sampler={self.name!r} needs one stable key per prompt to track its pass rate")
        step = super().begin(num_prompts, prompt_keys)
        step.estimates = checked_estimates(self.estimator, step.keys)
        self.plan_budgets(step)
        return step

    def plan_budgets(self, step: SamplingStep) -> None:
        """Fill `step.budgets` (one per prompt) from `step.estimates`."""
        raise NotImplementedError

    @property
    def trains_on_every_draw(self) -> bool:
        """Whether every completion drawn enters the update (group sizes vary), rather than `num_generations`."""
        raise NotImplementedError

    def request_size(self, step: SamplingStep, index: int) -> int:
        return step.budgets[index] if step.rounds == 0 else 0

    def keep(self, step: SamplingStep, index: int) -> list[int]:
        if self.trains_on_every_draw:
            return list(range(len(step.pools[index])))
        return super().keep(step, index)

    def end_step(self, step: SamplingStep, selection: Selection) -> None:
        learn_pass_rates(self.estimator, step, selection, step.estimates)

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "estimator": self.estimator.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.estimator.load_state_dict(state["estimator"])
