"""Run a sampler against Bernoulli pass rates, with no model: the cost and signal of a sampling rule in microseconds."""

from __future__ import annotations

import heapq
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


GENERATION_SCHEDULES = ("rounds", "continuous")
ARRIVALS = ("in_order", "length_correlated")
RIGHT_MEAN_LENGTH, WRONG_MEAN_LENGTH = 1.0, 4.0
"""`arrival="length_correlated"`: a completion's generation time is exponential with this mean, right ones short."""


def run_population(
    sampler: Sampler,
    population: Sequence[float],
    seed: int,
    steps: int = 1,
    schedule: str = "rounds",
    arrival: str = "in_order",
) -> Selection:
    """
    Run `steps` generation batches of `sampler` over one prompt per entry of `population` (its pass rate; its key is
    its index, so the same prompts come back every step) and return the last batch's `Selection`.

    `schedule="continuous"` runs the round-free schedule (`ContinuousStep`, sequential samplers only) on an engine
    that returns each draw after its generation time: `arrival="in_order"` in submission order, `"length_correlated"`
    right completions faster than wrong ones (exponential times, means `RIGHT_MEAN_LENGTH`, `WRONG_MEAN_LENGTH`), so
    results come back out of order. Its pools are those of rounds on the same draws whatever the arrival; its draws
    come from one stream per prompt, so they are not the rounds schedule's draws for the same seed.
    """
    _choice("schedule", schedule, GENERATION_SCHEDULES)
    _choice("arrival", arrival, ARRIVALS)
    draws = random.Random(seed)
    keys = list(range(len(population)))
    selection = None
    for _ in range(steps):
        if schedule == "continuous":
            selection = _continuous_batch(sampler, population, keys, draws, arrival)
            continue
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


def _continuous_batch(
    sampler: Sampler, population: Sequence[float], keys: list[int], draws: random.Random, arrival: str
) -> Selection:
    """One round-free generation batch: each prompt's rewards come from its own stream, in submission order."""
    streams = [random.Random(draws.getrandbits(64)) for _ in population]
    # Generation times come from a stream of their own: the arrival model never changes what is drawn.
    timing = random.Random(draws.getrandbits(64))
    step = sampler.begin_continuous(len(population), keys)
    queue: list[tuple[float, int, int, int, float]] = []  # (finish time, sequence, prompt, draw, reward)
    clock, sequence = 0.0, 0

    def submit() -> None:
        nonlocal sequence
        for prompt, draw in step.to_submit():
            right = streams[prompt].random() < population[prompt]
            if arrival == "in_order":
                finish = float(sequence)
            else:
                finish = clock + timing.expovariate(1.0 / (RIGHT_MEAN_LENGTH if right else WRONG_MEAN_LENGTH))
            heapq.heappush(queue, (finish, sequence, prompt, draw, 1.0 if right else 0.0))
            sequence += 1

    submit()
    while queue:
        clock, _, prompt, draw, reward = heapq.heappop(queue)
        step.complete(prompt, draw, reward)
        submit()
    return step.finish()


def _choice(name: str, value: str, choices: Sequence[str]) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, choices))}, got {value!r}.")


def simulate(
    settings: SamplerSettings,
    pass_rates: Sequence[float],
    trials: int,
    seed: int = 0,
    steps: int = 1,
    schedule: str = "rounds",
    arrival: str = "in_order",
) -> list[SimulationResult]:
    """
    Run `steps` generation batches over a population of `trials` prompts per pass rate, every completion positive
    (reward 1) with its prompt's pass rate and negative (reward 0) otherwise, and report the last batch per pass
    rate. The whole population is one batch, so budget-sharing samplers (`est`) see the mix; with `steps > 1` the
    same prompts come back, so `est`'s tracker learns their pass rates. Deterministic for a `seed`. `schedule` and
    `arrival`: see `run_population` (the continuous schedule needs `seq_pos` or `seq_balance`).
    """
    _choice("schedule", schedule, GENERATION_SCHEDULES)
    _choice("arrival", arrival, ARRIVALS)
    if schedule == "continuous" and not settings.sampler_class.has_exit_rule:
        raise ValueError(
            f"the continuous schedule runs sampler='seq_pos' or 'seq_balance', got {settings.sampler!r}: pick one of "
            "those, or simulate the rounds schedule (schedule='rounds', `--generation-schedule rounds`)."
        )
    if trials < 1:
        raise ValueError(f"trials must be at least 1, got {trials}")
    if steps < 1:
        raise ValueError(f"steps must be at least 1, got {steps}")
    for p in pass_rates:
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"every pass rate must lie in [0, 1], got {p}")
    sampler = build_sampler(settings)
    population = [p for p in pass_rates for _ in range(trials)]
    selection = run_population(sampler, population, seed=seed, steps=steps, schedule=schedule, arrival=arrival)

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
