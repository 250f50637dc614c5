"""
DAPO with a gated refill (`sampler="dapo_gated"`): DAPO's drop-and-refill, where the refill passes over a prompt drawn
before when its chance of a mixed group, `1 - E[p^n] - E[(1-p)^n]` under the Beta posterior of its pass rate, is below
`min_mixed_chance_ratio` times the measured share of mixed groups (docs/samplers.md gives the rule and why). The
loader's own batch is drawn as DAPO draws it, so every prompt keeps one visit per epoch. Pure Python: no torch, no TRL.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from trl_ada.samplers import GatesRefills, SamplerSettings, SamplingStep, Selection, register_sampler
from trl_ada.samplers.dapo import DapoOptions, DapoSampler
from trl_ada.samplers.tracker import DecayedBetaTracker

PRIORS = ("mean", "fitted")
FITTED_WEIGHT_BOUNDS = (0.1, 1000.0)
"""`"fitted"`: the prior's weight `alpha + beta` is kept in these bounds (a spread at its maximum, or none, has no
finite moment fit)."""
MIXED_SHARE_DECAY = 0.9
"""Weight of the past in the running mixed share: about the last ten batches count."""


@dataclass(kw_only=True)
class GatedRefillOptions(DapoOptions):
    """The knobs of `sampler="dapo_gated"`: DAPO's, `pass_rate_decay` and its own `sampler_kwargs`."""

    pass_rate_decay: float

    min_mixed_chance_ratio: float = 0.5
    """A refill prompt is passed over when its chance of a mixed group is below this fraction of the measured mixed
    share of recent groups: 0 passes over nothing (plain DAPO), 1 keeps only prompts at least as promising as average."""
    prior: str = "mean"
    """The prior of a prompt's pass rate: `"mean"`, centred on the measured mean pass rate with the weight of
    `prior_draws` draws; `"fitted"`, a Beta fitted by moments to the measured spread of the prompts' pass rates."""
    prior_draws: float = 2.0
    """Weight, in draws, of the `"mean"` prior."""

    def describe(self, settings: SamplerSettings) -> str:
        return (
            f"{super().describe(settings)} The refill passes over a prompt drawn before when its chance of a mixed "
            f"group of {settings.num_generations}, from its past draws, is below {self.min_mixed_chance_ratio} "
            "times the measured share of mixed groups."
        )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.prior not in PRIORS:
            raise ValueError(f"sampler_kwargs prior={self.prior!r} is not supported. Choose one of {PRIORS}.")
        ratio, weight = self.min_mixed_chance_ratio, self.prior_draws
        if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0.0 <= ratio <= 1.0:
            raise ValueError(f"sampler_kwargs min_mixed_chance_ratio={ratio!r}: must be a number in [0, 1].")
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not 0.0 < weight < math.inf:
            raise ValueError(f"sampler_kwargs prior_draws={weight!r}: must be a positive finite number.")


def fitted_prior(counts: Iterable[tuple[float, float]]) -> tuple[float, float]:
    """A Beta prior `(alpha, beta)` fitted by moments to prompts' `(draws, positives)` counts: mean
    `m = sum K / sum N`; the variance of the true pass rates is that of the measured rates `K / N` with their binomial
    noise removed (`E[(K/N - m)^2] = Var(p) + (m (1 - m) - Var(p)) E[1/N]`); then
    `alpha + beta = m (1 - m) / Var(p) - 1`, kept in `FITTED_WEIGHT_BOUNDS`."""
    counts = [(total, positives) for total, positives in counts if total > 0]
    if not counts:
        raise ValueError("fitted_prior needs at least one prompt with draws")
    mean = sum(k for _, k in counts) / sum(n for n, _ in counts)
    spread = mean * (1.0 - mean)
    low, high = FITTED_WEIGHT_BOUNDS
    if spread == 0.0:
        return high * mean, high * (1.0 - mean)
    measured = sum((k / n - mean) ** 2 for n, k in counts) / len(counts)
    # E[(K/N - m)^2] = Var(p) + E[p (1 - p)] E[1/N], and E[p (1 - p)] = m (1 - m) - Var(p).
    inverse_draws = sum(1.0 / n for n, _ in counts) / len(counts)
    variance = (measured - spread * inverse_draws) / (1.0 - inverse_draws) if inverse_draws < 1.0 else 0.0
    weight = high if variance <= 0.0 else min(max(spread / variance - 1.0, low), high)
    return weight * mean, weight * (1.0 - mean)


def mixed_chance(alpha: float, beta: float, draws: int) -> float:
    """`1 - E[p^k] - E[(1-p)^k]` for `p ~ Beta(alpha, beta)`: the chance `k` draws hold both outcomes."""
    all_right = all_wrong = 1.0
    for i in range(draws):
        all_right *= (alpha + i) / (alpha + beta + i)
        all_wrong *= (beta + i) / (alpha + beta + i)
    return max(0.0, 1.0 - all_right - all_wrong)


class DrawHistory(DecayedBetaTracker):
    """Every drawn prompt's decayed counts (no prior: the gate applies its own), plus the undecayed totals of every
    draw, whose mean pass rate is the prior's mean; one `update` counts both, so `draw_memories` covers the totals
    too."""

    def __init__(self, decay: float) -> None:
        super().__init__(decay, 0.0, 0.0)
        self.draws = 0
        self.positives = 0

    def update(self, keys: Sequence[Hashable], totals: Sequence[int], positives: Sequence[int]) -> None:
        super().update(keys, totals, positives)
        self.draws += sum(totals)
        self.positives += sum(positives)


@register_sampler("dapo_gated")
class GatedRefillSampler(GatesRefills, DapoSampler):
    """DAPO whose refill passes over prompts predicted to come back unmixed (see the module docstring); it draws, drops
    and refills as `sampler="dapo"`. Its draw history and running measurements are saved with the checkpoint."""

    Options = GatedRefillOptions

    def __init__(self, settings: SamplerSettings, estimator: Any = None) -> None:
        super().__init__(settings, estimator)
        self.history = DrawHistory(settings.pass_rate_decay)
        self.mixed_share = math.nan
        self._fitted: tuple[float, float] | None = None  # `prior="fitted"`: refitted after every batch

    @property
    def draws_seen(self) -> int:
        """Draws counted so far, over every prompt."""
        return self.history.draws

    def predicted_mixed_chance(self, key: Hashable) -> float | None:
        """The prompt's chance of a mixed group of `num_generations`; `None` for a prompt never drawn."""
        total, positives = self.history.counts.get(str(key), (0.0, 0.0))
        if total == 0.0 or self.draws_seen == 0:
            return None
        alpha, beta = self.prior_parameters()
        return mixed_chance(positives + alpha, total - positives + beta, self.settings.num_generations)

    @property
    def positives_seen(self) -> int:
        """Positive draws counted so far, over every prompt."""
        return self.history.positives

    def prior_parameters(self) -> tuple[float, float]:
        """The Beta prior of a prompt's pass rate, from the measurements so far (`prior`)."""
        # Kept proper when every draw so far had one outcome.
        mean = min(max(self.positives_seen / self.draws_seen, 0.5 / self.draws_seen), 1.0 - 0.5 / self.draws_seen)
        if self.options.prior == "mean":
            return self.options.prior_draws * mean, self.options.prior_draws * (1.0 - mean)
        if self._fitted is None:
            alpha, beta = fitted_prior(self.history.counts.values())
            weight = alpha + beta
            self._fitted = (weight * mean, weight * (1.0 - mean))
        return self._fitted

    def refill_passes_over(self, key: Hashable) -> bool:
        chance = self.predicted_mixed_chance(key)
        if chance is None or math.isnan(self.mixed_share):
            return False
        # Counted by the walk that asks, which logs it once per update or log window.
        return chance < self.options.min_mixed_chance_ratio * self.mixed_share

    def begin(self, num_prompts: int, prompt_keys: Any = None) -> SamplingStep:
        if prompt_keys is None or len(prompt_keys) != num_prompts:
            raise ValueError("sampler='dapo_gated' needs one stable key per prompt to remember its draws")
        return super().begin(num_prompts, prompt_keys)

    def end_step(self, step: SamplingStep, selection: Selection) -> None:
        self.history.update(step.keys, *step.draw_counts())
        self._fitted = None
        share = sum(result.has_signal for result in selection.prompts) / len(selection.prompts)
        self.mixed_share = (
            share
            if math.isnan(self.mixed_share)
            else (MIXED_SHARE_DECAY * self.mixed_share + (1.0 - MIXED_SHARE_DECAY) * share)
        )
        selection.metrics["gate/mixed_share"] = self.mixed_share
        selection.metrics["gate/remembered_prompts"] = float(len(self.history.counts))

    def state_dict(self) -> dict[str, Any]:
        return {
            **super().state_dict(),
            "history": self.history.state_dict(),
            "mixed_share": self.mixed_share,
            "draws_seen": self.draws_seen,
            "positives_seen": self.positives_seen,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.history.load_state_dict(state["history"])
        self.mixed_share = float(state["mixed_share"])
        self.history.draws = int(state["draws_seen"])
        self.history.positives = int(state["positives_seen"])
        self._fitted = None
