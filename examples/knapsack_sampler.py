"""
A sampler plug-in for trl-ada: a knapsack-style budget rule of one's own, registered as "greedy_mixed_chance".

Each step has TRL's budget of `B * num_generations` completions for `B` prompts. A prompt only teaches when its group
holds both outcomes, which `k` draws at pass rate `p` achieve with probability `1 - p^k - (1 - p)^k`. This sampler
hands out the budget one completion at a time to the prompt whose chance of a mixed group gains the most from it (the
greedy solution of that knapsack, exact here because each prompt's gain shrinks with `k`), from pass rates a
decayed Beta tracker learns across epochs. It trains on every completion drawn (like `est` with
`est_train_on="all"`), so the batch keeps TRL's `B * num_generations` rows. (trl-ada's built-in `sampler="knapsack"`
is Knapsack-RL, the paper's rule of this kind: its value also weighs each prompt by `p (1 - p)^2`.)

Use it from Python (`import knapsack_sampler` registers it; then `AdaGRPOConfig(sampler="greedy_mixed_chance",
sampler_kwargs={"max_draws": 12})`) or from the command line by import path, e.g.
`trl-ada simulate --sampler knapsack_sampler:MixedChanceSampler --sampler-kwargs '{"max_draws": 12}'` with this
directory on `PYTHONPATH`.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Any

from trl_ada.samplers import Sampler, SamplerOptions, register_sampler
from trl_ada.samplers.tracker import DecayedBetaTracker


@dataclass(kw_only=True)
class MixedChanceOptions(SamplerOptions):
    """What the sampler reads: its own knobs (given as `sampler_kwargs`) and the config's `pass_rate_decay`."""

    splits_batch_budget = True  # a prompt's budget depends on the other prompts of its batch

    min_draws: int = 2
    """Completions every prompt gets (at least 2, so each has a baseline)."""
    max_draws: int = 16
    """Completions one prompt may get at most."""
    pass_rate_decay: float  # named like a config knob: read from the config

    def __post_init__(self) -> None:
        if not 2 <= self.min_draws <= self.max_draws:
            raise ValueError(f"need 2 <= min_draws <= max_draws, got {self.min_draws} and {self.max_draws}")
        if not self.min_draws <= self.num_generations <= self.max_draws:
            raise ValueError(
                f"the step's budget is num_generations={self.num_generations} per prompt on average, outside "
                f"[min_draws, max_draws] = [{self.min_draws}, {self.max_draws}]; change sampler_kwargs or "
                "num_generations."
            )

    @property
    def max_pool_size(self) -> int:
        return self.max_draws


def mixed_chance(pass_rate: float, draws: int) -> float:
    """Probability that `draws` completions at `pass_rate` hold both a positive and a negative."""
    return 1.0 - pass_rate**draws - (1.0 - pass_rate) ** draws


@register_sampler("greedy_mixed_chance")
class MixedChanceSampler(Sampler):
    """Split the step's `B * num_generations` completions where each adds the most chance of a mixed group."""

    Options = MixedChanceOptions

    def __init__(self, settings: Any) -> None:
        super().__init__(settings)
        self.estimator = DecayedBetaTracker(self.options.pass_rate_decay, 1.0, 1.0)

    def begin(self, num_prompts: int, prompt_keys: Any = None):
        step = super().begin(num_prompts, prompt_keys)
        rates = self.estimator.estimate(step.keys)
        low, high = self.options.min_draws, self.options.max_draws
        budgets = [low] * num_prompts
        # Max-heap of each prompt's gain from one more draw; the gains of one prompt shrink, so greedy is optimal.
        gains = [(-(mixed_chance(p, low + 1) - mixed_chance(p, low)), i) for i, p in enumerate(rates)]
        heapq.heapify(gains)
        for _ in range(num_prompts * (self.settings.num_generations - low)):
            _, i = heapq.heappop(gains)
            budgets[i] += 1
            if budgets[i] < high:
                k = budgets[i]
                heapq.heappush(gains, (-(mixed_chance(rates[i], k + 1) - mixed_chance(rates[i], k)), i))
        step.budgets = budgets
        return step

    def request_size(self, step, index: int) -> int:
        return step.budgets[index] if step.rounds == 0 else 0

    def keep(self, step, index: int) -> list[int]:
        return list(range(len(step.pools[index])))  # every completion: the total is B * num_generations

    def end_step(self, step, selection) -> None:
        totals = [positives + negatives for positives, negatives in step.outcomes]
        self.estimator.update(step.keys, totals, [positives for positives, _ in step.outcomes])
        selection.metrics["greedy_mixed_chance/budget_max"] = float(max(step.budgets))

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "estimator": self.estimator.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.estimator.load_state_dict(state["estimator"])
