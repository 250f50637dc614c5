"""
What TRL trains: the one decision, shared by both trainers, of whether TRL's own group advantages may stand in for the
ones a sampler computed. Pure Python.

TRL recomputes GRPO's advantages from the rewards of the rows it is handed (`r - group mean`, divided by the group's or
the batch's std under `scale_rewards`). Handing it nothing keeps its float32 computation, which is how `uniform`
reproduces `GRPOTrainer` bit for bit; everywhere else the sampler's advantages must be handed over, or TRL trains
something the sampler did not compute. The decision has two parts:

- [`grpo_rule_holds`], from the settings alone: every setting that can change an advantage is at GRPO's rule
  ([`ADVANTAGE_SETTINGS`]). The asynchronous worker, which must choose before it draws, reads only this part.
- [`trl_advantages_stand_in`], per update: the static part, and the sampler's advantages equal GRPO's rule recomputed
  on the very rows TRL will group. Reading the values, not the knobs, means a new knob cannot bypass it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

from . import rules
from .base import Sampler
from .settings import SamplerSettings

ADVANTAGE_SETTINGS: Mapping[str, Callable[[SamplerSettings, str], bool]] = {
    "baseline": lambda s, _: s.baseline in ("pool", "group"),
    "normalize_advantages": lambda s, _: not s.normalize_advantages,
    # The weight: linear objective, the base class's weight rule (est's residual weight is not), no clip below 1.
    "objective": lambda s, _: s.objective == "linear" and s.sampler_class.weight is Sampler.weight,
    "max_weight": lambda s, _: s.max_weight >= 1.0,
    "train_on": lambda _, train_on: train_on == "downsample",
    # TRL's three scale_rewards rules are the sampler's, so any of them holds; listed so that the table is complete.
    "scale_rewards": lambda s, _: s.scale_rewards in ("group", "batch", "none"),
}
"""Every setting that can change an advantage once the draws are made, with the test that it is at GRPO's rule. The
draw counts (a pool larger than its group) and `zero_variance_tolerance` change advantages too; they are data, checked
per update by [`trl_advantages_stand_in`]. `tests/test_signal_matrix.py` fails when a knob is in neither this table nor
[`DRAW_SETTINGS`]."""

DRAW_SETTINGS: frozenset[str] = frozenset(
    {
        # What is drawn, how much and when: these change which rows an update holds, never the rule on them.
        "sampler", "sampler_kwargs", "round_size", "max_rounds", "positive_quota", "negative_quota",
        "positive_threshold", "downsample", "round_policy", "round_confidence", "pass_rate_decay",
        "pass_rate_prior_alpha", "pass_rate_prior_beta", "pass_rate_predictor", "pass_rate_predictor_learning_rate",
        "skip_unmixed_above", "est_min_samples", "est_max_samples", "est_mean_samples", "est_train_on",
        "dapo_refill", "dapo_max_refills", "dapo_on_exhausted", "num_generations", "seed",
        # Read by the weight rules only (power objective, est's residual weight, normalisation of the weights): the
        # per-update check sees the weights they give.
        "power_alpha", "normalize_weights", "est_sample_power", "est_epsilon", "zero_variance_tolerance",
        # The trainer's schedule (when draws are made, not how they are scored).
        "generation_schedule", "continuous_max_in_flight",
    }
)  # fmt: skip
"""The knobs that change what is drawn or kept, or act only through a weight or a pool that the per-update check
reads, so that [`grpo_rule_holds`] need not name them."""


def grpo_rule_holds(settings: SamplerSettings, train_on: str = "downsample") -> bool:
    """Whether, under `settings`, a prompt whose pool is its update group gets GRPO's advantages: every setting of
    [`ADVANTAGE_SETTINGS`] is at GRPO's rule."""
    return all(test(settings, train_on) for test in ADVANTAGE_SETTINGS.values())


def grpo_advantages(kept_rewards: Sequence[Sequence[float]], scale_rewards: str) -> list[list[float]]:
    """GRPO's advantages (TRL's `sum_then_normalize` rule) of groups of rewards, in float64: `r - group mean`, divided
    by `std + 1e-4` (the group's, or the whole update's under `"batch"`); zero for an unscorable (NaN) reward."""
    batch_std = rules.mean_and_std([r for group in kept_rewards for r in group])[1]
    advantages = []
    for group in kept_rewards:
        mean, std = rules.mean_and_std(group)
        scale = {"group": std, "batch": batch_std, "none": None}[scale_rewards]
        advantages.append([rules.advantage(r, mean, scale, 1.0) for r in group])
    return advantages


def trl_advantages_stand_in(
    settings: SamplerSettings,
    train_on: str,
    kept_rewards: Sequence[Sequence[float]],
    advantages: Sequence[Sequence[float]],
    *,
    aggregation: str = "sum_then_normalize",
    tolerance: float = 1e-6,
) -> bool:
    """Whether TRL's own advantages may be trained in place of `advantages`, the sampler's for one update: the
    settings hold GRPO's rule ([`grpo_rule_holds`]), every group has `num_generations` rows (TRL groups by it), and
    each advantage equals GRPO's ([`grpo_advantages`]) on the same rows within `tolerance` (relative, plus absolute).
    `kept_rewards` and `advantages`: one sequence per trained prompt, in the order TRL trains them. `aggregation`:
    TRL's `multi_objective_aggregation`; `"normalize_then_sum"` is TRL's own rule over the reward functions, accepted
    only where the settings hold GRPO's rule (`AdaGRPOConfig` checks it), so there TRL's advantages always stand."""
    if not grpo_rule_holds(settings, train_on):
        return False
    n = settings.num_generations
    if any(len(group) != n for group in kept_rewards) or len(kept_rewards) != len(advantages):
        return False
    if aggregation != "sum_then_normalize":
        return True
    expected = grpo_advantages(kept_rewards, settings.scale_rewards)
    return all(
        len(got) == len(want)
        and all(math.isclose(a, b, rel_tol=tolerance, abs_tol=tolerance) for a, b in zip(got, want))
        for got, want in zip(advantages, expected, strict=True)
    )
