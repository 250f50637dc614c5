"""Configuration for [`AdaGRPOTrainer`]."""

from __future__ import annotations

import logging
import math
import warnings
from dataclasses import MISSING, dataclass, field, fields
from typing import Any

from trl import GRPOConfig

from .samplers import SAMPLER_NAMES, SamplerSettings
from .samplers.settings import KnobUse, check_knobs_read

DEPRECATED_NAMES: dict[str, str] = {
    "est_decay": "pass_rate_decay",
    "est_prior_alpha": "pass_rate_prior_alpha",
    "est_prior_beta": "pass_rate_prior_beta",
}
"""Old knob names still accepted (with a `FutureWarning`), and the names that replaced them."""

CONFIG_KNOB_USES: dict[str, KnobUse] = {
    "continuous_max_in_flight": KnobUse(
        lambda config: config.generation_schedule == "continuous",
        "generation_schedule='continuous'",
        ("generation_schedule",),
    ),
}
"""The config-level knobs under the rule of `trl_ada.samplers.settings.KNOB_USES` (the sampler knobs' table)."""

logger = logging.getLogger(__name__)


@dataclass
class AdaGRPOConfig(GRPOConfig):
    r"""
    Configuration class for [`AdaGRPOTrainer`] (Reinforce-Ada, [arXiv 2510.04996](https://huggingface.co/papers/2510.04996)).

    Inherits every parameter of [`~trl.GRPOConfig`]. `num_generations` keeps TRL's meaning: it is the size `n` of the
    *update group*, i.e. how many completions of each prompt enter the loss. Adaptive samplers may draw more than `n`
    completions for a prompt (in rounds of `round_size`), then downsample the pool to exactly `n`, so the training step
    keeps TRL's static shapes.

    Knobs that only some samplers read: a knob that the chosen `sampler` (or `round_policy`, `objective`,
    `est_train_on`, `generation_schedule`, DAPO refills) does not read must keep its default; any other value raises
    at construction, naming the setting that reads it, instead of being silently ignored. The table is
    `trl_ada.samplers.settings.KNOB_USES` (plus `CONFIG_KNOB_USES` here); the knobs every sampler reads are
    `num_generations`, `positive_threshold`, `baseline`, `scale_rewards`, `max_weight`, `normalize_weights`,
    `zero_variance_tolerance` and `seed`.

    Parameters:
        > Parameters that control the adaptive sampling

        sampler (`str`, *optional*, defaults to `"seq_balance"`):
            Sampling strategy. `"uniform"`: plain GRPO, one round of `num_generations` per prompt (reproduces
            `GRPOTrainer`). `"seq_pos"`: rounds of `round_size` until a prompt has `positive_quota` positives.
            `"seq_balance"`: rounds until a prompt has `positive_quota` positives and `negative_quota` negatives.
            `"est"`: Reinforce-Ada-Est, one allocation per step from tracked pass rates (`est_*` knobs). `"dapo"`:
            the DAPO baseline, uniform sampling that drops zero-variance groups and refills the batch (`dapo_*`).
        round_size (`int`, *optional*, defaults to `8`):
            Completions generated per active prompt in each round (`M` in the paper). Ignored by `"uniform"`.
        max_rounds (`int`, *optional*, defaults to `4`):
            Maximum number of rounds per generation batch. `round_size * max_rounds` caps the completions drawn for
            one prompt. Ignored by `"uniform"`.
        positive_quota (`int` or `None`, *optional*, defaults to `None`):
            Positives a prompt needs before it retires. `None` means 1 for `"seq_pos"` and `num_generations // 2` for
            `"seq_balance"`.
        negative_quota (`int` or `None`, *optional*, defaults to `None`):
            Negatives a prompt needs before it retires (`"seq_balance"` only). `None` means
            `num_generations - num_generations // 2`: with an odd `num_generations` the extra slot is a negative's,
            so the quotas equal exactly what a balanced update group takes (and positives, the scarce side on hard
            prompts, are the smaller half).
        positive_threshold (`float`, *optional*, defaults to `0.5`):
            A completion is positive when its (weighted, summed) reward is strictly greater than this value. The
            paper's authors used 0.7 on 0/1 rewards; any value in (0, 1) is equivalent for binary rewards.
        baseline (`str`, *optional*, defaults to `"pool"`):
            Baseline subtracted from each reward. `"pool"`: mean reward of every completion drawn for the prompt (the
            paper's high-fidelity baseline). `"group"`: mean of the `num_generations` kept completions (TRL's).
        objective (`str`, *optional*, defaults to `"linear"`):
            Per-prompt gradient weight `w(p̂)` from the objective `f(p)`: `"linear"` (f = p, w = 1, the authors'
            released code), `"log"` (f = log p, w = 1/p̂, the paper's Seq estimator), `"power"` (f = p^α,
            w = α p̂^(α-1)). `p̂` is the share of positives in the prompt's whole pool.
        power_alpha (`float`, *optional*, defaults to `0.5`):
            Exponent α of the `"power"` objective, in (0, 1].
        max_weight (`float`, *optional*, defaults to `10.0`):
            Upper clip of the per-prompt weight `w(p̂)`, applied before normalisation. Needed because 1/p̂ is unbounded
            as p̂ → 0.
        normalize_weights (`bool`, *optional*, defaults to `True`):
            Rescale the per-prompt weights of a generation batch to mean 1 (over prompts with a non-zero advantage).
            The objective then changes *how the update is spread over prompts*, not its overall size, so the learning
            rate tuned for GRPO carries over; with `False` a `"log"` run's effective step grows as prompts get
            harder. A no-op for `"linear"`.
        downsample (`str`, *optional*, defaults to `"balanced"`):
            How a pool is cut to `num_generations`. `"balanced"`: up to `num_generations // 2` positives, the rest
            (`num_generations - num_generations // 2` when there are enough) negatives, topping up from the other
            side when one side is short; any `num_generations` works. `"random"`: uniformly at random.
        zero_variance_tolerance (`float`, *optional*, defaults to `1e-6`):
            Rewards whose standard deviation is at most this value count as constant. A prompt has no signal (zero
            advantages, excluded from weight normalisation, dropped by DAPO's filling) when the rewards its baseline
            comes from are constant: the whole pool with `baseline="pool"`, the kept group with `"group"`. Float
            noise can leave a tiny non-zero std in a constant group, so an exact comparison would miss it.

        round_policy (`str`, *optional*, defaults to `"fixed"`):
            How many completions an active prompt asks for in each round of `seq_*`. `"fixed"`: `round_size` (the
            paper). `"predictive"`: `round_size` first, then the smallest request that meets the remaining quotas
            with probability `round_confidence` under a Beta posterior from the prompt's pool. `"tracked"`: the same
            from the first round on, with the prior from a pass-rate tracker (`pass_rate_decay`, `pass_rate_prior_*`)
            that remembers prompts across epochs. Each round waits for its longest completion, so fewer rounds means
            less wall time; see BENCHMARKS.md for the samples-rounds trade-off.
        round_confidence (`float`, *optional*, defaults to `0.7`):
            Target probability of finishing a prompt in its next round, for the predictive policies.
        generation_schedule (`str`, *optional*, defaults to `"rounds"`):
            How `seq_pos`/`seq_balance` generate their draws. `"rounds"`: synchronous rounds, each one generate call
            that waits for its slowest completion (every backend). `"continuous"` (vLLM server mode only, single-turn
            completions): no barrier across prompts. Each prompt draws its own rounds, one after another, without
            waiting for the other prompts: the request its round policy makes (`fixed`: `round_size`;
            `predictive`/`tracked`: the predicted need) goes out as one-draw requests, each completion is scored as it
            returns, and the exit rule and the cap are checked when the prompt's round is complete, where rounds check
            them. So with the same settings a prompt's pool is exactly the rounds' pool on the same draws (in
            submission order, never biased toward short completions), and caps, quotas, downsampling, baselines and
            weights are those of rounds; exits after every draw are `round_size=1`, in both schedules. Nothing is
            drawn past an exit check, so nothing is aborted. The weights are synced once per step.

            With vLLM, a `seed` in `generation_kwargs` makes every request for one prompt return the same completions
            (vLLM varies the seed only between the `n` completions of one request). It is therefore rejected wherever
            trl-ada sends one prompt in more than one request per step: `seq_pos`/`seq_balance` with `max_rounds > 1`,
            the continuous schedule or `vllm_mode="colocate"`, and `est` (its budgets differ per prompt, so its draws
            go one per request). `uniform` and `dapo` make `GRPOTrainer`'s own requests and accept it.
        continuous_max_in_flight (`int`, *optional*, defaults to `2048`):
            `"continuous"` only: draws in flight on the server at most (one HTTP connection each); further draws
            wait on the training side, in submission order. Each running draw is a sequence the engines decode, so
            this caps their batch: 2,048 is what one GRPO generate call of the paper's batch runs (512 prompts x 4)
            and uvicorn's listen backlog (vLLM's server), and 512 made the paper-scale projection of
            `benchmarks/generation_cost.py` 2.07x GRPO-n4 instead of 1.37x. The process's soft open-file limit is
            raised to fit it (up to the hard limit; training fails at start, naming the fix, when it cannot).

        > Parameters of the pass-rate estimates (read by `sampler="est"` and by `round_policy="predictive"` /
        > `"tracked"`)

        pass_rate_decay (`float`, *optional*, defaults to `0.9`):
            Discount `λ` of a prompt's tracked counts at each visit: `N <- λN + n_t`, `K <- λK + k_t`. In (0, 1];
            1 keeps the whole history. Read by `sampler="est"` and `round_policy="tracked"`.
        pass_rate_prior_alpha (`float`, *optional*, defaults to `1.0`):
            `α` of the Beta prior, positive and finite; `p̂ = (K + α) / (N + α + β)`, so an unseen prompt reads
            `α / (α + β)`. Read by `sampler="est"` and `round_policy="predictive"`/`"tracked"`.
        pass_rate_prior_beta (`float`, *optional*, defaults to `1.0`):
            `β` of the Beta prior, positive and finite.
        pass_rate_predictor (`str`, *optional*, defaults to `"tracker"`):
            Where the pass-rate estimates come from. `"tracker"`: the decayed Beta counts above (an unseen prompt
            reads `α / (α + β)`). `"learned"`: the paper's value network, an online logistic regression on hashed
            character n-grams of the prompt text, trained on every scored draw; it predicts a prompt on its first
            visit, and its prediction `m` is the mean of a Beta prior of strength `α + β` that the prompt's decayed
            counts update: `p̂ = (K + (α + β) m) / (N + α + β)`. A local directory or a Hub repo id: a predictor saved
            by an earlier run (`<output_dir>/pass_rate_predictor/`), warm-started (weights and optimizer state; counts
            start empty). Read by `sampler="est"` (budgets), `round_policy="tracked"` (first-round prior with counts)
            and `round_policy="predictive"` (with a learned predictor, the prediction is its prior from the first
            round on). The learned predictor is saved with every checkpoint and in `pass_rate_predictor/` of every
            saved model (so `push_to_hub` uploads it).
        pass_rate_predictor_learning_rate (`float`, *optional*, defaults to `0.1`):
            Adagrad step size of the learned predictor. Read only with a learned predictor.
        est_decay, est_prior_alpha, est_prior_beta (`float` or `None`, *optional*, defaults to `None`):
            Deprecated names of `pass_rate_decay`, `pass_rate_prior_alpha` and `pass_rate_prior_beta`: a value given
            is carried over to the new name with a `FutureWarning`; giving both names different values raises.

        > Parameters of `sampler="est"` (Reinforce-Ada-Est)

        est_sample_power (`float`, *optional*, defaults to `0.5`):
            Budgets follow `N_x ∝ p̂_x^-s`; the residual gradient weight is `(p̂_x + est_epsilon)^-(1-s)`, so their
            product is the log objective's `1/p`. 0.5 is the paper's hybrid, 1.0 pure implicit weighting.
        est_min_samples (`int` or `None`, *optional*, defaults to `None`):
            Lower clip of a prompt's budget. `None`: 2 with `est_train_on="all"`, `num_generations` with
            `"downsample"`.
        est_max_samples (`int` or `None`, *optional*, defaults to `None`):
            Upper clip of a prompt's budget. `None`: `4 * num_generations`.
        est_mean_samples (`float` or `None`, *optional*, defaults to `None`):
            Completions drawn per prompt on average: the step's total budget is the paper's
            `N_total = round(B * est_mean_samples)` for `B` prompts. Must lie in `[est_min_samples,
            est_max_samples]`. `None`: `num_generations` with `est_train_on="all"` (the only value it allows, since
            every completion enters TRL's batch of `B * num_generations` rows), `2 * num_generations` with
            `"downsample"`.
        est_epsilon (`float`, *optional*, defaults to `0.01`):
            `ε` in the residual weight, which keeps it finite when a pool has no positive.
        est_train_on (`str`, *optional*, defaults to `"all"`):
            `"all"`: train on every completion (group sizes vary, the total stays `B * num_generations`; what the
            paper's Est did, which is why it costs like GRPO-n8 in the backward pass). `"downsample"`: draw
            `est_mean_samples` per prompt on average, then cut each pool to `num_generations` like `seq_*`.

        > Parameters of DAPO's batch filling

        dapo_refill (`bool` or `None`, *optional*, defaults to `None`):
            Drop prompts without a signal (see `zero_variance_tolerance`; with `sampler="dapo"` the pool is the
            kept group, so this is DAPO's zero-variance filter) and refill the batch from further prompts.
            `None`: on for `sampler="dapo"`, off otherwise. `True` with `seq_pos`/`seq_balance` stacks DAPO's
            filling on adaptive sampling (the paper notes the two combine).
        dapo_max_refills (`int`, *optional*, defaults to `10`):
            Extra generation batches drawn at most per step (verl's `max_num_gen_batches`).
        dapo_on_exhausted (`str`, *optional*, defaults to `"raise"`):
            What happens when the cap is reached before the batch is full: `"raise"` (as verl) or
            `"keep_partial"` (train on the informative prompts, padded with zero-advantage groups for static shapes).
    """

    sampler: str = field(
        default="seq_balance",
        metadata={"help": "Sampling strategy.", "choices": list(SAMPLER_NAMES)},
    )
    round_size: int = field(
        default=8,
        metadata={"help": "Completions generated per active prompt in each round (M in the paper)."},
    )
    max_rounds: int = field(
        default=4,
        metadata={"help": "Maximum rounds per generation batch; round_size * max_rounds caps a prompt's pool."},
    )
    positive_quota: int | None = field(
        default=None,
        metadata={
            "help": "Positives a prompt needs before it retires. None: 1 for seq_pos, num_generations // 2 for "
            "seq_balance."
        },
    )
    negative_quota: int | None = field(
        default=None,
        metadata={
            "help": "Negatives a prompt needs before it retires (seq_balance). None: num_generations - "
            "num_generations // 2 (the extra slot of an odd num_generations is a negative's)."
        },
    )
    positive_threshold: float = field(
        default=0.5,
        metadata={"help": "A completion is positive when its reward is strictly greater than this value."},
    )
    baseline: str = field(
        default="pool",
        metadata={
            "help": "Baseline: mean reward of the whole pool, or of the kept group.",
            "choices": ["pool", "group"],
        },
    )
    objective: str = field(
        default="linear",
        metadata={
            "help": "Objective f(p) whose gradient weight w(p̂) multiplies the advantage.",
            "choices": ["linear", "log", "power"],
        },
    )
    power_alpha: float = field(default=0.5, metadata={"help": "Exponent of the power objective, in (0, 1]."})
    max_weight: float = field(default=10.0, metadata={"help": "Upper clip of the per-prompt weight."})
    normalize_weights: bool = field(
        default=True,
        metadata={"help": "Rescale per-prompt weights to mean 1 over the generation batch."},
    )
    downsample: str = field(
        default="balanced",
        metadata={"help": "How a pool is cut to num_generations.", "choices": ["balanced", "random"]},
    )
    zero_variance_tolerance: float = field(
        default=1e-6,
        metadata={
            "help": "Reward std at or below which rewards count as constant; a prompt whose baseline rewards (pool "
            "or kept group) are constant has no signal."
        },
    )
    round_policy: str = field(
        default="fixed",
        metadata={"help": "Request size per round for seq_*.", "choices": ["fixed", "predictive", "tracked"]},
    )
    round_confidence: float = field(
        default=0.7, metadata={"help": "Target probability of finishing a prompt in its next round."}
    )
    generation_schedule: str = field(
        default="rounds",
        metadata={
            "help": "seq_* draws in synchronous rounds, or continuously on a vLLM server (each prompt's rounds without "
            "waiting for the other prompts: the same pools as rounds).",
            "choices": ["rounds", "continuous"],
        },
    )
    continuous_max_in_flight: int = field(
        default=2048, metadata={"help": "continuous schedule: draws in flight on the server at most."}
    )
    pass_rate_decay: float = field(
        default=0.9,
        metadata={"help": "Discount of a prompt's tracked counts, in (0, 1] (est, round_policy='tracked')."},
    )
    pass_rate_prior_alpha: float = field(
        default=1.0,
        metadata={"help": "Alpha of the Beta prior on pass rates (est, round_policy='predictive'/'tracked')."},
    )
    pass_rate_prior_beta: float = field(
        default=1.0,
        metadata={"help": "Beta of the Beta prior on pass rates (est, round_policy='predictive'/'tracked')."},
    )
    pass_rate_predictor: str = field(
        default="tracker",
        metadata={
            "help": "Pass-rate estimates: 'tracker' (decayed Beta counts), 'learned' (online logistic regression on "
            "the prompt text, predicts first visits), or a local directory / Hub id of a saved predictor to "
            "warm-start from (est, round_policy='predictive'/'tracked')."
        },
    )
    pass_rate_predictor_learning_rate: float = field(
        default=0.1, metadata={"help": "Adagrad step size of the learned pass-rate predictor."}
    )
    est_decay: float | None = field(default=None, metadata={"help": "Deprecated: use pass_rate_decay."})
    est_prior_alpha: float | None = field(default=None, metadata={"help": "Deprecated: use pass_rate_prior_alpha."})
    est_prior_beta: float | None = field(default=None, metadata={"help": "Deprecated: use pass_rate_prior_beta."})
    est_sample_power: float = field(
        default=0.5,
        metadata={"help": "Budgets follow p̂^-s; the residual weight is p̂^-(1-s). 0.5: the paper's hybrid."},
    )
    est_min_samples: int | None = field(
        default=None, metadata={"help": "Lower clip of a prompt's budget. None: 2 (train on all) or num_generations."}
    )
    est_max_samples: int | None = field(
        default=None, metadata={"help": "Upper clip of a prompt's budget. None: 4 * num_generations."}
    )
    est_mean_samples: float | None = field(
        default=None,
        metadata={
            "help": "Completions drawn per prompt on average (total budget N_total = round(B * est_mean_samples)). "
            "None: num_generations with est_train_on='all', 2 * num_generations with 'downsample'."
        },
    )
    est_epsilon: float = field(default=0.01, metadata={"help": "Epsilon in the residual weight (p̂ + eps)^-(1-s)."})
    est_train_on: str = field(
        default="all",
        metadata={
            "help": "Train on all completions, or draw est_mean_samples per prompt and downsample to n.",
            "choices": ["all", "downsample"],
        },
    )
    dapo_refill: bool | None = field(
        default=None,
        metadata={
            "help": "Drop prompts without a signal (constant baseline rewards) and refill the batch. None: on for "
            "sampler='dapo' only."
        },
    )
    dapo_max_refills: int = field(default=10, metadata={"help": "Extra generation batches drawn at most per step."})
    dapo_on_exhausted: str = field(
        default="raise",
        metadata={
            "help": "At the refill cap: raise, or keep the partial batch.",
            "choices": ["raise", "keep_partial"],
        },
    )

    def __post_init__(self) -> None:
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
        if "round_size" in unset_names and upgraded.sampler in ("seq_pos", "seq_balance"):
            needed = math.ceil(upgraded.num_generations / upgraded.max_rounds)
            upgraded.round_size = max(upgraded.round_size, needed)
        upgraded._validate_adaptive_sampling()
        return upgraded

    def _validate_adaptive_sampling(self) -> None:
        self._carry_deprecated_names()
        if self.multi_objective_aggregation != "sum_then_normalize" and self.sampler != "uniform":
            raise ValueError(
                f"multi_objective_aggregation={self.multi_objective_aggregation!r} normalises each reward function "
                "inside the group, which has no meaning for a pool baseline. Use "
                "multi_objective_aggregation='sum_then_normalize' (TRL's default) or sampler='uniform'."
            )
        # Validates every sampler knob (and fills the quota defaults) before any model is loaded.
        settings = self.sampler_settings()
        self._validate_generation_schedule(settings)
        check_knobs_read(
            self, CONFIG_KNOB_USES, {f.name: f.default for f in fields(self) if f.name in CONFIG_KNOB_USES}
        )
        self._validate_generation_seed(settings)
        self.positive_quota = settings.positive_quota
        self.negative_quota = settings.negative_quota
        self.est_min_samples = settings.est_min_samples
        self.est_max_samples = settings.est_max_samples
        self.est_mean_samples = settings.est_mean_samples

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
        sequential = settings.sampler in ("seq_pos", "seq_balance")
        one_request_per_prompt = settings.sampler in ("uniform", "dapo") or (
            sequential
            and settings.max_rounds == 1
            and self.generation_schedule == "rounds"
            and self.vllm_mode == "server"
        )
        if one_request_per_prompt:
            return
        if settings.sampler == "est":
            how = "sampler='est' gives prompts different budgets, so vLLM receives its draws one per request"
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
        if self.generation_schedule not in ("rounds", "continuous"):
            raise ValueError(
                f"generation_schedule must be 'rounds' or 'continuous', got {self.generation_schedule!r}."
            )
        if self.continuous_max_in_flight < 1:
            raise ValueError(f"continuous_max_in_flight must be at least 1, got {self.continuous_max_in_flight}.")
        if self.generation_schedule == "rounds":
            return
        if settings.sampler not in ("seq_pos", "seq_balance") or settings.refills:
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
        return SamplerSettings(
            sampler=self.sampler,
            num_generations=self.num_generations,
            round_size=self.round_size,
            max_rounds=self.max_rounds,
            positive_quota=self.positive_quota,
            negative_quota=self.negative_quota,
            positive_threshold=self.positive_threshold,
            baseline=self.baseline,
            scale_rewards=self.scale_rewards,
            objective=self.objective,
            power_alpha=self.power_alpha,
            max_weight=self.max_weight,
            normalize_weights=self.normalize_weights,
            downsample=self.downsample,
            zero_variance_tolerance=self.zero_variance_tolerance,
            seed=self.seed,
            pass_rate_decay=self.pass_rate_decay,
            pass_rate_prior_alpha=self.pass_rate_prior_alpha,
            pass_rate_prior_beta=self.pass_rate_prior_beta,
            pass_rate_predictor=self.pass_rate_predictor,
            pass_rate_predictor_learning_rate=self.pass_rate_predictor_learning_rate,
            est_sample_power=self.est_sample_power,
            est_min_samples=self.est_min_samples,
            est_max_samples=self.est_max_samples,
            est_mean_samples=self.est_mean_samples,
            est_epsilon=self.est_epsilon,
            est_train_on=self.est_train_on,
            dapo_refill=self.dapo_refill,
            dapo_max_refills=self.dapo_max_refills,
            dapo_on_exhausted=self.dapo_on_exhausted,
            round_policy=self.round_policy,
            round_confidence=self.round_confidence,
        ).validated()
