"""Validated settings shared by every sampler. Pure Python: no torch, no TRL."""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, fields, replace
from typing import Any

SAMPLER_NAMES: tuple[str, ...] = ("uniform", "seq_pos", "seq_balance", "est", "dapo")
SEQUENTIAL_SAMPLERS: tuple[str, ...] = ("seq_pos", "seq_balance")
EST_TRAIN_ON: tuple[str, ...] = ("all", "downsample")
DAPO_ON_EXHAUSTED: tuple[str, ...] = ("raise", "keep_partial")
ROUND_POLICIES: tuple[str, ...] = ("fixed", "predictive", "tracked")
BASELINES: tuple[str, ...] = ("pool", "group")
SCALE_REWARDS: tuple[str, ...] = ("group", "batch", "none")
OBJECTIVES: tuple[str, ...] = ("linear", "log", "power")
DOWNSAMPLES: tuple[str, ...] = ("balanced", "random")


_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]{0,95}(/[A-Za-z0-9][\w.-]{0,95})?")
"""What a Hub repo id looks like (`name` or `owner/name`); `pass_rate_predictor` accepts one to warm-start from."""


def _choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{name}={value!r} is not supported. Choose one of {list(choices)}.")


@dataclass(frozen=True)
class SamplerSettings:
    """
    Every knob a sampler reads, validated once by [`SamplerSettings.validated`].

    `AdaGRPOConfig` documents each field; this dataclass exists so that samplers can be built and tested without
    TRL (for example by `trl-ada simulate`). A knob that only some samplers or policies read ([`KNOB_USES`]) must keep
    its default elsewhere: `validated` raises rather than ignore it.
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
    pass_rate_decay: float = 0.9
    pass_rate_prior_alpha: float = 1.0
    pass_rate_prior_beta: float = 1.0
    pass_rate_predictor: str = "tracker"
    pass_rate_predictor_learning_rate: float = 0.1
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
        _choice("round_policy", self.round_policy, ROUND_POLICIES)
        _choice("est_train_on", self.est_train_on, EST_TRAIN_ON)
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
        # One rule for every knob: a value other than the default that this sampler / policy does not read raises.
        check_knobs_read(self, KNOB_USES, SETTINGS_DEFAULTS)
        self._validate_pass_rate_prior()
        self._validate_pass_rate_predictor()
        if not 0.0 < self.round_confidence < 1.0:
            raise ValueError(f"round_confidence must lie in (0, 1), got {self.round_confidence}.")
        if self.sampler in ("uniform", "dapo", "est"):
            return self._validated_est() if self.sampler == "est" else self

        cap = self.max_pool_size
        if cap < n:
            raise ValueError(
                f"round_size * max_rounds = {self.round_size} * {self.max_rounds} = {cap} is smaller than "
                f"num_generations = {n}: a pool cannot be downsampled to an update group larger than itself. "
                f"Raise round_size or max_rounds so that round_size * max_rounds >= {n}."
            )
        positive_quota, negative_quota = self.positive_quota, self.negative_quota
        if self.sampler == "seq_pos":
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

    def _validate_pass_rate_prior(self) -> None:
        # Checked whatever the sampler: a value that no sampler reads has already been rejected above, and the ones
        # read (est, the predictive and tracked round policies) must be valid before any compute is spent.
        if not 0.0 < self.pass_rate_decay <= 1.0:  # also rejects NaN
            raise ValueError(f"pass_rate_decay must lie in (0, 1] (1 keeps all history), got {self.pass_rate_decay}.")
        for name in ("pass_rate_prior_alpha", "pass_rate_prior_beta"):
            value = getattr(self, name)
            if not (value > 0.0 and math.isfinite(value)):
                raise ValueError(
                    f"{name} must be a positive finite number (a Beta prior keeps p̂ away from 0 and 1), got {value}."
                )

    def _validate_pass_rate_predictor(self) -> None:
        # Checked before any compute: the name, the learning rate, and that a local directory holds a predictor (a
        # value that is neither "tracker", "learned" nor an existing path must look like a Hub repo id).
        value = self.pass_rate_predictor
        rate = self.pass_rate_predictor_learning_rate
        if not (rate > 0.0 and math.isfinite(rate)):
            raise ValueError(f"pass_rate_predictor_learning_rate must be a positive finite number, got {rate}.")
        if value in ("tracker", "learned"):
            return
        if not isinstance(value, str) or not value:
            raise ValueError(f"pass_rate_predictor must be 'tracker', 'learned', or a path or Hub id; got {value!r}.")
        if os.path.exists(value):
            from .predictor import PREDICTOR_DIR, PREDICTOR_FILE, find_predictor_file

            if find_predictor_file(value) is None:
                raise ValueError(
                    f"pass_rate_predictor={value!r} is a local path without a learned predictor (expected "
                    f"{PREDICTOR_DIR}/{PREDICTOR_FILE} or {PREDICTOR_FILE} inside it). Point it at the output "
                    "directory of a run with pass_rate_predictor='learned', or use 'learned' to start from scratch."
                )
        elif not _HUB_ID.fullmatch(value):
            raise ValueError(
                f"pass_rate_predictor={value!r} is neither 'tracker', 'learned', an existing local directory nor a Hub "
                "repo id ('owner/name'). Fix the path, or use 'learned'."
            )

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
        n = self.num_generations
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


# ---------------------------------------------------------------------------------------------------------------------
# Which configurations read which knob
# ---------------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class KnobUse:
    """
    Which configurations read a knob. `reads(settings)` says whether the current one does; `readers` names the ones
    that do (for the error message); `depends_on` names the settings that decide it.
    """

    reads: Callable[[Any], bool]
    readers: str
    depends_on: tuple[str, ...] = ("sampler",)
    hint: str = ""


def _sequential(settings: Any) -> bool:
    return settings.sampler in SEQUENTIAL_SAMPLERS


def _est(settings: Any) -> bool:
    return settings.sampler == "est"


def _refills(settings: Any) -> bool:
    return settings.sampler == "dapo" or bool(settings.dapo_refill)


_SEQ = "sampler='seq_pos' or 'seq_balance'"
_EST = "sampler='est'"
_REFILLS = "sampler='dapo' or dapo_refill=True"

KNOB_USES: dict[str, KnobUse] = {
    "round_size": KnobUse(_sequential, _SEQ),
    "max_rounds": KnobUse(_sequential, _SEQ),
    "positive_quota": KnobUse(_sequential, _SEQ),
    # 0 is what validation fills in for seq_pos, whose exit rule counts positives only.
    "negative_quota": KnobUse(
        lambda s: s.sampler == "seq_balance" or (s.sampler == "seq_pos" and s.negative_quota == 0),
        "sampler='seq_balance'",
    ),
    "objective": KnobUse(
        lambda s: s.sampler != "est",
        "sampler='uniform', 'seq_pos', 'seq_balance' or 'dapo'",
        hint="sampler='est' splits the log objective between sampling (N ∝ p̂^-est_sample_power) and a residual "
        "weight: tune est_sample_power instead (0.5: the paper's hybrid; 1.0: pure implicit weighting).",
    ),
    "power_alpha": KnobUse(lambda s: s.objective == "power", "objective='power'", ("objective",)),
    "downsample": KnobUse(
        lambda s: _sequential(s) or (_est(s) and s.est_train_on == "downsample"),
        f"{_SEQ}, or sampler='est' with est_train_on='downsample' (the others train on every completion drawn)",
        ("sampler", "est_train_on"),
    ),
    "round_policy": KnobUse(_sequential, _SEQ),
    "round_confidence": KnobUse(
        lambda s: _sequential(s) and s.round_policy in ("predictive", "tracked"),
        "round_policy='predictive' or 'tracked' (with sampler='seq_pos' or 'seq_balance')",
        ("sampler", "round_policy"),
    ),
    "pass_rate_decay": KnobUse(
        lambda s: _est(s) or (_sequential(s) and s.round_policy == "tracked"),
        "sampler='est', or round_policy='tracked' (its pass-rate tracker)",
        ("sampler", "round_policy"),
    ),
    "pass_rate_prior_alpha": KnobUse(
        lambda s: _est(s) or (_sequential(s) and s.round_policy in ("predictive", "tracked")),
        "sampler='est', or round_policy='predictive' or 'tracked' (their Beta prior)",
        ("sampler", "round_policy"),
    ),
    "pass_rate_prior_beta": KnobUse(
        lambda s: _est(s) or (_sequential(s) and s.round_policy in ("predictive", "tracked")),
        "sampler='est', or round_policy='predictive' or 'tracked' (their Beta prior)",
        ("sampler", "round_policy"),
    ),
    "pass_rate_predictor": KnobUse(
        lambda s: _est(s) or (_sequential(s) and s.round_policy in ("predictive", "tracked")),
        "sampler='est', or round_policy='predictive' or 'tracked' (their pass-rate prior)",
        ("sampler", "round_policy"),
    ),
    "pass_rate_predictor_learning_rate": KnobUse(
        lambda s: (
            s.pass_rate_predictor != "tracker"
            and (_est(s) or (_sequential(s) and s.round_policy in ("predictive", "tracked")))
        ),
        "pass_rate_predictor='learned' or a saved predictor (with sampler='est' or round_policy='predictive'/"
        "'tracked')",
        ("sampler", "round_policy", "pass_rate_predictor"),
    ),
    "est_sample_power": KnobUse(_est, _EST),
    "est_min_samples": KnobUse(_est, _EST),
    "est_max_samples": KnobUse(_est, _EST),
    "est_mean_samples": KnobUse(_est, _EST),
    "est_epsilon": KnobUse(_est, _EST),
    "est_train_on": KnobUse(_est, _EST),
    "dapo_refill": KnobUse(lambda s: _sequential(s) or s.sampler == "dapo", f"{_SEQ} (or sampler='dapo')"),
    "dapo_max_refills": KnobUse(_refills, _REFILLS, ("sampler", "dapo_refill")),
    "dapo_on_exhausted": KnobUse(_refills, _REFILLS, ("sampler", "dapo_refill")),
}
"""Every knob that only some samplers or policies read. A value other than its default elsewhere is an error."""

UNIVERSAL_KNOBS: frozenset[str] = frozenset(
    {
        "sampler",
        "num_generations",
        "positive_threshold",
        "baseline",
        "scale_rewards",
        "max_weight",
        "normalize_weights",
        "zero_variance_tolerance",
        "seed",
    }
)
"""The knobs every sampler reads (outcomes, baselines, weights, metrics, the downsampling generator)."""

SETTINGS_DEFAULTS: dict[str, Any] = {f.name: f.default for f in fields(SamplerSettings) if f.default is not MISSING}


def check_knobs_read(values: Any, uses: Mapping[str, KnobUse], defaults: Mapping[str, Any]) -> None:
    """
    The one rule for knobs that only some configurations read: `values` (settings or a config) may set such a knob to
    anything but its default only where it is read; elsewhere it would be silently ignored, so this raises
    `ValueError` naming the knob, the setting that makes it unread and what reads it.
    """
    for name, use in uses.items():
        value = getattr(values, name)
        if value == defaults[name] or use.reads(values):  # NaN is never equal to a default: it is checked too
            continue
        context = ", ".join(f"{key}={getattr(values, key)!r}" for key in use.depends_on)
        raise ValueError(
            f"{name}={value!r} has no effect with {context}: only {use.readers} read(s) it. Remove {name} (default "
            f"{defaults[name]!r}). Use {use.readers} if you meant it to take effect."
            + (f" {use.hint}" if use.hint else "")
        )
