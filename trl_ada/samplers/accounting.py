"""
Where a step's completions go: per pass-rate band of the prompt, how many were drawn and what share of them served
an update group with a signal ("useful draws"). Pure Python: no torch, no TRL.

A prompt's band is its pool's measured pass rate `p̂` (positives over scored, unmasked draws), the one number every
sampler has after drawing, tracker or not:

- `none_right`: `p̂ = 0`, every draw wrong (the prompt was hopeless at this budget);
- `low`: `0 < p̂ <= 1/4`; `mid`: `1/4 < p̂ < 3/4`; `high`: `3/4 <= p̂ < 1`;
- `all_right`: `p̂ = 1`, every draw right;
- `unscored`: no draw had a reward.

A prompt's draws are *useful* when the prompt is in the update and its group carries a signal
([`PromptResult.has_signal`]): the pool's draws then set its baseline and the kept ones move the policy. They are
*trained* when they are themselves in that group. DAPO's dropped groups, and a sequential sampler's pool that hit
the cap with one outcome, count as drawn and not useful: that is the waste this accounting exists to find.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

BANDS = ("none_right", "low", "mid", "high", "all_right", "unscored")
"""The pass-rate bands, in the order tables print them."""


def band_of(pass_rate: float) -> str:
    """The band of a pool's measured pass rate (NaN: `unscored`)."""
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
    """
    The `draws/*` metrics of one update, over every prompt drawn for it (first batch and refills):

    - `draws/drawn`: completions drawn (not `total`: TRL reads that word in a name as a sum over the log window);
      `draws/useful_share`, `draws/trained_share`: the shares of them that were useful and trained (see the module
      docstring);
    - per band `B` with at least one draw: `draws/B/share`, the share of the update's draws spent on prompts of that
      band, and `draws/B/useful_share`, the share of that band's draws that were useful;
    - the same counts as counters ([`draw_counters`]), which a logging window sums: a run's totals are the sums of its
      logged counters at any `logging_steps`, where the shares above are averaged over the window's updates.
    """
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
    """
    The shares of [`draw_metrics`] as `(numerator, denominator)` pairs, for a producer that reports many small
    batches: TRL's asynchronous trainer reduces a pair over its log window as `sum(numerators) / sum(denominators)`,
    so every draw of the window weighs the same (a mean of per-batch shares would not). Every band is present in
    every report, so each band's share of the window has the window's whole draw count below it. `draws/drawn` is
    the mean number of draws per report. The counters ([`draw_counters`]) are plain numbers, which that trainer sums.
    """
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
    """
    The names of the counters [`draw_metrics`] and [`draw_rates`] report, every band included whether drawn or not:
    `draws/drawn_total`, `draws/useful_total`, `draws/trained_total`, and per band `B` `draws/B/drawn_total` and
    `draws/B/useful_total`. The word `total` makes a logging window sum them
    (`trl_ada.reporting.metrics.LOG_WINDOW_REDUCTIONS`, and TRL's asynchronous trainer by the name).
    """
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
