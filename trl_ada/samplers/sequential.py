"""
The sequential samplers of Reinforce-Ada: `seq_pos` and `seq_balance` (Algorithm 2 of the paper), rounds of draws for
every prompt until its exit rule holds or its pool reaches the cap. They alone run on the round-free schedule
([`ContinuousStep`], `sampler.begin_continuous`), so this module, not `base`, imports it: `continuous` builds on
`base` and nothing in `base` imports it back.

Pure Python: no torch and no TRL.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Hashable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from . import rules
from .base import (
    _BASELINES,
    Sampler,
    SamplingStep,
    Selection,
    _count,
    _objective_phrase,
    estimate_metrics,
    skip_metrics,
)
from .continuous import ContinuousStep
from .predictor import build_pass_rate_estimator
from .registry import register_sampler
from .tracker import PassRateEstimator, checked_beta_parameters

if TYPE_CHECKING:
    from .settings import SamplerSettings


class SequentialSampler(Sampler):
    """
    Reinforce-Ada-Seq (Algorithm 2 of the paper): rounds of completions for every active prompt until its exit rule
    holds or its pool reaches `round_size * max_rounds`.

    How many completions a prompt asks for in a round is the round policy: `"fixed"` always `round_size` (the
    paper); `"predictive"` `round_size` first, then the smallest request that meets the remaining quotas with
    probability `round_confidence` under a Beta posterior from the pool; `"tracked"` the same from the first round
    on, with the prior taken from a pass-rate tracker that remembers the prompt from earlier epochs. Fewer rounds
    matter because each round waits for its longest completion. With a learned predictor (`pass_rate_predictor`, or
    an `estimator` object) both predictive policies take their prior from it from the first round on: `"tracked"` its
    `beta_parameters` (prediction and the prompt's decayed counts), `"predictive"` its `prior_parameters` (the
    prediction alone).

    Subclasses are the exit rules' quotas: `default_quotas` fills `positive_quota` / `negative_quota`.
    """

    knobs = frozenset(
        {
            "round_size",
            "max_rounds",
            "positive_quota",
            "objective",
            "downsample",
            "round_policy",
            "round_confidence",
            "pass_rate_decay",
            "pass_rate_prior_alpha",
            "pass_rate_prior_beta",
            "pass_rate_predictor",
            "skip_unmixed_above",
            "dapo_refill",
            "dapo_max_refills",
            "dapo_on_exhausted",
        }
    )
    _PREDICTIVE = ("predictive", "tracked")
    knob_conditions = {
        "round_confidence": "with round_policy='predictive' or 'tracked'",
        "pass_rate_decay": "with round_policy='tracked', its pass-rate tracker",
        "pass_rate_prior_alpha": "with round_policy='predictive' or 'tracked', their Beta prior",
        "pass_rate_prior_beta": "with round_policy='predictive' or 'tracked', their Beta prior",
        "pass_rate_predictor": "with round_policy='predictive' or 'tracked', their pass-rate prior",
        "skip_unmixed_above": "with round_policy='tracked', or 'predictive' with a learned predictor",
        "dapo_max_refills": "with dapo_refill=True",
        "dapo_on_exhausted": "with dapo_refill=True",
    }
    has_exit_rule = True

    @classmethod
    def reads(cls, settings: SamplerSettings, name: str) -> bool:
        if name not in cls.knobs:
            return False
        if name == "pass_rate_decay":
            return settings.round_policy == "tracked"
        if name in (
            "round_confidence",
            "pass_rate_prior_alpha",
            "pass_rate_prior_beta",
            "pass_rate_predictor",
            "skip_unmixed_above",
        ):
            return settings.round_policy in cls._PREDICTIVE
        if name in ("dapo_max_refills", "dapo_on_exhausted"):
            return bool(settings.dapo_refill)
        return True

    @classmethod
    def knob_depends_on(cls, name: str) -> tuple[str, ...]:
        if name in ("dapo_max_refills", "dapo_on_exhausted"):
            return ("dapo_refill",)
        return ("round_policy",) if name in cls.knob_conditions else ()

    @classmethod
    def max_pool_size(cls, settings: SamplerSettings) -> int:
        return settings.round_size * settings.max_rounds

    @classmethod
    def one_request_per_prompt(cls, settings: SamplerSettings) -> bool:
        return settings.max_rounds == 1

    @classmethod
    def default_quotas(cls, settings: SamplerSettings) -> tuple[int, int]:
        """`(positive_quota, negative_quota)` with the `None`s filled in."""
        raise NotImplementedError

    @classmethod
    def describe(cls, settings: SamplerSettings) -> str:
        positive_quota, negative_quota = cls.default_quotas(settings)
        quotas = _count(positive_quota, "positive") + (
            f" and {_count(negative_quota, 'negative')}" if negative_quota else ""
        )
        requests = {
            "fixed": f"{settings.round_size} per round",
            "predictive": f"{settings.round_size} in the first round, then the fewest that meet its remaining quotas "
            f"with probability {settings.round_confidence} under a Beta posterior from its pool",
            "tracked": f"the fewest that meet its quotas with probability {settings.round_confidence} under a prior "
            "from a pass-rate tracker that remembers it across epochs",
        }[settings.round_policy]
        text = (
            f"Sampler `{settings.sampler}` (Reinforce-Ada-Seq): completions are drawn in rounds, each active prompt "
            f"asking for {requests}, until its pool holds {quotas} or reaches "
            f"{cls.max_pool_size(settings)} completions ({settings.max_rounds} rounds at most). Each pool is then "
            f"downsampled ({settings.downsample}) to an update group of {settings.num_generations}, with "
            f"{_BASELINES[settings.baseline]} as baseline{_objective_phrase(settings)}."
        )
        if settings.dapo_refill:
            text += (
                " Prompts whose pool has no signal are dropped and the batch is refilled from further prompts (DAPO's "
                f"dynamic sampling, at most {settings.dapo_max_refills} extra generation batches)."
            )
        return text

    @classmethod
    def resolve(cls, settings: SamplerSettings) -> SamplerSettings:
        n, cap = settings.num_generations, cls.max_pool_size(settings)
        if cap < n:
            raise ValueError(
                f"round_size * max_rounds = {settings.round_size} * {settings.max_rounds} = {cap} is smaller than "
                f"num_generations = {n}: a pool cannot be downsampled to an update group larger than itself. "
                f"Raise round_size or max_rounds so that round_size * max_rounds >= {n}."
            )
        positive_quota, negative_quota = cls.default_quotas(settings)
        if positive_quota < 1:
            raise ValueError(f"positive_quota must be at least 1, got {positive_quota}.")
        if positive_quota + negative_quota > cap:
            raise ValueError(
                f"positive_quota + negative_quota = {positive_quota} + {negative_quota} can never be reached within "
                f"the cap round_size * max_rounds = {cap} completions per prompt, so every prompt would use the whole "
                f"cap. Lower the quotas or raise round_size / max_rounds."
            )
        return replace(settings, positive_quota=positive_quota, negative_quota=negative_quota)

    def __init__(self, settings: SamplerSettings, estimator: PassRateEstimator | None = None) -> None:
        super().__init__(settings)
        settings = self.settings
        policy = settings.round_policy
        if estimator is None and (
            policy == "tracked" or (policy == "predictive" and settings.pass_rate_predictor != "tracker")
        ):
            estimator = build_pass_rate_estimator(settings)
        if estimator is not None:
            method = "beta_parameters" if policy == "tracked" else "prior_parameters"
            if policy not in ("tracked", "predictive") or not callable(getattr(estimator, method, None)):
                raise ValueError(
                    f"round_policy={policy!r} takes a first-round prior from a pass-rate estimator's {method}(keys) "
                    f"(a list of (alpha, beta)); {type(estimator).__name__} has none. Use round_policy='tracked' or "
                    "'predictive' with trl_ada.samplers.LearnedPassRatePredictor or an estimator with that method."
                )
        if settings.skip_unmixed_above is not None and estimator is None:
            raise ValueError(
                f"skip_unmixed_above={settings.skip_unmixed_above} skips prompts by their predicted pass rate, and "
                "round_policy='predictive' with pass_rate_predictor='tracker' predicts none (every prompt reads the "
                "same prior). Use round_policy='tracked', pass_rate_predictor='learned', or pass a "
                "pass_rate_estimator; or remove skip_unmixed_above."
            )
        self.tracker = estimator

    def begin(self, num_prompts: int, prompt_keys: Sequence[Hashable] | None = None) -> SamplingStep:
        step = SamplingStep(self, num_prompts)
        if self.tracker is not None:
            if prompt_keys is None or len(prompt_keys) != num_prompts:
                raise ValueError("round_policy='tracked' needs one stable key per prompt")
            step.keys = list(prompt_keys)
            method = "beta_parameters" if self.settings.round_policy == "tracked" else "prior_parameters"
            step.priors = checked_beta_parameters(self.tracker, method, step.keys)
            step.skipped = rules.skipped_prompts(
                [alpha / (alpha + beta) for alpha, beta in step.priors],
                self.settings.num_generations,
                self.settings.skip_unmixed_above,
            )
        return step

    def begin_continuous(self, num_prompts: int, prompt_keys: Sequence[Hashable] | None = None) -> ContinuousStep:
        return ContinuousStep(self, num_prompts, prompt_keys)

    def request_size(self, step: SamplingStep, index: int) -> int:
        return self.block_request(step, index, step.rounds)

    def block_request(self, step: SamplingStep, index: int, rounds_drawn: int) -> int:
        """
        The request of prompt `index`'s next round, after `rounds_drawn` rounds of it (0: it exited, reached the cap or
        has had `max_rounds`). One definition for both schedules: rounds ask it for every prompt once per round; the
        round-free schedule (`ContinuousStep`) asks it of each prompt when its previous block is complete.
        """
        if rounds_drawn >= self.settings.max_rounds:
            return 0
        # The last round must ask for whatever the cap still allows: no later round can make up a shortfall.
        return self.demand(step, index, last_round=rounds_drawn == self.settings.max_rounds - 1)

    def demand(self, step: SamplingStep, index: int, last_round: bool = False) -> int:
        """
        The round policy, in one place for both schedules: how many more completions prompt `index` needs given its
        pool so far (0: exited, or the pool is at the cap). In rounds (`request_size`) it is the next round's
        request, and on the round-free schedule (`ContinuousStep`) the size of the prompt's next block (see
        `block_request`).

        `"fixed"` asks for `round_size`; `"predictive"` for `round_size` while the pool is empty (nothing to predict
        from), then for the smallest request that meets the remaining quotas with probability `round_confidence`;
        `"tracked"` for that request from the start, with the tracker's prior. `last_round`: ask for all the room left.
        """
        settings = self.settings
        pool_size = len(step.pools[index])
        positives, negatives = step.outcomes[index]
        if pool_size >= settings.max_pool_size or self.has_exited(pool_size, positives, negatives):
            return 0
        room = settings.max_pool_size - pool_size
        if step.skipped is not None and step.skipped[index]:
            # Predicted unmixed (`skip_unmixed_above`): one request of the update group, trained on as GRPO's.
            return min(max(settings.num_generations - pool_size, 0), room)
        if pool_size and step.scorable[index] == 0:
            # No reward function scored any draw (all None): further draws are no more likely to be scored, so the
            # prompt only fills its update group (zero advantages) instead of drawing to the cap.
            return min(max(settings.num_generations - pool_size, 0), room)
        # In rounds the pool is empty exactly in the first round (every prompt draws at least once in it).
        if settings.round_policy == "fixed" or (
            settings.round_policy == "predictive" and pool_size == 0 and step.priors is None
        ):
            return min(settings.round_size, room)
        if last_round:
            return room
        alpha, beta = (
            step.priors[index]
            if step.priors is not None
            else (settings.pass_rate_prior_alpha, settings.pass_rate_prior_beta)
        )
        return rules.predictive_request(
            positives_needed=max(settings.positive_quota - positives, 0),
            negatives_needed=max(settings.negative_quota - negatives, 0),
            alpha=alpha + positives,
            beta=beta + negatives,
            confidence=settings.round_confidence,
            min_request=max(settings.num_generations - pool_size, 1),
            max_request=room,
        )

    def outlook(self, prior: tuple[float, float], pass_rate: float) -> tuple[float, float]:
        """
        `(expected draws, chance of a mixed pool)` of one prompt sampled by this round policy without the skip, with
        prior `prior` (its `step.priors` entry) and every draw positive with probability `pass_rate`: exact, over
        every path of rounds (each round's request from `block_request`, as the sampler makes it; paths less likely
        than 1e-12 are dropped). What `skip/draws_saved` and `skip/expected_signal_lost` compare a skipped prompt with.
        """
        stub = SamplingStep(self, 1)
        stub.priors = [prior]
        states: dict[tuple[int, int], float] = {(0, 0): 1.0}  # (pool size, positives) -> probability
        draws = mixed = 0.0
        for rounds_drawn in range(self.settings.max_rounds + 1):
            following: dict[tuple[int, int], float] = defaultdict(float)
            for (size, positives), probability in states.items():
                stub.pools[0] = [0.0] * size  # only its length is read
                stub.outcomes[0] = (positives, size - positives)
                stub.scorable[0] = size
                request = self.block_request(stub, 0, rounds_drawn)
                if request == 0:
                    draws += probability * size
                    mixed += probability * (0 < positives < size)
                    continue
                for hits in range(request + 1):
                    path = (
                        probability * math.comb(request, hits) * pass_rate**hits * (1 - pass_rate) ** (request - hits)
                    )
                    if path > 1e-12:
                        following[(size + request, positives + hits)] += path
            states = following
        return draws, mixed

    def end_step(self, step: SamplingStep, selection: Selection) -> None:
        if self.tracker is not None:
            totals, positives = [p + q for p, q in step.outcomes], [p for p, _ in step.outcomes]
            priors = [alpha / (alpha + beta) for alpha, beta in step.priors or ()]
            selection.metrics.update(estimate_metrics(step, priors))
            if step.skipped is not None:
                outlooks = {
                    index: self.outlook(step.priors[index], priors[index])
                    for index, skipped in enumerate(step.skipped)
                    if skipped
                }
                selection.metrics.update(
                    skip_metrics(
                        step,
                        priors,
                        {index: draws for index, (draws, _) in outlooks.items()},
                        {index: mixed for index, (_, mixed) in outlooks.items()},
                    )
                )
            self.tracker.update(step.keys, totals, positives)
            for name, value in getattr(self.tracker, "last_metrics", {}).items():
                selection.metrics[f"pass_rate_predictor/{name}"] = value

    @property
    def pass_rate_estimator(self) -> PassRateEstimator | None:
        return self.tracker

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        if self.tracker is not None:
            state["tracker"] = self.tracker.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        if self.tracker is not None:
            self.tracker.load_state_dict(state["tracker"])

    def has_exited(self, pool_size: int, positives: int, negatives: int) -> bool:
        """The exit rule. A pool smaller than the update group never exits, so it can always be downsampled."""
        return (
            pool_size >= self.settings.num_generations
            and positives >= self.settings.positive_quota
            and negatives >= self.settings.negative_quota
        )


@register_sampler("seq_pos")
class SeqPosSampler(SequentialSampler):
    """Reinforce-Ada-Seq-pos: a prompt retires once it has `positive_quota` positives (1 by default)."""

    @classmethod
    def reads(cls, settings: SamplerSettings, name: str) -> bool:
        # 0 is what `resolve` fills in: the exit rule counts positives only.
        return (name == "negative_quota" and settings.negative_quota == 0) or super().reads(settings, name)

    @classmethod
    def default_quotas(cls, settings: SamplerSettings) -> tuple[int, int]:
        return (1 if settings.positive_quota is None else settings.positive_quota), 0


@register_sampler("seq_balance")
class SeqBalanceSampler(SequentialSampler):
    """
    Reinforce-Ada-Seq-balance: a prompt retires once it has `positive_quota` positives and `negative_quota` negatives
    (by default exactly what a balanced update group takes: `n // 2` and `n - n // 2`).
    """

    knobs = SequentialSampler.knobs | {"negative_quota"}

    @classmethod
    def default_quotas(cls, settings: SamplerSettings) -> tuple[int, int]:
        n = settings.num_generations
        # The quotas are exactly what a balanced group takes (odd n: the extra slot is a negative's, see
        # rules.downsample), so an exited pool fills its group without topping up from the other side.
        positive_quota = n // 2 if settings.positive_quota is None else settings.positive_quota
        negative_quota = n - n // 2 if settings.negative_quota is None else settings.negative_quota
        if negative_quota < 1:
            raise ValueError(f"negative_quota must be at least 1 for sampler='seq_balance', got {negative_quota}.")
        return positive_quota, negative_quota
