"""Run a sampler against Bernoulli pass rates, with no model: the cost and signal of a sampling rule in microseconds."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from . import rules
from .base import build_sampler
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


def simulate(
    settings: SamplerSettings, pass_rates: Sequence[float], trials: int, seed: int = 0
) -> list[SimulationResult]:
    """
    For every pass rate, run one generation batch of `trials` prompts whose completions are positive (reward 1) with
    that probability and negative (reward 0) otherwise. Deterministic for a `seed`.
    """
    if trials < 1:
        raise ValueError(f"trials must be at least 1, got {trials}")
    for p in pass_rates:
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"every pass rate must lie in [0, 1], got {p}")
    draws = random.Random(seed)
    results = []
    for p in pass_rates:
        sampler = build_sampler(settings)
        step = sampler.begin(trials)
        while requests := step.requests():
            total = sum(count for _, count in requests)
            step.observe(requests, [1.0 if draws.random() < p else 0.0 for _ in range(total)])
        selection = step.finish()
        threshold = sampler.settings.positive_threshold
        mixed = 0
        for pool, result in zip(selection.pools, selection.prompts, strict=True):
            positives, negatives = rules.count_outcomes([pool[i] for i in result.kept], threshold)
            mixed += positives > 0 and negatives > 0
        sizes = [len(pool) for pool in selection.pools]
        results.append(
            SimulationResult(
                pass_rate=p,
                mean_samples=sum(sizes) / trials,
                mean_rounds=sum(selection.rounds_per_prompt) / trials,
                mixed_share=mixed / trials,
                max_samples=max(sizes),
                trials=trials,
            )
        )
    return results
