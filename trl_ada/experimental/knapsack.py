"""
Knapsack-RL (Li et al., arXiv 2509.25849): each step's fixed budget of completions is split over its prompts by a
knapsack on their pass rates. [`allocate`] is the allocation, a pure function; [`KnapsackSampler`] draws it. The value
of `k` draws for a prompt of pass rate `p` is `v(p, k) = (1 - p^k - (1 - p)^k) * p * (1 - p)^2`. Its gain
from one more draw, `(p^k (1 - p) + p (1 - p)^k) * p * (1 - p)^2`, does not grow with `k`, so taking the largest
marginal gains of all prompts first maximises the sum exactly (no dynamic program over the budget).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from trl_ada.samplers import (
    PassRateEstimator,
    SamplerOptions,
    SamplerSettings,
    SamplingStep,
    Selection,
    read_when,
    register_sampler,
)
from trl_ada.samplers.base import trained_on_phrase
from trl_ada.samplers.budgeted import BudgetedSampler

PAPER = "Knapsack-RL (Li et al., arXiv 2509.25849)"


def value(pass_rate: float, draws: int) -> float:
    """The paper's value of `draws` completions for a prompt of `pass_rate`: `(1 - p^k - (1-p)^k) * p * (1-p)^2`."""
    p = pass_rate
    return (1.0 - p**draws - (1.0 - p) ** draws) * p * (1.0 - p) ** 2


def allocate(
    pass_rates: Sequence[float],
    budget: int,
    min_draws: int,
    max_draws: int,
    *,
    solved_draws: int = 2,
    unsolved_draws: int = 2,
) -> list[int]:
    """Knapsack-RL's allocation of `budget` completions over prompts, one per entry of `pass_rates` (each in [0, 1]): a
    solved prompt (`p = 1`) gets `solved_draws`, an unsolved one `unsolved_draws`, the others between `min_draws` and
    `max_draws` so as to maximise `sum(value(p, k))` exactly (equal gains to the lower index first). What the mixed
    prompts cannot take goes evenly to the unsolved prompts, then the solved ones. `ValueError` naming the fix when the
    floors exceed `budget` or `budget` exceeds `len(pass_rates) * max_draws`."""
    rates = np.asarray(pass_rates, dtype=float)
    if rates.ndim != 1 or rates.size == 0:
        raise ValueError("allocate needs a non-empty list of pass rates, one per prompt.")
    if not np.all((rates >= 0.0) & (rates <= 1.0)):  # also NaN
        bad = next(float(p) for p in rates if not 0.0 <= p <= 1.0)
        raise ValueError(f"pass rates must lie in [0, 1], got {bad}.")
    for name, number in (
        ("budget", budget),
        ("min_draws", min_draws),
        ("max_draws", max_draws),
        ("solved_draws", solved_draws),
        ("unsolved_draws", unsolved_draws),
    ):
        if isinstance(number, bool) or not isinstance(number, (int, np.integer)) or number < 0:
            raise ValueError(f"{name} must be a non-negative integer, got {number!r}.")
    if max(min_draws, solved_draws, unsolved_draws) > max_draws:
        raise ValueError(
            f"max_draws={max_draws} is below a floor (min_draws={min_draws}, solved_draws={solved_draws}, "
            f"unsolved_draws={unsolved_draws}). Raise max_draws or lower the floors."
        )
    solved, unsolved = rates == 1.0, rates == 0.0
    mixed = ~(solved | unsolved)
    floors = np.where(solved, solved_draws, np.where(unsolved, unsolved_draws, min_draws)).astype(np.int64)
    floor_total = int(floors.sum())
    if budget < floor_total:
        raise ValueError(
            f"a budget of {budget} completions is below the floors: {int(mixed.sum())} mixed prompts x "
            f"min_draws={min_draws} + {int(unsolved.sum())} unsolved x unsolved_draws={unsolved_draws} + "
            f"{int(solved.sum())} solved x solved_draws={solved_draws} = {floor_total}. Raise the budget (completions "
            "per prompt) or lower min_draws / solved_draws / unsolved_draws."
        )
    if budget > rates.size * max_draws:
        raise ValueError(
            f"a budget of {budget} completions exceeds what {rates.size} prompts can take at max_draws={max_draws} "
            f"each ({rates.size * max_draws}). Raise max_draws or lower the budget."
        )
    budgets = floors.copy()
    rest = budget - floor_total
    mixed_indices = np.flatnonzero(mixed)
    if mixed_indices.size and rest > 0 and max_draws > min_draws:
        added = _largest_gains(rates[mixed_indices], rest, min_draws, max_draws - min_draws)
        budgets[mixed_indices] += added
        rest -= int(added.sum())
    # Leftover (every mixed prompt at max_draws): the unsolved prompts first, then the solved ones.
    for group in (np.flatnonzero(unsolved), np.flatnonzero(solved)):
        while rest > 0 and group.size:
            room = max_draws - budgets[group]
            open_ = group[room > 0]
            if not open_.size:
                break
            share = min(rest // open_.size, int(room[room > 0].min()))
            if share == 0:  # fewer draws left than open prompts: one each, lowest index first
                budgets[open_[:rest]] += 1
                rest = 0
                break
            budgets[open_] += share
            rest -= share * open_.size
    assert rest == 0, rest  # guaranteed by the capacity check above
    return [int(b) for b in budgets]


def _largest_gains(rates: np.ndarray, count: int, min_draws: int, room: int) -> np.ndarray:
    """How many of the `count` largest marginal gains (draws `min_draws + 1` to `min_draws + room`) fall to each
    prompt, equal gains taken in (prompt, draw) order. Only the first `width` gains of each prompt are computed,
    doubling `width` while a prompt takes all of its (a later gain is never larger, so this is exact)."""
    width = min(room, count, 2 * -(-count // rates.size) + 8)
    while True:
        p = rates[:, None]
        draws = min_draws + np.arange(width)[None, :]
        # Computed directly, not as a difference of values, whose cancellation could break each row's decreasing order.
        flat = ((p**draws * (1.0 - p) + p * (1.0 - p) ** draws) * (p * (1.0 - p) ** 2)).ravel()
        if count < flat.size:
            # Every gain above the count-th largest, then those equal to it in flat order (prompt, then draw).
            threshold = np.partition(flat, flat.size - count)[flat.size - count]
            above = np.flatnonzero(flat > threshold)
            chosen = np.concatenate([above, np.flatnonzero(flat == threshold)[: count - above.size]])
        else:
            chosen = np.arange(flat.size)
        added = np.bincount(chosen // width, minlength=rates.size)
        if width == room or not np.any(added == width):
            return added
        width = min(room, 2 * width)


TRAIN_ON = ("all", "downsample")


@dataclass(kw_only=True)
class KnapsackOptions(SamplerOptions):
    """The knobs of `sampler="knapsack"`: its own, given as `sampler_kwargs` (e.g. `{"max_draws": 16}`), and the config
    knobs it reads. `__post_init__` fills `max_draws` and `draws_per_prompt` and checks them together."""

    splits_batch_budget = True  # the step's budget is split across the batch

    min_draws: int = 2
    """Completions every prompt of mixed outcome at its last visit gets at least (at least 2: a baseline)."""
    max_draws: int | None = None
    """Completions one prompt gets at most in a step. `None`: `4 * num_generations`."""
    solved_draws: int = 2
    """Completions of a prompt whose draws at its last visit were all right (the paper's fixed small budget)."""
    unsolved_draws: int = 2
    """Completions of a prompt whose draws at its last visit were all wrong; it also takes what mixed prompts cannot."""
    draws_per_prompt: int | None = None
    """The step's budget per prompt (a first visit gets exactly this many). `None`: `num_generations` with
    `train_on="all"` (the only value it allows), `2 * num_generations` with `"downsample"`."""
    train_on: str = "all"
    """`"all"`: train on every completion drawn (group sizes vary); `"downsample"`: cut each pool to `num_generations`."""
    objective: str
    downsample: str = read_when("train_on", "downsample")
    pass_rate_decay: float
    pass_rate_prior_alpha: float
    pass_rate_prior_beta: float
    pass_rate_predictor: str

    def __post_init__(self) -> None:
        for name in ("min_draws", "solved_draws", "unsolved_draws", "max_draws", "draws_per_prompt"):
            number = getattr(self, name)
            if number is None and name in ("max_draws", "draws_per_prompt"):
                continue
            if isinstance(number, bool) or not isinstance(number, int) or number < 2:
                raise ValueError(
                    f"sampler_kwargs {name}={number!r}: must be an integer of at least 2 (a group needs two "
                    "completions for a baseline)."
                )
        if self.train_on not in TRAIN_ON:
            raise ValueError(f"sampler_kwargs train_on={self.train_on!r} is not supported. Choose one of {TRAIN_ON}.")
        n = self.num_generations
        high = 4 * n if self.max_draws is None else self.max_draws
        mean = self.draws_per_prompt
        if mean is None:
            mean = n if self.train_on == "all" else 2 * n
        if self.train_on == "all" and mean != n:
            raise ValueError(
                f"train_on='all' trains on every completion drawn and TRL's batch holds num_generations={n} rows per "
                f"prompt, so draws_per_prompt must be {n}; got {mean}. Remove draws_per_prompt from sampler_kwargs, "
                "or use train_on='downsample' to draw more than is trained on."
            )
        floors = {name: getattr(self, name) for name in ("min_draws", "solved_draws", "unsolved_draws")}
        if self.train_on == "downsample":
            short = {name: floor for name, floor in floors.items() if floor < n}
            if short:
                raise ValueError(
                    f"train_on='downsample' cuts every pool to num_generations={n}, so every floor must be at least "
                    f"{n}; got {short}. Raise them in sampler_kwargs or use train_on='all'."
                )
        if not max(floors.values()) <= mean <= high:
            raise ValueError(
                f"sampler='knapsack' spends draws_per_prompt={mean} completions per prompt on average, which the "
                f"floors {floors} and max_draws={high} cannot meet (None means 4 * num_generations). Choose them "
                "with every floor <= draws_per_prompt <= max_draws."
            )
        self.max_draws, self.draws_per_prompt = high, mean

    @property
    def max_pool_size(self) -> int:
        return self.max_draws

    def describe(self, settings: SamplerSettings) -> str:
        trained_on = trained_on_phrase(self.train_on == "all", settings)
        return (
            f"Sampler `{settings.sampler}` ({PAPER}): each step spends {self.draws_per_prompt} completions per "
            "prompt on average, all drawn in one generate call. A prompt on its first visit gets "
            f"{self.draws_per_prompt}; one whose draws at its last visit were all right gets "
            f"{self.solved_draws}, all wrong {self.unsolved_draws}; the others share the rest by the paper's "
            "knapsack, maximising the sum of (1 - p̂^k - (1 - p̂)^k) p̂ (1 - p̂)^2 over their budgets k in "
            f"[{self.min_draws}, {self.max_draws}], from each prompt's tracked pass rate p̂; what they cannot "
            f"take goes to the all-wrong prompts. {trained_on[0].upper()}{trained_on[1:]}."
        )


@register_sampler("knapsack")
class KnapsackSampler(BudgetedSampler):
    """Knapsack-RL: each step spends exactly `B * draws_per_prompt` completions, split over the `B` prompts by
    [`allocate`] in one round. A first visit gets `draws_per_prompt`, a prompt all right or all wrong at its last visit
    `solved_draws` / `unsolved_draws`; the others share the rest by their pass rate from the estimator `est` reads."""

    Options = KnapsackOptions

    def __init__(self, settings: SamplerSettings, estimator: PassRateEstimator | None = None) -> None:
        super().__init__(settings, estimator)
        # Each prompt's share of positives at its last visit (among its scored draws): the paper's p = 0 / p = 1 test.
        self.last_pass_rate: dict[str, float] = {}

    def plan_budgets(self, step: SamplingStep) -> None:
        plan, num_prompts = self.options, step.num_prompts
        visited, rates = [], []
        for index, key in enumerate(step.keys):
            last = self.last_pass_rate.get(str(key))
            if last is not None:
                visited.append(index)
                # Unmixed at the last visit: the paper's fixed budgets; otherwise the estimator's pass rate.
                rates.append(last if last in (0.0, 1.0) else step.estimates[index])
        budgets = [plan.draws_per_prompt] * num_prompts
        if visited:
            allocated = allocate(
                rates,
                plan.draws_per_prompt * len(visited),
                plan.min_draws,
                plan.max_draws,
                solved_draws=plan.solved_draws,
                unsolved_draws=plan.unsolved_draws,
            )
            for index, budget in zip(visited, allocated, strict=True):
                budgets[index] = budget
        step.budgets = budgets

    @property
    def trains_on_every_draw(self) -> bool:
        return self.options.train_on == "all"

    def end_step(self, step: SamplingStep, selection: Selection) -> None:
        super().end_step(step, selection)
        classes = [self.last_pass_rate.get(str(key)) for key in step.keys]
        for key, total, hits in zip(step.keys, *step.draw_counts(), strict=True):
            if total:  # a visit with no scored draw says nothing about the prompt
                self.last_pass_rate[str(key)] = hits / total
        plan, count = self.options, step.num_prompts
        mixed = [i for i, last in enumerate(classes) if last is not None and last not in (0.0, 1.0)]
        selection.metrics.update(
            {
                "knapsack/first_visit_share": sum(last is None for last in classes) / count,
                "knapsack/solved_share": sum(last == 1.0 for last in classes) / count,
                "knapsack/unsolved_share": sum(last == 0.0 for last in classes) / count,
                "knapsack/mixed_budget_mean": (
                    math.fsum(step.budgets[i] for i in mixed) / len(mixed) if mixed else math.nan
                ),
                "knapsack/budget_at_floor_share": sum(step.budgets[i] == plan.min_draws for i in mixed) / count,
                "knapsack/budget_at_cap_share": sum(b == plan.max_draws for b in step.budgets) / count,
                "knapsack/remembered_prompts": float(len(self.last_pass_rate)),
            }
        )

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "last_pass_rate": dict(self.last_pass_rate)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.last_pass_rate = {str(key): float(rate) for key, rate in state["last_pass_rate"].items()}
