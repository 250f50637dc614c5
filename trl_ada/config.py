"""Configuration for [`AdaGRPOTrainer`]."""

from __future__ import annotations

import logging
import math
import warnings
from dataclasses import MISSING, dataclass, field, fields, replace
from typing import Any

from trl import GRPOConfig

from .samplers import SamplerSettings
from .samplers.rules import loss_normaliser
from .samplers.settings import SamplerFields, check_choices, check_unread_knob
from .samplers.signal import grpo_rule_holds
from .samplers.simulate import GENERATION_SCHEDULES

logger = logging.getLogger(__name__)


def batch_rules(settings: SamplerSettings) -> str | None:
    """What in the validated `settings` reads a whole generation batch (named for messages), or `None` where every
    rule reads one prompt's pool (`SamplerSettings.rules_are_per_prompt`). Over a batch of one prompt such a rule
    does nothing: `est` gives every prompt its mean budget, `normalize_weights` scales every weight back to 1."""
    if settings.rules_are_per_prompt:
        return None
    named = []
    if settings.sampler == "est":
        named.append("sampler='est' (its budgets share the batch's mean, est_mean_samples)")
    if settings.scale_rewards == "batch":
        named.append("scale_rewards='batch' (the batch's reward std)")
    if settings.normalize_weights and settings.objective != "linear":
        named.append(f"objective={settings.objective!r} with normalize_weights=True (weights rescaled to mean 1)")
    return " and ".join(named) or f"sampler={settings.sampler!r} (its Options.splits_batch_budget)"


TRAIN_ON_CHOICES = ("downsample", "pool")


def check_train_on(train_on: str, settings: SamplerSettings) -> None:
    """Raise `ValueError`, naming the fix, where `train_on` ([`TrainOnField`]) cannot hold with the validated
    `settings`: the one rule for both trainers (and the asynchronous rollout loop)."""
    if train_on not in TRAIN_ON_CHOICES:
        raise ValueError(f"train_on={train_on!r} is not supported. Choose one of {list(TRAIN_ON_CHOICES)}.")
    if train_on == "downsample":
        return
    if settings.max_pool_size <= settings.num_generations:
        how = (
            f"round_size * max_rounds = {settings.max_pool_size} is num_generations, so the pool is the update group. "
            "Raise round_size or max_rounds, or remove train_on."
            if settings.has_exit_rule
            else f"sampler={settings.sampler!r} draws num_generations = {settings.num_generations} per prompt: its "
            "pool is its update group. Remove train_on, or use sampler='seq_pos', 'seq_balance' or 'est'."
        )
        raise ValueError(f"train_on='pool' trains on every draw of a pool larger than its update group, and {how}")
    if settings.baseline != "pool":
        raise ValueError(
            f"train_on='pool' trains on the whole pool, whose baseline is the pool's mean; baseline="
            f"{settings.baseline!r} would centre it on the mean of a downsampled group that is not trained on. Remove "
            "baseline (default 'pool'), or use train_on='downsample'."
        )
    if settings.sampler == "knapsack" and settings.options.train_on == "downsample":
        raise ValueError(
            "train_on='pool' trains on every draw of the pool and sampler_kwargs train_on='downsample' cuts each pool "
            "to num_generations: choose one. With sampler='knapsack' training on the whole pool is its train_on='all' "
            "(the default), which train_on='pool' leaves as it is: remove train_on from sampler_kwargs, or use "
            "train_on='downsample'."
        )
    if settings.sampler == "est" and settings.est_train_on == "downsample":
        raise ValueError(
            "train_on='pool' trains on every draw of the pool and est_train_on='downsample' cuts each pool to "
            "num_generations: choose one. With sampler='est' training on the whole pool is est_train_on='all' (its "
            "default), which train_on='pool' leaves as it is: remove est_train_on, or use train_on='downsample'."
        )
    default_downsample = SamplerSettings.__dataclass_fields__["downsample"].default
    if settings.downsample != default_downsample:
        raise ValueError(
            f"downsample={settings.downsample!r} chooses which draws of a pool enter the update, and train_on='pool' "
            f"trains on all of them. Remove downsample (default {default_downsample!r}), or use "
            "train_on='downsample'."
        )


def with_defaults(cls: type, args: Any) -> tuple[Any, set[str]]:
    """A `cls` holding every value of `args` (a config TRL has post-processed), its own fields' defaults for the rest,
    and the names of those fields."""
    upgraded = cls.__new__(cls)
    upgraded.__dict__.update(args.__dict__)
    unset = [f for f in fields(cls) if f.name not in args.__dict__]
    for f in unset:
        setattr(upgraded, f.name, f.default_factory() if f.default_factory is not MISSING else f.default)
    return upgraded, {f.name for f in unset}


TRAIN_ON_HELP = (
    'What a prompt trains on once its pool is done: `"downsample"` (its update group of `num_generations`) or `"pool"` '
    "(every draw of its pool, each advantage scaled by the share of its outcome's draws that the group kept, so the "
    'prompt weighs what its group would). `"pool"` needs `baseline="pool"` and a pool that can outgrow its group; the '
    "synchronous trainer leaves out a few draws so that TRL's batch splits evenly (see the docs)."
)


@dataclass
class TrainOnField:
    """`train_on`, declared once for both trainers' configs (a trainer's knob: samplers downsample as they always do)."""

    train_on: str = field(default="downsample", metadata={"help": TRAIN_ON_HELP, "choices": list(TRAIN_ON_CHOICES)})


ADA_ONLY_FIELDS = ("generation_schedule", "continuous_max_in_flight", "train_on")
"""The trainer's own knobs (not read by samplers): declared on `AdaGRPOConfig`, and `train_on` on `TrainOnField`."""


@dataclass
class AdaGRPOConfig(TrainOnField, SamplerFields, GRPOConfig):
    r"""
    Configuration class for [`AdaGRPOTrainer`] (Reinforce-Ada, [arXiv 2510.04996](https://huggingface.co/papers/2510.04996)).

    Inherits every parameter of [`~trl.GRPOConfig`]. `num_generations` keeps TRL's meaning: the size `n` of the
    *update group*, how many completions of each prompt enter the loss. Adaptive samplers may draw more than `n`
    completions for a prompt, then downsample the pool to exactly `n`, so the training step keeps TRL's shapes.

    A knob that the chosen sampler does not read must keep its default: any other value raises at construction,
    naming what reads it. The docs page "Configuration knobs" says what each knob is for.

    Parameters:
        > Parameters that control the adaptive sampling

        sampler (`str`, *optional*, defaults to `"seq_balance"`):
            Sampling strategy, a name registered with `trl_ada.samplers.register_sampler`. Built in: `"uniform"`
            (GRPO), `"seq_pos"`, `"seq_balance"` (rounds until a prompt meets its quotas), `"est"` and `"est_ema"`
            (budgets from pass rates), `"dapo"` (drops groups without a signal, refills); experimental plug-ins
            (`trl_ada.experimental`): `"knapsack"`, `"dapo_gated"` and `"spo"`. See the Samplers docs.
        sampler_kwargs (`dict` or `str` or `None`, *optional*, defaults to `None`):
            Keyword arguments for the chosen sampler's own options dataclass, as a dict or a JSON string. Of trl-ada's
            samplers, only the experimental plug-ins take any: `"knapsack"`
            (`trl_ada.experimental.knapsack.KnapsackOptions`), `"dapo_gated"`
            (`trl_ada.experimental.dapo_gated.GatedRefillOptions`) and `"spo"` (`trl_ada.experimental.spo.SpoOptions`).
        round_size (`int`, *optional*, defaults to `8`):
            Number of completions generated per active prompt in each round (`M` in the paper). Must be at least 1. Read
            by `"seq_pos"` and `"seq_balance"`.
        max_rounds (`int`, *optional*, defaults to `4`):
            Maximum number of rounds per generation batch. Must be at least 1, and `round_size * max_rounds`, the cap on
            the completions drawn for one prompt, must be at least `num_generations`. Read by `"seq_pos"` and
            `"seq_balance"`.
        positive_quota (`int` or `None`, *optional*, defaults to `None`):
            Number of positive completions a prompt needs before it retires. If `None`, it defaults to `1` for
            `"seq_pos"` and `num_generations // 2` for `"seq_balance"`. Must be at least 1, and the quotas together at
            most `round_size * max_rounds`.
        negative_quota (`int` or `None`, *optional*, defaults to `None`):
            Number of negative completions a prompt needs before it retires (`"seq_balance"` only). If `None`, it
            defaults to `num_generations - num_generations // 2`, so that the quotas fill a balanced update group.
        positive_threshold (`float`, *optional*, defaults to `0.5`):
            A completion counts as positive when its (weighted, summed) reward is strictly greater than this value. Must
            be finite.
        baseline (`str`, *optional*, defaults to `"pool"`):
            Baseline subtracted from each reward: `"pool"` (the mean reward of all the prompt's draws, as in the
            paper), `"group"` (the kept group's, as `GRPOTrainer`), `"tracked"` (the prompt's mean reward at earlier
            steps, SPO's) or `"predicted"` (a learned predictor's). The last two need rewards in [0, 1] and
            `scale_rewards="none"`.
        objective (`str`, *optional*, defaults to `"linear"`):
            Objective `f(p)` whose derivative weights each prompt, from `p̂`, the share of positives in its pool.
            Supported values are `"linear"` (weight 1), `"log"` (weight `1/p̂`, the paper's Seq estimator) and `"power"`
            (weight `α p̂^(α-1)`). Not read by `sampler="est"`, which weights through `est_sample_power`.
        power_alpha (`float`, *optional*, defaults to `0.5`):
            Exponent `α` of the `"power"` objective. Must lie in (0, 1]. Read only with `objective="power"`.
        max_weight (`float`, *optional*, defaults to `10.0`):
            Upper clip of the per-prompt weight, applied before normalisation. Must be positive and finite: the `"log"`
            weight `1/p̂` is unbounded as `p̂` goes to 0.
        normalize_weights (`bool`, *optional*, defaults to `True`):
            Whether to rescale the per-prompt weights of an update to mean 1. The mean is over the prompts with a
            non-zero advantage, so the objective changes how the update is spread over prompts, not its size. Has no
            effect with `objective="linear"`.
        normalize_advantages (`bool` or `None`, *optional*, defaults to `None`):
            Whether to normalise the update's advantages, `(A - mean A) / (std A + 1e-4)` over the rows of the
            prompts with a signal (SPO's batch normalisation), in place of `scale_rewards`, which must then be
            `"none"`. Meant for `baseline="tracked"`, whose unmixed groups have no spread of their own. If `None`, it
            is `True` for `sampler="spo"` (its recipe) and `False` otherwise.
        downsample (`str`, *optional*, defaults to `"balanced"`):
            How a pool is cut to `num_generations` completions. Supported values are `"balanced"` (up to
            `num_generations // 2` positives, the rest negatives, topped up from the other side when one is short) and
            `"random"`. Read by `"seq_pos"`, `"seq_balance"`, and by `"est"` and `"knapsack"` when they downsample.
        zero_variance_tolerance (`float`, *optional*, defaults to `1e-06`):
            Standard deviation at or below which rewards count as constant. A prompt whose baseline rewards (the pool
            with `baseline="pool"`, the kept group with `"group"`) are constant has no signal and gets zero advantages.
            Must be finite and non-negative.
        round_policy (`str`, *optional*, defaults to `"fixed"`):
            How many completions an active prompt asks for in each round. Supported values are `"fixed"` (`round_size`,
            as in the paper), `"predictive"` (`round_size` first, then the smallest request that meets the remaining
            quotas with probability `round_confidence`) and `"tracked"` (the same from the first round on, with pass
            rates remembered across epochs). Read by `"seq_pos"` and `"seq_balance"`.
        round_confidence (`float`, *optional*, defaults to `0.7`):
            Target probability of finishing a prompt in its next round. Must lie in (0, 1). Read with
            `round_policy="predictive"` or `"tracked"`.

        > Parameters of the pass-rate estimates (read by `sampler="est"` and by `round_policy="predictive"` /
        > `"tracked"`)

        pass_rate_decay (`float`, *optional*, defaults to `0.9`):
            Discount `λ` of a prompt's tracked counts at each visit: `N <- λN + n` and `K <- λK + k`. Must lie in (0,
            1]; `1` keeps the whole history. Read by `sampler="est"`, `"knapsack"` and `"dapo_gated"`, by
            `round_policy="tracked"` and by `baseline="tracked"` or `"predicted"`.
        pass_rate_prior_alpha (`float`, *optional*, defaults to `1.0`):
            `α` of the Beta prior of the pass-rate estimates. With it `p̂ = (K + α) / (N + α + β)`, so an unseen prompt
            reads `α / (α + β)`. Must be positive and finite. Read by `sampler="est"` and `"knapsack"`, by
            `round_policy="predictive"` or `"tracked"` and by `baseline="tracked"` or `"predicted"`.
        pass_rate_prior_beta (`float`, *optional*, defaults to `1.0`):
            `β` of the Beta prior of the pass-rate estimates (see `pass_rate_prior_alpha`). Must be positive and finite.
        pass_rate_predictor (`str`, *optional*, defaults to `"tracker"`):
            Source of the pass-rate estimates. Supported values are `"tracker"` (the decayed Beta counts), `"learned"`
            (an online model of the prompt text, whose prediction is the prior of the counts), or a local directory or
            Hub repo id holding a predictor saved by an earlier run, to warm-start from. Read by `sampler="est"` and
            `"knapsack"`, by `round_policy="predictive"` or `"tracked"` and by `baseline="predicted"`.
        pass_rate_predictor_learning_rate (`float`, *optional*, defaults to `0.1`):
            Adagrad step size of the learned pass-rate predictor. Must be positive and finite. Read only when
            `pass_rate_predictor` is not `"tracker"`; a resumed run uses this value, not the checkpoint's.
        skip_unmixed_above (`float` or `None`, *optional*, defaults to `None`):
            Skip adaptive sampling for prompts predicted to come back unmixed. A prompt whose predicted chance of an
            all-right or all-wrong group, `p̂^n + (1 - p̂)^n` with `n = num_generations`, is above this value draws
            `num_generations` (`est_min_samples` under `"est"`). If `None`, no prompt is skipped; otherwise it must lie
            in (0, 1). Read by `"est"` and `round_policy="tracked"` (or `"predictive"` with a learned predictor).

        > Parameters of `sampler="est"` (Reinforce-Ada-Est)

        est_sample_power (`float`, *optional*, defaults to `0.5`):
            Exponent `s` of `sampler="est"`'s budgets, `N_x ∝ p̂_x^-s`. The rest of the log objective's weight, `(p̂_x +
            est_epsilon)^-(1-s)`, weights the gradient. Must lie in [0, 1]: `0.5` is the paper's hybrid, `1.0` pure
            implicit weighting.
        est_min_samples (`int` or `None`, *optional*, defaults to `None`):
            Lower clip of a prompt's budget under `sampler="est"`. If `None`, it defaults to `2` with
            `est_train_on="all"` and to `num_generations` with `"downsample"`, the smallest values allowed.
        est_max_samples (`int` or `None`, *optional*, defaults to `None`):
            Upper clip of a prompt's budget under `sampler="est"`. If `None`, it defaults to `4 * num_generations`.
        est_mean_samples (`float` or `None`, *optional*, defaults to `None`):
            Average number of completions drawn per prompt under `sampler="est"`. A step of `B` prompts draws `round(B *
            est_mean_samples)`. Must lie in `[est_min_samples, est_max_samples]`. If `None`, it defaults to
            `num_generations` with `est_train_on="all"`, the only value allowed there, and to `2 * num_generations` with
            `"downsample"`.
        est_epsilon (`float`, *optional*, defaults to `0.01`):
            `ε` in the residual weight `(p̂_x + ε)^-(1-s)` of `sampler="est"`, which keeps it finite when a pool has no
            positive. Must be positive and finite.
        est_train_on (`str`, *optional*, defaults to `"all"`):
            What `sampler="est"` trains on. Supported values are `"all"` (every completion drawn: group sizes vary and
            the total stays `B * num_generations`, as in the paper) and `"downsample"` (draw `est_mean_samples` per
            prompt on average, then cut each pool to `num_generations`).

        > Parameters of DAPO's batch filling

        dapo_refill (`bool` or `None`, *optional*, defaults to `None`):
            Whether to drop prompts without a signal (see `zero_variance_tolerance`) and refill the batch from further
            prompts, as DAPO does. If `None`, it is on for `sampler="dapo"` and `"dapo_gated"` and off otherwise; `True`
            also combines with `"seq_pos"` and `"seq_balance"`.
        dapo_max_refills (`int`, *optional*, defaults to `10`):
            Maximum number of extra generation batches drawn per step to fill the batch (verl's `max_num_gen_batches`).
            Must be non-negative. Read when DAPO refills are on.
        dapo_on_exhausted (`str`, *optional*, defaults to `"raise"`):
            What to do when `dapo_max_refills` is reached before the batch is full. Supported values are `"raise"` (as
            in verl) and `"keep_partial"` (train on the prompts with a signal, padded with zero-advantage groups). Read
            when DAPO refills are on; the asynchronous trainer supports only `"raise"`.

        > Parameters of the generation schedule (read by `seq_pos` / `seq_balance`)

        generation_schedule (`str`, *optional*, defaults to `"rounds"`):
            How `"seq_pos"` and `"seq_balance"` generate their draws. Supported values are `"rounds"` (one generate call
            per round; every backend) and `"continuous"` (each prompt draws its own rounds as one-draw requests, without
            waiting for the other prompts; vLLM server mode, single-turn completions, no DAPO refills). Both give a
            prompt the same pool on the same draws.
        continuous_max_in_flight (`int`, *optional*, defaults to `2048`):
            Maximum number of draws in flight on the vLLM server with `generation_schedule="continuous"`. Further draws
            wait in submission order. Must be at least 1. The process's soft open-file limit is raised to fit it, and
            training fails at start, naming the fix, when the hard limit is lower.

        > What a prompt trains on

        train_on (`str`, *optional*, defaults to `"downsample"`):
            What a prompt trains on once its pool is done: `"downsample"` (its update group of `num_generations`) or
            `"pool"` (every draw of its pool, each advantage scaled by the share of its outcome's draws that the group
            kept, so the prompt weighs what its group would). `"pool"` needs `baseline="pool"` and a pool that can
            outgrow its group; the synchronous trainer leaves out a few draws so that TRL's batch splits evenly (see the
            docs).
    """

    generation_schedule: str = field(
        default="rounds",
        metadata={
            "help": 'How `"seq_pos"` and `"seq_balance"` generate their draws. Supported values are `"rounds"` (one '
            'generate call per round; every backend) and `"continuous"` (each prompt draws its own rounds as '
            "one-draw requests, without waiting for the other prompts; vLLM server mode, single-turn completions, "
            "no DAPO refills). Both give a prompt the same pool on the same draws.",
            "choices": list(GENERATION_SCHEDULES),
        },
    )
    continuous_max_in_flight: int = field(
        default=2048,
        metadata={
            "help": 'Maximum number of draws in flight on the vLLM server with `generation_schedule="continuous"`. '
            "Further draws wait in submission order. Must be at least 1. The process's soft open-file limit is "
            "raised to fit it, and training fails at start, naming the fix, when the hard limit is lower.",
        },
    )

    def __post_init__(self) -> None:
        with warnings.catch_warnings():
            if self.gradient_checkpointing is True and getattr(self, "activation_checkpointing", None) is None:
                # TRL's default, under the name transformers deprecates: nothing for the user to rename.
                warnings.filterwarnings("ignore", "`gradient_checkpointing` is deprecated", FutureWarning)
            super().__post_init__()
        self._validate_adaptive_sampling()

    @classmethod
    def from_grpo_config(cls, args: GRPOConfig, environment_owns_data: bool = False) -> AdaGRPOConfig:
        """An `AdaGRPOConfig` holding every value of `args` (already post-processed by TRL) and the Ada defaults,
        adapted so that it never rejects a config `GRPOTrainer` accepts: a `multi_objective_aggregation` other than
        `"sum_then_normalize"`, a `seed` in `generation_kwargs` with vLLM, or an environment that owns the data
        (`environment_owns_data`) falls back to `sampler="uniform"` with a warning, and `round_size` grows to
        `ceil(num_generations / max_rounds)` where the default cap is below `num_generations`."""
        if not isinstance(args, GRPOConfig):
            raise TypeError(f"args must be an AdaGRPOConfig or a trl.GRPOConfig, got {type(args).__name__}.")
        upgraded, unset_names = with_defaults(cls, args)
        if "sampler" in unset_names and upgraded.multi_objective_aggregation != "sum_then_normalize":
            logger.warning(
                "multi_objective_aggregation=%r normalises each reward function inside the group, and a pool "
                "baseline has no such per-function normalisation; training with sampler='uniform' (plain GRPO). "
                "Use multi_objective_aggregation='sum_then_normalize' for adaptive sampling.",
                upgraded.multi_objective_aggregation,
            )
            upgraded.sampler = "uniform"
        if "sampler" in unset_names and upgraded.use_vllm and upgraded._generation_seed() is not None:
            logger.warning(
                "generation_kwargs sets seed=%r, so vLLM returns the same completions for every request of one prompt, "
                "and adaptive sampling sends a prompt in several requests; training with sampler='uniform' (plain "
                "GRPO). Remove the seed from generation_kwargs for adaptive sampling.",
                upgraded._generation_seed(),
            )
            upgraded.sampler = "uniform"
        if "sampler" in unset_names and environment_owns_data:
            logger.warning(
                "No train_dataset with environment_factory: the environment owns the data, and its reset() may set up "
                "a new task for every episode, which adaptive sampling cannot pool; training with sampler='uniform' "
                "(plain GRPO). Pass a train_dataset whose rows name each task for adaptive sampling."
            )
            upgraded.sampler = "uniform"
        # Only rounds read round_size (the knob rule rejects it elsewhere), so it grows only for them.
        if "round_size" in unset_names and upgraded.sampler_settings(validate=False).reads("round_size"):
            needed = math.ceil(upgraded.num_generations / upgraded.max_rounds)
            upgraded.round_size = max(upgraded.round_size, needed)
        upgraded._validate_adaptive_sampling()
        logger.info("Got a GRPOConfig; using AdaGRPOConfig's Reinforce-Ada defaults (sampler=%r).", upgraded.sampler)
        return upgraded

    def _validate_adaptive_sampling(self) -> None:
        if not self.learning_rate >= 0.0 or math.isinf(self.learning_rate):  # NaN fails the first test
            raise ValueError(
                f"learning_rate={self.learning_rate} would step against the gradient or nowhere meaningful; give a "
                "positive, finite learning rate (e.g. 1e-6 for a 1.5B model, 1e-4 for the shipped tiny one)."
            )
        # Validates every sampler knob (and fills the sampler's defaults) before any model is loaded.
        settings = self.sampler_settings()
        if self.multi_objective_aggregation != "sum_then_normalize" and not (
            self.sampler == "uniform" and grpo_rule_holds(settings, self.train_on)
        ):
            # Only where TRL's own advantages are trained does its per-function normalisation take effect.
            raise ValueError(
                f"multi_objective_aggregation={self.multi_objective_aggregation!r} normalises each reward function "
                "inside the group, which TRL applies only to its own group advantages: with any other sampler, "
                "baseline, weight or normalisation trl-ada trains its own advantages and the aggregation "
                "would be replaced. Use multi_objective_aggregation='sum_then_normalize' (TRL's default), or "
                "sampler='uniform' with its default baseline, objective and normalize_advantages."
            )
        self._validate_generation_schedule(settings)
        check_train_on(self.train_on, settings)
        if self.train_on == "pool":
            loss_normaliser(self.loss_type)  # the step scale reads what the loss divides by
        self._validate_generation_seed(settings)
        self._warn_one_prompt_generation_batch(settings)
        # What the sampler filled in (quotas, est bounds, parsed sampler_kwargs) is what the run uses: show it here.
        for f in fields(SamplerFields):
            setattr(self, f.name, getattr(settings, f.name))
        self.scale_rewards = settings.scale_rewards  # TRL's knob, which a sampler's recipe may fill

    def _warn_one_prompt_generation_batch(self, settings: SamplerSettings) -> None:
        # The sampler's batch-level rules compare the prompts of a generation batch; over one prompt (TRL's defaults:
        # 8 samples, num_generations 8) they do nothing. A warning, not an error: the batch is TRL's and GRPOTrainer
        # accepts it. `scale_rewards="batch"` is TRL's own rule, which one prompt leaves as GRPOTrainer has it.
        rules = batch_rules(replace(settings, scale_rewards="group"))
        if rules is None or self.generation_batch_size // self.num_generations > 1:
            return
        logger.warning(
            "A generation batch holds one prompt (generation_batch_size=%d = per_device_train_batch_size %d x "
            "steps_per_generation %d x processes, over num_generations=%d), and %s compare the prompts of a "
            "generation batch: over one prompt est gives every prompt its mean budget and the weight normalisation "
            "scales every weight back to 1, so they do nothing. Raise per_device_train_batch_size or "
            "steps_per_generation (or generation_batch_size) so that a generation batch holds several prompts.",
            self.generation_batch_size,
            self.per_device_train_batch_size,
            self.steps_per_generation,
            self.num_generations,
            rules,
        )

    def _generation_seed(self) -> Any:
        generation_kwargs = self.generation_kwargs
        return generation_kwargs.get("seed") if isinstance(generation_kwargs, dict) else None

    def _validate_generation_seed(self, settings: SamplerSettings) -> None:
        # vLLM draws the n completions of one request from seeds seed, seed + 1, ...; two requests for one prompt with
        # the same seed return the same completions, so a pool would be one completion (or one round) repeated.
        seed = self._generation_seed()
        if seed is None or not self.use_vllm:
            return  # transformers generation does not read a seed from generation_kwargs
        one_request_per_prompt = settings.one_request_per_prompt and (
            not settings.has_exit_rule or (self.generation_schedule == "rounds" and self.vllm_mode == "server")
        )
        if one_request_per_prompt:
            return
        if not settings.has_exit_rule:
            how = f"sampler={settings.sampler!r} gives prompts different budgets, so vLLM receives its draws one per request"
        elif self.generation_schedule == "continuous":
            how = "generation_schedule='continuous' sends every draw as its own request"
        elif self.vllm_mode != "server":
            how = f"vllm_mode={self.vllm_mode!r} sends every completion as its own request"
        else:
            how = f"sampler={settings.sampler!r} sends each prompt again in every round (max_rounds={self.max_rounds})"
        raise ValueError(
            f"generation_kwargs sets seed={seed!r}: vLLM then returns the same completions for every request of one "
            f"prompt with that seed, and {how}, so a prompt's pool would repeat the same completions. Remove 'seed' "
            "from generation_kwargs (the training seed, `seed`, still makes the sampler's choices reproducible), or "
            "use sampler='uniform' or 'dapo'."
        )

    def _validate_generation_schedule(self, settings: SamplerSettings) -> None:
        # The trainer's own knobs (the sampler knobs are checked by the settings): choices, values, the unread rule.
        check_choices(self, ["generation_schedule"])
        if not self.continuous_max_in_flight >= 1:
            raise ValueError(f"continuous_max_in_flight must be at least 1, got {self.continuous_max_in_flight}.")
        check_choices(self, ["train_on"])
        if self.generation_schedule != "continuous":
            where = f"generation_schedule={self.generation_schedule!r}"
            check_unread_knob(self, "continuous_max_in_flight", where, "generation_schedule='continuous'")
        if self.generation_schedule == "rounds":
            return
        if not settings.has_exit_rule or settings.refills:
            raise ValueError(
                f"generation_schedule='continuous' schedules the draws of sampler='seq_pos' or 'seq_balance' (without "
                f"DAPO refills); sampler={settings.sampler!r}{' with dapo_refill' if settings.refills else ''} draws "
                "in one pass. Use generation_schedule='rounds', or sampler='seq_balance'."
            )
        if not self.use_vllm or self.vllm_mode != "server":
            backend = f"vLLM in {self.vllm_mode!r} mode" if self.use_vllm else "transformers generation"
            raise ValueError(
                f"generation_schedule='continuous' keeps each prompt's draws in flight on a vLLM server as separate "
                "requests; "
                f"{backend} generates in synchronous calls. Set use_vllm=True, vllm_mode='server' (start the server "
                "with `trl vllm-serve`), or use generation_schedule='rounds'."
            )

    def sampler_settings(self, validate: bool = True) -> SamplerSettings:
        """The pure-Python sampler settings this config describes (raises `ValueError` on an invalid combination)."""
        settings = SamplerSettings(**{f.name: getattr(self, f.name) for f in fields(SamplerSettings)})
        return settings.validated() if validate else settings
