"""Pass-rate estimators keyed by a stable prompt id. Pure Python."""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class PassRateEstimator(Protocol):
    """A pass-rate estimator, passed as `AdaGRPOTrainer(..., pass_rate_estimator=MyEstimator())`: `estimate` returns
    values strictly inside (0, 1), the same on every process; the keys are `PromptKey`s (the prompt's text as
    `key.text`); `state_dict` is JSON-serialisable. The round policies of `seq_*` also read `beta_parameters(keys)`
    (`"tracked"`) or `prior_parameters(keys)` (`"predictive"`), each a list of Beta `(alpha, beta)`."""

    def estimate(self, keys: Sequence[Hashable]) -> list[float]: ...

    def update(self, keys: Sequence[Hashable], totals: Sequence[int], positives: Sequence[float]) -> None:
        """Count each prompt's `totals` scored draws, of which `positives` succeeded (a remembered baseline passes
        the sum of its rewards in [0, 1] there, so that it remembers the mean reward)."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class DecayedBetaTracker:
    """Per-prompt decayed counts `N <- λN + n_t`, `K <- λK + k_t` with the Beta-prior estimate
    `p̂ = (K + α) / (N + α + β)`, which never reads 0 or 1. Keys must be stable across shuffling and epochs."""

    def __init__(self, decay: float, prior_alpha: float, prior_beta: float) -> None:
        self.decay = decay
        self.prior_alpha = prior_alpha
        self.prior_beta = prior_beta
        self.counts: dict[str, tuple[float, float]] = {}

    def estimate(self, keys: Sequence[Hashable]) -> list[float]:
        return [a / (a + b) for a, b in self.beta_parameters(keys)]

    def beta_parameters(self, keys: Sequence[Hashable]) -> list[tuple[float, float]]:
        """The Beta posterior `(K + α, N - K + β)` of each prompt's pass rate."""
        parameters = []
        for key in keys:
            total, positives = self.counts.get(str(key), (0.0, 0.0))
            parameters.append((positives + self.prior_alpha, total - positives + self.prior_beta))
        return parameters

    def visited(self, keys: Sequence[Hashable]) -> list[bool]:
        """Whether each prompt has counted draws (its estimate is more than the prior)."""
        return [self.counts.get(str(key), (0.0, 0.0))[0] > 0.0 for key in keys]

    def update(self, keys: Sequence[Hashable], totals: Sequence[int], positives: Sequence[float]) -> None:
        for key, n_t, k_t in zip(keys, totals, positives, strict=True):
            total, hits = self.counts.get(str(key), (0.0, 0.0))
            self.counts[str(key)] = (self.decay * total + n_t, self.decay * hits + k_t)

    def state_dict(self) -> dict[str, Any]:
        return {"counts": {key: list(value) for key, value in self.counts.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.counts = {key: (float(total), float(hits)) for key, (total, hits) in state["counts"].items()}


def checked_estimates(estimator: PassRateEstimator, keys: Sequence[Hashable]) -> list[float]:
    """`estimator.estimate(keys)`, checked: one estimate per key, each strictly inside (0, 1)."""
    estimates = estimator.estimate(keys)
    if len(estimates) != len(keys):
        raise ValueError(
            f"{type(estimator).__name__}.estimate returned {len(estimates)} estimates for {len(keys)} prompts; return "
            "one per key."
        )
    for key, estimate in zip(keys, estimates, strict=True):
        if not 0.0 < estimate < 1.0:  # also NaN
            raise ValueError(
                f"{type(estimator).__name__}.estimate returned {estimate} for prompt {str(key)!r}; estimates must lie "
                "strictly in (0, 1). Fix the estimator."
            )
    return estimates


def checked_beta_parameters(estimator: Any, method: str, keys: Sequence[Hashable]) -> list[tuple[float, float]]:
    """`estimator.<method>(keys)` (`beta_parameters` or `prior_parameters`), checked: one `(alpha, beta)` per key, each
    positive and finite (the round policy's beta-binomial sums would otherwise fail deep inside)."""
    parameters = list(getattr(estimator, method)(keys))
    name = f"{type(estimator).__name__}.{method}"
    if len(parameters) != len(keys):
        raise ValueError(
            f"{name} returned {len(parameters)} (alpha, beta) pairs for {len(keys)} prompts; return one per key."
        )
    checked = []
    for key, pair in zip(keys, parameters, strict=True):
        try:
            alpha, beta = (float(value) for value in pair)
        except (TypeError, ValueError):
            raise ValueError(
                f"{name} returned {pair!r} for prompt {str(key)!r}; return an (alpha, beta) pair."
            ) from None
        if not (alpha > 0.0 and beta > 0.0 and math.isfinite(alpha) and math.isfinite(beta)):
            raise ValueError(
                f"{name} returned (alpha, beta) = ({alpha}, {beta}) for prompt {str(key)!r}; the Beta parameters of a "
                "pass rate must be positive and finite (add a prior, e.g. pass_rate_prior_alpha and "
                "pass_rate_prior_beta, to the counts). Fix the estimator."
            )
        checked.append((alpha, beta))
    return checked
