"""Reinforce-Ada-Est (Algorithm 1 of the paper): one allocation per step from tracked pass rates."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from . import rules
from .base import _BASELINES, SamplingStep, Selection, skip_metrics, trained_on_phrase
from .budgeted import BudgetedSampler
from .registry import register_sampler
from .settings import SamplerOptions, SamplerSettings, read_when


@dataclass(kw_only=True)
class EstOptions(SamplerOptions):
    """What `est` reads; `__post_init__` fills `est_min_samples`, `est_max_samples` and `est_mean_samples` and checks
    they can be met together."""

    splits_batch_budget = True  # the budgets share the batch's mean (`est_mean_samples`)
    unread_hints = {
        **SamplerOptions.unread_hints,
        "objective": "sampler='est' splits the log objective between sampling (N ∝ p̂^-est_sample_power) and a "
        "residual weight: tune est_sample_power instead (0.5: the paper's hybrid; 1.0: pure implicit weighting).",
    }

    downsample: str = read_when("est_train_on", "downsample")
    pass_rate_decay: float
    pass_rate_prior_alpha: float
    pass_rate_prior_beta: float
    pass_rate_predictor: str
    est_sample_power: float
    est_min_samples: int | None
    est_max_samples: int | None
    est_mean_samples: float | None
    est_epsilon: float
    est_train_on: str
    skip_unmixed_above: float | None

    smallest_pool: ClassVar[int] = 2
    """The fewest draws a prompt may get: two, so that every pool has a baseline of its own."""

    def __post_init__(self) -> None:
        n = self.num_generations
        default_min = self.smallest_pool if self.est_train_on == "all" else n
        low = default_min if self.est_min_samples is None else self.est_min_samples
        high = 4 * n if self.est_max_samples is None else self.est_max_samples
        if low > high:
            raise ValueError(f"est_min_samples ({low}) must not exceed est_max_samples ({high}).")
        if self.est_train_on == "downsample" and low < n:
            raise ValueError(
                f"est_train_on='downsample' cuts every pool to num_generations={n}, so est_min_samples must be at "
                f"least {n}; got {low}. Raise est_min_samples or use est_train_on='all'."
            )
        if low < self.smallest_pool:
            raise ValueError(
                f"est_min_samples must be at least {self.smallest_pool} so every prompt has a baseline, got {low}."
            )
        mean = self.est_mean_samples
        if self.est_train_on == "all":
            # Every completion is trained on, and TRL's batch holds B * num_generations rows.
            if mean is not None and mean != n:
                raise ValueError(
                    f"est_train_on='all' trains on every completion drawn and TRL's batch holds num_generations={n} "
                    f"rows per prompt, so est_mean_samples must be {n}; got {mean}. Remove est_mean_samples, or use "
                    "est_train_on='downsample' to draw more than is trained on."
                )
            mean = n
        elif mean is None:
            # Downsampling needs a budget above n to choose from (the paper's Est drew twice its Seq group size).
            mean = 2 * n
        if not low <= mean <= high:  # also rejects NaN and infinity
            raise ValueError(
                f"The step's budget is {mean} completions per prompt on average (est_mean_samples; None means "
                f"num_generations with est_train_on='all', 2 * num_generations with 'downsample'), which the bounds "
                f"[est_min_samples, est_max_samples] = [{low}, {high}] cannot meet. Choose est_mean_samples and "
                f"bounds with est_min_samples <= est_mean_samples <= est_max_samples."
            )
        self.est_min_samples, self.est_max_samples, self.est_mean_samples = low, high, mean

    @property
    def max_pool_size(self) -> int:
        return self.est_max_samples

    def describe(self, settings: SamplerSettings) -> str:
        trained_on = trained_on_phrase(self.est_train_on == "all", settings)
        power = self.est_sample_power
        return (
            f"Sampler `{settings.sampler}` (Reinforce-Ada-Est): each step gives every prompt a budget of completions "
            f"proportional to p̂^-{power} from its tracked pass rate p̂, clipped to "
            f"[{self.est_min_samples}, {self.est_max_samples}] and {self.est_mean_samples:g} per prompt on "
            f"average, all drawn in one generate call; {trained_on}. The advantage is the reward minus "
            f"{_BASELINES[settings.baseline]}, weighted by (p̂ + {self.est_epsilon:g})^-(1-{power:g})."
        )


@register_sampler("est")
class EstSampler(BudgetedSampler):
    """Reinforce-Ada-Est: budgets `N_x ∝ p̂_x^-s` (s = `est_sample_power`) clipped to
    `[est_min_samples, est_max_samples]` and summing exactly to `round(B * est_mean_samples)`, all drawn in one round;
    advantage `(r - r̄_x) * w_x` with the residual weight `w_x = (p̂_x + eps)^-(1-s)` from the step's own pool."""

    Options = EstOptions

    def plan_budgets(self, step: SamplingStep) -> None:
        settings = self.settings
        scores = [p**-settings.est_sample_power for p in step.estimates]
        total = round(step.num_prompts * settings.est_mean_samples)
        low, high = settings.est_min_samples, settings.est_max_samples
        step.budgets = rules.allocate_budget(scores, total, low, high)
        step.skipped = rules.skipped_prompts(step.estimates, settings.num_generations, settings.skip_unmixed_above)
        if step.skipped is not None:
            # Skipped prompts get the least budget; the step's total (TRL's static batch) goes to the others.
            step.budgets_without_skip = step.budgets
            step.budgets = rules.allocate_budget_with_skips(scores, step.skipped, total, low, high)

    @property
    def trains_on_every_draw(self) -> bool:
        return self.settings.est_train_on == "all"

    def weight(self, pass_rate: float) -> float:
        settings = self.settings
        return rules.residual_weight(pass_rate, settings.est_sample_power, settings.est_epsilon, settings.max_weight)

    def end_step(self, step: SamplingStep, selection: Selection) -> None:
        super().end_step(step, selection)
        if step.skipped is not None:
            without = step.budgets_without_skip
            outlooks = {
                i: (float(without[i]), 1.0 - rules.unmixed_chance(step.estimates[i], without[i]))
                for i, skipped in enumerate(step.skipped)
                if skipped
            }
            selection.metrics.update(skip_metrics(step, step.estimates, outlooks))
        settings = self.settings
        budgets = step.budgets
        estimates = sorted(step.estimates)
        selection.metrics.update(
            {
                "est/tracked_pass_rate/mean": sum(estimates) / len(estimates),
                "est/tracked_pass_rate/p10": _quantile(estimates, 0.1),
                "est/tracked_pass_rate/p50": _quantile(estimates, 0.5),
                "est/tracked_pass_rate/p90": _quantile(estimates, 0.9),
                "est/budget_at_floor_share": sum(b == settings.est_min_samples for b in budgets) / len(budgets),
                "est/budget_at_cap_share": sum(b == settings.est_max_samples for b in budgets) / len(budgets),
                "est/tracked_prompts": float(_tracked_prompts(self.estimator)),
            }
        )


def _tracked_prompts(estimator: Any) -> int:
    """Prompts with counts: a tracker's `counts` dict, or the one a learned predictor keeps (`counts.counts`)."""
    counts = getattr(estimator, "counts", None)
    counts = getattr(counts, "counts", counts)
    return len(counts) if counts is not None else 0


def _quantile(sorted_values: Sequence[float], q: float) -> float:
    position = q * (len(sorted_values) - 1)
    below = math.floor(position)
    above = min(below + 1, len(sorted_values) - 1)
    return sorted_values[below] + (sorted_values[above] - sorted_values[below]) * (position - below)


@dataclass(kw_only=True)
class EstEmaOptions(EstOptions):
    """What `est_ema` reads: est's knobs, with the Reinforce-Ada authors' later settings as its recipe."""

    smallest_pool: ClassVar[int] = 1
    recipe: ClassVar[dict[str, Any]] = {
        "est_sample_power": 1.0,
        "pass_rate_prior_beta": 16.0,
        "pass_rate_decay": 0.9,
        "scale_rewards": "none",
        "positive_threshold": 0.7,
        "est_min_samples": 1,
    }
    """The authors' constants: a Beta(1, 16) prior, counts decayed by 0.9 per visit, budgets in proportion to 1/p̂,
    no reward scaling, a success above 0.7, and one draw per prompt at least."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.skip_unmixed_above is not None:
            raise ValueError(
                "sampler='est_ema' gives every prompt one draw and shares the rest by 1/p̂; skip_unmixed_above is "
                "sampler='est''s. Remove skip_unmixed_above."
            )

    def describe(self, settings: SamplerSettings) -> str:
        return (
            f"Sampler `{settings.sampler}` (the Reinforce-Ada authors' later single-round variant): each step every "
            f"prompt drew one completion, and the rest of {self.est_mean_samples:g} per prompt on average was shared "
            f"in proportion to p̂^-{self.est_sample_power:g} from its decayed Beta(α, β) pass rate (at most "
            f"{self.est_max_samples} per prompt), all drawn in one generate call; every completion drawn was trained "
            f"on, against {_BASELINES[settings.baseline]}."
        )


@register_sampler("est_ema")
class EstEmaSampler(EstSampler):
    """The Reinforce-Ada authors' later variant (their verl code's single-round adaptive sampling, `ray_trainer_ema`):
    one round per step; every prompt draws one completion and the rest of the step's `B * est_mean_samples` is shared
    in proportion to `p̂^-est_sample_power` (1: `1/p̂`), floors first, then one more each to the largest fractional
    parts; every draw trained on. Its recipe holds the authors' tracker (Beta(1, 16), decay 0.9). One difference,
    documented: a prompt with a single draw has no baseline of its own here and trains nothing, where their code
    scores it `r - 0`."""

    Options = EstEmaOptions

    def plan_budgets(self, step: SamplingStep) -> None:
        settings = self.settings
        # p̂ never reads 0 under a Beta prior; the floor keeps a custom estimator's 0 finite, as the authors' 1e-6.
        scores = [max(p, 1e-6) ** -settings.est_sample_power for p in step.estimates]
        total = round(step.num_prompts * settings.est_mean_samples)
        shares = rules.allocate_budget(scores, total - step.num_prompts, 0, settings.est_max_samples - 1)
        step.budgets = [1 + share for share in shares]
