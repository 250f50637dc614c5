"""Configuration for [`AdaAsyncGRPOTrainer`]: TRL's `AsyncGRPOConfig` plus the sampler knobs, declared once."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, fields

from trl.experimental.async_grpo import AsyncGRPOConfig

from ..config import TrainOnField, batch_rules, check_train_on, with_defaults
from ..samplers import GatesRefills, SamplerSettings
from ..samplers.settings import SamplerFields, check_knobs_read, check_unread_knob

logger = logging.getLogger(__name__)


def gates_refills(settings: SamplerSettings) -> bool:
    """Whether the sampler of the validated `settings` refills DAPO's batch through a gate ([`GatesRefills`]), which
    the worker's stream then passes through (`trl_ada.async_grpo.rollout.StreamGate`)."""
    return settings.refills and issubclass(settings.sampler_class, GatesRefills)


def worker_batch_rules(settings: SamplerSettings) -> str | None:
    """What in the validated `settings` reads a whole generation batch of the worker (named for messages), or `None`:
    the synchronous trainer's `batch_rules`, and a refill gate (it measures the mixed share per generation batch)."""
    rules = batch_rules(settings)
    if not gates_refills(settings):
        return rules
    gate = f"sampler={settings.sampler!r} (its gate measures the share of mixed groups over generation batches)"
    return gate if rules is None else f"{rules} and {gate}"


MIN_PROMPTS_PER_GENERATION_BATCH = 8
"""The fewest prompts a generation batch holds by default where a rule reads the whole batch: TRL's defaults (8 samples
per optimizer step, 8 per prompt) would otherwise make a batch of one prompt, over which those rules do nothing."""


def check_prompts_per_generation_batch(prompts: int, settings: SamplerSettings) -> None:
    """Raise `ValueError`, naming the fix, where generation batches of `prompts` prompts cannot serve the validated
    `settings`: fewer than one, or one where a rule reads the whole batch."""
    if isinstance(prompts, bool) or not isinstance(prompts, int) or prompts < 1:
        raise ValueError(f"prompts_per_generation_batch must be a positive integer or None, got {prompts!r}.")
    rules = worker_batch_rules(settings)
    if prompts == 1 and rules is not None:
        raise ValueError(
            f"prompts_per_generation_batch=1 with {rules}: these rules compare the prompts of a generation batch, and "
            "over one prompt est gives every prompt its mean budget and the weight normalisation scales every weight "
            "back to 1, so they would do nothing. Use at least 2 prompts (default None: one optimizer step's prompts, "
            f"and at least {MIN_PROMPTS_PER_GENERATION_BATCH})."
        )


def resolve_prompts_per_generation_batch(
    requested: int | None, settings: SamplerSettings, samples_per_step: int
) -> int:
    """The prompts of one generation batch (`AdaAsyncGRPOConfig.prompts_per_generation_batch`): 1 where every rule
    reads one prompt's pool; else `requested`, by default one optimizer step's prompts (`samples_per_step //
    num_generations`) and at least `MIN_PROMPTS_PER_GENERATION_BATCH`."""
    if worker_batch_rules(settings) is None:
        return 1
    if requested is not None:
        return requested
    return max(MIN_PROMPTS_PER_GENERATION_BATCH, samples_per_step // settings.num_generations)


SYNC_ONLY_KNOBS = {
    "dapo_on_exhausted": "the asynchronous worker has no partial batch to keep (it fails once dapo_max_refills is "
    "reached), so it does not read it (AdaGRPOConfig does).",
}
"""Sampler knobs of the synchronous trainer's refills that the asynchronous stream has no use for, and why."""


@dataclass
class AdaAsyncGRPOConfig(TrainOnField, SamplerFields, AsyncGRPOConfig):
    r"""
    Configuration class for [`AdaAsyncGRPOTrainer`]: Reinforce-Ada ([arXiv 2510.04996](https://huggingface.co/papers/2510.04996))
    in TRL's asynchronous trainer, where a rollout worker keeps generating while the trainer trains.

    Inherits every parameter of [`~trl.experimental.async_grpo.AsyncGRPOConfig`]. `num_generations` keeps TRL's
    meaning: the size `n` of a prompt's update group. The sampler knobs are those of [`AdaGRPOConfig`], with the same
    meanings. In the asynchronous worker every draw is its own request (`seq_pos`/`seq_balance` draw round-free, as
    `generation_schedule="continuous"` does), a prompt's kept samples are queued as soon as its pool is done (only
    rules that read the whole batch make prompts wait, in batches of `prompts_per_generation_batch`), rewards are
    scaled by the group's std unless `scale_rewards` says otherwise, `dapo` keeps drawing further prompts in place of
    the groups it drops (so `dapo_on_exhausted` must keep its default), `spo` draws its prompts from the stream by
    priority, and `sampler="uniform"` with `objective="linear"` is exactly `AsyncGRPOTrainer`. The docs page
    "Asynchronous training" says what happens per sampler.

    Parameters:
        > Parameters of adaptive sampling: those of [`AdaGRPOConfig`], with the same names, defaults and meanings

        > Parameters of the asynchronous trainer

        train_on (`str`, *optional*, defaults to `"downsample"`):
            What a prompt trains on once its pool is done, as in [`AdaGRPOConfig`] (one declaration for both). Here
            TRL's packing needs no static shapes, so no draw of a pool is left out.
        scale_rewards (`str`, *optional*, defaults to `"group"`):
            How the centred rewards are scaled, as `GRPOConfig.scale_rewards`: `"group"` divides them by the standard
            deviation of the group (the only rule of TRL's asynchronous trainer), `"batch"` by that of the generation
            batch, and `"none"` leaves them unscaled. `baseline="tracked"` or `"predicted"` needs `"batch"` or
            `"none"` (SPO's recipe: `"none"` with `normalize_advantages=True`); the worker then computes every
            advantage itself.
        prompts_per_generation_batch (`int` or `None`, *optional*, defaults to `None`):
            Number of prompts per generation batch when a rule reads the whole batch. Those rules are `sampler="est"`,
            `"knapsack"` and `"dapo_gated"`, and `objective="log"` or `"power"` with `normalize_weights`. If `None`, it
            defaults to one optimizer step's prompts, and at least 8. Must be at least 2 with those rules; without them
            each prompt is a batch of its own and this must stay `None`.
    """

    scale_rewards: str = field(
        default="group",
        metadata={
            "help": 'How the centred rewards are scaled, as `GRPOConfig.scale_rewards`: `"group"` divides them by the '
            'standard deviation of the group (the only rule of TRL\'s asynchronous trainer), `"batch"` by that of '
            'the generation batch, and `"none"` leaves them unscaled. `baseline="tracked"` or `"predicted"` needs '
            '`"batch"` or `"none"` (SPO\'s recipe: `"none"` with `normalize_advantages=True`); the worker then '
            "computes every advantage itself.",
            "choices": ["group", "batch", "none"],
        },
    )
    prompts_per_generation_batch: int | None = field(
        default=None,
        metadata={
            "help": "Number of prompts per generation batch when a rule reads the whole batch. Those rules are "
            '`sampler="est"`, `"knapsack"` and `"dapo_gated"`, and `objective="log"` or `"power"` with '
            "`normalize_weights`. If `None`, it defaults to one optimizer step's prompts, and at least "
            f"{MIN_PROMPTS_PER_GENERATION_BATCH}. Must be at least 2 with those rules; without them each prompt is a "
            "batch of its own and this must stay `None`.",
        },
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        self._validate_adaptive_sampling()

    @classmethod
    def from_async_config(cls, args: AsyncGRPOConfig) -> AdaAsyncGRPOConfig:
        """An `AdaAsyncGRPOConfig` holding every value of `args` (already post-processed by TRL) and the Ada defaults."""
        if not isinstance(args, AsyncGRPOConfig):
            raise TypeError(
                f"args must be an AdaAsyncGRPOConfig or a trl.experimental.async_grpo.AsyncGRPOConfig, got "
                f"{type(args).__name__}."
            )
        upgraded, _ = with_defaults(cls, args)
        upgraded._validate_adaptive_sampling()
        logger.info("Got an AsyncGRPOConfig; using the Reinforce-Ada defaults (sampler=%r).", upgraded.sampler)
        return upgraded

    def _validate_adaptive_sampling(self) -> None:
        settings = self.sampler_settings()  # every knob's own check and the unread-knob rule, before any model loads
        if worker_batch_rules(settings) is None:  # only a rule that reads the whole batch reads the batch's size
            where = ", ".join(f"{key}={getattr(self, key)!r}" for key in ("sampler", "objective", "normalize_weights"))
            readers = (
                "sampler='est', 'knapsack' and 'dapo_gated' and objective='log' or 'power' with normalize_weights=True"
            )
            check_unread_knob(self, "prompts_per_generation_batch", where, readers)
        check_train_on(self.train_on, settings)
        if self.prompts_per_generation_batch is not None:
            check_prompts_per_generation_batch(self.prompts_per_generation_batch, settings)
        # What the sampler filled in (quotas, est bounds, parsed sampler_kwargs) is what the run uses: show it here.
        for f in fields(SamplerFields):
            setattr(self, f.name, getattr(settings, f.name))
        self.scale_rewards = settings.scale_rewards  # TRL's knob, which a sampler's recipe may fill

    def sampler_settings(self) -> SamplerSettings:
        """The pure-Python sampler settings this config describes (raises `ValueError` on an invalid combination)."""
        values = {f.name: getattr(self, f.name) for f in fields(SamplerSettings) if hasattr(self, f.name)}
        # Before the settings' own checks: a knob this trainer never reads is named as such, not as a combination.
        check_knobs_read(self, SYNC_ONLY_KNOBS, SamplerSettings(**values), not_read=SYNC_ONLY_KNOBS)
        return SamplerSettings(**values).validated()


ASYNC_ONLY_FIELDS = ("prompts_per_generation_batch",)
"""The asynchronous trainer's own knobs (not read by samplers), declared on `AdaAsyncGRPOConfig` (`train_on`, a knob of
both trainers, is `TrainOnField`'s)."""
