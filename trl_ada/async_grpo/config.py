"""Configuration for [`AdaAsyncGRPOTrainer`]: TRL's `AsyncGRPOConfig` plus the sampler knobs, declared once."""

from __future__ import annotations

import logging
from dataclasses import MISSING, dataclass, fields

from trl.experimental.async_grpo import AsyncGRPOConfig

from ..config import batch_rules
from ..samplers import Sampler, SamplerFields, SamplerSettings
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
      batch (`est`'s mean budget, `normalize_weights` with a weighting `objective`) do the prompts wait for one
      another, in generation batches of `prompts_per_generation_batch` prompts (below).
    - `knapsack` splits each generation batch's budget over its prompts, as `est` does.
    - `dapo` drops groups without a signal and keeps drawing further prompts. `dapo_max_refills` bounds the drawing
      as in the synchronous trainer: once `(dapo_max_refills + 1)` generation batches' worth of prompts in a row have
      not filled one batch with prompts that carry a signal (a reward that is constant everywhere), the worker fails
      naming the cause. With `normalize_weights` and a weighting `objective`, kept prompts wait until a generation
      batch's worth (`prompts_per_generation_batch`) has a signal, and their weights are normalised over them. There
      is no partial batch to keep, so `dapo_on_exhausted` must keep its default.
    - `dapo_gated` draws the prompt stream as `dapo` does, with the refill's gate: a prompt's first row in an epoch
      (`len(train_dataset)` prompts kept with a signal, TRL's count of an epoch) is the loader's and is always made;
      when the stream meets it again within the epoch (a refill, since drops made the epoch need more draws) the
      prompt is passed over if the gate predicts it unmixed. Its gate measures the mixed share over generation
      batches of `prompts_per_generation_batch` prompts.
    - Rewards are scaled as TRL's asynchronous trainer scales them (by the group's std: `scale_rewards="group"`).
    - `sampler="uniform"` with `objective="linear"` is exactly `AsyncGRPOTrainer` (its loop, groups and advantages;
      its worker with the fixes of `RobustAsyncRolloutWorker`). Where the advantages are not TRL's (a weighting
      `objective` with any sampler, `est`'s residual weight, a pool that outgrows its update group), the worker
      computes them with the synchronous trainer's code, as `AdaGRPOTrainer` does: no knob is accepted and ignored.
    - `train_on="pool"` (below, a knob of this trainer alone) trains on every draw of a pool instead of its
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


def gates_refills(settings: SamplerSettings) -> bool:
    """
    Whether the sampler of the validated `settings` refills DAPO's batch through a gate (`sampler="dapo_gated"`, or a
    plug-in overriding [`Sampler.refill_passes_over`]): the worker then passes over the prompts of the stream that the
    gate rejects on a refill visit (`trl_ada.async_grpo.rollout.StreamGate`).
    """
    return settings.refills and settings.sampler_class.refill_passes_over is not Sampler.refill_passes_over


def worker_batch_rules(settings: SamplerSettings) -> str | None:
    """
    What in the validated `settings` reads a whole generation batch of the worker (named for messages), or `None`:
    the synchronous trainer's `batch_rules`, and a refill gate, whose measured share of mixed groups is a generation
    batch's (`GatedRefillSampler.end_step`), as in the synchronous trainer.
    """
    rules = batch_rules(settings)
    if not gates_refills(settings):
        return rules
    gate = f"sampler={settings.sampler!r} (its gate measures the share of mixed groups over generation batches)"
    return gate if rules is None else f"{rules} and {gate}"


MIN_PROMPTS_PER_GENERATION_BATCH = 8
"""The fewest prompts a generation batch holds by default where a rule reads the whole batch
(`AdaAsyncGRPOConfig.prompts_per_generation_batch=None`): TRL's defaults (8 samples per optimizer step, 8 per prompt)
would otherwise make a batch of one prompt, over which those rules do nothing."""


def check_prompts_per_generation_batch(prompts: int, settings: SamplerSettings) -> None:
    """
    Raise `ValueError`, naming the fix, where generation batches of `prompts` prompts cannot serve the validated
    `settings`: fewer than one, or one where a rule reads the whole batch (over one prompt `est` gives every prompt its
    mean budget and `normalize_weights` scales every weight back to 1). The one rule: the config checks its knob with
    it, the rollout loop's `AsyncSampling` its batch size.
    """
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
    """
    The prompts of one generation batch (`AdaAsyncGRPOConfig.prompts_per_generation_batch`): 1 where every rule reads
    one prompt's pool; else `requested`, by default one optimizer step's prompts (`samples_per_step //
    num_generations`) and at least `MIN_PROMPTS_PER_GENERATION_BATCH`.
    """
    if worker_batch_rules(settings) is None:
        return 1
    if requested is not None:
        return requested
    return max(MIN_PROMPTS_PER_GENERATION_BATCH, samples_per_step // settings.num_generations)


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
        "scaling, times `num_generations / pool size` (TRL's asynchronous trainer packs its samples, so it needs no "
        "static shapes). A prompt's advantages then sum, over its pool, to what its update group's would: it weighs "
        "`w_x` in the loss (the paper's `1/p̂` under the log objective), however many draws its exit rule took, where "
        "unscaled a `seq_pos` prompt drawing about `1/p̂` would weigh about `w_x / p̂`. An optimizer step of "
        "`per_device_train_batch_size * gradient_accumulation_steps * world_size` samples holds fewer prompts, and "
        "TRL's safety ceiling on `max_steps` (set when `max_steps` is not) grows by `round_size * max_rounds / "
        "num_generations` so that it cannot end training before `num_train_epochs`. Needs a pool that can outgrow its "
        'update group (not `uniform` or `dapo`, whose pool is their group) and `baseline="pool"`. With `est` it is '
        'what `est_train_on="all"` (the default) already does (its kept group is its pool, its budget its implicit '
        'weight: nothing is scaled); `est_train_on="downsample"` contradicts it and raises.',
        choices=TRAIN_ON_CHOICES,
        section=SECTION_ASYNC,
    )
    prompts_per_generation_batch: int | None = knob(
        None,
        'Prompts per generation batch where a rule reads the whole batch: `sampler="est"` (its budgets share the '
        "batch's mean, `est_mean_samples`: a hard prompt draws more because an easy one of the same batch draws less), "
        '`"knapsack"` (the batch\'s budget split by a knapsack), `"dapo_gated"` (its gate\'s share of mixed groups) '
        'and a weighting `objective` (`"log"`, `"power"`) with `normalize_weights` (weights rescaled to mean 1 '
        "over the batch's prompts). The batch's samples are queued once its last prompt is done. `None`: one "
        "optimizer step's prompts, `per_device_train_batch_size * gradient_accumulation_steps * world_size // "
        f"num_generations`, and at least {MIN_PROMPTS_PER_GENERATION_BATCH} (TRL's defaults make one prompt per "
        "step, over which those rules would do nothing). 1 is rejected with those rules. Where every rule reads one "
        "prompt's pool (`seq_*`, `uniform`, `dapo` with a linear objective, or `normalize_weights=False`) each "
        "prompt is a batch of its own, its samples queued as soon as its pool is done, and this knob must keep its "
        "default.",
        doc_type="`int` or `None`",
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
        self._check_prompts_per_generation_batch(settings)
        # What the sampler filled in (quotas, est bounds, parsed sampler_kwargs) is what the run uses: show it here.
        for f in fields(SamplerFields):
            setattr(self, f.name, getattr(settings, f.name))

    def _check_prompts_per_generation_batch(self, settings: SamplerSettings) -> None:
        requested = self.prompts_per_generation_batch
        if requested is None:
            return
        check_prompts_per_generation_batch(requested, settings)
        # The unread-knob rule: a value nothing reads would be silently ignored.
        if worker_batch_rules(settings) is None:
            raise ValueError(
                f"prompts_per_generation_batch={requested!r} has no effect with sampler={settings.sampler!r}, "
                f"objective={settings.objective!r}, normalize_weights={settings.normalize_weights!r}: every rule "
                "reads one prompt's pool, so each prompt is a generation batch of its own (its samples queued as soon "
                "as its pool is done). Remove prompts_per_generation_batch (default None). It is read by "
                "sampler='est', 'knapsack' and 'dapo_gated' and by objective='log' or 'power' with "
                "normalize_weights=True."
            )

    def sampler_settings(self) -> SamplerSettings:
        """The pure-Python sampler settings this config describes (raises `ValueError` on an invalid combination)."""
        # AsyncGRPOConfig has no `scale_rewards`: its trainer always scales by the group's std, SamplerSettings' default.
        values = {f.name: getattr(self, f.name) for f in fields(SamplerSettings) if hasattr(self, f.name)}
        return SamplerSettings(**values).validated()


ASYNC_ONLY_FIELDS = ("train_on", "prompts_per_generation_batch")
"""The asynchronous trainer's own knobs (not read by samplers), declared on `AdaAsyncGRPOConfig`."""

AdaAsyncGRPOConfig.__doc__ = HEADER + render_parameters(
    [*fields(SamplerFields), *(AdaAsyncGRPOConfig.__dataclass_fields__[name] for name in ASYNC_ONLY_FIELDS)]
)
