"""
The `Sampler` contract and the [`SamplingStep`] the trainer drives once per generation batch (`begin`, `requests` and
`observe` until no request is left, then `finish`: docs/custom-sampler.md shows the loop). Pure Python: no torch and no
TRL, so every rule can be checked with Bernoulli rewards (see `trl-ada simulate`).
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

from . import rules
from .accounting import PromptDraws, draw_metrics
from .predictor import build_pass_rate_estimator, calibration, calibration_bins
from .settings import REMEMBERED_BASELINES, SamplerOptions, SamplerSettings, option_fields
from .tracker import DecayedBetaTracker, PassRateEstimator, checked_estimates


@dataclass(frozen=True)
class PromptResult:
    """What the update sees of one prompt: its kept completions and how they are scored."""

    kept: tuple[int, ...]
    """Indices into the prompt's pool, in draw order."""
    baseline: float
    """Value subtracted from each kept reward (pool or group mean)."""
    scale: float | None
    """Std the centred rewards are divided by (`+1e-4`), or `None` without reward scaling; with
    `normalize_advantages`, the std of the update's advantages that normalised them."""
    weight: float
    """Objective weight `w(p̂)` (clipped, then normalised when `normalize_weights`)."""
    pass_rate: float
    """Share of positives among the scorable completions of the whole pool (`p̂`)."""
    advantages: tuple[float, ...]
    """One advantage per kept completion."""
    has_signal: bool
    """Whether the rewards the baseline is computed from (the pool, or the kept group under `baseline="group"`) vary
    beyond `zero_variance_tolerance`; without a signal every advantage is zero."""
    unnormalised_weight: float
    """The sampler's weight before `normalize_weights` (clipped): what [`finish_update`] rescales over the update."""
    draw_shares: tuple[float, ...] = ()
    """Per kept completion, the factor of its advantage (empty: every factor is 1). With `train_on="pool"` every draw
    is kept, scaled by the share of its outcome's draws the sampler's group took ([`rules.outcome_shares`])."""

    def kept_rewards(self, pool: Sequence[float]) -> list[float]:
        """The rewards of the kept completions, in `kept`'s order."""
        return [pool[i] for i in self.kept]

    def advantage_of(self, reward: float) -> float:
        """`w * (r - b)` for a completion with `reward` ([`rules.advantage`]); exactly zero without a signal."""
        return rules.advantage(reward, self.baseline, self.scale, self.weight) if self.has_signal else 0.0


@dataclass(frozen=True)
class Selection:
    """The result of one generation batch: a [`PromptResult`] per prompt plus the statistics worth logging."""

    prompts: tuple[PromptResult, ...]
    pools: tuple[tuple[float, ...], ...]
    rounds: int
    active_after_round: tuple[int, ...]
    rounds_per_prompt: tuple[int, ...]
    group_size: int
    metrics: dict[str, float] = field(default_factory=dict)
    kept_constant: tuple[bool, ...] = ()
    """Per prompt: whether its kept group's rewards are constant (what `zero_variance_share/kept` averages)."""


class SamplingStep:
    """The state of one generation batch: every prompt's pool of rewards, in draw order."""

    def __init__(self, sampler: Sampler, num_prompts: int) -> None:
        if num_prompts < 1:
            raise ValueError("a sampling step needs at least one prompt")
        self.sampler = sampler
        self.settings = sampler.settings
        self.pools: list[list[float]] = [[] for _ in range(num_prompts)]
        self.rounds = 0
        self.active_after_round: list[int] = []
        self.rounds_per_prompt: list[int] = [0] * num_prompts
        # (positives, negatives) per pool, kept up to date so exit rules never rescan a pool.
        self.outcomes: list[tuple[int, int]] = [(0, 0)] * num_prompts
        self.scorable: list[int] = [0] * num_prompts  # completions with a reward (not NaN)
        self.masked: list[set[int]] = [set() for _ in range(num_prompts)]  # pool indices the loss will mask
        # Filled by stateful samplers: stable prompt keys, prior pass-rate estimates, per-prompt budgets.
        self.keys: list[Hashable] | None = None
        self.estimates: list[float] | None = None
        self.budgets: list[int] | None = None
        self.priors: list[tuple[float, float]] | None = None
        # `skip_unmixed_above`: which prompts are skipped (None: the skip is off), and est's budgets without it.
        self.skipped: list[bool] | None = None
        self.budgets_without_skip: list[int] | None = None
        self._pending: list[tuple[int, int]] | None = None
        self._next_sizes: list[int] | None = None

    @property
    def num_prompts(self) -> int:
        return len(self.pools)

    def draw_counts(self) -> tuple[list[int], list[int]]:
        """Per prompt, its scored draws and its positives: what a pass-rate estimator's `update` reads."""
        return [p + q for p, q in self.outcomes], [p for p, _ in self.outcomes]

    def requests(self) -> list[tuple[int, int]]:
        """`(prompt_index, count)` pairs for the next round, ascending by prompt; empty when sampling is over."""
        if self._pending is not None:
            raise RuntimeError("observe() the previous round's rewards before asking for the next round")
        sizes = self._round_sizes() if self._next_sizes is None else self._next_sizes
        requests = [(index, count) for index, count in enumerate(sizes) if count > 0]
        self._pending = requests or None
        return requests

    def observe(
        self, requests: Sequence[tuple[int, int]], rewards: Sequence[float], masked: Sequence[bool] | None = None
    ) -> None:
        """Add one round's rewards, laid out as `requests` asked (prompt by prompt, `count` each). `masked` flags
        completions the loss will drop (truncated ones): their rewards enter the pool's mean and std, but they count as
        neither positive nor negative, and are kept only when nothing else fills the update group."""
        if self._pending is None or list(requests) != self._pending:
            raise RuntimeError("observe() must receive exactly the requests of the last requests() call")
        expected = sum(count for _, count in requests)
        if len(rewards) != expected or (masked is not None and len(masked) != expected):
            raise ValueError(f"expected {expected} rewards (and mask flags) for this round, got {len(rewards)}")
        offset = 0
        for index, count in requests:
            self.add(
                index,
                rewards[offset : offset + count],
                None if masked is None else masked[offset : offset + count],
            )
            self.rounds_per_prompt[index] += 1
            offset += count
        self._pending = None
        self.rounds += 1
        # The next round's sizes, computed once: they also give the count of prompts still active.
        self._next_sizes = self._round_sizes()
        self.active_after_round.append(sum(1 for count in self._next_sizes if count > 0))

    def _round_sizes(self) -> list[int]:
        options = self.sampler.options
        if self.rounds >= options.max_rounds:
            if self.rounds == 1 and "max_rounds" not in option_fields(type(options)):
                self._refuse_a_second_round()
            return [0] * self.num_prompts
        return [self.sampler.request_size(self, index) for index in range(self.num_prompts)]

    def _refuse_a_second_round(self) -> None:
        """A sampler whose `Options` do not read `max_rounds` gets one round; one that asks for a second would
        otherwise retry nothing, silently."""
        asked = [index for index in range(self.num_prompts) if self.sampler.request_size(self, index) > 0]
        if asked:
            raise ValueError(
                f"sampler={self.sampler.name!r} asked for a second round of draws for {len(asked)} prompts, and its "
                f"Options ({type(self.sampler.options).__name__}) do not read max_rounds, so a generation batch "
                "has one round. Declare `max_rounds: int` in its Options (the config's max_rounds then caps the "
                "rounds, 4 by default), or return 0 from request_size once step.rounds > 0."
            )

    def add(self, index: int, rewards: Sequence[float], masked: Sequence[bool] | None = None) -> None:
        """Append completions to prompt `index`'s pool, in draw order, and update its outcome counts."""
        new = [float(r) for r in rewards]
        if masked is not None:
            start = len(self.pools[index])
            self.masked[index].update(start + i for i, flag in enumerate(masked) if flag)
        self.pools[index].extend(new)
        self.scorable[index] += sum(1 for r in new if rules.is_scorable(r))
        positives, negatives = rules.count_outcomes(
            new if masked is None else [r for r, flag in zip(new, masked) if not flag],
            self.settings.positive_threshold,
        )
        old_positives, old_negatives = self.outcomes[index]
        self.outcomes[index] = (old_positives + positives, old_negatives + negatives)

    def finish(self) -> Selection:
        """Downsample every pool to `num_generations` and compute baselines, scales, weights and advantages."""
        if self._pending is not None:
            raise RuntimeError("observe() the last round's rewards before finish()")
        settings = self.settings
        kept = [self.sampler.keep(self, index) for index in range(self.num_prompts)]
        draw_shares: list[tuple[float, ...]] = [()] * self.num_prompts
        if self.sampler.train_on == "pool":
            # The sampler's group still sets what each outcome weighs in the update; every draw of the pool carries it.
            threshold = settings.positive_threshold
            draw_shares = [
                tuple(rules.outcome_shares(pool, group, threshold, self.masked[index]))
                for index, (group, pool) in enumerate(zip(kept, self.pools, strict=True))
            ]
            kept = [list(range(len(pool))) for pool in self.pools]
        pools = self.pools
        kept_rewards = [[pool[i] for i in idx] for pool, idx in zip(pools, kept, strict=True)]

        pool_stats = [rules.mean_and_std(pool) for pool in self.pools]
        # The baseline and the std come from the same set of rewards: the whole pool, or the kept group.
        baseline_rewards = kept_rewards if settings.baseline == "group" else pools
        stats = [rules.mean_and_std(r) for r in baseline_rewards]
        # A signal is a varying baseline: with a pool baseline a constant kept group has one, a constant pool none.
        tolerance = settings.zero_variance_tolerance
        has_signal = [not rules.has_zero_variance(rewards, tolerance) for rewards in baseline_rewards]
        remembered = self._remembered_pass_rates()
        for index, pass_rate in enumerate(remembered):
            if pass_rate is not None:
                # SPO's baseline, read before this step's draws: an unmixed group can still carry a signal.
                stats[index] = (pass_rate, stats[index][1])
                has_signal[index] = any(
                    abs(reward - pass_rate) > tolerance for reward in kept_rewards[index] if rules.is_scorable(reward)
                )
        # The batch std is taken over the update's rows by `finish_update`.
        scales: list[float | None] = (
            [std for _, std in stats] if settings.scale_rewards == "group" else [None] * self.num_prompts
        )
        pass_rates = [p / (p + q) if p + q else math.nan for p, q in self.outcomes]
        weights = [self.sampler.weight(0.0 if math.isnan(p) else p) for p in pass_rates]

        kept_constant = [rules.has_zero_variance(rewards, tolerance) for rewards in kept_rewards]
        prompts = [
            PromptResult(tuple(idx), baseline, scale, weight, pass_rate, (), useful, weight, share)
            for idx, (baseline, _), scale, weight, pass_rate, useful, share in zip(
                kept, stats, scales, weights, pass_rates, has_signal, draw_shares, strict=True
            )
        ]
        results = list(finish_update(prompts, kept_rewards, settings))
        metrics = self._metrics(results, kept_constant, pool_stats)
        if self.sampler.baseline_history is not None:
            metrics["baseline/tracked_share"] = sum(p is not None for p in remembered) / self.num_prompts
            self.sampler.baseline_history.update(self.keys, *self._reward_sums())
        selection = Selection(
            prompts=tuple(results),
            pools=tuple(tuple(pool) for pool in self.pools),
            rounds=self.rounds,
            active_after_round=tuple(self.active_after_round),
            rounds_per_prompt=tuple(self.rounds_per_prompt),
            group_size=settings.num_generations,
            metrics=metrics,
            kept_constant=tuple(kept_constant),
        )
        self.sampler.end_step(self, selection)
        return selection

    def _reward_sums(self) -> tuple[list[int], list[float]]:
        """Per prompt, its scored draws (masked ones left out) and the sum of their rewards: what a remembered
        baseline's memory counts, so that it remembers the mean reward (SPO's tracker), the pass rate for 0/1 rewards.
        A Beta memory holds a mean in [0, 1]: any other reward is refused."""
        totals, sums = [], []
        for index, pool in enumerate(self.pools):
            rewards = [r for i, r in enumerate(pool) if rules.is_scorable(r) and i not in self.masked[index]]
            outside = [r for r in rewards if not 0.0 <= r <= 1.0]
            if outside:
                raise ValueError(
                    f"baseline={self.settings.baseline!r} remembers each prompt's mean reward as a Beta estimate, "
                    f"which needs rewards in [0, 1]; a reward of {outside[0]!r} came back. Scale the reward "
                    "functions into [0, 1] (reward_weights, or the functions themselves), or use baseline='pool'."
                )
            totals.append(len(rewards))
            sums.append(math.fsum(rewards))
        return totals, sums

    def _remembered_pass_rates(self) -> list[float | None]:
        """Each prompt's remembered pass rate before this step's draws (None: none, or a first "tracked" visit)."""
        history = self.sampler.baseline_history
        if history is None:
            return [None] * self.num_prompts
        if self.keys is None:
            raise ValueError(
                f"baseline={self.settings.baseline!r} remembers prompts by key: begin() the step with prompt_keys."
            )
        estimates = checked_estimates(history, self.keys)
        if self.settings.baseline == "predicted":
            return list(estimates)
        return [estimate if visited else None for estimate, visited in zip(estimates, history.visited(self.keys))]

    def _metrics(
        self,
        results: list[PromptResult],
        kept_constant: list[bool],
        pool_stats: list[tuple[float, float]],
    ) -> dict[str, float]:
        settings = self.settings
        n, tolerance = settings.num_generations, settings.zero_variance_tolerance
        sizes = [len(pool) for pool in self.pools]
        # What plain GRPO with the same n would have seen: the first n draws of each prompt.
        zero_first = [rules.has_zero_variance(pool[:n], tolerance) for pool in self.pools]
        pass_rates = [r.pass_rate for r in results if not math.isnan(r.pass_rate)]
        metrics = {
            "samples_per_prompt/mean": sum(sizes) / len(sizes),
            "samples_per_prompt/max": float(max(sizes)),
            "samples_per_prompt/min": float(min(sizes)),
            "rounds": float(self.rounds),
            "rounds_per_prompt/mean": sum(self.rounds_per_prompt) / len(self.rounds_per_prompt),
            "zero_variance_share/first_n": sum(zero_first) / len(zero_first),
            "pass_rate/mean": sum(pass_rates) / len(pass_rates) if pass_rates else math.nan,
            "weight/mean": _nanmean([r.weight if r.has_signal else math.nan for r in results]),
            "pool_reward/mean": _nanmean([mean for mean, _ in pool_stats]),
        }
        if not settings.refills:
            # These groups are the update's; with DAPO refills `BatchFiller.metrics` reports both over the update.
            metrics["zero_variance_share/kept"] = sum(kept_constant) / len(kept_constant)
            metrics.update(draw_metrics(selection_draws(results, self.pools)))
        metrics["unscorable_share"] = sum(count == 0 for count in self.scorable) / len(self.scorable)
        for round_index, active in enumerate(self.active_after_round, start=1):
            metrics[f"active_prompts/after_round_{round_index}"] = float(active)
        return metrics


def finish_update(
    prompts: Sequence[PromptResult], kept_rewards: Sequence[Sequence[float]], settings: SamplerSettings
) -> tuple[PromptResult, ...]:
    """`prompts`, one update's, with the rules that read the whole update applied once over them
    (`scale_rewards="batch"`, `normalize_weights`, `normalize_advantages`, over the prompts with a signal), then each
    prompt's advantages. `kept_rewards`: one list per prompt."""
    if settings.scale_rewards == "batch":
        batch_std = rules.mean_and_std([r for rewards in kept_rewards for r in rewards])[1]
        scales = [batch_std] * len(prompts)
    else:
        scales = [prompt.scale for prompt in prompts]
    weights = [prompt.unnormalised_weight for prompt in prompts]
    if settings.normalize_weights:
        # Mean 1 over the prompts that carry a signal, so the objective reshapes the update, not its size.
        signal = [w for w, prompt in zip(weights, prompts, strict=True) if prompt.has_signal]
        if signal:
            mean_weight = math.fsum(signal) / len(signal)
            weights = [w / mean_weight for w in weights]
    results = []
    for prompt, rewards, scale, weight in zip(prompts, kept_rewards, scales, weights, strict=True):
        # Exactly zero without a signal: DAPO pads batches with such groups, which must add no gradient.
        result = replace(prompt, scale=scale, weight=weight)
        advantages = tuple(result.advantage_of(r) for r in rewards)
        if result.draw_shares:
            advantages = tuple(share * a for share, a in zip(result.draw_shares, advantages, strict=True))
        results.append(replace(result, advantages=advantages))
    if settings.normalize_advantages:
        results = _normalised_over_update(results, kept_rewards)
    return tuple(results)


def _normalised_over_update(
    results: Sequence[PromptResult], kept_rewards: Sequence[Sequence[float]]
) -> list[PromptResult]:
    """SPO's batch normalisation (`normalize_advantages`): `(A - mean A) / (std A + 1e-4)` over the update's scorable
    rows of the prompts with a signal; the other rows stay exactly zero. A z-score of N values is at most
    `(N - 1) / sqrt(N)` in size, so no spread, however small, blows it up."""
    values = [
        a
        for result, rewards in zip(results, kept_rewards, strict=True)
        if result.has_signal
        for a, r in zip(result.advantages, rewards, strict=True)
        if rules.is_scorable(r)
    ]
    mean, std = rules.mean_and_std(values)
    normalised = []
    for result, rewards in zip(results, kept_rewards, strict=True):
        if not result.has_signal:
            normalised.append(result)
            continue
        advantages = tuple(
            (a - mean) / (std + rules.STD_EPSILON) if rules.is_scorable(r) else 0.0
            for a, r in zip(result.advantages, rewards, strict=True)
        )
        normalised.append(replace(result, scale=std, advantages=advantages))
    return normalised


def fit_trained_rows(
    results: Sequence[PromptResult], multiple: int, group_size: int
) -> tuple[tuple[PromptResult, ...], int]:
    """`results` with the fewest kept completions left out that make their total a multiple of `multiple`
    (`train_on="pool"` where TRL's rows must split evenly), and how many. Each comes from the largest group (earlier
    prompt on a tie), the completion whose advantage is smallest in magnitude (later draw on a tie); no group falls
    below `group_size`."""
    total = sum(len(result.kept) for result in results)
    surplus = total % multiple
    kept = [
        list(zip(result.kept, result.advantages, result.draw_shares or (1.0,) * len(result.kept), strict=True))
        for result in results
    ]
    for _ in range(surplus):
        largest = max(range(len(kept)), key=lambda index: (len(kept[index]), -index))
        if len(kept[largest]) <= group_size:
            raise ValueError(
                f"{total} kept completions cannot be cut to a multiple of {multiple} without taking a group below "
                f"{group_size} completions."
            )
        position = min(range(len(kept[largest])), key=lambda i: (abs(kept[largest][i][1]), -i))
        del kept[largest][position]
    fitted = tuple(
        replace(
            result,
            kept=tuple(row[0] for row in rows),
            advantages=tuple(row[1] for row in rows),
            draw_shares=tuple(row[2] for row in rows) if result.draw_shares else (),
        )
        for result, rows in zip(results, kept, strict=True)
    )
    return fitted, surplus


def selection_draws(
    results: Sequence[PromptResult], pools: Sequence[Sequence[float]], in_update: Sequence[bool] | None = None
) -> list[PromptDraws]:
    """Each prompt of a batch for [`draw_metrics`]; `in_update` (default: all) says which prompts the update took."""
    taken = in_update if in_update is not None else [True] * len(results)
    return [
        PromptDraws(result.pass_rate, len(pool), useful, len(result.kept) if useful else 0)
        for result, pool, chosen in zip(results, pools, taken, strict=True)
        for useful in (chosen and result.has_signal,)
    ]


def _nanmean(values: Sequence[float]) -> float:
    finite = [v for v in values if not math.isnan(v)]
    return sum(finite) / len(finite) if finite else math.nan


def learn_pass_rates(
    estimator: PassRateEstimator, step: SamplingStep, selection: Selection, estimates: Sequence[float]
) -> None:
    """Log how `estimates`, made at the step's start, fared against its draws (`pass_rate_predictor/*`), then update
    `estimator` with them and log its own `last_metrics`."""
    totals, positives = step.draw_counts()
    scores = {**calibration(estimates, totals, positives), **calibration_bins(estimates, totals, positives)}
    selection.metrics.update({f"pass_rate_predictor/{name}": value for name, value in scores.items()})
    estimator.update(step.keys, totals, positives)
    for name, value in getattr(estimator, "last_metrics", {}).items():
        selection.metrics[f"pass_rate_predictor/{name}"] = value


def skip_metrics(
    step: SamplingStep, estimates: Sequence[float], outlooks: Mapping[int, tuple[float, float]]
) -> dict[str, float]:
    """What `skip_unmixed_above` saved and cost in one generation batch (`skip/*`; empty when the skip is off).
    `outlooks`: per skipped prompt, the draws it would have had without the skip and the chance its pool would then
    have come back mixed (`seq_*`: [`SequentialSampler.outlook`])."""
    if step.skipped is None:
        return {}
    chosen = [index for index, skipped in enumerate(step.skipped) if skipped]
    drawn = {index: len(step.pools[index]) for index in chosen}
    metrics = {
        "skip/share": len(chosen) / step.num_prompts,
        "skip/draws_saved": math.fsum(outlooks[index][0] - drawn[index] for index in chosen),
    }
    if chosen:
        n = step.settings.num_generations
        mixed = [positives > 0 and negatives > 0 for positives, negatives in (step.outcomes[i] for i in chosen)]
        lost = [outlooks[i][1] - (1.0 - rules.unmixed_chance(estimates[i], drawn[i])) for i in chosen]
        metrics.update(
            {
                "skip/predicted_unmixed": math.fsum(rules.unmixed_chance(estimates[i], n) for i in chosen)
                / len(chosen),
                "skip/mixed_share": sum(mixed) / len(chosen),
                "skip/expected_signal_lost": math.fsum(lost) / len(chosen),
            }
        )
    return metrics


class Sampler:
    """The whole contract of a sampler plug-in ([`register_sampler`]): how many more completions a prompt needs
    (`request_size`), which enter the update (`keep`), with what weight (`weight`), what it learns after a step
    (`end_step`), its state (`state_dict`) and its knobs (`Options`). Every process seeds the downsampling generator
    alike and feeds it the same rewards. A sampler that reads a pass-rate estimator keeps it as `self.estimator`."""

    name: ClassVar[str]
    """Set by [`register_sampler`]."""
    Options: ClassVar[type[SamplerOptions]] = SamplerOptions
    """The knobs this sampler reads and its checks ([`SamplerOptions`]); `self.options` holds their values."""

    def __init__(self, settings: SamplerSettings, estimator: PassRateEstimator | None = None) -> None:
        self.settings = settings.validated()
        self.options = self.settings.options
        self.rng = random.Random(self.settings.seed)
        if estimator is not None and not self.settings.sampler_reads("pass_rate_predictor"):
            raise ValueError(
                f"sampler={self.name!r} reads no pass-rate estimator; remove pass_rate_estimator, or use sampler='est' "
                "or round_policy='predictive'/'tracked' of seq_pos/seq_balance."
            )
        self.estimator = estimator
        # The trainer config's `train_on` (set by `build_sampler`): the group `keep` chooses, or the whole pool.
        self.train_on = "downsample"
        # A remembered baseline's memory, updated by `finish`; separate from the sampler's own estimator.
        self.baseline_history: PassRateEstimator | None = None
        if self.settings.baseline == "tracked":
            self.baseline_history = DecayedBetaTracker(
                self.settings.pass_rate_decay, self.settings.pass_rate_prior_alpha, self.settings.pass_rate_prior_beta
            )
        elif self.settings.baseline == "predicted":
            self.baseline_history = build_pass_rate_estimator(self.settings)

    def begin(self, num_prompts: int, prompt_keys: Sequence[Hashable] | None = None) -> SamplingStep:
        """Start a generation batch of `num_prompts` prompts (`prompt_keys`: stable ids, for stateful samplers)."""
        step = SamplingStep(self, num_prompts)
        if prompt_keys is not None:
            if len(prompt_keys) != num_prompts:
                raise ValueError(f"sampler={self.name!r} got {len(prompt_keys)} prompt keys for {num_prompts} prompts")
            step.keys = list(prompt_keys)
        return step

    def request_size(self, step: SamplingStep, index: int) -> int:
        """How many more completions prompt `index` needs in round `step.rounds + 1` (0: retired)."""
        raise NotImplementedError

    def keep(self, step: SamplingStep, index: int) -> list[int]:
        """Indices (draw order) of the completions of prompt `index` that enter the update."""
        settings = self.settings
        return rules.downsample(
            step.pools[index],
            settings.num_generations,
            settings.downsample,
            settings.positive_threshold,
            self.rng,
            excluded=step.masked[index],
        )

    def weight(self, pass_rate: float) -> float:
        """Gradient weight of a prompt whose pool has this share of positives (before normalisation)."""
        settings = self.settings
        return rules.objective_weight(pass_rate, settings.objective, settings.power_alpha, settings.max_weight)

    def end_step(self, step: SamplingStep, selection: Selection) -> None:
        """Called once the step is finished; stateful samplers update themselves here."""

    def state_dict(self) -> dict[str, Any]:
        """Training state to save in a checkpoint."""
        state: dict[str, Any] = {"rng": self.rng.getstate()}
        if self.baseline_history is not None:
            state["baseline_history"] = self.baseline_history.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        version, internal, gauss = state["rng"]
        self.rng.setstate((version, tuple(internal), gauss))
        if self.baseline_history is not None and "baseline_history" in state:
            self.baseline_history.load_state_dict(state["baseline_history"])


def draw_memories(sampler: Sampler) -> tuple[PassRateEstimator, ...]:
    """Every pass-rate estimator the sampler holds (its `estimator` and any history of its own): what a resumed
    asynchronous worker leaves its already counted rows out of."""
    return tuple(value for value in vars(sampler).values() if isinstance(value, PassRateEstimator))


def describe(settings: SamplerSettings) -> str:
    """What the sampler of `settings` did, in a few Markdown sentences (the model card's `Options.describe`). A plug-in
    whose `Options` says nothing of its own (it may inherit a trl-ada sampler's) is named by its class."""
    cls = settings.sampler_class
    owner = next(klass for klass in cls.Options.__mro__ if "describe" in vars(klass))
    text = settings.options.describe(settings)
    if text is not None and (cls.__module__.startswith("trl_ada.") or not owner.__module__.startswith("trl_ada.")):
        return text
    return (
        f"Completions were drawn by the plug-in sampler `{cls.__module__}.{cls.__qualname__}` (registered as "
        f"`{settings.sampler}`), which does not describe its rule; its settings are listed below."
    )


_BASELINES = {
    "pool": "the mean reward of every completion drawn for the prompt (its whole pool)",
    "group": "the mean reward of the kept group",
    "tracked": (
        "the prompt's mean reward from its earlier steps (its pass rate, for 0/1 rewards; decayed Beta counts, read "
        "before the step's draws; the pool's mean reward on a first visit)"
    ),
    "predicted": (
        "a learned predictor's estimate of the prompt's pass rate (from its text and earlier draws, made before the "
        "step's draws)"
    ),
}
"""How `describe` words each `baseline`."""


def group_baseline_phrase(settings: SamplerSettings) -> str:
    """`describe`'s words for the baseline of a sampler whose pool is its group (`uniform`, `dapo`)."""
    return _BASELINES[settings.baseline] if settings.baseline in REMEMBERED_BASELINES else "the group's mean reward"


def trained_on_phrase(trains_on_every_draw: bool, settings: SamplerSettings) -> str:
    """`describe`'s words for what a budgeted sampler (`est`, `knapsack`) trains on."""
    if trains_on_every_draw:
        return "every completion drawn is trained on (group sizes vary)"
    return f"each pool is downsampled ({settings.downsample}) to {settings.num_generations}"


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}{'' if number == 1 else 's'}"


def _objective_phrase(settings: SamplerSettings) -> str:
    """`describe`'s words for a non-linear objective's per-prompt weight (nothing for `"linear"`: every weight is 1)."""
    if settings.objective == "linear":
        return ""
    return f", and each prompt's gradient weighted by the `{settings.objective}` objective's w(p̂) of its pool"


def build_sampler(
    settings: SamplerSettings,
    estimator: Any = None,
    predictor_source: str | None = None,
    train_on: str = "downsample",
) -> Sampler:
    """The sampler that `settings.sampler` names (any registered one). `estimator`: a pass-rate estimator object, in
    place of the one `settings.pass_rate_predictor` names; its state must be JSON-serialisable (checked here, before
    any compute). `predictor_source`: a local directory holding that saved predictor (the snapshot of a Hub id).
    `train_on`: the trainer config's `train_on`, already checked."""
    settings = settings.validated()
    if estimator is not None:
        if not settings.sampler_reads("pass_rate_predictor"):
            raise ValueError(
                f"a pass_rate_estimator is read by sampler='est' and by round_policy='predictive' or 'tracked' of "
                f"seq_pos/seq_balance, not by sampler={settings.sampler!r} with round_policy={settings.round_policy!r} "
                "(baseline='predicted' reads the predictor that pass_rate_predictor names)."
            )
        if settings.pass_rate_predictor != "tracker":
            raise ValueError(
                f"pass_rate_predictor={settings.pass_rate_predictor!r} and a pass_rate_estimator object both choose the "
                "pass-rate estimator. Give one: remove pass_rate_predictor, or the pass_rate_estimator argument."
            )
        if not isinstance(estimator, PassRateEstimator):
            raise TypeError(
                f"pass_rate_estimator must implement estimate, update, state_dict and load_state_dict "
                f"(trl_ada.samplers.PassRateEstimator); {type(estimator).__name__} does not."
            )
    if predictor_source is not None and settings.sampler_reads("pass_rate_predictor"):
        estimator = build_pass_rate_estimator(settings, predictor_source)
    cls = settings.sampler_class
    sampler = cls(settings) if estimator is None else cls(settings, estimator)
    sampler.train_on = train_on
    if predictor_source is not None and settings.baseline == "predicted":
        # `baseline="predicted"` warm-starts from the saved predictor too, in an object of its own.
        sampler.baseline_history = build_pass_rate_estimator(settings, predictor_source)
    try:
        json.dumps(sampler.state_dict())
    except (TypeError, ValueError) as error:
        raise ValueError(
            f"The sampler's state (with its pass-rate estimator, {type(sampler.estimator).__name__}) is saved "
            f"as JSON in every checkpoint (ada_sampler_state.json), and it is not JSON-serialisable: {error}. Make the "
            "estimator's state_dict() return only dicts, lists, strings, numbers, booleans and None."
        ) from error
    return sampler
