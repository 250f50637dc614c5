"""
Every sampler knob, declared once: its type, default, help text (the documentation of `AdaGRPOConfig`, of the command
line and of `trl-ada simulate`) and its own validation. Pure Python: no torch, no TRL.

- [`SamplerFields`] declares the knobs trl-ada adds. `AdaGRPOConfig` inherits it (so its fields, defaults and `--help`
  are these), and its docstring is rendered from this metadata ([`render_parameters`]).
- [`SamplerSettings`] adds the three knobs TRL owns (`num_generations`, `scale_rewards`, `seed`, with TRL's defaults;
  a test checks them against `GRPOConfig`) and is what samplers read. [`SamplerSettings.validated`] runs every rule.
- Which sampler reads which knob is declared by the sampler classes (`Sampler.knobs`, `Sampler.reads`; see
  `trl_ada.samplers.base`), so a registered sampler brings its own. A knob the chosen configuration does not read must
  keep its default: any other value raises, naming what reads it ([`check_knobs_read`]).
"""

from __future__ import annotations

import json
import math
import os
import re
import textwrap
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import MISSING, Field, dataclass, field, fields, replace
from typing import Any

SECTION_SAMPLING = "Parameters that control the adaptive sampling"
SECTION_PASS_RATES = (
    'Parameters of the pass-rate estimates (read by `sampler="est"` and by `round_policy="predictive"` / `"tracked"`)'
)
SECTION_EST = 'Parameters of `sampler="est"` (Reinforce-Ada-Est)'
SECTION_DAPO = "Parameters of DAPO's batch filling"

_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]{0,95}(/[A-Za-z0-9][\w.-]{0,95})?")
"""What a Hub repo id looks like (`name` or `owner/name`); `pass_rate_predictor` accepts one to warm-start from."""


def knob(
    default: Any,
    help: str,
    *,
    choices: Iterable[str] | None = None,
    check: Callable[[Any], bool] | None = None,
    requirement: str = "",
    read_if: tuple[str, Callable[[Any], bool], str] | None = None,
    section: str | None = None,
    doc_type: str | None = None,
) -> Any:
    """
    Declare a knob: a dataclass `field` whose metadata carries everything about it.

    `help`: the documentation (first sentence short: it is also the `--help` line). `choices`: the allowed values.
    `check` / `requirement`: a predicate on the value and what it requires ("must lie in (0, 1]"), checked where the
    knob is read. `read_if`: `(parent knob, predicate on the settings, description)` for a knob that is read only when
    another read knob has some value (`power_alpha` under `objective="power"`). `section`: starts a docstring section.
    """
    # HfArgumentParser hands a field's metadata to argparse's add_argument, so only "help" and "choices" go there; the
    # rest of the declaration is kept beside the field (`knob_extras`).
    metadata: dict[str, Any] = {"help": help}
    if choices is not None:
        metadata["choices"] = list(choices)
    declared = field(default=default, metadata=metadata)
    extras: dict[str, Any] = {}
    if check is not None:
        extras["check"] = check
        extras["requirement"] = requirement
    if read_if is not None:
        extras["read_if"] = read_if
    if section is not None:
        extras["section"] = section
    if doc_type is not None:
        extras["doc_type"] = doc_type
    _EXTRAS[declared] = extras
    return declared


_EXTRAS: dict[Field, dict[str, Any]] = {}
"""The declarations' other parts (check, requirement, read_if, section, doc_type), by field: a dataclass that
inherits a field keeps the same `Field` object."""


def knob_extras(declared: Field) -> dict[str, Any]:
    """What [`knob`] declared beyond the help and the choices (empty for a field declared otherwise)."""
    return _EXTRAS.get(declared, {})


def _positive_finite(value: Any) -> bool:
    return value > 0.0 and math.isfinite(value)


@dataclass
class SamplerFields:
    """The knobs trl-ada adds to TRL's config, each declared once (see the module docstring)."""

    sampler: str = knob(
        "seq_balance",
        'Sampling strategy, a name registered with `trl_ada.samplers.register_sampler`. Built in: `"uniform"`: '
        'plain GRPO, one round of `num_generations` per prompt (reproduces `GRPOTrainer`). `"seq_pos"`: rounds of '
        '`round_size` until a prompt has `positive_quota` positives. `"seq_balance"`: rounds until a prompt has '
        '`positive_quota` positives and `negative_quota` negatives. `"est"`: Reinforce-Ada-Est, one allocation per '
        'step from tracked pass rates (`est_*` knobs). `"dapo"`: the DAPO baseline, uniform sampling that drops '
        'zero-variance groups and refills the batch (`dapo_*`). `"knapsack"`: Knapsack-RL (Li et al., arXiv '
        "2509.25849), a fixed budget per step split by a knapsack over the prompts' pass rates (its knobs are "
        '`sampler_kwargs`, `trl_ada.samplers.KnapsackOptions`). `"dapo_gated"`: DAPO whose refill passes over '
        "prompts that their past draws predict will come back without a signal (its knobs are `sampler_kwargs`, "
        "`trl_ada.samplers.GatedRefillOptions`).",
        section=SECTION_SAMPLING,
    )
    sampler_kwargs: dict[str, Any] | str | None = knob(
        None,
        "Keyword arguments of a registered sampler's own knobs (the fields of its `options` dataclass), as a dict or "
        'a JSON string (on the command line). Of the built-in samplers `"knapsack"` '
        '(`trl_ada.samplers.KnapsackOptions`) and `"dapo_gated"` (`trl_ada.samplers.GatedRefillOptions`) take some: '
        "the others' knobs are the fields below.",
        doc_type="`dict` or `str` or `None`",
    )
    round_size: int = knob(
        8,
        "Completions generated per active prompt in each round (`M` in the paper).",
        check=lambda v: v >= 1,
        requirement="must be at least 1",
    )
    max_rounds: int = knob(
        4,
        "Maximum number of rounds per generation batch. `round_size * max_rounds` caps the completions drawn for one "
        "prompt.",
        check=lambda v: v >= 1,
        requirement="must be at least 1",
    )
    positive_quota: int | None = knob(
        None,
        'Positives a prompt needs before it retires. `None` means 1 for `"seq_pos"` and `num_generations // 2` for '
        '`"seq_balance"`.',
    )
    negative_quota: int | None = knob(
        None,
        'Negatives a prompt needs before it retires (`"seq_balance"` only). `None` means '
        "`num_generations - num_generations // 2`: with an odd `num_generations` the extra slot is a negative's, so "
        "the quotas equal exactly what a balanced update group takes (and positives, the scarce side on hard prompts, "
        "are the smaller half).",
    )
    positive_threshold: float = knob(
        0.5,
        "A completion is positive when its (weighted, summed) reward is strictly greater than this value. The "
        "paper's authors used 0.7 on 0/1 rewards; any value in (0, 1) is equivalent for binary rewards.",
        check=math.isfinite,
        requirement="must be a finite number",
    )
    baseline: str = knob(
        "pool",
        'Baseline subtracted from each reward. `"pool"`: mean reward of every completion drawn for the prompt (the '
        "paper's high-fidelity baseline). `\"group\"`: mean of the `num_generations` kept completions (TRL's).",
        choices=("pool", "group"),
    )
    objective: str = knob(
        "linear",
        'Per-prompt gradient weight `w(p̂)` from the objective `f(p)`: `"linear"` (f = p, w = 1, the authors\' '
        'released code), `"log"` (f = log p, w = 1/p̂, the paper\'s Seq estimator), `"power"` (f = p^α, '
        "w = α p̂^(α-1)). `p̂` is the share of positives in the prompt's whole pool.",
        choices=("linear", "log", "power"),
    )
    power_alpha: float = knob(
        0.5,
        'Exponent α of the `"power"` objective, in (0, 1].',
        check=lambda v: 0.0 < v <= 1.0,
        requirement="must lie in (0, 1]",
        read_if=("objective", lambda s: s.objective == "power", "objective='power'"),
    )
    max_weight: float = knob(
        10.0,
        "Upper clip of the per-prompt weight `w(p̂)`, applied before normalisation. Needed because 1/p̂ is unbounded "
        "as p̂ → 0. Positive and finite.",
        check=_positive_finite,
        requirement="must be a positive finite number (it bounds 1/p̂, which is infinite at p̂ = 0: an infinite "
        "clip gives such a prompt an infinite weight, NaN advantages and, after normalisation, every other prompt a "
        "zero weight); use e.g. the default 10.0",
    )
    normalize_weights: bool = knob(
        True,
        "Rescale the per-prompt weights of an update to mean 1 (over prompts with a non-zero advantage). The "
        "objective then changes *how the update is spread over prompts*, not its overall size, so the learning rate "
        'tuned for GRPO carries over; with `False` a `"log"` run\'s effective step grows as prompts get harder. A '
        'no-op for `"linear"`.',
    )
    downsample: str = knob(
        "balanced",
        'How a pool is cut to `num_generations`. `"balanced"`: up to `num_generations // 2` positives, the rest '
        "(`num_generations - num_generations // 2` when there are enough) negatives, topping up from the other side "
        'when one side is short; any `num_generations` works. `"random"`: uniformly at random.',
        choices=("balanced", "random"),
    )
    zero_variance_tolerance: float = knob(
        1e-6,
        "Rewards whose standard deviation is at most this value count as constant. A prompt has no signal (zero "
        "advantages, excluded from weight normalisation, dropped by DAPO's filling) when the rewards its baseline "
        'comes from are constant: the whole pool with `baseline="pool"`, the kept group with `"group"`. Float '
        "noise can leave a tiny non-zero std in a constant group, so an exact comparison would miss it.",
        # inf would make every group constant (no signal anywhere), NaN none: both are typos, not tolerances.
        check=lambda v: 0.0 <= v < math.inf,
        requirement="must be a finite, non-negative number",
    )
    round_policy: str = knob(
        "fixed",
        'How many completions an active prompt asks for in each round of `seq_*`. `"fixed"`: `round_size` (the '
        'paper). `"predictive"`: `round_size` first, then the smallest request that meets the remaining quotas with '
        'probability `round_confidence` under a Beta posterior from the prompt\'s pool. `"tracked"`: the same from '
        "the first round on, with the prior from a pass-rate tracker (`pass_rate_decay`, `pass_rate_prior_*`) that "
        "remembers prompts across epochs. Each round waits for its longest completion, so fewer rounds means less "
        "wall time; see BENCHMARKS.md for the samples-rounds trade-off.",
        choices=("fixed", "predictive", "tracked"),
    )
    round_confidence: float = knob(
        0.7,
        "Target probability of finishing a prompt in its next round, for the predictive policies.",
        check=lambda v: 0.0 < v < 1.0,
        requirement="must lie in (0, 1)",
    )
    pass_rate_decay: float = knob(
        0.9,
        "Discount `λ` of a prompt's tracked counts at each visit: `N <- λN + n_t`, `K <- λK + k_t`. In (0, 1]; 1 keeps "
        'the whole history. Read by `sampler="est"`, `"knapsack"`, `"dapo_gated"` (its refill gate\'s draw history) and '
        '`round_policy="tracked"`.',
        check=lambda v: 0.0 < v <= 1.0,
        requirement="must lie in (0, 1] (1 keeps all history)",
        section=SECTION_PASS_RATES,
    )
    pass_rate_prior_alpha: float = knob(
        1.0,
        "`α` of the Beta prior, positive and finite; `p̂ = (K + α) / (N + α + β)`, so an unseen prompt reads "
        '`α / (α + β)`. Read by `sampler="est"` and `round_policy="predictive"`/`"tracked"`.',
        check=_positive_finite,
        requirement="must be a positive finite number (a Beta prior keeps p̂ away from 0 and 1)",
    )
    pass_rate_prior_beta: float = knob(
        1.0,
        "`β` of the Beta prior, positive and finite.",
        check=_positive_finite,
        requirement="must be a positive finite number (a Beta prior keeps p̂ away from 0 and 1)",
    )
    pass_rate_predictor: str = knob(
        "tracker",
        'Where the pass-rate estimates come from. `"tracker"`: the decayed Beta counts above (an unseen prompt '
        'reads `α / (α + β)`). `"learned"`: the paper\'s value network, an online logistic regression on hashed '
        "character n-grams of the prompt text, trained on every scored draw; it predicts a prompt on its first visit, "
        "and its prediction `m` is the mean of a Beta prior of strength `α + β` that the prompt's decayed counts "
        "update: `p̂ = (K + (α + β) m) / (N + α + β)`. A local directory or a Hub repo id: a predictor saved by an "
        "earlier run (`<output_dir>/pass_rate_predictor/`), warm-started (weights and optimizer state; counts start "
        'empty). Read by `sampler="est"` (budgets), `round_policy="tracked"` (first-round prior with counts) and '
        '`round_policy="predictive"` (with a learned predictor, the prediction is its prior from the first round '
        "on). The learned predictor is saved with every checkpoint and in `pass_rate_predictor/` of every saved "
        "model (so `push_to_hub` uploads it).",
    )
    pass_rate_predictor_learning_rate: float = knob(
        0.1,
        "Adagrad step size of the learned predictor. Read only with a learned predictor.",
        check=_positive_finite,
        requirement="must be a positive finite number",
        read_if=(
            "pass_rate_predictor",
            lambda s: s.pass_rate_predictor != "tracker",
            "pass_rate_predictor='learned' or a saved predictor",
        ),
    )
    skip_unmixed_above: float | None = knob(
        None,
        "Skip adaptive sampling for prompts predicted to come back unmixed (GRESO's idea): a prompt whose predicted "
        "chance of an all-right or all-wrong group of `num_generations` draws, `p̂^n + (1 - p̂)^n` from the pass-rate "
        "estimate `p̂` made at the step's start, is above this probability draws no more than it must. `None` (off): "
        "every prompt is sampled adaptively. Under `seq_*` a skipped prompt draws exactly `num_generations` in one "
        'request and trains on them (its group is GRPO\'s); under `sampler="est"` it gets `est_min_samples` and the '
        "step's fixed total goes to the other prompts. The skipped prompts' draws still show what the skip cost: "
        "`ada/skip/*` logs the share skipped, the draws saved, and the share of skipped prompts that came back mixed. "
        'Read by `sampler="est"` and by `round_policy="tracked"` (or `"predictive"` with a learned predictor).',
        check=lambda v: v is None or 0.0 < v < 1.0,
        requirement="must be None (off) or a probability in (0, 1)",
    )
    est_sample_power: float = knob(
        0.5,
        "Budgets follow `N_x ∝ p̂_x^-s`; the residual gradient weight is `(p̂_x + est_epsilon)^-(1-s)`, so their "
        "product is the log objective's `1/p`. 0.5 is the paper's hybrid, 1.0 pure implicit weighting.",
        check=lambda v: 0.0 <= v <= 1.0,
        requirement="must lie in [0, 1]",
        section=SECTION_EST,
    )
    est_min_samples: int | None = knob(
        None,
        'Lower clip of a prompt\'s budget. `None`: 2 with `est_train_on="all"`, `num_generations` with '
        '`"downsample"`.',
    )
    est_max_samples: int | None = knob(None, "Upper clip of a prompt's budget. `None`: `4 * num_generations`.")
    est_mean_samples: float | None = knob(
        None,
        "Completions drawn per prompt on average: the step's total budget is the paper's "
        "`N_total = round(B * est_mean_samples)` for `B` prompts. Must lie in `[est_min_samples, est_max_samples]`. "
        '`None`: `num_generations` with `est_train_on="all"` (the only value it allows, since every completion '
        'enters TRL\'s batch of `B * num_generations` rows), `2 * num_generations` with `"downsample"`.',
    )
    est_epsilon: float = knob(
        0.01,
        "`ε` in the residual weight, which keeps it finite when a pool has no positive.",
        check=_positive_finite,
        requirement="must be a positive finite number",
    )
    est_train_on: str = knob(
        "all",
        '`"all"`: train on every completion (group sizes vary, the total stays `B * num_generations`; what the '
        'paper\'s Est did, which is why it costs like GRPO-n8 in the backward pass). `"downsample"`: draw '
        "`est_mean_samples` per prompt on average, then cut each pool to `num_generations` like `seq_*`.",
        choices=("all", "downsample"),
    )
    dapo_refill: bool | None = knob(
        None,
        'Drop prompts without a signal (see `zero_variance_tolerance`; with `sampler="dapo"` the pool is the kept '
        "group, so this is DAPO's zero-variance filter) and refill the batch from further prompts. `None`: on for "
        '`sampler="dapo"`, off otherwise. `True` with `seq_pos`/`seq_balance` stacks DAPO\'s filling on adaptive '
        "sampling (the paper notes the two combine).",
        section=SECTION_DAPO,
    )
    dapo_max_refills: int = knob(
        10,
        "Extra generation batches drawn at most per step (verl's `max_num_gen_batches`).",
        check=lambda v: v >= 0,
        requirement="must be non-negative",
    )
    dapo_on_exhausted: str = knob(
        "raise",
        'What happens when the cap is reached before the batch is full: `"raise"` (as verl) or `"keep_partial"` '
        "(train on the informative prompts, padded with zero-advantage groups for static shapes).",
        choices=("raise", "keep_partial"),
    )


@dataclass
class SamplerSettings(SamplerFields):
    """
    Every knob a sampler reads, validated once by [`SamplerSettings.validated`]: trl-ada's ([`SamplerFields`]) plus the
    three TRL owns, with TRL's defaults. `AdaGRPOConfig.sampler_settings()` builds one from a config; `trl-ada
    simulate` and the sampler tests build one directly, without TRL.
    """

    num_generations: int = knob(
        8,
        "TRL's `num_generations`: the size `n` of the update group (completions per prompt in the loss).",
        check=lambda v: v is not None and v >= 2,
        requirement="must be at least 2 to form a group with a baseline",
    )
    scale_rewards: str = knob(
        "group",
        "TRL's `scale_rewards`: divide the centred rewards by the group's std, the batch's, or not at all.",
        choices=("group", "batch", "none"),
    )
    seed: int = knob(42, "TRL's `seed`: the sampler's downsampling generator starts from it on every process.")

    @property
    def sampler_class(self) -> type:
        """The registered class of `sampler`."""
        from .registry import sampler_class

        return sampler_class(self.sampler)

    @property
    def max_pool_size(self) -> int:
        """The cap on completions drawn for one prompt in one generation batch."""
        return self.sampler_class.max_pool_size(self)

    @property
    def refills(self) -> bool:
        """Whether prompts without a signal are dropped and the batch refilled from further prompts (DAPO)."""
        return bool(self.dapo_refill) or self.sampler_class.refills_batches

    @property
    def options(self) -> Any:
        """The registered sampler's own knobs (its `options` dataclass, from `sampler_kwargs`), or `None`."""
        return self.sampler_class.parse_options(self.sampler_kwargs)

    def reads(self, name: str) -> bool:
        """Whether this configuration reads knob `name` (every sampler reads the universal ones)."""
        if name in UNIVERSAL_KNOBS:
            return True
        read_if = knob_extras(KNOB_FIELDS[name]).get("read_if")
        if read_if is not None:
            parent, predicate, _ = read_if
            return self.reads(parent) and predicate(self)
        return self.sampler_class.reads(self, name)

    def validated(self) -> SamplerSettings:
        """
        Check every knob and return a copy with the sampler's defaults filled in (quotas, est bounds); raise
        `ValueError` naming the fix. The order: the sampler's name, each knob's choices, contradictions the sampler
        names itself, the rule for unread knobs, each read knob's own requirement, then the sampler's combined rules.
        """
        cls = self.sampler_class
        for f in fields(SamplerSettings):
            choices = f.metadata.get("choices")
            if choices is not None and getattr(self, f.name) not in choices:
                raise ValueError(f"{f.name}={getattr(self, f.name)!r} is not supported. Choose one of {choices}.")
        cls.check_contradictions(self)
        check_knobs_read(self, SETTINGS_DEFAULTS, reads=self.reads, context=self._unread_context)
        for f in fields(SamplerSettings):
            check = knob_extras(f).get("check")
            value = getattr(self, f.name)
            # Requirements of unread knobs were covered by the rule above (their values are the defaults).
            if check is not None and self.reads(f.name) and not check(value):
                raise ValueError(f"{f.name} {knob_extras(f)['requirement']}, got {value}.")
        if self.reads("pass_rate_predictor"):
            _check_pass_rate_predictor(self.pass_rate_predictor)
        settings = self
        if isinstance(self.sampler_kwargs, str):
            settings = replace(self, sampler_kwargs=_parse_json_kwargs(self.sampler_kwargs))
        settings.options  # noqa: B018 - validates sampler_kwargs against the sampler's options
        return cls.resolve(settings)

    def _unread_context(self, name: str) -> tuple[str, str]:
        """`(the settings that make knob `name` unread, what reads it)`, for the unread-knob error."""
        read_if = knob_extras(KNOB_FIELDS[name]).get("read_if")
        if read_if is not None:
            parent, _, description = read_if
            if self.reads(parent):
                return f"{parent}={getattr(self, parent)!r}", description
            return self._unread_context(parent)
        from .registry import SAMPLERS

        depends_on = self.sampler_class.knob_depends_on(name)
        context = ", ".join(f"{key}={getattr(self, key)!r}" for key in ("sampler", *depends_on))
        # Readers grouped by the setting they need: "sampler='seq_pos' or 'seq_balance' (with round_policy='tracked')".
        groups: dict[str, list[str]] = {}
        for sampler_name, cls in SAMPLERS.items():
            if name in cls.knobs:
                groups.setdefault(cls.knob_conditions.get(name, ""), []).append(repr(sampler_name))
        readers = [
            "sampler=" + " or ".join(names) + (f" ({condition})" if condition else "")
            for condition, names in groups.items()
        ]
        return context, ", or ".join(readers) or "no registered sampler"


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
        "zero_variance_tolerance",
        "seed",
    }
)
"""The knobs every sampler reads (outcomes, baselines, weights, metrics, the downsampling generator)."""

SETTINGS_DEFAULTS: dict[str, Any] = {f.name: f.default for f in fields(SamplerSettings) if f.default is not MISSING}


def check_knobs_read(
    values: Any,
    defaults: Mapping[str, Any],
    *,
    reads: Callable[[str], bool],
    context: Callable[[str], tuple[str, str]],
    hints: Mapping[str, str] | None = None,
) -> None:
    """
    The one rule for knobs that only some configurations read: `values` (settings or a config) may set a knob of
    `defaults` to anything but its default only where it is read (`reads(name)`); elsewhere it would be silently
    ignored, so this raises `ValueError` naming the knob, the settings that make it unread and what reads it
    (`context(name)`).
    """
    for name, default in defaults.items():
        value = getattr(values, name)
        if value == default or reads(name):  # NaN is never equal to a default: it is checked too
            continue
        where, readers = context(name)
        hint = (hints or {}).get(name) or _hint(values, name)
        raise ValueError(
            f"{name}={value!r} has no effect with {where}: only {readers} read(s) it. Remove {name} (default "
            f"{default!r}). Use {readers} if you meant it to take effect." + (f" {hint}" if hint else "")
        )


def _hint(values: Any, name: str) -> str:
    sampler = getattr(values, "sampler_class", None)
    return sampler.knob_hints.get(name, "") if sampler is not None else ""


def _check_pass_rate_predictor(value: Any) -> None:
    # Checked before any compute: a value that is neither "tracker", "learned" nor an existing path must look like a
    # Hub repo id, and a local directory must hold a predictor.
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


# ---------------------------------------------------------------------------------------------------------------------
# Documentation rendered from the declarations
# ---------------------------------------------------------------------------------------------------------------------


def _doc_type(f: Field) -> str:
    if "doc_type" in knob_extras(f):
        return knob_extras(f)["doc_type"]
    # `from __future__ import annotations` keeps each type as its source text, e.g. "int | None"; HfArgumentParser
    # replaces it in place by the resolved type, whose members are named the same way.
    if isinstance(f.type, str):
        members = [part.strip() for part in f.type.split("|")]
    else:
        union = isinstance(f.type, types.UnionType) or typing.get_origin(f.type) is typing.Union
        members = [getattr(m, "__name__", str(m)) for m in (typing.get_args(f.type) if union else (f.type,))]
        members = ["None" if m == "NoneType" else m for m in members]
    return " or ".join(f"`{member}`" for member in members)


def render_parameters(declared: Iterable[Field], indent: int = 8) -> str:
    """
    The `Parameters` entries of a config docstring in TRL's style, from each field's `help` metadata:
    ``name (`type`, *optional*, defaults to `default`):`` then the help, wrapped. A field with a `section` starts a
    ``> section`` line.
    """
    lines: list[str] = []
    pad = " " * indent
    for f in declared:
        section = knob_extras(f).get("section")
        if section is not None:
            if lines:
                lines.append("")
            lines.extend(
                textwrap.wrap(section, 120 - indent - 2, initial_indent=pad + "> ", subsequent_indent=pad + "> ")
            )
            lines.append("")
        default = f.default if f.default is not MISSING else None
        shown = f'"{default}"' if isinstance(default, str) else repr(default)
        lines.append(f"{pad}{f.name} ({_doc_type(f)}, *optional*, defaults to `{shown}`):")
        lines.extend(
            textwrap.wrap(
                f.metadata["help"],
                120,
                initial_indent=pad + "    ",
                subsequent_indent=pad + "    ",
                break_long_words=False,
                break_on_hyphens=False,
            )
        )
    return "\n".join(lines)
