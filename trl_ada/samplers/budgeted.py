"""Samplers that give every prompt a budget of completions once per step (`est`, `knapsack`). Pure Python."""

from __future__ import annotations

from .base import Sampler, SamplingStep


class BudgetedSampler(Sampler):
    """
    A prompt's completions are its budget (`step.budgets`, filled by `begin`), drawn in one round; the update trains
    on every draw (`trains_on_every_draw`) or on the pool downsampled to `num_generations`.
    """

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
