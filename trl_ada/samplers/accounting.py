"""
Where a step's completions go: per band of the pool's measured pass rate `p̂` ([`band_of`]), how many were drawn and
how many were *useful* (the prompt is in the update and its group carries a signal) or *trained* (in that group
themselves). DAPO's dropped groups, and a pool that hit the cap with one outcome, are drawn and not useful: the waste
this accounting exists to find. Pure Python: no torch, no TRL.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

BANDS = ("none_right", "low", "mid", "high", "all_right", "unscored")
"""The pass-rate bands, in the order tables print them."""


def band_of(pass_rate: float) -> str:
    """The band of a pool's measured pass rate: `none_right` (0), `low` (up to 1/4), `mid`, `high` (from 3/4),
    `all_right` (1), or `unscored` (NaN)."""
    if math.isnan(pass_rate):
        return "unscored"
    if pass_rate <= 0.0:
        return "none_right"
    if pass_rate >= 1.0:
        return "all_right"
    if pass_rate <= 0.25:
        return "low"
    return "mid" if pass_rate < 0.75 else "high"


@dataclass(frozen=True)
class PromptDraws:
    """One prompt of one generation batch, as the accounting sees it."""

    pass_rate: float
    """The pool's measured pass rate (NaN when no draw was scored)."""
    draws: int
    """Completions drawn for the prompt (its pool)."""
    useful: bool
    """The prompt is in the update and its group carries a signal."""
    trained: int
    """Of `draws`, those in the update's group (0 when not `useful`)."""


def draw_metrics(prompts: Iterable[PromptDraws]) -> dict[str, float]:
    """The `draws/*` metrics of one update, over every prompt drawn for it (first batch and refills): `draws/drawn`
    (not `total`: TRL sums such names over the log window), `draws/useful_share` and `draws/trained_share`; per band
    `B` drawn, `draws/B/share` and `draws/B/useful_share`; and the counters of [`draw_counters`]."""
    drawn, useful, trained = _tally(prompts)
    total = sum(drawn.values())
    counters = _counters(drawn, useful, trained)
    if total == 0:
        return {"draws/drawn": 0.0, **counters}
    metrics = {
        "draws/drawn": float(total),
        "draws/useful_share": sum(useful.values()) / total,
        "draws/trained_share": trained / total,
    }
    for band in BANDS:
        if drawn[band]:
            metrics[f"draws/{band}/share"] = drawn[band] / total
            metrics[f"draws/{band}/useful_share"] = useful[band] / drawn[band]
    return {**metrics, **counters}


def draw_rates(prompts: Iterable[PromptDraws]) -> dict[str, tuple[float, float] | float]:
    """The shares of [`draw_metrics`] as `(numerator, denominator)` pairs, which TRL's asynchronous trainer reduces
    over its log window as `sum(numerators) / sum(denominators)`, so every draw weighs the same. Every band is in every
    report; `draws/drawn` is the mean draws per report; the counters ([`draw_counters`]) are plain numbers."""
    drawn, useful, trained = _tally(prompts)
    total = float(sum(drawn.values()))
    rates: dict[str, tuple[float, float] | float] = {
        "draws/drawn": (total, 1.0),
        "draws/useful_share": (float(sum(useful.values())), total),
        "draws/trained_share": (float(trained), total),
    }
    for band in BANDS:
        rates[f"draws/{band}/share"] = (float(drawn[band]), total)
        rates[f"draws/{band}/useful_share"] = (float(useful[band]), float(drawn[band]))
    return {**rates, **_counters(drawn, useful, trained)}


def draw_counters() -> tuple[str, ...]:
    """The counters [`draw_metrics`] and [`draw_rates`] report, every band included: `draws/drawn_total`,
    `draws/useful_total`, `draws/trained_total`, and per band `draws/B/drawn_total` and `draws/B/useful_total`. The
    word `total` makes a logging window sum them."""
    per_band = tuple(f"draws/{band}/{count}_total" for band in BANDS for count in ("drawn", "useful"))
    return ("draws/drawn_total", "draws/useful_total", "draws/trained_total", *per_band)


def _counters(drawn: dict[str, int], useful: dict[str, int], trained: int) -> dict[str, float]:
    counts = [sum(drawn.values()), sum(useful.values()), trained]
    counts += [count for band in BANDS for count in (drawn[band], useful[band])]
    return {name: float(count) for name, count in zip(draw_counters(), counts, strict=True)}


def _tally(prompts: Iterable[PromptDraws]) -> tuple[dict[str, int], dict[str, int], int]:
    """Per band, the draws and the useful draws; and the trained draws over all bands."""
    drawn = dict.fromkeys(BANDS, 0)
    useful = dict.fromkeys(BANDS, 0)
    trained = 0
    for prompt in prompts:
        band = band_of(prompt.pass_rate)
        drawn[band] += prompt.draws
        if prompt.useful:
            useful[band] += prompt.draws
            trained += prompt.trained
    return drawn, useful, trained
