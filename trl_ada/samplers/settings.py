"""Validated settings shared by every sampler. Pure Python: no torch, no TRL."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

SAMPLER_NAMES: tuple[str, ...] = ("uniform", "seq_pos", "seq_balance", "est", "dapo")
SEQUENTIAL_SAMPLERS: tuple[str, ...] = ("seq_pos", "seq_balance")
EST_TRAIN_ON: tuple[str, ...] = ("all", "downsample")
DAPO_ON_EXHAUSTED: tuple[str, ...] = ("raise", "keep_partial")
ROUND_POLICIES: tuple[str, ...] = ("fixed", "predictive", "tracked")
BASELINES: tuple[str, ...] = ("pool", "group")
SCALE_REWARDS: tuple[str, ...] = ("group", "batch", "none")
OBJECTIVES: tuple[str, ...] = ("linear", "log", "power")
DOWNSAMPLES: tuple[str, ...] = ("balanced", "random")


def _choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{name}={value!r} is not supported. Choose one of {list(choices)}.")


@dataclass(frozen=True)
class SamplerSettings:
    """
    Every knob a sampler reads, validated once by [`SamplerSettings.validated`].

    `AdaGRPOConfig` documents each field; this dataclass exists so that samplers can be built and tested without
    TRL (for example by `trl-ada simulate`).
    """

    sampler: str = "seq_balance"
    num_generations: int = 4
    round_size: int = 8
    max_rounds: int = 4
    positive_quota: int | None = None
    negative_quota: int | None = None
    positive_threshold: float = 0.5
    baseline: str = "pool"
    scale_rewards: str = "none"
    objective: str = "linear"
    power_alpha: float = 0.5
    max_weight: float = 10.0
    normalize_weights: bool = True
    downsample: str = "balanced"
    zero_variance_tolerance: float = 1e-6
    seed: int = 0
    est_decay: float = 0.9
    est_prior_alpha: float = 1.0
    est_prior_beta: float = 1.0
    est_sample_power: float = 0.5
    est_min_samples: int | None = None
    est_max_samples: int | None = None
    est_mean_samples: float | None = None
    est_epsilon: float = 0.01
    est_train_on: str = "all"
    dapo_refill: bool | None = None
    dapo_max_refills: int = 10
    dapo_on_exhausted: str = "raise"
    round_policy: str = "fixed"
    round_confidence: float = 0.7

    @property
    def max_pool_size(self) -> int:
        """The cap on completions drawn for one prompt in one generation batch."""
        if self.sampler in ("uniform", "dapo"):
            return self.num_generations
        if self.sampler == "est":
            return self.est_max_samples if self.est_max_samples is not None else 4 * self.num_generations
        return self.round_size * self.max_rounds

    @property
    def refills(self) -> bool:
        """Whether prompts without a signal are dropped and the batch refilled from further prompts (DAPO)."""
        return bool(self.dapo_refill) or self.sampler == "dapo"

    def validated(self) -> SamplerSettings:
        """Check every knob and return a copy with the quota defaults filled in; raise `ValueError` naming the fix."""
        _choice("sampler", self.sampler, SAMPLER_NAMES)
        _choice("baseline", self.baseline, BASELINES)
        _choice("scale_rewards", self.scale_rewards, SCALE_REWARDS)
        _choice("objective", self.objective, OBJECTIVES)
        _choice("downsample", self.downsample, DOWNSAMPLES)
        n = self.num_generations
        if n is None or n < 2:
            raise ValueError(f"num_generations must be at least 2 to form a group with a baseline, got {n}.")
        if self.round_size < 1:
            raise ValueError(f"round_size must be at least 1, got {self.round_size}.")
        if self.max_rounds < 1:
            raise ValueError(f"max_rounds must be at least 1, got {self.max_rounds}.")
        if not math.isfinite(self.positive_threshold):
            raise ValueError(f"positive_threshold must be a finite number, got {self.positive_threshold}.")
        if not 0.0 < self.power_alpha <= 1.0:
            raise ValueError(f"power_alpha must lie in (0, 1], got {self.power_alpha}.")
        if not self.max_weight > 0.0:
            raise ValueError(f"max_weight must be positive, got {self.max_weight}.")
        if not self.zero_variance_tolerance >= 0.0:
            raise ValueError(f"zero_variance_tolerance must be non-negative, got {self.zero_variance_tolerance}.")

        self._validate_dapo()
        _choice("round_policy", self.round_policy, ROUND_POLICIES)
        if self.round_policy != "fixed" and self.sampler not in SEQUENTIAL_SAMPLERS:
            raise ValueError(
                f"round_policy={self.round_policy!r} sizes the rounds of a sequential sampler; sampler="
                f"{self.sampler!r} has a single round. Use sampler='seq_pos' or 'seq_balance', or round_policy='fixed'."
            )
        if not 0.0 < self.round_confidence < 1.0:
            raise ValueError(f"round_confidence must lie in (0, 1), got {self.round_confidence}.")
        if self.est_mean_samples is not None and self.sampler != "est":
            raise ValueError(
                f"est_mean_samples={self.est_mean_samples} sets the budget of sampler='est' and has no effect with "
                f"sampler={self.sampler!r}. Remove est_mean_samples, or use sampler='est'."
            )
        positive_quota, negative_quota = self.positive_quota, self.negative_quota
        if self.sampler in ("uniform", "dapo", "est"):
            for name, value in (("positive_quota", positive_quota), ("negative_quota", negative_quota)):
                if value is not None:
                    raise ValueError(
                        f"{name}={value} has no effect with sampler={self.sampler!r}, which has no exit rule. "
                        f"Remove {name}, or use sampler='seq_pos' or 'seq_balance'."
                    )
            return self._validated_est() if self.sampler == "est" else self

        cap = self.max_pool_size
        if cap < n:
            raise ValueError(
                f"round_size * max_rounds = {self.round_size} * {self.max_rounds} = {cap} is smaller than "
                f"num_generations = {n}: a pool cannot be downsampled to an update group larger than itself. "
                f"Raise round_size or max_rounds so that round_size * max_rounds >= {n}."
            )
        if self.sampler == "seq_pos":
            if negative_quota not in (None, 0):  # 0 is what validation itself fills in
                raise ValueError(
                    f"negative_quota={negative_quota} has no effect with sampler='seq_pos', whose exit rule counts "
                    "positives only. Remove negative_quota, or use sampler='seq_balance'."
                )
            positive_quota = 1 if positive_quota is None else positive_quota
            negative_quota = 0
        else:
            # The quotas are exactly what a balanced group takes (odd n: the extra slot is a negative's, see
            # rules.downsample), so an exited pool fills its group without topping up from the other side.
            positive_quota = n // 2 if positive_quota is None else positive_quota
            negative_quota = n - n // 2 if negative_quota is None else negative_quota
            if negative_quota < 1:
                raise ValueError(f"negative_quota must be at least 1 for sampler='seq_balance', got {negative_quota}.")
        if positive_quota < 1:
            raise ValueError(f"positive_quota must be at least 1, got {positive_quota}.")
        if positive_quota + negative_quota > cap:
            raise ValueError(
                f"positive_quota + negative_quota = {positive_quota} + {negative_quota} can never be reached within "
                f"the cap round_size * max_rounds = {cap} completions per prompt, so every prompt would use the whole "
                f"cap. Lower the quotas or raise round_size / max_rounds."
            )
        return replace(self, positive_quota=positive_quota, negative_quota=negative_quota)

    def _validate_dapo(self) -> None:
        _choice("dapo_on_exhausted", self.dapo_on_exhausted, DAPO_ON_EXHAUSTED)
        if self.sampler == "dapo" and self.dapo_refill is False:
            raise ValueError(
                "sampler='dapo' is uniform sampling with batch refilling; dapo_refill=False contradicts it. "
                "Remove dapo_refill, or use sampler='uniform'."
            )
        if self.dapo_refill and self.sampler in ("uniform", "est"):
            raise ValueError(
                f"dapo_refill=True combines DAPO's batch filling with a sequential sampler; with "
                f"sampler={self.sampler!r} use sampler='dapo' instead, or combine it with 'seq_pos'/'seq_balance'."
            )
        if self.dapo_max_refills < 0:
            raise ValueError(f"dapo_max_refills must be non-negative, got {self.dapo_max_refills}.")

    def _validated_est(self) -> SamplerSettings:
        _choice("est_train_on", self.est_train_on, EST_TRAIN_ON)
        n = self.num_generations
        if self.objective != "linear":
            raise ValueError(
                f"objective={self.objective!r} has no effect with sampler='est', which splits the log objective "
                "between sampling (N ∝ p̂^-est_sample_power) and a residual weight. Remove objective, or tune "
                "est_sample_power (0.5: the paper's hybrid; 1.0: pure implicit weighting)."
            )
        if not 0.0 < self.est_decay <= 1.0:
            raise ValueError(f"est_decay must lie in (0, 1] (1 keeps all history), got {self.est_decay}.")
        if not (self.est_prior_alpha > 0.0 and self.est_prior_beta > 0.0):
            raise ValueError(
                f"est_prior_alpha and est_prior_beta must be positive (a Beta prior keeps p̂ away from 0 and 1), "
                f"got {self.est_prior_alpha} and {self.est_prior_beta}."
            )
        if not 0.0 <= self.est_sample_power <= 1.0:
            raise ValueError(f"est_sample_power must lie in [0, 1], got {self.est_sample_power}.")
        if not self.est_epsilon > 0.0:
            raise ValueError(f"est_epsilon must be positive, got {self.est_epsilon}.")
        default_min = 2 if self.est_train_on == "all" else n
        low = default_min if self.est_min_samples is None else self.est_min_samples
        high = 4 * n if self.est_max_samples is None else self.est_max_samples
        if low > high:
            raise ValueError(f"est_min_samples ({low}) must not exceed est_max_samples ({high}).")
        if self.est_train_on == "downsample" and low < n:
            raise ValueError(
                f"est_train_on='downsample' cuts every pool to num_generations={n}, so est_min_samples must be at "
                f"least {n}; got {low}. Raise est_min_samples or use est_train_on='all'."
            )
        if low < 2:
            raise ValueError(f"est_min_samples must be at least 2 so every prompt has a baseline, got {low}.")
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
            # Downsampling needs a budget above n to choose from; the paper's Est drew 8 per prompt on average
            # where its Seq runs trained on groups of 4.
            mean = 2 * n
        if not low <= mean <= high:  # also rejects NaN and infinity
            raise ValueError(
                f"The step's budget is {mean} completions per prompt on average (est_mean_samples; None means "
                f"num_generations with est_train_on='all', 2 * num_generations with 'downsample'), which the bounds "
                f"[est_min_samples, est_max_samples] = [{low}, {high}] cannot meet. Choose est_mean_samples and "
                f"bounds with est_min_samples <= est_mean_samples <= est_max_samples."
            )
        return replace(self, est_min_samples=low, est_max_samples=high, est_mean_samples=mean)
