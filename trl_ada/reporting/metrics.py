"""Evaluation and data-selection maths as pure functions (plain Python, bands compared as exact fractions): pass@k,
Ave@k, pass-rate bands and histograms; and how a logging window reduces each metric trl-ada logs."""

from __future__ import annotations

import math
from collections.abc import Iterable, MutableMapping, Sequence
from dataclasses import dataclass
from fractions import Fraction

from ..samplers.accounting import draw_counters
from ..samplers.rules import is_positive
from ..samplers.settings import SamplerFields

POSITIVE_THRESHOLD = SamplerFields.__dataclass_fields__["positive_threshold"].default
"""`positive_threshold`'s default: what evaluation counts as correct unless told otherwise."""


def count_correct(rewards: Iterable[float | None], threshold: float = POSITIVE_THRESHOLD) -> int | None:
    """Number of rewards strictly above ``threshold`` (a completion counts as correct, as ``positive_threshold`` in
    `AdaGRPOConfig`), or ``None`` when every reward is ``None`` (the verifier does not apply to the problem)."""
    values = list(rewards)
    if values and all(value is None for value in values):
        return None
    return sum(1 for value in values if value is not None and is_positive(value, threshold))


def pass_at_k(num_samples: int, num_correct: int, k: int) -> float:
    """Unbiased estimator of pass@k from ``num_samples`` samples of which ``num_correct`` are correct:
    ``1 - C(n - c, k) / C(n, k)`` (Chen et al., 2021), computed as a product to stay exact-ish for large ``n``."""
    if num_samples < 1:
        raise ValueError(f"num_samples must be >= 1, got {num_samples}.")
    if not 0 <= num_correct <= num_samples:
        raise ValueError(f"num_correct must be in [0, num_samples={num_samples}], got {num_correct}.")
    if not 1 <= k <= num_samples:
        raise ValueError(f"k must be in [1, num_samples={num_samples}], got {k}; draw more samples for a larger k.")
    if num_samples - num_correct < k:
        return 1.0
    # C(n-c, k) / C(n, k) = prod_{i=n-c+1}^{n} (1 - k / i)
    fail = 1.0
    for i in range(num_samples - num_correct + 1, num_samples + 1):
        fail *= 1.0 - k / i
    return 1.0 - fail


def _per_problem_samples(correct_counts: Sequence[int], num_samples: int | Sequence[int]) -> list[int]:
    if isinstance(num_samples, int):
        return [num_samples] * len(correct_counts)
    if len(num_samples) != len(correct_counts):
        raise ValueError(f"Got {len(correct_counts)} correct counts but {len(num_samples)} sample counts.")
    return list(num_samples)


def mean_pass_at_k(correct_counts: Sequence[int], num_samples: int | Sequence[int], k: int) -> float:
    """pass@k averaged over problems (``nan`` for no problem)."""
    if not correct_counts:
        return float("nan")
    samples = _per_problem_samples(correct_counts, num_samples)
    return math.fsum(pass_at_k(n, c, k) for n, c in zip(samples, correct_counts, strict=True)) / len(correct_counts)


def average_at_k(correct_counts: Sequence[int], num_samples: int | Sequence[int]) -> float:
    """Ave@k: accuracy averaged over the ``k`` samples of each problem, then over problems (the paper's Ave@32), equal
    to ``mean_pass_at_k(..., k=1)``; ``nan`` for no problem."""
    if not correct_counts:
        return float("nan")
    samples = _per_problem_samples(correct_counts, num_samples)
    for n, c in zip(samples, correct_counts, strict=True):
        if n < 1 or not 0 <= c <= n:
            raise ValueError(f"Invalid counts: {c} correct out of {n} samples.")
    return math.fsum(c / n for n, c in zip(samples, correct_counts, strict=True)) / len(correct_counts)


def weighted_average(values: Sequence[float], weights: Sequence[float]) -> float:
    """``sum(w v) / sum(w)``, e.g. benchmark scores weighted by their number of problems (the paper's "weighted
    average"). ``nan`` when the weights sum to zero."""
    if len(values) != len(weights):
        raise ValueError(f"Got {len(values)} values but {len(weights)} weights.")
    total = math.fsum(weights)
    if total == 0:
        return float("nan")
    return math.fsum(v * w for v, w in zip(values, weights, strict=True)) / total


def pass_rate_histogram(correct_counts: Iterable[int], num_samples: int) -> dict[int, int]:
    """How many problems had each number of correct samples, for every count ``0..num_samples`` (zeros included)."""
    histogram = dict.fromkeys(range(num_samples + 1), 0)
    for count in correct_counts:
        if not 0 <= count <= num_samples:
            raise ValueError(f"A correct count {count} is outside [0, {num_samples}].")
        histogram[count] += 1
    return histogram


def _exact(value: float | int | str | Fraction) -> Fraction:
    # Fraction(repr(float)) is the decimal the user typed (0.375 -> 3/8, 0.313 -> 313/1000), not its binary value.
    if isinstance(value, Fraction):
        return value
    if isinstance(value, float):
        return Fraction(repr(value))
    return Fraction(value)


@dataclass(frozen=True)
class PassRateBand:
    """An interval of pass rates, e.g. the paper's ``(0, 0.375]`` (keep prompts with 1..6 of 16 samples correct):
    ``0 <= low <= high <= 1``, kept as exact fractions so ``c / n`` is compared without float rounding, and
    ``include_low``/``include_high`` saying whether each end is inside the band."""

    low: Fraction
    high: Fraction
    include_low: bool = False
    include_high: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "low", _exact(self.low))
        object.__setattr__(self, "high", _exact(self.high))
        if not 0 <= self.low <= self.high <= 1:
            raise ValueError(f"A pass-rate band needs 0 <= low <= high <= 1, got low={self.low}, high={self.high}.")
        if self.low == self.high and not (self.include_low and self.include_high):
            raise ValueError(f"The band {self} is empty; include both ends to select exactly {float(self.low)}.")

    @classmethod
    def from_ends(cls, low: float, high: float, ends: str = "(]") -> PassRateBand:
        """A band from its bounds and interval brackets: ``ends`` is one of ``"(]"``, ``"[]"``, ``"[)"``, ``"()"``."""
        if ends not in ("(]", "[]", "[)", "()"):
            raise ValueError(f"ends must be one of '(]', '[]', '[)', '()', got {ends!r}.")
        return cls(_exact(low), _exact(high), include_low=ends[0] == "[", include_high=ends[1] == "]")

    @classmethod
    def from_correct_range(cls, min_correct: int, max_correct: int, num_samples: int) -> PassRateBand:
        """The band of prompts with ``min_correct..max_correct`` (both included) correct samples out of
        ``num_samples``; e.g. the paper's hard set is ``from_correct_range(1, 2, 16)``."""
        if num_samples < 1:
            raise ValueError(f"num_samples must be >= 1, got {num_samples}.")
        if not 0 <= min_correct <= max_correct <= num_samples:
            raise ValueError(
                f"A correct range needs 0 <= min <= max <= num_samples={num_samples}, "
                f"got {min_correct}..{max_correct}."
            )
        return cls(Fraction(min_correct, num_samples), Fraction(max_correct, num_samples), True, True)

    def contains(self, num_correct: int, num_samples: int) -> bool:
        """Whether the pass rate ``num_correct / num_samples`` lies in the band (exact comparison)."""
        rate = Fraction(num_correct, num_samples)
        above_low = rate >= self.low if self.include_low else rate > self.low
        below_high = rate <= self.high if self.include_high else rate < self.high
        return above_low and below_high

    def side(self, num_correct: int, num_samples: int) -> str:
        """``"below"`` (too hard), ``"inside"`` or ``"above"`` (too easy) the band."""
        if self.contains(num_correct, num_samples):
            return "inside"
        rate = Fraction(num_correct, num_samples)
        return "below" if rate <= self.low else "above"

    def __str__(self) -> str:
        opening = "[" if self.include_low else "("
        closing = "]" if self.include_high else ")"
        return f"{opening}{float(self.low):.6g}, {float(self.high):.6g}{closing}"


LOG_WINDOW_REDUCTIONS: dict[str, str] = {
    "samples_per_prompt/max": "max",
    "samples_per_prompt/min": "min",
    "round_time/max": "max",
    "round_time/total": "sum",
    "async/pool_version_span_max": "max",
    "advantages/abs_max": "max",
    "dapo/prompts_dropped_total": "sum",
    "dapo/groups_dropped_total": "sum",
    "dapo/groups_total": "sum",
    "dapo/passed_over_total": "sum",
    "gate/passed_over_total": "sum",
    "priority/passed_over_total": "sum",
    "sample/dropped_stale_total": "sum",
    **dict.fromkeys(draw_counters(), "sum"),
}
"""
The metrics trl-ada logs (names without `ada/`) that a logging window reduces by something other than the mean:
extrema and counters of increments. The name's last segment carries the reduction (`total`, `max`, `min`), as TRL's
asynchronous trainer reads it; `AdaGRPOTrainer` applies this table ([`reduce_log_window`]) itself.
"""

_REDUCERS = {"sum": math.fsum, "max": max, "min": min}


def advantage_metrics(advantages: Sequence[float]) -> dict[str, float]:
    """`ada/advantages/abs_max`, `/mean` and `/std` (unbiased) of the advantages a trainer hands its loss: a blow-up
    shows on the first step it happens. Empty for no advantage."""
    values = list(advantages)
    if not values:
        return {}
    mean = math.fsum(values) / len(values)
    spread = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (len(values) - 1)) if len(values) > 1 else 0.0
    return {
        "ada/advantages/abs_max": max(abs(v) for v in values),
        "ada/advantages/mean": mean,
        "ada/advantages/std": spread,
    }


def log_window_reduction(name: str) -> str:
    """How a logging window should reduce metric `name` (with or without its `ada/` prefix): `"mean"`, `"max"`,
    `"min"` or `"sum"`, from [`LOG_WINDOW_REDUCTIONS`]."""
    return LOG_WINDOW_REDUCTIONS.get(name.removeprefix("ada/"), "mean")


def reduce_log_window(window: MutableMapping[str, list[float]]) -> None:
    """Collapse, in place, the values a logging window holds for each trl-ada metric (`ada/*`) that
    [`log_window_reduction`] does not average into the one value it reduces to (NaN values skipped, as TRL does), so
    a trainer that averages every window logs the sum, maximum or minimum. Other metrics are left alone."""
    for name, values in window.items():
        reduction = log_window_reduction(name) if name.startswith("ada/") else "mean"
        valid = [value for value in values if not math.isnan(value)]
        if reduction != "mean" and valid:
            window[name] = [float(_REDUCERS[reduction](valid))]


__all__ = [
    "LOG_WINDOW_REDUCTIONS",
    "advantage_metrics",
    "PassRateBand",
    "average_at_k",
    "count_correct",
    "log_window_reduction",
    "mean_pass_at_k",
    "pass_at_k",
    "pass_rate_histogram",
    "reduce_log_window",
    "weighted_average",
]
