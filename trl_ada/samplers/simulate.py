"""Run a sampler against Bernoulli pass rates, with no model: the cost and signal of a sampling rule in microseconds."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from . import rules
from .base import Sampler, Selection, build_sampler
from .settings import SamplerSettings


@dataclass(frozen=True)
class SimulationResult:
    """Averages over `trials` prompts that share one pass rate."""

    pass_rate: float
    mean_samples: float
    """Completions drawn per prompt."""
    mean_rounds: float
    """Rounds in which a prompt received completions."""
    mixed_share: float
    """Share of prompts whose kept group holds both outcomes (a non-zero GRPO gradient)."""
    max_samples: int
    trials: int

    def to_dict(self) -> dict[str, float | int]:
        return asdict(self)


def run_population(sampler: Sampler, population: Sequence[float], seed: int, steps: int = 1) -> Selection:
    """
    Run `steps` generation batches of `sampler` over one prompt per entry of `population` (its pass rate; its key is
    its index, so the same prompts come back every step) and return the last batch's `Selection`.
    """
    draws = random.Random(seed)
    keys = list(range(len(population)))
    selection = None
    for _ in range(steps):
        step = sampler.begin(len(population), keys)
        while requests := step.requests():
            rewards = []
            for index, count in requests:
                p = population[index]
                rewards.extend(1.0 if draws.random() < p else 0.0 for _ in range(count))
            step.observe(requests, rewards)
        selection = step.finish()
    assert selection is not None
    return selection


def simulate(
    settings: SamplerSettings, pass_rates: Sequence[float], trials: int, seed: int = 0, steps: int = 1
) -> list[SimulationResult]:
    """
    Run `steps` generation batches over a population of `trials` prompts per pass rate, every completion positive
    (reward 1) with its prompt's pass rate and negative (reward 0) otherwise, and report the last batch per pass
    rate. The whole population is one batch, so budget-sharing samplers (`est`) see the mix; with `steps > 1` the
    same prompts come back, so `est`'s tracker learns their pass rates. Deterministic for a `seed`.
    """
    if trials < 1:
        raise ValueError(f"trials must be at least 1, got {trials}")
    if steps < 1:
        raise ValueError(f"steps must be at least 1, got {steps}")
    for p in pass_rates:
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"every pass rate must lie in [0, 1], got {p}")
    sampler = build_sampler(settings)
    population = [p for p in pass_rates for _ in range(trials)]
    selection = run_population(sampler, population, seed=seed, steps=steps)

    threshold = sampler.settings.positive_threshold
    results = []
    for offset, p in zip(range(0, len(population), trials), pass_rates, strict=True):
        block = range(offset, offset + trials)
        mixed = 0
        for index in block:
            pool, result = selection.pools[index], selection.prompts[index]
            positives, negatives = rules.count_outcomes([pool[i] for i in result.kept], threshold)
            mixed += positives > 0 and negatives > 0
        sizes = [len(selection.pools[index]) for index in block]
        results.append(
            SimulationResult(
                pass_rate=p,
                mean_samples=sum(sizes) / trials,
                mean_rounds=sum(selection.rounds_per_prompt[index] for index in block) / trials,
                mixed_share=mixed / trials,
                max_samples=max(sizes),
                trials=trials,
            )
        )
    return results
