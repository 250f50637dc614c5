"""Configuration for [`AdaAsyncGRPOTrainer`]: TRL's `AsyncGRPOConfig` plus the sampler knobs, declared once."""

from __future__ import annotations

import logging
from dataclasses import MISSING, dataclass, fields

from trl.experimental.async_grpo import AsyncGRPOConfig

from ..samplers import SamplerFields, SamplerSettings
from ..samplers.settings import knob, render_parameters

logger = logging.getLogger(__name__)

HEADER = r"""
    Configuration class for [`AdaAsyncGRPOTrainer`]: Reinforce-Ada ([arXiv 2510.04996](https://huggingface.co/papers/2510.04996))
    in TRL's asynchronous trainer, where a rollout worker keeps generating while the trainer trains.

    Inherits every parameter of [`~trl.experimental.async_grpo.AsyncGRPOConfig`]. `num_generations` keeps TRL's
    meaning: the size `n` of a prompt's update group. The sampler knobs below are those of [`AdaGRPOConfig`], declared
    once in `trl_ada.samplers.settings.SamplerFields`, with the same meanings; what differs in the asynchronous worker:

    - `seq_pos`/`seq_balance` draw each prompt's rounds as blocks, round-free (each draw its own request, the exit rule
      and the cap checked when a block is back, the pool in submission order), as `generation_schedule="continuous"`
      does in the synchronous trainer; `est` sends each prompt's budget at once.
    - A prompt's kept samples are queued as soon as its pool is done. Only where a rule reads the whole generation
      batch (`est`'s mean budget, `normalize_weights` with a weighting `objective`, `scale_rewards="batch"`) do the
      prompts wait for one another, in batches of `per_device_train_batch_size * gradient_accumulation_steps *
      world_size / num_generations` prompts (one optimizer step's worth).
    - `dapo` drops groups without a signal and keeps drawing further prompts. `dapo_max_refills` bounds the drawing
      as in the synchronous trainer: once `(dapo_max_refills + 1)` generation batches' worth of prompts in a row have
      not filled one batch with prompts that carry a signal (a reward that is constant everywhere), the worker fails
      naming the cause. There is no partial batch to keep, so `dapo_on_exhausted` must keep its default.
    - Rewards are scaled as TRL's asynchronous trainer scales them (by the group's std: `scale_rewards="group"`).
    - `sampler="uniform"` is exactly `AsyncGRPOTrainer` (its loop, groups and advantages; its worker with the fixes
      of `RobustAsyncRolloutWorker`).
    - `train_on="pool"` (below, the one knob of this trainer alone) trains on every draw of a pool instead of its
      update group: TRL's packing needs no static shapes.

    Parameters:
"""

SECTION_ASYNC = "Parameters of the asynchronous trainer"

TRAIN_ON_CHOICES = ("downsample", "pool")


def check_train_on(train_on: str, settings: SamplerSettings) -> None:
    """
    Raise `ValueError`, naming the fix, where `train_on` (see `AdaAsyncGRPOConfig.train_on`) cannot hold with the
    validated `settings`. The one rule: the config checks it at construction, the rollout loop's `AsyncSampling` too.
    """
    if train_on not in TRAIN_ON_CHOICES:
        raise ValueError(f"train_on={train_on!r} is not supported. Choose one of {list(TRAIN_ON_CHOICES)}.")
    if train_on == "downsample":
        return
    if settings.max_pool_size <= settings.num_generations:
        how = (
            f"round_size * max_rounds = {settings.max_pool_size} is num_generations, so the pool is the update group. "
            "Raise round_size or max_rounds, or remove train_on."
            if settings.sampler_class.has_exit_rule
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
    if settings.sampler == "est" and settings.est_train_on == "downsample":
        raise ValueError(
            "train_on='pool' trains on every draw of the pool and est_train_on='downsample' cuts each pool to "
            "num_generations: choose one. With sampler='est' training on the whole pool is est_train_on='all' (its "
            "default), which train_on='pool' leaves as it is: remove est_train_on, or use train_on='downsample'."
        )


SYNC_ONLY_KNOBS = ("dapo_on_exhausted",)
"""Sampler knobs of the synchronous trainer's refills that the asynchronous stream has no use for."""


@dataclass
class AdaAsyncGRPOConfig(SamplerFields, AsyncGRPOConfig):
    # The docstring is rendered from the fields' metadata (`__doc__` below), as AdaGRPOConfig's is.

    train_on: str = knob(
        "downsample",
        'What a prompt of `seq_pos`, `seq_balance` or `est` trains on once its pool is done. `"downsample"`: its '
        'update group, the pool cut to `num_generations` as in the synchronous trainer. `"pool"`: every draw of the '
        "pool, in submission order, each with its own draw's policy version and the advantage the update group's rule "
        "gives it, `w_x (r_i - p̂_x)` with the same baseline (the pool's mean reward `p̂_x`), weight `w_x` and std "
        "scaling (TRL's asynchronous trainer packs its samples, so it needs no static shapes). A prompt then "
        "contributes as many rows as it drew: hard prompts, whose pools are larger, weigh more in the loss (as "
        '`est_train_on="all"` does in the synchronous trainer), and an optimizer step of '
        "`per_device_train_batch_size * gradient_accumulation_steps * world_size` samples holds fewer prompts. Needs a "
        "pool that can outgrow its update group (not `uniform` or `dapo`, whose pool is their group) and "
        '`baseline="pool"`. With `est` it is what `est_train_on="all"` (the default) already does; '
        '`est_train_on="downsample"` contradicts it and raises.',
        choices=TRAIN_ON_CHOICES,
        section=SECTION_ASYNC,
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
        upgraded = cls.__new__(cls)
        upgraded.__dict__.update(args.__dict__)
        for f in fields(cls):
            if f.name not in args.__dict__:
                setattr(upgraded, f.name, f.default_factory() if f.default_factory is not MISSING else f.default)
        upgraded._validate_adaptive_sampling()
        logger.info("Got an AsyncGRPOConfig; using the Reinforce-Ada defaults (sampler=%r).", upgraded.sampler)
        return upgraded

    def _validate_adaptive_sampling(self) -> None:
        settings = self.sampler_settings()  # every knob's own check and the unread-knob rule, before any model loads
        for name in SYNC_ONLY_KNOBS:
            default = SamplerFields.__dataclass_fields__[name].default
            if getattr(self, name) != default:
                raise ValueError(
                    f"{name}={getattr(self, name)!r}: the asynchronous worker has no partial batch to keep (it "
                    f"fails once dapo_max_refills is reached). Remove {name} (AdaGRPOConfig reads it)."
                )
        check_train_on(self.train_on, settings)
        # What the sampler filled in (quotas, est bounds, parsed sampler_kwargs) is what the run uses: show it here.
        for f in fields(SamplerFields):
            setattr(self, f.name, getattr(settings, f.name))

    def sampler_settings(self) -> SamplerSettings:
        """The pure-Python sampler settings this config describes (raises `ValueError` on an invalid combination)."""
        # AsyncGRPOConfig has no `scale_rewards`: its trainer always scales by the group's std, SamplerSettings' default.
        values = {f.name: getattr(self, f.name) for f in fields(SamplerSettings) if hasattr(self, f.name)}
        return SamplerSettings(**values).validated()


ASYNC_ONLY_FIELDS = ("train_on",)
"""The asynchronous trainer's own knobs (not read by samplers), declared on `AdaAsyncGRPOConfig`."""

AdaAsyncGRPOConfig.__doc__ = HEADER + render_parameters(
    [*fields(SamplerFields), *(AdaAsyncGRPOConfig.__dataclass_fields__[name] for name in ASYNC_ONLY_FIELDS)]
)
