"""
Every sampler knob, declared once as TRL declares its own: a dataclass field with its default and `metadata={"help":
...}` (and `"choices"`), its value checked in [`SamplerSettings.check_values`]. [`SamplerFields`] declares trl-ada's
knobs (`AdaGRPOConfig` inherits it); [`SamplerSettings`] adds the three TRL owns and is what samplers read. A sampler
names the knobs it reads as the fields of its `Options` ([`SamplerOptions`]); any other knob must keep its default
([`check_knobs_read`]). Pure Python: no torch, no TRL.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import MISSING, Field, dataclass, field, fields, replace
from typing import Any, ClassVar

from .capabilities import RunsRoundFree
from .registry import sampler_class

_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]{0,95}(/[A-Za-z0-9][\w.-]{0,95})?")
"""What a Hub repo id looks like (`name` or `owner/name`); `pass_rate_predictor` accepts one to warm-start from."""


def check_choices(values: Any, names: Iterable[str]) -> None:
    """Each knob of `names` on `values` among its declared `choices` (`ValueError` naming the knob and them)."""
    for name in names:
        choices, value = values.__dataclass_fields__[name].metadata.get("choices"), getattr(values, name)
        if choices is not None and value not in choices:
            raise ValueError(f"{name}={value!r} is not supported. Choose one of {choices}.")


def check_unread_knob(values: Any, name: str, where: str, readers: str, hint: str = "") -> None:
    """The rule for a knob that the configuration `values` does not read: it keeps its default, or `ValueError` names
    the knob, the settings that leave it unread (`where`) and what reads it (`readers`)."""
    value, default = getattr(values, name), values.__dataclass_fields__[name].default
    if value == default:  # NaN is never equal to a default: it is refused too
        return
    raise ValueError(
        f"{name}={value!r} has no effect with {where}: only {readers} read(s) it. Remove {name} (default "
        f"{default!r}). Use {readers} if you meant it to take effect." + (f" {hint}" if hint else "")
    )


def check_knobs_read(
    values: Any, names: Iterable[str], settings: SamplerSettings, not_read: Mapping[str, str] | None = None
) -> None:
    """The unread-knob rule ([`check_unread_knob`]) for the sampler knobs `names` of `values` (either config, or the
    settings themselves): `settings` decide which are read ([`SamplerSettings.reads`]). `not_read`: knobs the trainer
    never reads, with the reason."""
    for name in names:
        value, default = getattr(values, name), values.__dataclass_fields__[name].default
        if value == default:
            continue
        if not_read and name in not_read:
            raise ValueError(f"{name}={value!r}: {not_read[name]} Remove {name} (default {default!r}).")
        if not settings.reads(name):
            where, readers = settings.unread_context(name)
            check_unread_knob(values, name, where, readers, settings.sampler_class.Options.unread_hints.get(name, ""))


@dataclass
class SamplerFields:
    """The knobs trl-ada adds to TRL's config, each declared once (see the module docstring)."""

    sampler: str = field(
        default="seq_balance",
        metadata={
            "help": "Sampling strategy, a name registered with `trl_ada.samplers.register_sampler`. Built in: "
            '`"uniform"` (GRPO), `"seq_pos"`, `"seq_balance"` (rounds until a prompt meets its quotas), '
            '`"est"` and `"est_ema"` (budgets from pass rates), `"dapo"` (drops groups without a signal, '
            'refills); experimental plug-ins (`trl_ada.experimental`): `"knapsack"`, `"dapo_gated"` and `"spo"`. See '
            "the Samplers docs.",
        },
    )
    sampler_kwargs: dict[str, Any] | str | None = field(
        default=None,
        metadata={
            "help": "Keyword arguments for the chosen sampler's own options dataclass, as a dict or a JSON string. "
            'Of trl-ada\'s samplers, only the experimental plug-ins take any: `"knapsack"` '
            '(`trl_ada.experimental.knapsack.KnapsackOptions`), `"dapo_gated"` '
            '(`trl_ada.experimental.dapo_gated.GatedRefillOptions`) and `"spo"` (`trl_ada.experimental.spo.SpoOptions`).',
        },
    )
    round_size: int = field(
        default=8,
        metadata={
            "help": "Number of completions generated per active prompt in each round (`M` in the paper). Must be at "
            'least 1. Read by `"seq_pos"` and `"seq_balance"`.',
        },
    )
    max_rounds: int = field(
        default=4,
        metadata={
            "help": "Maximum number of rounds per generation batch. Must be at least 1, and `round_size * "
            "max_rounds`, the cap on the completions drawn for one prompt, must be at least "
            '`num_generations`. Read by `"seq_pos"` and `"seq_balance"`.',
        },
    )
    positive_quota: int | None = field(
        default=None,
        metadata={
            "help": "Number of positive completions a prompt needs before it retires. If `None`, it defaults to `1` "
            'for `"seq_pos"` and `num_generations // 2` for `"seq_balance"`. Must be at least 1, and the '
            "quotas together at most `round_size * max_rounds`.",
        },
    )
    negative_quota: int | None = field(
        default=None,
        metadata={
            "help": 'Number of negative completions a prompt needs before it retires (`"seq_balance"` only). If '
            "`None`, it defaults to `num_generations - num_generations // 2`, so that the quotas fill a "
            "balanced update group.",
        },
    )
    positive_threshold: float = field(
        default=0.5,
        metadata={
            "help": "A completion counts as positive when its (weighted, summed) reward is strictly greater than "
            "this value. Must be finite.",
        },
    )
    baseline: str = field(
        default="pool",
        metadata={
            "help": 'Baseline subtracted from each reward: `"pool"` (the mean reward of all the prompt\'s draws, as '
            'in the paper), `"group"` (the kept group\'s, as `GRPOTrainer`), `"tracked"` (the prompt\'s '
            "mean reward at earlier steps, SPO's) or `\"predicted\"` (a learned predictor's). The last two "
            'need rewards in [0, 1] and `scale_rewards="none"`.',
            "choices": ["pool", "group", "tracked", "predicted"],
        },
    )
    objective: str = field(
        default="linear",
        metadata={
            "help": "Objective `f(p)` whose derivative weights each prompt, from `p̂`, the share of positives in its "
            'pool. Supported values are `"linear"` (weight 1), `"log"` (weight `1/p̂`, the paper\'s Seq '
            'estimator) and `"power"` (weight `α p̂^(α-1)`). Not read by `sampler="est"`, which weights '
            "through `est_sample_power`.",
            "choices": ["linear", "log", "power"],
        },
    )
    power_alpha: float = field(
        default=0.5,
        metadata={
            "help": 'Exponent `α` of the `"power"` objective. Must lie in (0, 1]. Read only with `objective="power"`.',
        },
    )
    max_weight: float = field(
        default=10.0,
        metadata={
            "help": "Upper clip of the per-prompt weight, applied before normalisation. Must be positive and finite: "
            'the `"log"` weight `1/p̂` is unbounded as `p̂` goes to 0.',
        },
    )
    normalize_weights: bool = field(
        default=True,
        metadata={
            "help": "Whether to rescale the per-prompt weights of an update to mean 1. The mean is over the prompts "
            "with a non-zero advantage, so the objective changes how the update is spread over prompts, not "
            'its size. Has no effect with `objective="linear"`.',
        },
    )
    normalize_advantages: bool | None = field(
        default=None,
        metadata={
            "help": "Whether to normalise the update's advantages, `(A - mean A) / (std A + 1e-4)` over the rows of "
            "the prompts with a signal (SPO's batch normalisation), in place of `scale_rewards`, which must "
            'then be `"none"`. Meant for `baseline="tracked"`, whose unmixed groups have no spread of their '
            'own. If `None`, it is `True` for `sampler="spo"` (its recipe) and `False` otherwise.',
        },
    )
    downsample: str = field(
        default="balanced",
        metadata={
            "help": 'How a pool is cut to `num_generations` completions. Supported values are `"balanced"` (up to '
            "`num_generations // 2` positives, the rest negatives, topped up from the other side when one is "
            'short) and `"random"`. Read by `"seq_pos"`, `"seq_balance"`, and by `"est"` and `"knapsack"` '
            "when they downsample.",
            "choices": ["balanced", "random"],
        },
    )
    zero_variance_tolerance: float = field(
        default=1e-6,
        metadata={
            "help": "Standard deviation at or below which rewards count as constant. A prompt whose baseline rewards "
            '(the pool with `baseline="pool"`, the kept group with `"group"`) are constant has no signal and '
            "gets zero advantages. Must be finite and non-negative.",
        },
    )
    round_policy: str = field(
        default="fixed",
        metadata={
            "help": 'How many completions an active prompt asks for in each round. Supported values are `"fixed"` '
            '(`round_size`, as in the paper), `"predictive"` (`round_size` first, then the smallest request '
            'that meets the remaining quotas with probability `round_confidence`) and `"tracked"` (the same '
            'from the first round on, with pass rates remembered across epochs). Read by `"seq_pos"` and '
            '`"seq_balance"`.',
            "choices": ["fixed", "predictive", "tracked"],
        },
    )
    round_confidence: float = field(
        default=0.7,
        metadata={
            "help": "Target probability of finishing a prompt in its next round. Must lie in (0, 1). Read with "
            '`round_policy="predictive"` or `"tracked"`.',
        },
    )
    pass_rate_decay: float = field(
        default=0.9,
        metadata={
            "help": "Discount `λ` of a prompt's tracked counts at each visit: `N <- λN + n` and `K <- λK + k`. Must "
            'lie in (0, 1]; `1` keeps the whole history. Read by `sampler="est"`, `"knapsack"` and '
            '`"dapo_gated"`, by `round_policy="tracked"` and by `baseline="tracked"` or `"predicted"`.',
        },
    )
    pass_rate_prior_alpha: float = field(
        default=1.0,
        metadata={
            "help": "`α` of the Beta prior of the pass-rate estimates. With it `p̂ = (K + α) / (N + α + β)`, so an "
            'unseen prompt reads `α / (α + β)`. Must be positive and finite. Read by `sampler="est"` and '
            '`"knapsack"`, by `round_policy="predictive"` or `"tracked"` and by `baseline="tracked"` or '
            '`"predicted"`.',
        },
    )
    pass_rate_prior_beta: float = field(
        default=1.0,
        metadata={
            "help": "`β` of the Beta prior of the pass-rate estimates (see `pass_rate_prior_alpha`). Must be "
            "positive and finite.",
        },
    )
    pass_rate_predictor: str = field(
        default="tracker",
        metadata={
            "help": 'Source of the pass-rate estimates. Supported values are `"tracker"` (the decayed Beta counts), '
            '`"learned"` (an online model of the prompt text, whose prediction is the prior of the counts), '
            "or a local directory or Hub repo id holding a predictor saved by an earlier run, to warm-start "
            'from. Read by `sampler="est"` and `"knapsack"`, by `round_policy="predictive"` or `"tracked"` '
            'and by `baseline="predicted"`.',
        },
    )
    pass_rate_predictor_learning_rate: float = field(
        default=0.1,
        metadata={
            "help": "Adagrad step size of the learned pass-rate predictor. Must be positive and finite. Read only "
            'when `pass_rate_predictor` is not `"tracker"`; a resumed run uses this value, not the '
            "checkpoint's.",
        },
    )
    skip_unmixed_above: float | None = field(
        default=None,
        metadata={
            "help": "Skip adaptive sampling for prompts predicted to come back unmixed. A prompt whose predicted "
            "chance of an all-right or all-wrong group, `p̂^n + (1 - p̂)^n` with `n = num_generations`, is "
            'above this value draws `num_generations` (`est_min_samples` under `"est"`). If `None`, no '
            'prompt is skipped; otherwise it must lie in (0, 1). Read by `"est"` and '
            '`round_policy="tracked"` (or `"predictive"` with a learned predictor).',
        },
    )
    est_sample_power: float = field(
        default=0.5,
        metadata={
            "help": "Exponent `s` of `sampler=\"est\"`'s budgets, `N_x ∝ p̂_x^-s`. The rest of the log objective's "
            "weight, `(p̂_x + est_epsilon)^-(1-s)`, weights the gradient. Must lie in [0, 1]: `0.5` is the "
            "paper's hybrid, `1.0` pure implicit weighting.",
        },
    )
    est_min_samples: int | None = field(
        default=None,
        metadata={
            "help": 'Lower clip of a prompt\'s budget under `sampler="est"`. If `None`, it defaults to `2` with '
            '`est_train_on="all"` and to `num_generations` with `"downsample"`, the smallest values allowed.',
        },
    )
    est_max_samples: int | None = field(
        default=None,
        metadata={
            "help": 'Upper clip of a prompt\'s budget under `sampler="est"`. If `None`, it defaults to `4 * '
            "num_generations`.",
        },
    )
    est_mean_samples: float | None = field(
        default=None,
        metadata={
            "help": 'Average number of completions drawn per prompt under `sampler="est"`. A step of `B` prompts '
            "draws `round(B * est_mean_samples)`. Must lie in `[est_min_samples, est_max_samples]`. If "
            '`None`, it defaults to `num_generations` with `est_train_on="all"`, the only value allowed '
            'there, and to `2 * num_generations` with `"downsample"`.',
        },
    )
    est_epsilon: float = field(
        default=0.01,
        metadata={
            "help": '`ε` in the residual weight `(p̂_x + ε)^-(1-s)` of `sampler="est"`, which keeps it finite when a '
            "pool has no positive. Must be positive and finite.",
        },
    )
    est_train_on: str = field(
        default="all",
        metadata={
            "help": 'What `sampler="est"` trains on. Supported values are `"all"` (every completion drawn: group '
            'sizes vary and the total stays `B * num_generations`, as in the paper) and `"downsample"` (draw '
            "`est_mean_samples` per prompt on average, then cut each pool to `num_generations`).",
            "choices": ["all", "downsample"],
        },
    )
    dapo_refill: bool | None = field(
        default=None,
        metadata={
            "help": "Whether to drop prompts without a signal (see `zero_variance_tolerance`) and refill the batch "
            'from further prompts, as DAPO does. If `None`, it is on for `sampler="dapo"` and `"dapo_gated"` '
            'and off otherwise; `True` also combines with `"seq_pos"` and `"seq_balance"`.',
        },
    )
    dapo_max_refills: int = field(
        default=10,
        metadata={
            "help": "Maximum number of extra generation batches drawn per step to fill the batch (verl's "
            "`max_num_gen_batches`). Must be non-negative. Read when DAPO refills are on.",
        },
    )
    dapo_on_exhausted: str = field(
        default="raise",
        metadata={
            "help": "What to do when `dapo_max_refills` is reached before the batch is full. Supported values are "
            '`"raise"` (as in verl) and `"keep_partial"` (train on the prompts with a signal, padded with '
            "zero-advantage groups). Read when DAPO refills are on; the asynchronous trainer supports only "
            '`"raise"`.',
            "choices": ["raise", "keep_partial"],
        },
    )


@dataclass
class SamplerSettings(SamplerFields):
    """Every knob a sampler reads, validated once by [`SamplerSettings.validated`]: trl-ada's ([`SamplerFields`]) plus
    the three TRL owns, with TRL's defaults. `AdaGRPOConfig.sampler_settings()` builds one from a config."""

    num_generations: int = field(
        default=8,
        metadata={
            "help": "TRL's `num_generations`: the size `n` of the update group, i.e. the completions per prompt that "
            "enter the loss. Adaptive samplers may draw more and downsample to it. Must be at least 2.",
        },
    )
    scale_rewards: str = field(
        default="group",
        metadata={
            "help": 'TRL\'s `scale_rewards`: how the centred rewards are scaled. `"group"` divides them by the '
            'standard deviation of the group, `"batch"` by that of the batch, and `"none"` leaves them '
            'unscaled. With `baseline="pool"`, `"group"` uses the pool\'s.',
            "choices": ["group", "batch", "none"],
        },
    )
    seed: int = field(
        default=42,
        metadata={
            "help": "TRL's `seed`: the sampler's downsampling generator starts from it, the same on every process.",
        },
    )

    @property
    def sampler_class(self) -> type:
        """The registered class of `sampler`."""
        return sampler_class(self.sampler)

    @property
    def options(self) -> SamplerOptions:
        """The registered sampler's `Options`, filled from these settings and `sampler_kwargs` (validated)."""
        options_class = self.sampler_class.Options
        names = set(option_fields(options_class))
        own = self._sampler_kwargs()
        unknown = sorted(set(own) - (names - set(KNOB_FIELDS)))
        if unknown:
            known = sorted(names - set(KNOB_FIELDS))
            if not known:
                raise ValueError(
                    f"sampler_kwargs={own!r} given, but sampler={self.sampler!r} has no options of its own. Remove "
                    "sampler_kwargs; its knobs are the config's fields."
                )
            raise ValueError(
                f"sampler_kwargs has {unknown}, which sampler={self.sampler!r} does not take. Its options are {known}."
            )
        shared = {name: getattr(self, name) for name in names & set(KNOB_FIELDS)}
        return options_class(**shared, **own)

    @property
    def max_pool_size(self) -> int:
        """The cap on completions drawn for one prompt in one generation batch."""
        return self.options.max_pool_size

    @property
    def refills(self) -> bool:
        """Whether prompts without a signal are dropped and the batch refilled (DAPO), as the `Options` resolve it."""
        if self.dapo_refill is not None:  # validated settings hold it resolved
            return self.dapo_refill
        return bool(getattr(self.options, "dapo_refill", False))

    @property
    def has_exit_rule(self) -> bool:
        """Whether the sampler runs an exit rule prompt by prompt, so the round-free schedule can drive it."""
        return issubclass(self.sampler_class, RunsRoundFree)

    @property
    def rules_are_per_prompt(self) -> bool:
        """Whether every rule of a generation batch reads only each prompt's own pool (no budget, reward std or weight
        normalisation across it), so a streaming worker may finish each prompt as a batch of its own."""
        return not (
            self.sampler_class.Options.splits_batch_budget
            or self.scale_rewards == "batch"
            or self.normalize_advantages
            or (self.objective != "linear" and self.normalize_weights)
        )

    @property
    def one_request_per_prompt(self) -> bool:
        """Whether every prompt is drawn in one request per step, all of one count (a vLLM `seed` stays usable)."""
        options = self.options
        return options.max_rounds == 1 and not options.splits_batch_budget

    def reads(self, name: str) -> bool:
        """Whether this configuration reads knob `name` (universal, a remembered baseline's, or the sampler's)."""
        remembered = name in TRACKED_BASELINE_KNOBS and self.baseline in REMEMBERED_BASELINES
        predicted = name == "pass_rate_predictor" and self.baseline == "predicted"
        return name in UNIVERSAL_KNOBS or remembered or predicted or self.sampler_reads(name)

    def sampler_reads(self, name: str) -> bool:
        """Whether the sampler itself reads knob `name`: its `Options` declare it, or it is read under another knob's
        setting ([`_read_under`])."""
        read_under = self._read_under(name)
        if read_under is not None:
            return read_under[0]
        declared = option_fields(self.sampler_class.Options).get(name)
        if declared is None:
            return False
        condition = declared.metadata.get(READ_WHEN)
        return condition is None or self._option_value(condition[0]) in condition[1]

    def _read_under(self, name: str) -> tuple[bool, tuple[str, ...], str] | None:
        """For a knob read under a setting of other knobs, whatever the sampler: `(whether these settings read it, the
        knobs that decide it, what reads it)`. `None` for every other knob (the sampler's `Options` decide)."""
        if name == "power_alpha":
            return self.reads("objective") and self.objective == "power", ("sampler", "objective"), "objective='power'"
        if name == "pass_rate_predictor_learning_rate":
            learned = self.reads("pass_rate_predictor") and self.pass_rate_predictor != "tracker"
            readers = "pass_rate_predictor='learned' or a saved predictor"
            return learned, ("sampler", "round_policy", "pass_rate_predictor"), readers
        return None

    def validated(self) -> SamplerSettings:
        """Check every knob and return a copy with the sampler's defaults filled in; raise `ValueError` naming the fix.
        The order: the sampler's name, each knob's choices, unread knobs, each knob's value ([`check_values`]), then
        the `Options`. A sampler's `Options.recipe` first fills the knobs left at their defaults ([`with_recipe`])."""
        self.sampler_class  # noqa: B018 - an unknown sampler raises first, naming the registered ones
        filled = self.with_recipe()
        if filled != self:
            return filled.validated()
        check_choices(self, KNOB_FIELDS)
        check_knobs_read(self, KNOB_FIELDS, self)
        self.check_values()
        if self.normalize_advantages and self.scale_rewards != "none":
            raise ValueError(
                f"normalize_advantages=True divides the advantages by their std over the update, and "
                f"scale_rewards={self.scale_rewards!r} would scale the rewards a second time. Set scale_rewards='none'."
            )
        companions = []
        if self.baseline in REMEMBERED_BASELINES and self.scale_rewards != "none":
            # An unmixed group (or a whole unmixed batch) has an advantage against its remembered mean but no spread:
            # a group's or a batch's std would divide by about 0.
            companions.append(
                f"scale_rewards='none' (an unmixed group on a prompt with history has an advantage but no spread, so "
                f"scale_rewards={self.scale_rewards!r} would divide it by a std of about 0; add "
                "normalize_advantages=True for SPO's batch normalisation)"
            )
        if self.baseline == "predicted" and self.pass_rate_predictor == "tracker":
            companions.append(
                "pass_rate_predictor='learned' or a saved predictor (baseline='predicted' reads a learned predictor, "
                "and 'tracker' is the counts alone; or use baseline='tracked')"
            )
        if companions:
            raise ValueError(f"baseline={self.baseline!r} needs " + "; and ".join(companions) + ".")
        if self.reads("pass_rate_predictor"):
            _check_pass_rate_predictor(self.pass_rate_predictor)
        settings = replace(self, sampler_kwargs=self._sampler_kwargs() or None)
        options = settings.options
        filled = {name: getattr(options, name) for name in option_fields(type(options)) if name in KNOB_FIELDS}
        return replace(settings, **filled)

    def check_values(self) -> None:
        """Each knob's requirement on its own value (`ValueError` naming the knob). An unread knob keeps its default
        ([`check_knobs_read`], checked first) and every default meets its requirement: this checks the knobs read."""
        if not self.round_size >= 1:
            raise ValueError(f"round_size must be at least 1, got {self.round_size}.")
        if not self.max_rounds >= 1:
            raise ValueError(f"max_rounds must be at least 1, got {self.max_rounds}.")
        if not math.isfinite(self.positive_threshold):
            raise ValueError(f"positive_threshold must be a finite number, got {self.positive_threshold}.")
        if not 0.0 < self.power_alpha <= 1.0:
            raise ValueError(f"power_alpha must lie in (0, 1], got {self.power_alpha}.")
        if not 0.0 < self.max_weight < math.inf:
            raise ValueError(
                "max_weight must be a positive finite number (it bounds 1/p̂, which is infinite at p̂ = 0: an infinite "
                "clip gives such a prompt an infinite weight, NaN advantages and, after normalisation, every other "
                f"prompt a zero weight); use e.g. the default 10.0, got {self.max_weight}."
            )
        # inf would make every group constant (no signal anywhere), NaN none: both are typos, not tolerances.
        if not 0.0 <= self.zero_variance_tolerance < math.inf:
            raise ValueError(
                f"zero_variance_tolerance must be a finite, non-negative number, got {self.zero_variance_tolerance}."
            )
        if not 0.0 < self.round_confidence < 1.0:
            raise ValueError(f"round_confidence must lie in (0, 1), got {self.round_confidence}.")
        if not 0.0 < self.pass_rate_decay <= 1.0:
            raise ValueError(f"pass_rate_decay must lie in (0, 1] (1 keeps all history), got {self.pass_rate_decay}.")
        for name in ("pass_rate_prior_alpha", "pass_rate_prior_beta"):
            if not 0.0 < getattr(self, name) < math.inf:
                raise ValueError(
                    f"{name} must be a positive finite number (a Beta prior keeps p̂ away from 0 and 1), got "
                    f"{getattr(self, name)}."
                )
        if not 0.0 < self.pass_rate_predictor_learning_rate < math.inf:
            raise ValueError(
                "pass_rate_predictor_learning_rate must be a positive finite number, got "
                f"{self.pass_rate_predictor_learning_rate}."
            )
        if not (self.skip_unmixed_above is None or 0.0 < self.skip_unmixed_above < 1.0):
            raise ValueError(
                f"skip_unmixed_above must be None (off) or a probability in (0, 1), got {self.skip_unmixed_above}."
            )
        if not 0.0 <= self.est_sample_power <= 1.0:
            raise ValueError(f"est_sample_power must lie in [0, 1], got {self.est_sample_power}.")
        if not 0.0 < self.est_epsilon < math.inf:
            raise ValueError(f"est_epsilon must be a positive finite number, got {self.est_epsilon}.")
        if not self.dapo_max_refills >= 0:
            raise ValueError(f"dapo_max_refills must be non-negative, got {self.dapo_max_refills}.")
        if not (self.num_generations is not None and self.num_generations >= 2):
            raise ValueError(
                f"num_generations must be at least 2 to form a group with a baseline, got {self.num_generations}."
            )

    def with_recipe(self) -> SamplerSettings:
        """These settings with the sampler's `Options.recipe` in every knob left at its default, and
        `normalize_advantages=None` resolved. A recipe is the sampler's own setting of the knobs it shares (`spo`: a
        remembered baseline, `scale_rewards="none"` and its normalisation; `est_ema`: the authors' tracker); a
        value given other than the default stands."""
        recipe = self.sampler_class.Options.recipe
        filled = {
            name: value
            for name, value in recipe.items()
            if getattr(self, name) == SETTINGS_DEFAULTS[name] and getattr(self, name) != value
        }
        if self.normalize_advantages is None:
            filled["normalize_advantages"] = bool(recipe.get("normalize_advantages", False))
        return replace(self, **filled) if filled else self

    def unread_context(self, name: str) -> tuple[str, str]:
        """`(the settings that make knob `name` unread, what reads it)`, for the unread-knob error."""
        from .registry import load_plugins

        read_under = self._read_under(name)
        if read_under is not None:
            _, depends_on, readers = read_under
            return ", ".join(f"{key}={getattr(self, key)!r}" for key in depends_on), readers
        condition = option_fields(self.sampler_class.Options).get(name)
        depends_on = () if condition is None else (condition.metadata[READ_WHEN][0],)
        context = ", ".join(f"{key}={self._option_value(key)!r}" for key in ("sampler", *depends_on))
        # Readers grouped by the setting they need: "sampler='seq_pos' or 'seq_balance' (with round_policy='tracked')".
        groups: dict[str, list[str]] = {}
        for sampler_name, cls in load_plugins().items():
            declared = option_fields(cls.Options).get(name)
            if declared is not None:
                groups.setdefault(_condition_text(declared), []).append(repr(sampler_name))
        readers = [
            "sampler=" + " or ".join(names) + (f" ({condition})" if condition else "")
            for condition, names in groups.items()
        ]
        if name in TRACKED_BASELINE_KNOBS or name == "pass_rate_predictor":
            context += f", baseline={self.baseline!r}"
            readers.append(
                "baseline='predicted'" if name == "pass_rate_predictor" else "baseline='tracked' or 'predicted'"
            )
        return context, ", or ".join(readers) or "no registered sampler"

    def _sampler_kwargs(self) -> dict[str, Any]:
        kwargs = self.sampler_kwargs
        return _parse_json_kwargs(kwargs) if isinstance(kwargs, str) else dict(kwargs or {})

    def _option_value(self, name: str) -> Any:
        """A knob's value, or one of the sampler's own options (given or its default), read before they are built."""
        if name in KNOB_FIELDS:
            return getattr(self, name)
        return self._sampler_kwargs().get(name, option_fields(self.sampler_class.Options)[name].default)


def option_fields(options_class: type) -> dict[str, Field]:
    """The fields of a sampler's `Options` that it is built with, by name: the knobs it reads and its own options."""
    return {f.name: f for f in fields(options_class) if f.init}


READ_WHEN = "trl_ada.read_when"
"""The metadata key of a conditionally read `Options` field (see [`read_when`])."""


def read_when(name: str, *values: Any, default: Any = MISSING) -> Any:
    """An `Options` field read only while knob or option `name` takes one of `values` (elsewhere: its default)."""
    return field(default=default, metadata={READ_WHEN: (name, values)})


def _condition_text(declared: Field) -> str:
    condition = declared.metadata.get(READ_WHEN)
    if condition is None:
        return ""
    name, values = condition
    return f"with {name}=" + " or ".join(repr(value) for value in values)


@dataclass(kw_only=True)
class SamplerOptions:
    """The base of every sampler's `Options`: a field named like a config knob (`round_size`, ...) is filled from the
    config, and declaring it is how a sampler says it reads that knob; a field of any other name is the sampler's own
    knob, given in `sampler_kwargs`. `__post_init__` checks the values and fills defaults (and accepts its own
    output)."""

    num_generations: int
    """The size of the update group, which every sampler reads."""
    max_rounds: int = field(default=1, init=False)
    """Rounds of draws in one generation batch at most: one, unless the sampler reads the `max_rounds` knob."""
    splits_batch_budget: ClassVar[bool] = False
    """Whether a prompt's budget depends on the other prompts of its generation batch (`est`, `knapsack`)."""
    unread_hints: ClassVar[Mapping[str, str]] = {
        "dapo_refill": "DAPO's batch filling on plain GRPO sampling is sampler='dapo': use sampler='dapo' instead."
    }
    """Knob -> a hint added to the error when a user sets it and this sampler does not read it."""
    recipe: ClassVar[Mapping[str, Any]] = {}
    """Knob values this sampler needs where the defaults do not fit (`trl-ada simulate` compares it with them)."""

    @property
    def max_pool_size(self) -> int:
        """The cap on completions drawn for one prompt in one generation batch."""
        return self.num_generations

    def describe(self, settings: SamplerSettings) -> str | None:
        """What the sampler did under `settings`, in a few Markdown sentences (the model card's); `None`: not said."""
        return None


KNOB_FIELDS: dict[str, Field] = {f.name: f for f in fields(SamplerSettings)}
"""Every knob's declaration by name."""

TRL_OWNED_KNOBS: frozenset[str] = frozenset({"num_generations", "scale_rewards", "seed"})
"""The knobs `GRPOConfig` declares (`SamplerSettings` carries them with TRL's defaults; configs inherit TRL's)."""

UNIVERSAL_KNOBS: frozenset[str] = frozenset(
    {
        "sampler",
        "sampler_kwargs",
        "num_generations",
        "positive_threshold",
        "baseline",
        "scale_rewards",
        "max_weight",
        "normalize_weights",
        "normalize_advantages",
        "zero_variance_tolerance",
        "seed",
    }
)
"""The knobs every sampler reads (outcomes, baselines, weights, metrics, the downsampling generator)."""

TRACKED_BASELINE_KNOBS: frozenset[str] = frozenset(
    {"pass_rate_decay", "pass_rate_prior_alpha", "pass_rate_prior_beta"}
)
"""The knobs a remembered baseline reads, whatever the sampler: those of its history's decayed Beta counts."""

REMEMBERED_BASELINES: tuple[str, ...] = ("tracked", "predicted")
"""The baselines read from a memory of each prompt's earlier draws (`Sampler.baseline_history`)."""

SETTINGS_DEFAULTS: dict[str, Any] = {f.name: f.default for f in fields(SamplerSettings) if f.default is not MISSING}


def _check_pass_rate_predictor(value: Any) -> None:
    # Checked before any compute: anything but a named value or a local directory holding a predictor is a Hub id.
    if value in ("tracker", "learned"):
        return
    if not isinstance(value, str) or not value:
        raise ValueError(f"pass_rate_predictor must be 'tracker', 'learned', or a path or Hub id; got {value!r}.")
    if os.path.exists(value):
        from .predictor import PREDICTOR_DIR, PREDICTOR_FILE, find_predictor_file

        if find_predictor_file(value) is None:
            raise ValueError(
                f"pass_rate_predictor={value!r} is a local path without a learned predictor (expected "
                f"{PREDICTOR_DIR}/{PREDICTOR_FILE} or {PREDICTOR_FILE} inside it). Point it at the output directory "
                "of a run with pass_rate_predictor='learned', or use 'learned' to start from scratch."
            )
    elif not _HUB_ID.fullmatch(value):
        raise ValueError(
            f"pass_rate_predictor={value!r} is neither 'tracker', 'learned', an existing local directory nor a Hub "
            "repo id ('owner/name'). Fix the path, or use 'learned'."
        )


def _parse_json_kwargs(text: str) -> dict[str, Any]:
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"sampler_kwargs={text!r} is not valid JSON ({error}); pass a JSON object.") from None
    if not isinstance(parsed, dict):
        raise ValueError(f"sampler_kwargs must be a JSON object (a dict of the sampler's options), got {text!r}.")
    return parsed
