"""Statistics over seeds: Student's t quantile, the mean with its t-interval, paired (same-seed) differences."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from typing import Any


def t_quantile(probability: float, df: int) -> float:
    """The ``probability`` quantile of Student's t with ``df`` degrees of freedom (bisection on its CDF).

    The CDF is the regularised incomplete beta function, evaluated by its continued fraction (Lentz), so no scipy is
    needed; accurate to ~1e-10, e.g. ``t_quantile(0.975, 4) = 2.7764451``.
    """
    if df < 1:
        raise ValueError(f"df must be >= 1, got {df}.")
    if not 0 < probability < 1:
        raise ValueError(f"probability must be in (0, 1), got {probability}.")

    def incomplete_beta(a: float, b: float, x: float, y: float) -> float:
        """I_x(a, b), with ``y = 1 - x`` passed in exactly (it is tiny where the t-CDF is needed most)."""
        if x <= 0:
            return 0.0
        if y <= 0:
            return 1.0
        if x > (a + 1) / (a + b + 2):  # the continued fraction converges fast only below the mean
            return 1.0 - incomplete_beta(b, a, y, x)
        log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log(y)
        tiny = 1e-300
        c, d = 1.0, 1.0 - (a + b) * x / (a + 1)
        d = 1.0 / (d if abs(d) > tiny else tiny)
        fraction = d
        for m in range(1, 300):
            for numerator in (
                m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
            ):
                d = 1.0 + numerator * d
                d = 1.0 / (d if abs(d) > tiny else tiny)
                c = 1.0 + numerator / c
                c = c if abs(c) > tiny else tiny
                fraction *= c * d
            if abs(c * d - 1.0) < 1e-15:
                break
        return math.exp(log_front) * fraction / a

    def upper_tail(t: float) -> float:  # P(T > t) for t >= 0
        return 0.5 * incomplete_beta(df / 2, 0.5, df / (df + t * t), t * t / (df + t * t))

    # The distribution is symmetric: solve in the upper half, where the tail is computed without cancellation.
    if probability == 0.5:
        return 0.0
    tail = 1.0 - probability if probability > 0.5 else probability
    low, high = 0.0, 1.0
    while upper_tail(high) > tail:
        high *= 2
    for _ in range(200):
        middle = (low + high) / 2
        if upper_tail(middle) > tail:
            low = middle
        else:
            high = middle
        if high - low < 1e-12:
            break
    value = (low + high) / 2
    return value if probability > 0.5 else -value


def mean_ci(values: Sequence[float], confidence: float = 0.95) -> dict[str, Any]:
    """Mean and two-sided t-interval over independent values (seeds): ``mean ± t_{(1+c)/2, n-1} · sd / sqrt(n)``.

    Returns ``{"mean", "ci_low", "ci_high", "half_width", "sd", "n"}``; with one value the interval is unknown
    (``None``).
    """
    values = [float(value) for value in values]
    if not values:
        return {"mean": None, "ci_low": None, "ci_high": None, "half_width": None, "sd": None, "n": 0}
    mean = statistics.fmean(values)
    if len(values) < 2:
        return {"mean": mean, "ci_low": None, "ci_high": None, "half_width": None, "sd": None, "n": 1}
    sd = statistics.stdev(values)
    half = t_quantile((1 + confidence) / 2, len(values) - 1) * sd / math.sqrt(len(values))
    return {
        "mean": mean,
        "ci_low": mean - half,
        "ci_high": mean + half,
        "half_width": half,
        "sd": sd,
        "n": len(values),
    }


def paired_difference(
    runs: Sequence[dict], reference: Sequence[dict], value: Callable[[dict], float | None]
) -> dict[str, Any]:
    """Mean and t-interval of ``value(run) - value(reference run)`` over the seeds both ran (paired by seed) where
    both have a value (``value`` returns None for a run that has none there, e.g. a curve that ended before it)."""
    by_seed = {run["seed"]: run for run in reference}
    mine = {run["seed"]: run for run in runs}
    differences, seeds = [], []
    for seed in sorted(seed for seed in mine if seed in by_seed):
        own, other = value(mine[seed]), value(by_seed[seed])
        if own is not None and other is not None:
            differences.append(own - other)
            seeds.append(seed)
    result = mean_ci(differences)
    result["seeds"] = seeds
    return result
