"""Configuration for [`AdaGRPOTrainer`]."""

from __future__ import annotations

import logging
import math
import warnings
from collections.abc import Callable
from dataclasses import MISSING, dataclass, fields, replace
from typing import Any

from trl import GRPOConfig

from .samplers import SamplerFields, SamplerSettings, sampler_class
from .samplers.settings import check_knobs_read, knob, knob_extras, render_parameters
from .samplers.simulate import GENERATION_SCHEDULES

DEPRECATED_NAMES: dict[str, str] = {
    "est_decay": "pass_rate_decay",
    "est_prior_alpha": "pass_rate_prior_alpha",
    "est_prior_beta": "pass_rate_prior_beta",
}
"""Old knob names still accepted (with a `FutureWarning`), and the names that replaced them."""

CONFIG_KNOB_USES: dict[str, tuple[Callable[[Any], bool], str, tuple[str, ...]]] = {
    "continuous_max_in_flight": (
        lambda config: config.generation_schedule == "continuous",
        "generation_schedule='continuous'",
        ("generation_schedule",),
    ),
}
"""The trainer-level knobs under the unread-knob rule: knob -> (reads(config), what reads it, settings deciding it)."""

logger = logging.getLogger(__name__)


def batch_rules(settings: SamplerSettings) -> str | None:
    """
    What in the validated `settings` reads a whole generation batch (named for messages), or `None` where every rule
    reads one prompt's pool (`Sampler.rules_are_per_prompt`). Over a batch of one prompt such a rule does nothing:
    `est` gives every prompt its mean budget, `normalize_weights` scales every weight back to 1.
    """
    if settings.sampler_class.rules_are_per_prompt(settings):
        return None
    named = []
    if settings.sampler == "est":
        named.append("sampler='est' (its budgets share the batch's mean, est_mean_samples)")
    if settings.scale_rewards == "batch":
        named.append("scale_rewards='batch' (the batch's reward std)")
    if settings.normalize_weights and settings.objective != "linear":
        named.append(f"objective={settings.objective!r} with normalize_weights=True (weights rescaled to mean 1)")
    return " and ".join(named) or f"sampler={settings.sampler!r} (its rules_are_per_prompt() is False)"


HEADER = r"""
    Configuration class for [`AdaGRPOTrainer`] (Reinforce-Ada, [arXiv 2510.04996](https://huggingface.co/papers/2510.04996)).

    Inherits every parameter of [`~trl.GRPOConfig`]. `num_generations` keeps TRL's meaning: it is the size `n` of the
    *update group*, i.e. how many completions of each prompt enter the loss. Adaptive samplers may draw more than `n`
    completions for a prompt (in rounds of `round_size`), then downsample the pool to exactly `n`, so the training step
    keeps TRL's static shapes.

    Every sampler knob below is declared once, in `trl_ada.samplers.settings.SamplerFields` (type, default, this text,
    its validation), which this class inherits; `trl-ada simulate` and the model card read the same declarations.
    Knobs that only some samplers read: a knob that the chosen `sampler` (or `round_policy`, `objective`,
    `est_train_on`, `generation_schedule`, DAPO refills) does not read must keep its default; any other value raises
    at construction, naming the setting that reads it, instead of being silently ignored. Which sampler reads which
    knob is declared by the sampler classes (`Sampler.knobs`); the knobs every sampler reads are `num_generations`,
    `positive_threshold`, `baseline`, `scale_rewards`, `max_weight`, `normalize_weights`, `zero_variance_tolerance`
    and `seed`.

    Parameters:
"""

ADA_ONLY_FIELDS = ("generation_schedule", "continuous_max_in_flight")
"""The trainer's own knobs (not read by samplers), declared on `AdaGRPOConfig`."""

SECTION_SCHEDULE = "Parameters of the generation schedule (read by `seq_pos` / `seq_balance`)"


@dataclass
class AdaGRPOConfig(SamplerFields, GRPOConfig):
    # The docstring is rendered from the fields' metadata below (`__doc__`), so it cannot drift from `--help`.

    generation_schedule: str = knob(
        "rounds",
        'How `seq_pos`/`seq_balance` generate their draws. `"rounds"`: synchronous rounds, each one generate call '
        'that waits for its slowest completion (every backend). `"continuous"` (vLLM server mode only, single-turn '
        "completions): no barrier across prompts. Each prompt draws its own rounds, one after another, without "
        "waiting for the other prompts: the request its round policy makes (`fixed`: `round_size`; "
        "`predictive`/`tracked`: the predicted need) goes out as one-draw requests, each completion is scored as it "
        "returns, and the exit rule and the cap are checked when the prompt's round is complete, where rounds check "
        "them. So with the same settings a prompt's pool is exactly the rounds' pool on the same draws (in "
        "submission order, never biased toward short completions), and caps, quotas, downsampling, baselines and "
        "weights are those of rounds; exits after every draw are `round_size=1`, in both schedules. Nothing is drawn "
        "past an exit check, so nothing is aborted. The weights are synced once per step. With vLLM, a `seed` in "
        "`generation_kwargs` makes every request for one prompt return the same completions (vLLM varies the seed "
        "only between the `n` completions of one request). It is therefore rejected wherever trl-ada sends one "
        "prompt in more than one request per step: `seq_pos`/`seq_balance` with `max_rounds > 1`, the continuous "
        'schedule or `vllm_mode="colocate"`, and `est` (its budgets differ per prompt, so its draws go one per '
        "request). `uniform` and `dapo` make `GRPOTrainer`'s own requests and accept it.",
        choices=GENERATION_SCHEDULES,
        section=SECTION_SCHEDULE,
    )
    continuous_max_in_flight: int = knob(
        2048,
        '`"continuous"` only: draws in flight on the server at most (one HTTP connection each); further draws wait '
        "on the training side, in submission order. Each running draw is a sequence the engines decode, so this caps "
        "their batch: 2,048 is what one GRPO generate call of the paper's batch runs (512 prompts x 4) and uvicorn's "
        "listen backlog (vLLM's server), and 512 made the paper-scale projection of `benchmarks/generation_cost.py` "
        "2.07x GRPO-n4 instead of 1.37x. The process's soft open-file limit is raised to fit it (up to the hard "
        "limit; training fails at start, naming the fix, when it cannot).",
        check=lambda v: v >= 1,
        requirement="must be at least 1",
    )
    est_decay: float | None = knob(
        None,
        "Deprecated name of `pass_rate_decay`: a value given is carried over to the new name with a `FutureWarning`; "
        "giving both names different values raises.",
        section="Deprecated names",
    )
    est_prior_alpha: float | None = knob(None, "Deprecated name of `pass_rate_prior_alpha` (see `est_decay`).")
    est_prior_beta: float | None = knob(None, "Deprecated name of `pass_rate_prior_beta` (see `est_decay`).")

    def __post_init__(self) -> None:
        with warnings.catch_warnings():
            if self.gradient_checkpointing is True and getattr(self, "activation_checkpointing", None) is None:
                # TRL's default, under the name transformers deprecates: nothing for the user to rename.
                warnings.filterwarnings("ignore", "`gradient_checkpointing` is deprecated", FutureWarning)
            super().__post_init__()
        self._validate_adaptive_sampling()

    @classmethod
    def from_grpo_config(cls, args: GRPOConfig, environment_owns_data: bool = False) -> AdaGRPOConfig:
        """
        An `AdaGRPOConfig` holding every value of `args` (already post-processed by TRL) and the Ada defaults.

        Never rejects a config that `GRPOTrainer` accepts: the Ada knobs `args` leaves unset are adapted to the
        values it did set. A `multi_objective_aggregation` other than `"sum_then_normalize"`, or a `seed` in
        `generation_kwargs` with vLLM, or an environment that owns the data (`environment_owns_data`: an
        `environment_factory` without a `train_dataset`), falls back to `sampler="uniform"` (plain GRPO) with a
        warning; for
        `seq_*`, `round_size` grows to `ceil(num_generations / max_rounds)` when the default cap
        `round_size * max_rounds` is below `num_generations`.
        """
        if not isinstance(args, GRPOConfig):
            raise TypeError(f"args must be an AdaGRPOConfig or a trl.GRPOConfig, got {type(args).__name__}.")
        upgraded = cls.__new__(cls)
        upgraded.__dict__.update(args.__dict__)
        unset = [f for f in fields(cls) if f.name not in args.__dict__]
        for f in unset:
            setattr(upgraded, f.name, f.default_factory() if f.default_factory is not MISSING else f.default)
        unset_names = {f.name for f in unset}
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
        if "round_size" in unset_names and sampler_class(upgraded.sampler).reads(upgraded, "round_size"):
            needed = math.ceil(upgraded.num_generations / upgraded.max_rounds)
            upgraded.round_size = max(upgraded.round_size, needed)
        upgraded._validate_adaptive_sampling()
        logger.info("Got a GRPOConfig; using AdaGRPOConfig's Reinforce-Ada defaults (sampler=%r).", upgraded.sampler)
        return upgraded

    def _validate_adaptive_sampling(self) -> None:
        self._carry_deprecated_names()
        if self.multi_objective_aggregation != "sum_then_normalize" and self.sampler != "uniform":
            raise ValueError(
                f"multi_objective_aggregation={self.multi_objective_aggregation!r} normalises each reward function "
                "inside the group, which has no meaning for a pool baseline. Use "
                "multi_objective_aggregation='sum_then_normalize' (TRL's default) or sampler='uniform'."
            )
        # Validates every sampler knob (and fills the sampler's defaults) before any model is loaded.
        settings = self.sampler_settings()
        self._validate_generation_schedule(settings)
        check_knobs_read(
            self,
            {f.name: f.default for f in fields(self) if f.name in CONFIG_KNOB_USES},
            reads=lambda name: CONFIG_KNOB_USES[name][0](self),
            context=lambda name: (
                ", ".join(f"{key}={getattr(self, key)!r}" for key in CONFIG_KNOB_USES[name][2]),
                CONFIG_KNOB_USES[name][1],
            ),
        )
        self._validate_generation_seed(settings)
        self._warn_one_prompt_generation_batch(settings)
        # What the sampler filled in (quotas, est bounds, parsed sampler_kwargs) is what the run uses: show it here.
        for f in fields(SamplerFields):
            setattr(self, f.name, getattr(settings, f.name))

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

    def _carry_deprecated_names(self) -> None:
        """Move a value given under a deprecated name to its new name (`FutureWarning`); both names differing raises."""
        for old, new in DEPRECATED_NAMES.items():
            value = getattr(self, old)
            if value is None:
                continue
            current, default = getattr(self, new), self.__dataclass_fields__[new].default
            if current != default and current != value:
                raise ValueError(
                    f"{old}={value!r} and {new}={current!r} disagree: {old} is the deprecated name of {new}. Set "
                    f"only {new}."
                )
            warnings.warn(
                f"{old} is deprecated and will be removed: it is now {new} (it also serves round_policy='predictive' "
                f"and 'tracked', not only sampler='est'). Using {new}={value!r}; rename it in your config.",
                FutureWarning,
                stacklevel=4,
            )
            setattr(self, new, value)
            setattr(self, old, None)

    def _generation_seed(self) -> Any:
        generation_kwargs = self.generation_kwargs
        return generation_kwargs.get("seed") if isinstance(generation_kwargs, dict) else None

    def _validate_generation_seed(self, settings: SamplerSettings) -> None:
        # vLLM draws the n completions of one request from seeds seed, seed + 1, ...; two requests for one prompt with
        # the same seed return the same completions, so a pool would be one completion (or one round) repeated.
        seed = self._generation_seed()
        if seed is None or not self.use_vllm:
            return  # transformers generation does not read a seed from generation_kwargs
        cls = settings.sampler_class
        one_request_per_prompt = cls.one_request_per_prompt(settings) and (
            not cls.has_exit_rule or (self.generation_schedule == "rounds" and self.vllm_mode == "server")
        )
        if one_request_per_prompt:
            return
        if not cls.has_exit_rule:
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
        for name in ADA_ONLY_FIELDS:  # the trainer-level knobs' own choices and requirements
            declared, value = self.__dataclass_fields__[name], getattr(self, name)
            choices, check = declared.metadata.get("choices"), knob_extras(declared).get("check")
            if choices is not None and value not in choices:
                raise ValueError(f"{name} must be one of {choices}, got {value!r}.")
            if check is not None and not check(value):
                raise ValueError(f"{name} {knob_extras(declared)['requirement']}, got {value}.")
        if self.generation_schedule == "rounds":
            return
        if not settings.sampler_class.has_exit_rule or settings.refills:
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

    def sampler_settings(self) -> SamplerSettings:
        """The pure-Python sampler settings this config describes (raises `ValueError` on an invalid combination)."""
        return SamplerSettings(**{f.name: getattr(self, f.name) for f in fields(SamplerSettings)}).validated()


_DOCUMENTED = {f.name for f in fields(SamplerFields)} | set(ADA_ONLY_FIELDS) | set(DEPRECATED_NAMES)
AdaGRPOConfig.__doc__ = HEADER + render_parameters([f for f in fields(AdaGRPOConfig) if f.name in _DOCUMENTED])
