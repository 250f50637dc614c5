"""
The sequential samplers `seq_pos` and `seq_balance` (Algorithm 2 of the paper). They alone run on the round-free
schedule ([`ContinuousStep`]), so this module, not `base`, imports it. Pure Python: no torch and no TRL.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

from . import rules
from .base import (
    _BASELINES,
    Sampler,
    SamplingStep,
    Selection,
    _count,
    _objective_phrase,
    learn_pass_rates,
    skip_metrics,
)
from .capabilities import RunsRoundFree
from .predictor import build_pass_rate_estimator
from .registry import register_sampler
from .settings import SamplerOptions, SamplerSettings, read_when
from .streaming import ContinuousStep
from .tracker import PassRateEstimator, checked_beta_parameters

_PREDICTIVE = ("predictive", "tracked")


@dataclass(kw_only=True)
class SequentialOptions(SamplerOptions):
    """What `seq_pos` and `seq_balance` read; `__post_init__` fills the quotas (`default_quotas`) and checks they fit
    under the cap."""

    round_size: int
    max_rounds: int
    positive_quota: int | None
    objective: str
    downsample: str
    round_policy: str
    round_confidence: float = read_when("round_policy", *_PREDICTIVE)
    pass_rate_decay: float = read_when("round_policy", "tracked")
    pass_rate_prior_alpha: float = read_when("round_policy", *_PREDICTIVE)
    pass_rate_prior_beta: float = read_when("round_policy", *_PREDICTIVE)
    pass_rate_predictor: str = read_when("round_policy", *_PREDICTIVE)
    skip_unmixed_above: float | None = read_when("round_policy", *_PREDICTIVE)
    dapo_refill: bool | None
    dapo_max_refills: int = read_when("dapo_refill", True)
    dapo_on_exhausted: str = read_when("dapo_refill", True)
    negative_quota: int | None = None
    """Filled by `__post_init__`: 0 for `seq_pos`, whose exit rule counts positives only."""

    def __post_init__(self) -> None:
        n, cap = self.num_generations, self.max_pool_size
        if cap < n:
            raise ValueError(
                f"round_size * max_rounds = {self.round_size} * {self.max_rounds} = {cap} is smaller than "
                f"num_generations = {n}: a pool cannot be downsampled to an update group larger than itself. "
                f"Raise round_size or max_rounds so that round_size * max_rounds >= {n}."
            )
        self.positive_quota, self.negative_quota = self.default_quotas()
        if self.positive_quota < 1:
            raise ValueError(f"positive_quota must be at least 1, got {self.positive_quota}.")
        if self.positive_quota + self.negative_quota > cap:
            raise ValueError(
                f"positive_quota + negative_quota = {self.positive_quota} + {self.negative_quota} can never be "
                f"reached within the cap round_size * max_rounds = {cap} completions per prompt, so every prompt would "
                "use the whole cap. Lower the quotas or raise round_size / max_rounds."
            )

    def default_quotas(self) -> tuple[int, int]:
        """`(positive_quota, negative_quota)` with the `None`s filled in."""
        raise NotImplementedError

    @property
    def max_pool_size(self) -> int:
        return self.round_size * self.max_rounds

    def describe(self, settings: SamplerSettings) -> str:
        quotas = _count(self.positive_quota, "positive") + (
            f" and {_count(self.negative_quota, 'negative')}" if self.negative_quota else ""
        )
        requests = {
            "fixed": f"{self.round_size} per round",
            "predictive": f"{self.round_size} in the first round, then the fewest that meet its remaining quotas "
            f"with probability {settings.round_confidence} under a Beta posterior from its pool",
            "tracked": f"the fewest that meet its quotas with probability {settings.round_confidence} under a prior "
            "from a pass-rate tracker that remembers it across epochs",
        }[self.round_policy]
        text = (
            f"Sampler `{settings.sampler}` (Reinforce-Ada-Seq): completions are drawn in rounds, each active prompt "
            f"asking for {requests}, until its pool holds {quotas} or reaches {self.max_pool_size} completions "
            f"({self.max_rounds} rounds at most). Each pool is then downsampled ({self.downsample}) to an update group "
            f"of {self.num_generations}, with {_BASELINES[settings.baseline]} as baseline{_objective_phrase(settings)}."
        )
        if settings.dapo_refill:
            text += (
                " Prompts whose pool has no signal are dropped and the batch is refilled from further prompts (DAPO's "
                f"dynamic sampling, at most {settings.dapo_max_refills} extra generation batches)."
            )
        return text


class SequentialSampler(RunsRoundFree, Sampler):
    """
    Reinforce-Ada-Seq (Algorithm 2 of the paper): rounds of completions for every active prompt until its exit rule
    holds or its pool reaches `round_size * max_rounds`; each request is the round policy's (`demand`). An estimator
    (`pass_rate_predictor`, or an `estimator` object) gives the predictive policies their prior from the first round:
    `"tracked"` its `beta_parameters`, `"predictive"` its `prior_parameters`. Subclasses set the exit rule's quotas.
    """

    def __init__(self, settings: SamplerSettings, estimator: PassRateEstimator | None = None) -> None:
        super().__init__(settings)
        settings = self.settings
        policy = settings.round_policy
        # What the predictive policies read of an estimator: its posterior ("tracked") or its prediction alone.
        self._prior_method = method = "beta_parameters" if policy == "tracked" else "prior_parameters"
        if estimator is None and (
            policy == "tracked" or (policy == "predictive" and settings.pass_rate_predictor != "tracker")
        ):
            estimator = build_pass_rate_estimator(settings)
        if estimator is not None:
            if policy not in ("tracked", "predictive") or not callable(getattr(estimator, method, None)):
                raise ValueError(
                    f"round_policy={policy!r} takes a first-round prior from a pass-rate estimator's {method}(keys) "
                    f"(a list of (alpha, beta)); {type(estimator).__name__} has none. Use round_policy='tracked' or "
                    "'predictive' with trl_ada.samplers.predictor.LearnedPassRatePredictor or an estimator with that method."
                )
        if settings.skip_unmixed_above is not None and estimator is None:
            raise ValueError(
                f"skip_unmixed_above={settings.skip_unmixed_above} skips prompts by their predicted pass rate, and "
                "round_policy='predictive' with pass_rate_predictor='tracker' predicts none (every prompt reads the "
                "same prior). Use round_policy='tracked', pass_rate_predictor='learned', or pass a "
                "pass_rate_estimator; or remove skip_unmixed_above."
            )
        self.estimator = estimator

    def begin(self, num_prompts: int, prompt_keys: Sequence[Hashable] | None = None) -> SamplingStep:
        if self.estimator is not None and prompt_keys is None:
            raise ValueError("round_policy='tracked' needs one stable key per prompt")
        # The keys also serve a remembered baseline, whatever the round policy.
        step = super().begin(num_prompts, prompt_keys)
        if self.estimator is not None:
            step.priors = checked_beta_parameters(self.estimator, self._prior_method, step.keys)
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
        """The request of prompt `index`'s next round after `rounds_drawn` of them (0: done), for both schedules (the
        round-free one asks it when the prompt's previous block is complete)."""
        if rounds_drawn >= self.settings.max_rounds:
            return 0
        # The last round must ask for whatever the cap still allows: no later round can make up a shortfall.
        return self.demand(step, index, last_round=rounds_drawn == self.settings.max_rounds - 1)

    def demand(self, step: SamplingStep, index: int, last_round: bool = False) -> int:
        """The round policy: how many more completions prompt `index` needs given its pool so far (0: exited, or at the
        cap). `"fixed"` asks for `round_size`; `"predictive"` for `round_size` while the pool is empty, then for the
        smallest request that meets the remaining quotas with probability `round_confidence`; `"tracked"` for that
        request from the start, with the estimator's prior. `last_round`: ask for all the room left."""
        settings = self.settings
        pool_size = len(step.pools[index])
        positives, negatives = step.outcomes[index]
        if pool_size >= self.options.max_pool_size or self.has_exited(pool_size, positives, negatives):
            return 0
        room = self.options.max_pool_size - pool_size
        skipped = step.skipped is not None and step.skipped[index]
        if skipped or (pool_size and step.scorable[index] == 0):
            # Predicted unmixed (`skip_unmixed_above`), or no draw scored so far (none will be): fill the update group.
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
            positives_needed=max(self.options.positive_quota - positives, 0),
            negatives_needed=max(self.options.negative_quota - negatives, 0),
            alpha=alpha + positives,
            beta=beta + negatives,
            confidence=settings.round_confidence,
            min_request=max(settings.num_generations - pool_size, 1),
            max_request=room,
        )

    def outlook(self, prior: tuple[float, float], pass_rate: float) -> tuple[float, float]:
        """`(expected draws, chance of a mixed pool)` of one prompt sampled by this round policy without the skip, with
        prior `prior` and every draw positive with probability `pass_rate`: exact over every path of rounds (paths less
        likely than 1e-12 are dropped). What `skip_metrics` compares a skipped prompt with."""
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
        if self.estimator is None:
            return
        priors = [alpha / (alpha + beta) for alpha, beta in step.priors or ()]
        if step.skipped is not None:
            outlooks = {
                index: self.outlook(step.priors[index], priors[index])
                for index, skipped in enumerate(step.skipped)
                if skipped
            }
            selection.metrics.update(skip_metrics(step, priors, outlooks))
        learn_pass_rates(self.estimator, step, selection, priors)

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        if self.estimator is not None:
            state["tracker"] = self.estimator.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        if self.estimator is not None:
            self.estimator.load_state_dict(state["tracker"])

    def has_exited(self, pool_size: int, positives: int, negatives: int) -> bool:
        """The exit rule. A pool smaller than the update group never exits, so it can always be downsampled."""
        return (
            pool_size >= self.settings.num_generations
            and positives >= self.options.positive_quota
            and negatives >= self.options.negative_quota
        )


@dataclass(kw_only=True)
class SeqPosOptions(SequentialOptions):
    """`seq_pos`'s quotas: `positive_quota` positives (1 by default), no negative."""

    negative_quota: int | None = field(default=None, init=False)

    def default_quotas(self) -> tuple[int, int]:
        return (1 if self.positive_quota is None else self.positive_quota), 0


@register_sampler("seq_pos")
class SeqPosSampler(SequentialSampler):
    """Reinforce-Ada-Seq-pos: a prompt retires once it has `positive_quota` positives (1 by default)."""

    Options = SeqPosOptions


@dataclass(kw_only=True)
class SeqBalanceOptions(SequentialOptions):
    """`seq_balance`'s quotas: by default exactly what a balanced update group takes (`n // 2` and `n - n // 2`)."""

    negative_quota: int | None

    def default_quotas(self) -> tuple[int, int]:
        n = self.num_generations
        # What a balanced group takes (odd n: the extra slot is a negative's), so an exited pool needs no top-up.
        positive_quota = n // 2 if self.positive_quota is None else self.positive_quota
        negative_quota = n - n // 2 if self.negative_quota is None else self.negative_quota
        if negative_quota < 1:
            raise ValueError(f"negative_quota must be at least 1 for sampler='seq_balance', got {negative_quota}.")
        return positive_quota, negative_quota


@register_sampler("seq_balance")
class SeqBalanceSampler(SequentialSampler):
    """Reinforce-Ada-Seq-balance: a prompt retires at `positive_quota` positives and `negative_quota` negatives."""

    Options = SeqBalanceOptions
