"""Samplers that give every prompt a budget of completions once per step (`est`, `knapsack`). Pure Python."""

from __future__ import annotations

from collections.abc import Hashable, Sequence

from .base import Sampler, SamplingStep
from .tracker import checked_estimates


class BudgetedSampler(Sampler):
    """
    A prompt's completions are its budget, drawn in one round: `begin` reads every prompt's pass-rate estimate from
    `self.estimator` and `plan_budgets` fills `step.budgets` from them. The update trains on every draw
    (`trains_on_every_draw`) or on the pool downsampled to `num_generations`.
    """

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
