"""Validated settings shared by every sampler. Pure Python: no torch, no TRL."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

SAMPLER_NAMES: tuple[str, ...] = ("uniform", "seq_pos", "seq_balance")
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

    @property
    def max_pool_size(self) -> int:
        """The cap on completions drawn for one prompt in one generation batch."""
        if self.sampler == "uniform":
            return self.num_generations
        return self.round_size * self.max_rounds

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

        positive_quota, negative_quota = self.positive_quota, self.negative_quota
        if self.sampler == "uniform":
            for name, value in (("positive_quota", positive_quota), ("negative_quota", negative_quota)):
                if value is not None:
                    raise ValueError(
                        f"{name}={value} has no effect with sampler='uniform' (one round of num_generations). "
                        f"Remove {name}, or use sampler='seq_pos' or 'seq_balance'."
                    )
            return self

        cap = self.max_pool_size
        if cap < n:
            raise ValueError(
                f"round_size * max_rounds = {self.round_size} * {self.max_rounds} = {cap} is smaller than "
                f"num_generations = {n}: a pool cannot be downsampled to an update group larger than itself. "
                f"Raise round_size or max_rounds so that round_size * max_rounds >= {n}."
            )
        if self.downsample == "balanced" and n % 2 != 0:
            raise ValueError(
                f"downsample='balanced' keeps num_generations // 2 positives and as many negatives, so it needs an "
                f"even num_generations; got {n}. Use an even num_generations or downsample='random'."
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
            positive_quota = n // 2 if positive_quota is None else positive_quota
            negative_quota = n // 2 if negative_quota is None else negative_quota
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
